#!/usr/bin/env bash
# The CPU kernels' RMSNorm right after a BLAS GEMM against back to back (bench/after_gemm.cpp),
# with OpenBLAS's own kernels for this CPU and with its AVX2 ones (OPENBLAS_CORETYPE=Haswell):
# the evidence behind the profiler timing memory-bound and attention kernels after a GEMM.
# One core, one BLAS thread. BUILD=DIR picks the build directory (default build/).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
[ -x "$build/bench/stepcast_after_gemm" ] || bash scripts/build.sh >/dev/null
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), family $(grep -m1 'cpu family' /proc/cpuinfo |
  cut -d: -f2 | tr -d ' ') model $(grep -m1 '^model\s*:' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')"
native=$(OPENBLAS_VERBOSE=2 OPENBLAS_NUM_THREADS=1 taskset -c 0 "$build/bench/stepcast_after_gemm" 2>&1)
echo "== OpenBLAS's kernels for this CPU ($(grep -o 'Core: .*' <<<"$native" | head -1))"
grep -v 'Core: ' <<<"$native"
echo "== OpenBLAS's AVX2 kernels (OPENBLAS_CORETYPE=Haswell)"
OPENBLAS_CORETYPE=Haswell OPENBLAS_NUM_THREADS=1 taskset -c 0 "$build/bench/stepcast_after_gemm"
