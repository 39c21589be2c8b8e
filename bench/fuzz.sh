#!/usr/bin/env bash
# The long fuzzing run: every loader's libFuzzer target for SECONDS each (default 300), two at a
# time, continuing the work corpora in build-fuzz/corpus-work/; prints scripts/fuzz.sh's table
# (executions, exec/s, cov/ft coverage, corpus, crash files). 13 targets × 300 s / 2 ≈ 33 min.
#
#   bash bench/fuzz.sh [SECONDS] [TARGET ...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-300}
[ $# -gt 0 ] && shift
exec bash scripts/fuzz.sh --seconds "$seconds" "$@"
