#!/usr/bin/env bash
# The main job (README): installs what is missing, builds, then runs stepcast on the shipped
# default — the tiny model under plans/tiny-cpu.json on this machine (topologies/localhost-cpu.json):
# its memory per rank and its StepProgram. Outputs go to out/main/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
model=plans/models/tiny.json
topology=topologies/localhost-cpu.json
plan=plans/tiny-cpu.json
out=out/main
echo
echo "== memory =="
build/stepcast memory --model "$model" --topology "$topology" --plan "$plan" --out "$out"
echo
echo "== lower =="
build/stepcast lower --model "$model" --topology "$topology" --plan "$plan" --out "$out"
echo
echo "outputs: $out/memory.json $out/program.json"
