#!/usr/bin/env bash
# The CPU executor's speed against the machine's GEMM limit (its issue): GPT-2 124M, micro batch 4,
# sequence 256, fp32, dropout 0. Measures one core's cblas_sgemm rate on the step's GEMM shapes
# (build/bench/stepcast_sgemm_rate), then `stepcast run` on 1 rank and on 2 ranks (one per core)
# under tp 2, pp 2 and dp 2, and prints step time, tokens/s, model flop/s and its ratio to the
# sgemm rate (issue: >= 0.5 on 1 rank), then where the single-rank instrumented step's time goes,
# by op. Figures are printed, not asserted. About 10 minutes on an otherwise idle 2-core machine.
# BUILD=DIR picks the build directory (default build/); STEPS=N the steps per run (default 6:
# 1 warm-up, N-2 timed, 1 instrumented).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
steps=${STEPS:-6}
[ -x "$build/stepcast" ] && [ -x "$build/bench/stepcast_sgemm_rate" ] ||
  BUILD_DIR=$build bash scripts/build.sh >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
topology=topologies/localhost-cpu.json

# The model: gpt2-124m.json as shipped but for seq_length 256.
model=$out/gpt2-124m-s256.json
sed 's/"seq_length": *[0-9]*/"seq_length": 256/' models/gpt2-124m.json >"$model"
grep -q '"seq_length": 256' "$model" || { echo "cpu_run.sh: no seq_length in gpt2-124m.json"; exit 1; }
seq=256

# plan NAME TP PP DP GLOBAL_BATCH: writes $out/NAME.json (fp32, dropout 0, micro batch 4, 1F1B,
# no ZeRO, no recompute: the plan's defaults otherwise).
plan() {
  cat >"$out/$1.json" <<EOF
{"name": "$1", "tp_size": $2, "pp_size": $3, "dp_size": $4, "micro_batch_size": 4,
 "global_batch_size": $5, "dtype": "fp32", "dropout": 0.0}
EOF
}
# Every 2-rank case runs 8 samples (2048 tokens) per step, twice the single rank's 4: with perfect
# scaling its step time equals the single rank's. tp 2 and pp 2 take them as 2 microbatches of 4
# (pp: 1F1B bubble (p-1)/(m+p-1) = 1/3), dp 2 as one microbatch of 4 per rank.
plan single 1 1 1 4
plan tp2 2 1 1 8
plan pp2 1 2 1 8
plan dp2 1 1 2 8

load() { cut -d' ' -f1 /proc/loadavg; }
echo "== machine: $(nproc) cores, load average $(load) before the runs (other work skews figures)"

# timed LABEL CMD...: runs CMD and leaves in $out/LABEL.cpu the share of a core it got ((user +
# system) / wall, e.g. "115%"): a 2-rank run that got well under 200% shared its cores.
timed() {
  local label=$1
  shift
  if [ -x /usr/bin/time ]; then
    /usr/bin/time -f "%P" -o "$out/$label.cpu" "$@"
  else
    echo "-" >"$out/$label.cpu"
    "$@"
  fi
}

echo
echo "== one core's cblas_sgemm rate on the step's GEMMs (OPENBLAS_NUM_THREADS=1, bound to a core)"
timed sgemm scripts/mpirun -np 1 --bind-to core "$build/bench/stepcast_sgemm_rate" |
  tee "$out/sgemm.log"
echo "CPU the sgemm run got: $(cat "$out/sgemm.cpu") of a core"
sgemm_gflops=$(awk '/^sgemm rate / { print $3 }' "$out/sgemm.log")
[ -n "$sgemm_gflops" ] || { echo "cpu_run.sh: no 'sgemm rate' line"; exit 1; }

# field FILE KEY: a number from the one-line measurement.json (the keys read here are unique).
field() { grep -o "\"$2\":[-0-9.eE+]*" "$1" | head -1 | cut -d: -f2; }
# The topology's fp32 peak per device, which measurement.json's "mfu" is relative to.
peak_flops_per_s=$(grep -o '"fp32": *[0-9.eE+]*' "$topology" | head -1 | sed 's/.*: *//')

