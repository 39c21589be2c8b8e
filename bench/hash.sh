#!/usr/bin/env bash
# SHA-256 throughput of program and checkpoint hashing (issue 18: >= 1 GB/s on this machine).
# BUILD=DIR picks the build directory (default build/).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
[ -x "$build/bench/stepcast_sha256_rate" ] || bash scripts/build.sh >/dev/null
"$build/bench/stepcast_sha256_rate"
