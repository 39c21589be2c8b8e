#!/usr/bin/env bash
# Fuzzes every input loader (fuzz/targets/NAME.cpp) with libFuzzer, AddressSanitizer and
# UndefinedBehaviorSanitizer for N seconds each, two targets at a time, and prints per target:
# executions, exec/s, coverage (libFuzzer's cov: edges and ft: features), corpus size and any
# crash file. Exit status 1 on a finding (crash, uncaught exception, sanitizer report, timeout,
# out-of-memory). Builds the clang configuration in build-fuzz/ first (FUZZ_BUILD_DIR overrides);
# work corpora grow in build-fuzz/corpus-work/NAME, crashes land in build-fuzz/crashes/NAME/.
# Without clang++ and libFuzzer it says so and exits 0. The test command runs it for 10 s
# (scripts/test.sh); bench/fuzz.sh is the long run.
#
#   bash scripts/fuzz.sh [--seconds N] [--jobs J] [TARGET ...]
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=10
jobs=2
targets=()
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fuzz: unknown option $1 (valid: --seconds N, --jobs J, target names)" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if [ ${#targets[@]} -eq 0 ]; then
  for source in fuzz/targets/*.cpp; do targets+=("$(basename "$source" .cpp)"); done
fi
for name in "${targets[@]}"; do
  [ -f "fuzz/targets/$name.cpp" ] || { echo "fuzz: no target '$name' (fuzz/targets/$name.cpp)" >&2; exit 2; }
done

# libFuzzer ships with clang (Debian: clang and libclang-rt-dev); check that a target links.
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' >"$probe/probe.cpp"
if ! command -v clang++ >/dev/null ||
   ! clang++ -fsanitize=fuzzer,address,undefined "$probe/probe.cpp" -o "$probe/probe" >/dev/null 2>&1; then
  echo "fuzz: clang with libFuzzer not found, skipped (bash scripts/install-deps.sh installs clang and libclang-rt-dev)"
  exit 0
fi

build_dir=${FUZZ_BUILD_DIR:-build-fuzz}
# UBSan's reports with their stacks, as ASan's have.
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
started=$(date +%s)
# -O1 without NDEBUG: libstdc++'s and nlohmann's assertions stay on; line tables for the stacks.
mkdir -p "$build_dir"
CXX=clang++ cmake -S . -B "$build_dir" -DSTEPCAST_FUZZ=ON -DSTEPCAST_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug \
  "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -gline-tables-only" >"$build_dir.configure.log" 2>&1 ||
  { cat "$build_dir.configure.log"; exit 1; }
build_targets=()
for name in "${targets[@]}"; do build_targets+=(--target "fuzz_$name"); done
cmake --build "$build_dir" -j"$(nproc)" "${build_targets[@]}" >"$build_dir/build.log" 2>&1 ||
  { tail -50 "$build_dir/build.log"; exit 1; }
built=$(date +%s)
echo "fuzz: built ${#targets[@]} targets in $((built - started)) s"

# The crash reproducers first, under the sanitizers: the gcc replay (ctest "fuzz replay: NAME")
# does not see an out-of-bounds read that happens not to crash.
mkdir -p "$build_dir/logs"
regressions_failing=()
for name in "${targets[@]}"; do
  for input in fuzz/regressions/"$name"/*; do
    [ -f "$input" ] && [ "$(basename "$input")" != README.md ] || continue
    if ! "$build_dir/fuzz/fuzz_$name" -rss_limit_mb=2048 -timeout=10 "$input" \
         >"$build_dir/logs/regression-$name-$(basename "$input").log" 2>&1; then
      regressions_failing+=("$input")
    fi
  done
done
if [ ${#regressions_failing[@]} -gt 0 ]; then
  echo "fuzz: ${#regressions_failing[@]} reproducers of fuzz/regressions/ still fail (unfixed findings):"
  printf '  %s\n' "${regressions_failing[@]}"
fi
echo "fuzz: fuzzing each target for $seconds s, $jobs at a time"

# One target: its seeds and growing work corpus, the dictionary of its format.
fuzz_one() {
  local name=$1
  local work=$build_dir/corpus-work/$name crashes=$build_dir/crashes/$name
  local dict=fuzz/dict/$name.dict
  [ -f "$dict" ] || dict=fuzz/dict/json.dict
  mkdir -p "$work" "$crashes" "$build_dir/logs"
  rm -f "$build_dir/logs/$name.status"
  local rc=0
  "$build_dir/fuzz/fuzz_$name" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
    -print_final_stats=1 -dict="$dict" -artifact_prefix="$crashes/" "$work" "fuzz/corpus/$name" \
    >"$build_dir/logs/$name.log" 2>&1 || rc=$?
  echo "$rc" >"$build_dir/logs/$name.status"
}

for name in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  fuzz_one "$name" &
done
wait

# The table, from libFuzzer's final stats and its last status line.
findings=0
printf "%-20s %12s %8s %7s %7s %9s %9s  %s\n" target executions exec/s cov ft corpus corpus_kB result
final_stat() { grep -o "^stat::$1: *[0-9]*" "$2" | grep -o '[0-9]*$' | tail -1; }
for name in "${targets[@]}"; do
  log=$build_dir/logs/$name.log
  rc=$(cat "$build_dir/logs/$name.status")
  last=$(grep -E ' cov: [0-9]+ ft: [0-9]+' "$log" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\)\/\([0-9]*[a-zA-Z]*\).*/\1 \2/p' <<<"$last")
  crash=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
  result=ok
  if [ "$rc" -ne 0 ] || [ -n "$crash" ]; then
    findings=$((findings + 1))
    result="FINDING ${crash:-exit status $rc, see $log}"
  fi
  printf "%-20s %12s %8s %7s %7s %9s %9s  %s\n" "$name" "$(final_stat number_of_executed_units "$log")" \
    "$(final_stat average_exec_per_sec "$log")" "${cov:--}" "${ft:--}" "${corp% *}" "${corp#* }" "$result"
done
echo "fuzz: $((${#targets[@]} - findings)) of ${#targets[@]} targets without findings in $(($(date +%s) - started)) s"
if [ ${#regressions_failing[@]} -gt 0 ] && [ "$findings" -eq 0 ]; then
  echo "fuzz: no new findings, but ${#regressions_failing[@]} reproducers still fail (listed above)"
  exit 1
fi
if [ "$findings" -gt 0 ]; then
  for name in "${targets[@]}"; do
    log=$build_dir/logs/$name.log
    grep -q "Test unit written to\|ERROR: libFuzzer\|ERROR: AddressSanitizer\|runtime error" "$log" || continue
    echo "--- $name ($log):"
    grep -m1 -E "uncaught exception|fuzz oracle|ERROR: (libFuzzer|AddressSanitizer)|runtime error|what\(\)" "$log" || true
    grep -m8 -E "^ *#[0-9]+ .* in stepcast::" "$log" || true
  done
  echo "fuzz: reproduce with $build_dir/fuzz/fuzz_NAME CRASH; minimize with -minimize_crash=1 -runs=100000;"
  echo "      keep the minimized input in fuzz/regressions/NAME/ (fuzz/README.md)"
  exit 1
fi