# run CASE RANKS: stepcast run under mpirun, one rank per core; leaves $out/CASE/measurement.json.
run() {
  local label=$1 ranks=$2
  echo "running $label on $ranks rank(s), $steps steps ..." >&2
  timed "$label" scripts/mpirun -np "$ranks" --bind-to core "$build/stepcast" run \
    --model "$model" --plan "$out/$label.json" --topology "$topology" --steps "$steps" \
    --out "$out/$label" >"$out/$label.log" 2>&1 || { cat "$out/$label.log"; exit 1; }
}
run single 1
for label in tp2 pp2 dp2; do run "$label" 2; done

echo
echo "== GPT-2 124M, micro batch 4, sequence $seq, fp32, $topology; step time: median of the"
echo "   $((steps - 2)) timed steps (after 1 warm-up; the instrumented last step excluded)"
printf "%-7s %5s %12s %7s %8s %8s %9s %11s %8s %6s %9s %9s %5s\n" case ranks microbatches tokens \
  step_s min_s tokens/s model_GF/s GF/s/rk ratio ratio_min vs_1_rank cpu
single_tps=""
for label in single tp2 pp2 dp2; do
  m=$out/$label/measurement.json
  ranks=1
  [ "$label" = single ] || ranks=2
  step_s=$(field "$m" step_time_s)
  min_s=$(field "$m" step_time_min_s)
  tps=$(field "$m" tokens_per_s)
  mfu=$(field "$m" mfu)
  [ "$label" = single ] && single_tps=$tps
  gbs=$(grep -o '"global_batch_size": *[0-9]*' "$out/$label.json" | grep -o '[0-9]*$')
  dp=$(grep -o '"dp_size": *[0-9]*' "$out/$label.json" | grep -o '[0-9]*$')
  # Model flop/s = mfu × peak × ranks: the executor computes mfu as model_flops_per_token ×
  # tokens per step / step time / (ranks × the topology's fp32 peak, 100e9 per core).
  awk -v label="$label" -v ranks="$ranks" -v mb=$((gbs / dp / 4)) -v tokens=$((gbs * seq)) \
    -v step_s="$step_s" -v min_s="$min_s" -v tps="$tps" -v mfu="$mfu" -v peak="$peak_flops_per_s" \
    -v sgemm="$sgemm_gflops" -v single_tps="$single_tps" -v cpu="$(cat "$out/$label.cpu")" 'BEGIN {
      gflops = mfu * peak * ranks / 1e9
      ratio = gflops / ranks / sgemm
      target = (ranks == 1) ? sprintf("  (issue: ratio >= 0.5, %s)", ratio >= 0.5 ? "met" : "NOT met") : ""
      printf "%-7s %5d %12d %7d %8.3f %8.3f %9.1f %11.2f %8.2f %6.3f %9.3f %9.3f %5s%s\n", label,
        ranks, mb, tokens, step_s, min_s, tps, gflops, gflops / ranks, ratio,
        ratio * step_s / min_s, tps / (ranks * single_tps), cpu, target
    }'
done
echo "microbatches: per rank per step; min_s: the fastest timed step; model_GF/s: model flops"
echo "per step / step time, all ranks (mfu x peak x ranks); GF/s/rk: per rank; ratio: GF/s/rk over"
echo "one core's sgemm rate ($sgemm_gflops GFLOP/s); ratio_min: the same at min_s; vs_1_rank:"
echo "tokens/s over ranks x the single rank's; cpu: share of a core the whole run got (user +"
echo "system over wall; 100% per rank when the machine is otherwise idle, less when shared)"
echo "load average after the runs: $(load)"

echo
echo "== the critical rank's instrumented step (measurement.json breakdown_s), s"
printf "%-7s %8s %9s %13s %8s %10s\n" case critical compute exposed_comm bubble optimizer
for label in single tp2 pp2 dp2; do
  m=$out/$label/measurement.json
  b=$(grep -o '"breakdown_s":{[^}]*}' "$m")
  printf "%-7s %8s %9.3f %13.3f %8.3f %10.3f\n" "$label" "$(field "$m" critical_rank)" \
    "$(field <(echo "$b") compute)" "$(field <(echo "$b") exposed_comm)" \
    "$(field <(echo "$b") bubble)" "$(field <(echo "$b") optimizer)"
