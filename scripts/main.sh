#!/usr/bin/env bash
# The main job (README): installs what is missing, builds, then runs stepcast on the shipped
# default — the tiny model under plans/tiny-cpu.json on this machine (topologies/localhost-cpu.json):
# memory, lowering, the simulator's prediction, the real run on the CPU under MPI, and the
# prediction next to the measurement. Outputs go to out/main/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
model=plans/models/tiny.json
topology=topologies/localhost-cpu.json
plan=plans/tiny-cpu.json
out=out/main
ranks=2
echo
echo "== memory =="
build/stepcast memory --model "$model" --topology "$topology" --plan "$plan" --out "$out"
echo
echo "== lower =="
build/stepcast lower --model "$model" --topology "$topology" --plan "$plan" --out "$out" --check
echo
echo "== simulate =="
build/stepcast simulate --model "$model" --topology "$topology" --plan "$plan" --out "$out"
echo
echo "== run (CPU, $ranks MPI ranks) =="
scripts/mpirun -np "$ranks" --bind-to core build/stepcast run --model "$model" \
  --topology "$topology" --plan "$plan" --steps 20 --out "$out"
echo
echo "== predicted against measured =="
num() { grep -o "\"$2\":[-0-9.e+]*" "$1" | head -1 | cut -d: -f2; }
predicted=$(num "$out/prediction.json" step_time_s)
measured=$(num "$out/measurement.json" step_time_s)
predicted_mem=$(num "$out/prediction.json" peak_bytes_max)
runtime_mem=$(num "$out/prediction.json" memory_runtime_bytes)
measured_mem=$(num "$out/measurement.json" measured_peak_bytes_max)
awk -v p="$predicted" -v m="$measured" -v pm="$predicted_mem" -v rm="$runtime_mem" -v mm="$measured_mem" 'BEGIN {
  printf "step time   predicted %.6f s   measured %.6f s   error %+.1f%%\n", p, m, 100 * (p - m) / m
  printf "peak memory predicted %.2f MiB (program buffers; + %.0f MiB runtime allowance)   measured %.2f MiB (high-water mark above the level before the arena)\n", (pm - rm) / 1048576, rm / 1048576, mm / 1048576
}'
echo "(the prediction uses the roofline on the topology's datasheet peaks; \`stepcast profile\` will calibrate it: issue 5)"
echo "outputs: $out/"
