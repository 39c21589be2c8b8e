#!/usr/bin/env bash
# The CPU kernels' GeLU on the profiler's values and on a step's activations (normal, sd 0.1-3),
# beside GeLU on libm's tanh: the kernel's time should not depend on the values.
# BUILD=DIR picks the build directory (default build/).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
[ -x "$build/bench/stepcast_gelu_values" ] || bash scripts/build.sh >/dev/null
"$build/bench/stepcast_gelu_values"
