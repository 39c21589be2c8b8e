#!/usr/bin/env bash
# Parameter servers on the CPU executor against simulate (issue 16): the tiny GPT in fp32,
# costed by this machine's quick profile. First one worker and one server (two processes on the
# two cores): the measured step (one global batch at the workers' throughput, median of REPEATS
# runs) against the predicted one, beside the same worker training alone synchronously. Then two
# workers and one server (three processes on two cores: oversubscribed, so the absolute times are
# noise; the staleness and the loss are not) with worker 1 slowed 3x, under staleness 1 and 8:
# the workers' steps, measured and predicted, and the staleness the servers saw. Figures are
# printed, not asserted. About a minute on an idle 2-core machine.
# BUILD=DIR picks the build directory (default build/); REPEATS=N runs per point (default 3).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
repeats=${REPEATS:-3}
[ -x "$build/stepcast" ] || BUILD_DIR=$build bash scripts/build.sh >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
model=models/tiny-gpt.json
# One node of four CPU "devices": the workers and the server share memory, as the processes do.
python3 - "$out/node.json" <<'PY'
import json, sys
t = json.load(open("topologies/localhost-cpu.json"))
t["num_nodes"] = 1
t["node"]["devices_per_node"] = 4
json.dump(t, open(sys.argv[1], "w"))
PY
topology=$out/node.json
scripts/mpirun -np 2 "$build/stepcast" profile --backend cpu --quick --out "$out/profile.json" >/dev/null

# plan NAME WORKERS SERVERS STALENESS: writes $out/NAME.json (no servers: synchronous).
plan() {
  python3 - "$out/$1.json" "$2" "$3" "$4" <<'PY'
import json, sys
path, workers, servers, staleness = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
p = {"name": path, "dp_size": workers, "micro_batch_size": 2, "global_batch_size": 4 * workers, "dtype": "fp32",
     "dropout": 0.0}
if servers:
    p.update({"data_parallel_mode": "async", "staleness": staleness, "parameter_servers": servers})
json.dump(p, open(path, "w"))
PY
}
# measured NAME RANKS [EXTRA...]: "step staleness_mean worker_steps..." (median step of $repeats runs).
measured() {
  local name=$1 ranks=$2
  shift 2
  for _ in $(seq "$repeats"); do
    scripts/mpirun -np "$ranks" "$build/stepcast" run --model $model --topology "$topology" \
      --plan "$out/$name.json" --steps 40 --quiet --out "$out/run" "$@" >/dev/null
    python3 -c "
import json; m = json.load(open('$out/run/measurement.json')); ps = m.get('parameter_servers', {})
print(m['step_time_s'], ps.get('staleness_updates_mean', 0), *ps.get('worker_step_s', []))"
  done | sort -g | awk '{a[NR]=$0} END {print a[int((NR+1)/2)]}'
}
# predicted NAME [SPEED_OF_1]: "step staleness_mean worker_steps...".
predicted() {
  python3 - "$out/topology.json" "${2:-1}" <<'PY'
import json, sys
t = json.load(open(sys.argv[1].replace("topology.json", "node.json")))
if float(sys.argv[2]) != 1:
    t["heterogeneity"] = {"devices": [{"device": 1, "compute_speed_factor": float(sys.argv[2])}]}
json.dump(t, open(sys.argv[1], "w"))
PY
  "$build/stepcast" simulate --model $model --topology "$out/topology.json" --plan "$out/$1.json" \
    --profile "$out/profile.json" --no-scaling --no-records --out "$out/sim" >/dev/null 2>&1
  python3 -c "
import json; p = json.load(open('$out/sim/prediction.json')); ps = p.get('async', {}).get('parameter_servers', {})
print(p['step_time_s'], ps.get('staleness_updates_mean', 0), *ps.get('worker_step_s', []))"
}
row() {
  python3 -c "
m, p = '$2'.split(), '$3'.split()
print('%-34s %11.5f %11.5f %+7.1f%%   staleness %5.2f / %5.2f   workers %s / %s' % ('$1', float(m[0]), float(p[0]),
      100 * (float(p[0]) / float(m[0]) - 1), float(m[1]), float(p[1]),
      ','.join('%.4f' % float(x) for x in m[2:]) or '-', ','.join('%.4f' % float(x) for x in p[2:]) or '-'))"
}
printf '%-34s %11s %11s %8s\n' point measured_s predicted_s error
plan sync1 1 0 0
plan ps11 1 1 1
row "1 worker, synchronous" "$(measured sync1 1)" "$(predicted sync1)"
row "1 worker + 1 server" "$(measured ps11 2)" "$(predicted ps11)"
plan ps21s1 2 1 1
plan ps21s8 2 1 8
row "2 workers + 1 server, s 1, w1 3x" "$(measured ps21s1 3 --slowdown 1:3)" "$(predicted ps21s1 0.3333333333)"
row "2 workers + 1 server, s 8, w1 3x" "$(measured ps21s8 3 --slowdown 1:3)" "$(predicted ps21s8 0.3333333333)"
