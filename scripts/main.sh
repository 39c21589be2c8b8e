#!/usr/bin/env bash
# The main job (README): installs what is missing, builds, then closes the loop on the shipped
# default — the tiny model on this machine's two cores (topologies/localhost-cpu.json): the
# planner's best plan (or examples/tiny-cpu.json when that one cannot run on the CPU backend), a quick
# profile of this machine, memory and lowering, the simulator's prediction with that profile, the
# real run on the CPU under MPI, and compare: predicted against measured. Outputs go to out/main/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
stepcast=${BUILD_DIR:-build}/stepcast
model=models/tiny.json
topology=topologies/localhost-cpu.json
out=out/main
ranks=2
batch=32
mkdir -p "$out"
start=$SECONDS
echo
echo "== plan (global batch $batch on $ranks cores) =="
rm -rf "$out/plans"
"$stepcast" plan --model "$model" --topology "$topology" --global-batch-size "$batch" --top 3 \
  --out "$out/plans"
top=$(ls "$out"/plans/01-*.json | grep -v '\.deepspeed\.json$')  # not its DeepSpeed config
# The planner ranks every plan the model admits; the CPU backend runs fp32/fp64 only and refuses
# sequence_parallel with ZeRO 2/3. One short run says whether the top plan runs here.
if scripts/mpirun -np "$ranks" "$stepcast" run --model "$model" --topology "$topology" \
     --plan "$top" --steps 1 --quiet >"$out/plan-check.log" 2>&1; then
  plan=$top
  echo "using the planner's top plan: $plan"
else
  plan=examples/tiny-cpu.json
  echo "the planner's top plan $top does not run on the CPU backend:"
  grep -m1 -i error "$out/plan-check.log" || tail -1 "$out/plan-check.log"
  echo "using the shipped default instead: $plan"
fi
echo
echo "== profile (quick: 3 points per axis, both cores busy) =="
scripts/mpirun -np "$ranks" --bind-to core "$stepcast" profile --backend cpu --quick \
  --out "$out/profile.json"
echo
echo "== memory =="
"$stepcast" memory --model "$model" --topology "$topology" --plan "$plan" --out "$out"
echo
echo "== lower =="
"$stepcast" lower --model "$model" --topology "$topology" --plan "$plan" --out "$out" --check
echo
echo "== simulate (with the profile) =="
"$stepcast" simulate --model "$model" --topology "$topology" --plan "$plan" \
  --profile "$out/profile.json" --out "$out"
echo
echo "== run (CPU, $ranks MPI ranks, one per core) =="
scripts/mpirun -np "$ranks" --bind-to core "$stepcast" run --model "$model" \
  --topology "$topology" --plan "$plan" --steps 20 --out "$out"
echo
echo "== compare =="
"$stepcast" compare "$out/prediction.json" "$out/measurement.json" --out "$out" >"$out/compare.txt"
sed -n '/^Step time/,/^Memory/p' "$out/compare.txt" | sed '$d'
echo
echo "== predicted against measured =="
num() { grep -o "\"$2\":[-0-9.e+]*" "$1" | head -1 | cut -d: -f2; }
predicted=$(num "$out/prediction.json" step_time_s)
measured=$(num "$out/measurement.json" step_time_s)
predicted_mem=$(num "$out/prediction.json" peak_bytes_max)
runtime_mem=$(num "$out/prediction.json" memory_runtime_bytes)
measured_mem=$(num "$out/measurement.json" measured_peak_bytes_max)
echo "plan $plan, profile $out/profile.json"
awk -v p="$predicted" -v m="$measured" -v pm="$predicted_mem" -v rm="$runtime_mem" -v mm="$measured_mem" 'BEGIN {
  printf "step time   predicted %.6f s   measured %.6f s   error %+.1f%%\n", p, m, 100 * (p - m) / m
  printf "peak memory predicted %.2f MiB (program buffers; + %.0f MiB runtime allowance)   measured %.2f MiB (anonymous pages the steps added above the level before the arena)   error %+.1f%%\n", (pm - rm) / 1048576, rm / 1048576, mm / 1048576, 100 * ((pm - rm) - mm) / mm
}'
echo "outputs: $out/ (compare.md: the whole comparison); the loop took $((SECONDS - start)) s"
