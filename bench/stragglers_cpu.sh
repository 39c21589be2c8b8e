#!/usr/bin/env bash
# A straggler on the CPU executor against simulate (issue 16): the tiny GPT, dp 2 (one rank per
# core), rank 1's compute stretched by FACTOR (`run --slowdown 1:FACTOR`) against `simulate` with
# device 1 at compute_speed_factor 1/FACTOR on localhost-cpu, costed by this machine's quick
# profile. Prints, per factor, the measured step (median of REPEATS runs) and the predicted one,
# each as a ratio to the uniform step (load and profile bias cancel in ratios), and their error.
# Then unequal replicas (plan microbatches_per_replica): with rank 1 at 2x, 3 and 1 microbatches
# against 2 and 2, measured and predicted, as the ratio balanced / even.
# Figures are printed, not asserted. About a minute and a half on an idle 2-core machine.
# BUILD=DIR picks the build directory (default build/); REPEATS=N runs per point (default 3);
# FACTORS="1.5 2 3" the factors.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
repeats=${REPEATS:-3}
factors=${FACTORS:-"1.5 2 3"}
[ -x "$build/stepcast" ] || BUILD_DIR=$build bash scripts/build.sh >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
model=models/tiny-gpt.json
cat >"$out/plan.json" <<'JSON'
{"name": "dp2", "dp_size": 2, "micro_batch_size": 2, "global_batch_size": 8, "dtype": "fp32", "dropout": 0.0}
JSON
scripts/mpirun -np 2 "$build/stepcast" profile --backend cpu --quick --out "$out/profile.json" >/dev/null

cat >"$out/balanced.json" <<'JSON'
{"name": "dp2-3-1", "dp_size": 2, "micro_batch_size": 2, "microbatches_per_replica": [3, 1], "dtype": "fp32", "dropout": 0.0}
JSON

# measured [FACTOR [PLAN]]: the median step time of $repeats runs.
measured() {
  local extra=${1:+--slowdown 1:$1}
  local plan=${2:-$out/plan.json}
  for _ in $(seq "$repeats"); do
    scripts/mpirun -np 2 "$build/stepcast" run --model $model --plan "$plan" --steps 8 --quiet \
      --out "$out/run" $extra >/dev/null
    python3 -c "import json; print(json.load(open('$out/run/measurement.json'))['step_time_s'])"
  done | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}
# predicted FACTOR [PLAN]: "step uniform" from one simulate on the topology with device 1 slowed.
predicted() {
  local plan=${2:-$out/plan.json}
  python3 - "$1" "$out" <<'PY'
import json, sys
t = json.load(open("topologies/localhost-cpu.json"))
t["heterogeneity"] = {"devices": [{"device": 1, "compute_speed_factor": 1 / float(sys.argv[1])}]}
json.dump(t, open(sys.argv[2] + "/topology.json", "w"))
PY
  "$build/stepcast" simulate --model $model --topology "$out/topology.json" --plan "$plan" \
    --profile "$out/profile.json" --no-scaling --no-records --out "$out/sim" >/dev/null 2>&1
  python3 -c "import json; p = json.load(open('$out/sim/prediction.json')); print(p['step_time_s'], p['heterogeneity']['uniform_step_time_s'])"
}

uniform=$(measured "")
printf '%-8s %14s %14s %14s %14s %8s\n' factor measured_s predicted_s measured_ratio predicted_ratio error
for f in $factors; do
  m=$(measured "$f")
  read -r p pu <<<"$(predicted "$f")"
  python3 -c "
m, u, p, pu = $m, $uniform, $p, $pu
print('%-8s %14.5f %14.5f %14.3f %14.3f %+7.1f%%' % ('$f', m, p, m / u, p / pu, 100 * ((p / pu) / (m / u) - 1)))"
done
echo "uniform step: measured $uniform s"

# Unequal replicas with rank 1 at 2x: 3 and 1 microbatches against 2 and 2.
m_even=$(measured 2)
m_balanced=$(measured 2 "$out/balanced.json")
read -r p_even _ <<<"$(predicted 2)"
read -r p_balanced _ <<<"$(predicted 2 "$out/balanced.json")"
python3 -c "
me, mb, pe, pb = $m_even, $m_balanced, $p_even, $p_balanced
print('rank 1 at 2x, microbatches 3,1 against 2,2: measured %.5f / %.5f s = %.3f, predicted %.5f / %.5f s = %.3f (%+.1f%%)'
      % (mb, me, mb / me, pb, pe, pb / pe, 100 * ((pb / pe) / (mb / me) - 1)))"