done

# Where the single rank's instrumented step goes: op durations (measurement.json "ops": id,
# start_s, end_s) joined with the program's ops (one per line in program.json: kind, name,
# phase, grad, flops), summed by kind, name, phase and grad.
echo
echo "== where the single rank's instrumented step goes (by op kind / name / phase / grad)"
"$build/stepcast" lower --model "$model" --plan "$out/single.json" --topology "$topology" \
  --out "$out/single-program" >/dev/null
grep -o '{"end_s":[^}]*}' "$out/single/measurement.json" >"$out/records"
awk -v sgemm="$sgemm_gflops" '
  # get(line, key): the value of "key": in a flat JSON object (quotes stripped), or "".
  function get(line, key,    i, rest, j) {
    i = index(line, "\"" key "\":")
    if (i == 0) return ""
    rest = substr(line, i + length(key) + 3)
    j = match(rest, /[,}]/)
    rest = substr(rest, 1, j - 1)
    gsub(/"/, "", rest)
    return rest
  }
  FNR == 1 { file++ }
  file == 1 {  # program.json: ops of the one role
    if ($0 !~ /^\{"id":/) next
    id = get($0, "id")
    name = get($0, "name"); grad = get($0, "grad")
    key[id] = sprintf("%-15s %-22s %-9s %-6s", get($0, "kind"), name == "" ? "-" : name,
                      get($0, "phase"), grad == "" ? "-" : grad)
    flops[id] = get($0, "flops") + 0
    next
  }
  {  # measurement.json op records
    id = get($0, "id"); s = get($0, "start_s") + 0; e = get($0, "end_s") + 0
    if (!(id in key)) { missing++; next }
    k = key[id]; t[k] += e - s; n[k]++; f[k] += flops[id]
    if (first == "" || s < first) first = s
    if (e > last) last = e
    busy += e - s
    if (key[id] ~ /^gemm /) { gemm_t += e - s; gemm_f += flops[id] }
  }
  END {
    span = last - first
    printf "%-15s %-22s %-9s %-6s %5s %9s %7s %9s %8s\n", "kind", "name", "phase", "grad", "ops",
           "time_s", "share", "GFLOP", "GFLOP/s"
    for (k in t) printf "%.9f|%s|%d|%.9f\n", t[k], k, n[k], f[k]
    printf "instrumented step %.3f s (first op start to last op end), ops busy %.3f s", span, busy
    if (missing) printf ", %d records not in the program", missing
    printf "\nall gemm ops: %.3f s = %.1f%% of the step, %.1f GFLOP at %.1f GFLOP/s = %.2f of sgemm\n",
           gemm_t, 100 * gemm_t / span, gemm_f / 1e9, gemm_f / 1e9 / gemm_t, gemm_f / 1e9 / gemm_t / sgemm
    printf "everything else: %.3f s = %.1f%% of the step\n", span - gemm_t, 100 * (span - gemm_t) / span
  }
' "$out/single-program/program.json" "$out/records" >"$out/breakdown.txt"
# Rows "time|key|ops|flops", longest first, as columns with their share of the step.
span=$(awk '/^instrumented step/ { print $3 }' "$out/breakdown.txt")
head -1 "$out/breakdown.txt"
grep '|' "$out/breakdown.txt" | sort -t'|' -k1,1 -g -r | awk -F'|' -v span="$span" '{
  printf "%s %5d %9.4f %6.1f%% %9.2f %8s\n", $2, $3, $1, 100 * $1 / span, $4 / 1e9,
         ($4 > 0 && $1 > 0) ? sprintf("%.1f", $4 / 1e9 / $1) : "-"
}'
grep -v '|' "$out/breakdown.txt" | tail -n +2
