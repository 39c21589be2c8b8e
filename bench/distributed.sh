#!/usr/bin/env bash
# A planner study in one process against the same study spread over `mpirun -np 2` (README
# "Running a study across a cluster"): `stepcast plan` on GPT-3 13B over 8 DGX A100 nodes (64
# GPUs, global batch 512), the best BENCH_DIST_EVALUATE (default 12) plans re-simulated with
# `--sim-mode` BENCH_DIST_SIM_MODE (default fast: about half a second each here; approx, which
# folds the data-parallel copies, makes the whole study about 1.5 s, too short to spread). Three
# runs: one process with --jobs 2 (two simulations at once), `scripts/mpirun -np 2` with --jobs 1
# (one per rank: the same two at once, so the ratio is the spread's overhead) and with --jobs 2
# (four at once). Prints each wall, the ratios to the single process, and whether plans.json
# (wall times aside) is the single process's. On one machine two ranks share its cores: the
# speedup a cluster gives comes from nodes' cores this machine does not have.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/stepcast ] || bash scripts/build.sh >/dev/null
bin=${STEPCAST:-build/stepcast}
evaluate=${BENCH_DIST_EVALUATE:-12}
sim_mode=${BENCH_DIST_SIM_MODE:-fast}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
study=(plan --model models/gpt3-13b.json --topology topologies/dgx-a100-80gb.json --nodes 8
       --global-batch-size 512 --evaluate "$evaluate" --top 5 --sim-mode "$sim_mode")
run() {
  local label=$1
  shift
  local start end
  start=$(date +%s.%N)
  "$@" --out "$out/$label" >"$out/$label.log" 2>&1 || { cat "$out/$label.log"; exit 1; }
  end=$(date +%s.%N)
  echo "$end - $start" | bc -l >"$out/$label.wall"
  printf '%-34s wall %7.1f s\n' "$label" "$(cat "$out/$label.wall")"
}
# plans.json without the wall-time keys, for the comparison.
figures() { python3 -c 'import json,sys
def strip(j):
    if isinstance(j, dict): return {k: strip(v) for k, v in j.items() if not k.endswith("wall_s")}
    if isinstance(j, list): return [strip(v) for v in j]
    return j
print(json.dumps(strip(json.load(open(sys.argv[1]))), sort_keys=True))' "$1"; }
run "one process, --jobs 2" "$bin" "${study[@]}" --jobs 2
run "mpirun -np 2, --jobs 1 per rank" scripts/mpirun -np 2 "$bin" "${study[@]}" --jobs 1
run "mpirun -np 2, --jobs 2 per rank" scripts/mpirun -np 2 "$bin" "${study[@]}" --jobs 2
one=$(cat "$out/one process, --jobs 2.wall")
for label in "mpirun -np 2, --jobs 1 per rank" "mpirun -np 2, --jobs 2 per rank"; do
  same=no
  [ "$(figures "$out/one process, --jobs 2/plans.json")" = "$(figures "$out/$label/plans.json")" ] && same=yes
  printf '%-34s %.2f× the single process'"'"'s wall; plans.json the same: %s\n' "$label" \
    "$(echo "$(cat "$out/$label.wall") / $one" | bc -l)" "$same"
done
grep -E "re-simulated in" "$out/one process, --jobs 2.log" | sed 's/^/one process: /'
