#!/usr/bin/env bash
# small-gpt's forward GEMMs back to back (as `stepcast profile` times them) against after a read of
# 64 MiB and of 1 GiB (bench/gemm_reuse.cpp): whether a step's GEMMs, whose operands the step's
# other work has pushed out of the core's caches, run at the profile's rate. One core, one BLAS
# thread. BUILD=DIR picks the build directory (default build/).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
[ -x "$build/bench/stepcast_gemm_reuse" ] || bash scripts/build.sh >/dev/null
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-); caches: $(lscpu | grep -E '^L(2|3)' | tr -s ' ' | tr '\n' ';')"
OPENBLAS_NUM_THREADS=1 taskset -c 0 "$build/bench/stepcast_gemm_reuse"
