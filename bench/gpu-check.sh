#!/usr/bin/env bash
# bench/gpu-check.sh — the CUDA backend on one GPU (the H200 device machine), about 3 minutes
# with a PREBUILT build (reports/gpu/README.md: what it measured there):
#   1. builds stepcast with the CUDA backend (sm_90a + compute_90 PTX), or takes PREBUILT's;
#   2. runs the [gpu] tests one process per case (kernels against the CPU backend, tiny-model
#      loss curves); the first failure again with cuBLASLt's log and under compute-sanitizer;
#   3. `stepcast profile --backend cuda` (--quick unless QUICK_PROFILE=0);
#   4. trains GPT-2 124M, GPT-3 1.3B and GPT-2 350M at sequence 1024 on one GPU for $STEPS steps
#      (`stepcast run --backend cuda`): tokens/s, MFU (model flops per step / step time / 989e12),
#      peak memory; and the same GPT, micro batch and steps in PyTorch (bench/pytorch_gpt.py: SDPA
#      is_causal, fused AdamW, bf16 autocast, no compile): tokens/s side by side;
#   5. `simulate` of the same runs on topologies/h200-1gpu.json with that profile and with
#      profiles/h200-sxm.json (datasheet): both prediction errors against the measured step times;
#   6. prints the table last (and writes it, the logs and work.tgz under $OUT or out/gpu-check).
#
# Usage (repository root):  bash bench/gpu-check.sh
#   STEPS=30 (steps per training run), QUICK_PROFILE=1 (profile --quick; 0: the full grid),
#   BUILD=build-gpu, JOBS=$(nproc), DEADLINE_S=420 (optional stages after this are skipped),
#   MODELS="gpt2-124m gpt3-1.3b gpt2-350m" (the training runs, in this order),
#   PREBUILT=DIR: use DIR/stepcast, DIR/libstepcast_cuda.so and DIR/tests/stepcast_cuda_tests
#   built elsewhere (same nvcc; saves the build's device time) instead of building; their
#   compiled-in source directory (PREBUILT_SOURCE_DIR, default /work/main) is linked to this
#   checkout when it does not exist, so the [gpu] tests find the shipped models.
# A bare GPU machine lacks the Debian packages stepcast needs (SimGrid and its ns-3 and GSL,
# Boost, OpenMPI, OpenBLAS; to build also nlohmann-json, Catch2 and the headers). Fetch them
# here first (Debian 12, apt):
#   bash bench/gpu-check.sh --fetch-deps         # running a PREBUILT build: ~31 MB
#   bash bench/gpu-check.sh --fetch-deps build   # building on the GPU machine too: ~48 MB
#   echo /.deps/ >> .git/info/exclude
# and carry .deps: the script unpacks them into /tmp/stepcast-deps (never into /) and points
# pkg-config, CMake, the loader and OpenMPI there.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT_DIR=${OUT:-$ROOT/out/gpu-check}
BUILD=${BUILD:-build-gpu}
STEPS=${STEPS:-30}
QUICK_PROFILE=${QUICK_PROFILE:-1}
JOBS=${JOBS:-$(nproc)}
DEADLINE_S=${DEADLINE_S:-420}
PREBUILT=${PREBUILT:-}
PREBUILT_SOURCE_DIR=${PREBUILT_SOURCE_DIR:-/work/main}
PEAK=989e12           # the issue's MFU denominator: H200 dense bf16, flop/s
TOPOLOGY=topologies/h200-1gpu.json
DATASHEET=profiles/h200-sxm.json
RUNTIME_DEBS=(libsimgrid3.32 libboost-context1.74.0 libboost-stacktrace1.74.0
  libboost-program-options1.74.0 libopenmpi3 openmpi-bin openmpi-common libpmix2 libhwloc15
  libevent-2.1-7 libevent-core-2.1-7 libevent-pthreads-2.1-7 libfabric1 libucx0 libpsm2-2
  libibverbs1 librdmacm1 libnl-3-200 libnl-route-3-200 libopenblas0-pthread libgfortran5
  libquadmath0 libns3.37 libgsl27 libgslcblas0 libsqlite3-0 libssl3 libudev1)  # SimGrid links ns-3, GSL
BUILD_DEBS=(libsimgrid-dev libboost-program-options-dev libboost1.74-dev nlohmann-json3-dev catch2
  libopenmpi-dev libopenblas-dev libopenblas-pthread-dev)

if [ "${1:-}" = "--fetch-deps" ]; then
  mkdir -p .deps
  packages=("${RUNTIME_DEBS[@]}")
  [ "${2:-}" = build ] && packages+=("${BUILD_DEBS[@]}")
  (cd .deps && apt-get download "${packages[@]}")
  du -sh .deps
  exit 0
fi

mkdir -p "$OUT_DIR"
T0=$(date +%s)
say() { printf '[%4ds] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }
in_time() { [ $(( $(date +%s) - T0 )) -lt "$DEADLINE_S" ] || { say "skipped (past DEADLINE_S=$DEADLINE_S): $*"; return 1; }; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit --format=csv 2>&1 | tee "$OUT_DIR/nvidia-smi.csv" || true
export OMPI_MCA_plm=${OMPI_MCA_plm:-isolated}  # one machine: launch locally, no ssh needed
LOG="$OUT_DIR/gpu-check.log"
: >"$LOG"

# ---- 0. dependencies: the machine's own, else the carried .deps ----
if ! ldconfig -p 2>/dev/null | grep -q libsimgrid.so.3 || ! command -v mpirun >/dev/null; then
  if ! ls .deps/*.deb >/dev/null 2>&1; then
    echo "gpu-check: SimGrid or OpenMPI missing and no .deps/*.deb carried: run" \
         "'bash bench/gpu-check.sh --fetch-deps' on a Debian 12 machine and carry .deps" >&2
    exit 2
  fi
  DEPS=/tmp/stepcast-deps
  mkdir -p "$DEPS"
  for f in .deps/*.deb; do dpkg -x "$f" "$DEPS"; done
  MULTIARCH=x86_64-linux-gnu
  export PATH="$DEPS/usr/bin:$PATH"
  export LD_LIBRARY_PATH="$DEPS/usr/lib/$MULTIARCH:$DEPS/usr/lib/$MULTIARCH/openblas-pthread:$DEPS/usr/lib/$MULTIARCH/openmpi/lib:${LD_LIBRARY_PATH:-}"
  export PKG_CONFIG_PATH="$DEPS/usr/lib/$MULTIARCH/pkgconfig:$DEPS/usr/share/pkgconfig"
  export PKG_CONFIG_SYSROOT_DIR="$DEPS"
  export CMAKE_PREFIX_PATH="$DEPS/usr"
  export OPAL_PREFIX="$DEPS/usr"   # OpenMPI, relocated (Debian configures it with prefix /usr)
  export CPATH="$DEPS/usr/include:$DEPS/usr/lib/$MULTIARCH/openmpi/include:${CPATH:-}"
  export LIBRARY_PATH="$DEPS/usr/lib/$MULTIARCH:${LIBRARY_PATH:-}"
  # Debian's alternatives links are not unpacked: name the MPI wrappers and BLAS directly.
  ln -sf "$DEPS/usr/bin/mpirun.openmpi" "$DEPS/usr/bin/mpirun" 2>/dev/null || true
  ln -sf "$DEPS/usr/bin/mpicxx.openmpi" "$DEPS/usr/bin/mpicxx" 2>/dev/null || true
  ln -sf "$DEPS/usr/lib/$MULTIARCH/openblas-pthread/libblas.so.3" "$DEPS/usr/lib/$MULTIARCH/libblas.so.3" 2>/dev/null || true
  ln -sf "$DEPS/usr/lib/$MULTIARCH/openblas-pthread/libblas.so" "$DEPS/usr/lib/$MULTIARCH/libblas.so" 2>/dev/null || true
  CMAKE_EXTRA=(-DMPI_CXX_COMPILER="$DEPS/usr/bin/mpicxx.openmpi"
               -DBLAS_LIBRARIES="$DEPS/usr/lib/$MULTIARCH/openblas-pthread/libblas.so")
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # the [gpu] tests' singleton MPI
  # PMIx looks for its plugins where Debian put them; the machine may hold another PMIx there.
  export PMIX_MCA_mca_base_component_path="$DEPS/usr/lib/$MULTIARCH/pmix2/lib/pmix"
  export PMIX_MCA_pcompress_base_silence_warning=1
  say "dependencies unpacked into $DEPS"
else
  CMAKE_EXTRA=()
fi
# NCCL: the toolkit's, else the one PyTorch's wheels carry (nvidia-nccl-cu13).
if ! ls /usr/local/cuda/lib*/libnccl.so* >/dev/null 2>&1; then
  NCCL_DIR=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null || true)
  if [ -n "$NCCL_DIR" ] && ls "$NCCL_DIR"/lib/libnccl.so* >/dev/null 2>&1; then
    NCCL_LIB=$(ls "$NCCL_DIR"/lib/libnccl.so* | head -1)
    CMAKE_EXTRA+=(-DSTEPCAST_NCCL_LIBRARY="$NCCL_LIB" -DSTEPCAST_NCCL_INCLUDE="$NCCL_DIR/include")
    export LD_LIBRARY_PATH="$NCCL_DIR/lib:${LD_LIBRARY_PATH:-}"
  fi
fi

# The CUDA libraries the toolkit lacks (cuBLASLt, runtime), from PyTorch's wheels too.
for pkg in cublas cuda_runtime; do
  dir=$(python3 -c "import nvidia.$pkg, os; print(os.path.dirname(nvidia.$pkg.__file__))" 2>/dev/null || true)
  [ -n "$dir" ] && [ -d "$dir/lib" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$dir/lib"
done

# ---- 1. build (or take a PREBUILT one) ----
MPIRUN="$ROOT/scripts/mpirun"
if [ -n "$PREBUILT" ]; then
  STEPCAST="$ROOT/$PREBUILT/stepcast"
  TESTS="$ROOT/$PREBUILT/tests/stepcast_cuda_tests"
  [ -e "$PREBUILT_SOURCE_DIR" ] || { mkdir -p "$(dirname "$PREBUILT_SOURCE_DIR")"; ln -s "$ROOT" "$PREBUILT_SOURCE_DIR"; }
  say "prebuilt $PREBUILT; the loader finds:"
  ldd "$STEPCAST" "$ROOT/$PREBUILT/libstepcast_cuda.so" "$TESTS" | grep "not found" || echo "  every library"
  "$STEPCAST" --version || { echo "gpu-check: the prebuilt stepcast does not start" >&2; exit 2; }
else
  say "build ($BUILD, $JOBS jobs)"
  GENERATOR=()
  command -v ninja >/dev/null && GENERATOR=(-G Ninja)
  cmake -S . -B "$BUILD" "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release "${CMAKE_EXTRA[@]}" >>"$LOG" 2>&1
  grep -q "STEPCAST_HAVE_CUDA:INTERNAL=ON\|CUDA backend ON" "$LOG" || { echo "gpu-check: CMake did not enable the CUDA backend (see $LOG)" >&2; exit 2; }
  cmake --build "$BUILD" -j "$JOBS" --target stepcast stepcast_cuda_tests >>"$LOG" 2>&1
  STEPCAST="$ROOT/$BUILD/stepcast"
  TESTS="$ROOT/$BUILD/tests/stepcast_cuda_tests"
  say "built"
fi

# ---- 2. the [gpu] tests, one process per test case (a crash or hang costs one case) ----
say "[gpu] tests"
GPU_TESTS=ok
: >"$OUT_DIR/gpu-tests.log"
mapfile -t CASES < <("$TESTS" --list-test-names-only | sed '/^$/d')
passed=0; failed=0
for case_name in "${CASES[@]}"; do
  in_time "test '$case_name'" || { GPU_TESTS=INCOMPLETE; break; }
  start=$(date +%s%N)
  if timeout 150 "$TESTS" "$case_name" >"$OUT_DIR/case.log" 2>&1; then
    verdict=passed; passed=$((passed + 1))
  else
    code=$?
    if [ "$code" = 77 ]; then verdict=SKIPPED; GPU_TESTS=SKIPPED
    else verdict="FAILED (exit $code)"; failed=$((failed + 1)); GPU_TESTS=FAILED; fi
  fi
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  printf '%-8s %6d ms  %s\n' "${verdict%% *}" "$ms" "$case_name" | tee -a "$OUT_DIR/gpu-tests.log"
  [ "$verdict" = passed ] || { sed 's/^/    /' "$OUT_DIR/case.log" | tail -40 >>"$OUT_DIR/gpu-tests.log"; }
done
say "[gpu] tests: $passed passed, $failed failed of ${#CASES[@]}"
# The first failed case again, with cuBLASLt's log (its reasons for NOT_SUPPORTED) and under
# compute-sanitizer's memcheck (bad accesses, API errors).
if [ "$failed" -gt 0 ]; then
  case_name=$(grep '^FAILED' "$OUT_DIR/gpu-tests.log" | sed "s/^FAILED *[0-9]* ms  //" | head -1)
  if in_time "diagnostics of '$case_name'"; then
    say "diagnostics: $case_name"
    CUBLASLT_LOG_LEVEL=4 timeout 45 "$TESTS" "$case_name" 2>&1 | grep -v '^$' | tail -80 >"$OUT_DIR/cublaslt.log" || true
    if command -v compute-sanitizer >/dev/null; then
      timeout 45 compute-sanitizer --tool memcheck --print-limit 20 "$TESTS" "$case_name" 2>&1 |
        grep -v '^$' | tail -40 >"$OUT_DIR/sanitizer.log" || true
    fi
  fi
fi

# ---- 3. the device profile (before the training runs: component evidence first) ----
WORK="$OUT_DIR/work"
mkdir -p "$WORK"
PROFILE="$WORK/h200-measured.json"
QUICK=()
[ "$QUICK_PROFILE" = 1 ] && QUICK=(--quick)
in_time "profile" && say "stepcast profile --backend cuda ${QUICK[*]}" &&
if ! timeout 60 "$MPIRUN" -np 1 "$STEPCAST" profile --backend cuda --topology "$TOPOLOGY" --out "$PROFILE" \
     "${QUICK[@]}" >"$WORK/profile.log" 2>&1; then
  echo "  profile failed:"; grep -v '^--\|^ \|^$' "$WORK/profile.log" | tail -8
fi
# ---- 4. training runs, stepcast and PyTorch ----
# name  model-file  micro-batch   (sequence 1024; one microbatch per step, bf16, flash)
ALL_RUNS=("gpt2-124m models/gpt2-124m.json 16"
          "gpt3-1.3b models/gpt3-1.3b.json 8"
          "gpt2-350m models/gpt2-350m.json 8")
RUNS=()
for spec in "${ALL_RUNS[@]}"; do
  case " ${MODELS:-gpt2-124m gpt3-1.3b gpt2-350m} " in *" ${spec%% *} "*) RUNS+=("$spec") ;; esac
done
for spec in "${RUNS[@]}"; do
  read -r name model mbs <<<"$spec"
  python3 - "$model" "$WORK/$name.model.json" "$WORK/$name.plan.json" "$mbs" <<'PY'
import json, sys
model, model_out, plan_out, mbs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
m = json.load(open(model))
m["seq_length"] = 1024
# The vocabulary padded to a multiple of 128, as Megatron-LM's --make-vocab-size-divisible-by
# (default 128) and nanoGPT's 50304 do: an odd row length (GPT-2's 50257) leaves the logits
# GEMM's rows unaligned, and cuBLASLt falls back to slow kernels. PyTorch trains the same file.
m["vocab_size"] = (m["vocab_size"] + 127) // 128 * 128
m["name"] = m["name"] + "-s1024"
json.dump(m, open(model_out, "w"), indent=1)
json.dump({"name": "gpu-check-" + m["name"], "micro_batch_size": mbs, "global_batch_size": mbs,
           "attention_impl": "flash", "dtype": "bf16", "grad_dtype": "fp32", "dropout": 0.0,
           "recompute": "none", "zero_stage": 0}, open(plan_out, "w"), indent=1)
PY
  in_time "$name runs" || continue
  say "$name: stepcast run --backend cuda (micro batch $mbs, $STEPS steps)"
  if ! timeout 150 "$MPIRUN" -np 1 "$STEPCAST" run --model "$WORK/$name.model.json" --plan "$WORK/$name.plan.json" \
       --topology "$TOPOLOGY" --backend cuda --steps "$STEPS" --quiet --out "$WORK/$name.run" \
       >"$WORK/$name.run.log" 2>&1; then
    echo "  stepcast run failed:"; grep -v '^--\|^ \|^$' "$WORK/$name.run.log" | tail -8
  fi
  say "$name: PyTorch"
  if ! timeout 150 python3 bench/pytorch_gpt.py --model "$WORK/$name.model.json" --micro-batch "$mbs" \
       --steps "$STEPS" --warmup 5 >"$WORK/$name.torch.json" 2>"$WORK/$name.torch.log"; then
    echo "  PyTorch failed:"; tail -5 "$WORK/$name.torch.log"
  fi
done

# ---- 5. simulate each run with the measured and the datasheet profile ----
for spec in "${RUNS[@]}"; do
  read -r name model mbs <<<"$spec"
  for which in measured datasheet; do
    profile=$PROFILE
    [ "$which" = datasheet ] && profile=$DATASHEET
    [ -f "$profile" ] || continue
    timeout 60 "$STEPCAST" simulate --model "$WORK/$name.model.json" --plan "$WORK/$name.plan.json" \
      --topology "$TOPOLOGY" --profile "$profile" --no-scaling --out "$WORK/$name.sim-$which" \
      >"$WORK/$name.sim-$which.log" 2>&1 || { echo "  simulate ($which) of $name failed:"; tail -3 "$WORK/$name.sim-$which.log"; }
  done
done

# ---- 6. the table ----
say "done in $(( $(date +%s) - T0 )) s; [gpu] tests: $GPU_TESTS"
python3 - "$WORK" "$PEAK" "$TOPOLOGY" "$OUT_DIR/gpu-check.md" "${RUNS[@]}" <<'PY'
import json, os, sys
work, peak, topology, table_path, runs = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
def load(path):
    try:
        with open(path) as f:
            text = f.read().strip().splitlines()
        return json.loads(text[-1]) if path.endswith(".torch.json") else json.loads("\n".join(text))
    except (OSError, ValueError, IndexError):
        return None
topo_peak = json.load(open(topology))["node"]["device"]["peak_flops_per_s"]["bf16"]
rows = ["| model | micro batch | stepcast tokens/s | PyTorch tokens/s | ratio | MFU (989e12) | "
        "peak memory stepcast / PyTorch (GiB) | step time (s) | predicted, measured profile | "
        "predicted, datasheet |",
        "|---|---|---|---|---|---|---|---|---|---|"]
def pct(x):
    return "—" if x is None else f"{100 * x:+.1f}%"
for spec in runs:
    name, _, mbs = spec.split()
    m = load(f"{work}/{name}.run/measurement.json")
    t = load(f"{work}/{name}.torch.json")
    if m is None:
        rows.append(f"| {name} | {mbs} | failed | " + (f"{t['tokens_per_s']:.0f}" if t else "—") + " | | | | | | |")
        continue
    step = m["step_time_s"]
    mfu = m["mfu"] * topo_peak / peak  # the executor's MFU is over the topology's peak
    mem = m["memory"]["measured_peak_bytes_max"] / 2**30
    dev = m["memory"].get("device_rank0", {}).get("used_high_water_bytes")
    errors = []
    for which in ("measured", "datasheet"):
        p = load(f"{work}/{name}.sim-{which}/prediction.json")
        errors.append(None if p is None else (p["step_time_s"] - step) / step)
    torch_tps = t["tokens_per_s"] if t else None
    rows.append(
        f"| {name} | {mbs} | {m['tokens_per_s']:.0f} | "
        + (f"{torch_tps:.0f} | {m['tokens_per_s'] / torch_tps:.2f}" if torch_tps else "— | —")
        + f" | {100 * mfu:.1f}% | {mem:.1f}"
        + (f" (device {dev / 2**30:.1f})" if dev else "")
        + (f" / {t['peak_memory_bytes'] / 2**30:.1f}" if t else " / —")
        + f" | {step:.4f} | {pct(errors[0])} | {pct(errors[1])} |")
text = "\n".join(rows)
print(text)
with open(table_path, "w") as f:
    f.write(text + "\n")
PY
# Everything else in one archive (the device tool brings back files at most two folders down);
# traces stay behind.
tar czf "$OUT_DIR/work.tgz" --exclude='trace*.json' -C "$OUT_DIR" work && rm -rf "$WORK"
[ "$GPU_TESTS" = ok ]
