#!/usr/bin/env bash
# Goodput on a real run: the measured wall time of a CPU job whose ranks are killed at chosen
# steps and restarted by scripts/train-with-restarts.sh, against `stepcast goodput
# --failure-at-steps` for the same failures. The prediction's inputs are measured on this machine
# first, without failures: the step time (run's median), the time to start a job and load its
# checkpoint (a resumed 1-step run), a failure's cost beyond the lost work (a job whose rank dies
# as it begins: start, the death noticed, the job ended), and the checkpoint write time (the
# uninterrupted run's wall time beyond its start and its steps, per checkpoint). Prints one table; timings are noisy on a
# shared machine, so it is a benchmark, not a test (tests/exec/test_train_restarts.cpp checks
# the weights and the steps).
#   bench/goodput_restarts.sh [STEPS=40] [EVERY=5] [FAILURES=12,27]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
steps=${1:-40}
every=${2:-5}
failures=${3:-12,27}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/plan.json" <<'EOF'
{"name": "bench-restarts", "tp_size": 1, "pp_size": 2, "dp_size": 1, "zero_stage": 0, "schedule": "1f1b",
 "recompute": "none", "sequence_parallel": false, "attention_impl": "materialized", "micro_batch_size": 1,
 "global_batch_size": 8, "dtype": "fp32", "dropout": 0.0}
EOF
run() {  # run DIR EXTRA...: the job's command line
  local dir=$1; shift
  echo scripts/mpirun -np 2 "$build/stepcast" run --model models/tiny.json --plan "$work/plan.json" \
    --topology topologies/localhost-cpu.json --checkpoint-dir "$dir" "$@"
}
now() { date +%s.%N; }

# 1. Without failures: step time and the wall time of the whole job.
t0=$(now)
$(run "$work/clean" --steps "$steps" --checkpoint-every "$every" --quiet --out "$work/clean-out") >/dev/null
t1=$(now)
step_s=$(python3 -c "import json; print(json.load(open('$work/clean-out/measurement.json'))['step_time_s'])")
# 2. A job started from a checkpoint that runs one step: start-up and reload; and 3. a job whose
#    rank dies as its first step begins: start-up, then the launcher noticing the death and
#    ending the job (what a failure costs beyond the lost work, with the relaunch). Three of
#    each, the median: start-up is the noisiest figure on a shared machine.
$(run "$work/one" --steps "$every" --checkpoint-every "$every" --quiet) >/dev/null
starts=() deaths=()
for _ in 1 2 3; do
  t2=$(now)
  $(run "$work/one-more" --steps $((every + 1)) --resume "$work/one" --quiet) >/dev/null
  t3=$(now)
  rm -rf "$work/dead"
  STEPCAST_TEST_DIE=1:0 $(run "$work/dead" --steps "$every" --quiet | sed "s|$build/stepcast|$build/stepcast-with-faults|") \
    >/dev/null 2>&1 || true
  t4=$(now)
  starts+=("$(python3 -c "print($t3 - $t2 - $step_s)")") deaths+=("$(python3 -c "print($t4 - $t3)")")
done
python3 - "$t0" "$t1" "$step_s" "$steps" "$every" "${starts[*]}" "${deaths[*]}" >"$work/figures" <<'EOF'
import sys, math, statistics
t0, t1, step, steps, every = map(float, sys.argv[1:6])
start = statistics.median(map(float, sys.argv[6].split()))    # launch, MPI, lowering, reading the checkpoint
failure = statistics.median(map(float, sys.argv[7].split()))  # a start, the death noticed, the job ended
checkpoints = math.ceil(steps / every)
write = max(1e-6, ((t1 - t0) - start - steps * step) / checkpoints)
print(start, failure, write, t1 - t0)
EOF
read -r start_s failure_s write_s clean_s <"$work/figures"
# 4. The supervised job with failures.
mkdir -p "$work/marks"
t6=$(now)
STEPCAST_TEST_DIE=$(echo "$failures" | sed "s/[0-9][0-9]*/1:&/g") STEPCAST_TEST_DIE_ONCE_DIR="$work/marks" \
  scripts/train-with-restarts.sh --log "$work/attempts.jsonl" -- \
  $(run "$work/failed" --steps "$steps" --checkpoint-every "$every" --quiet | sed "s|$build/stepcast|$build/stepcast-with-faults|") \
  >/dev/null 2>&1
t7=$(now)
# 5. goodput for the same failures, from the figures measured above: the checkpoint's write time
#    becomes a storage bandwidth (its bytes over the measured seconds).
tokens=$((steps * 8 * 64))
"$build/stepcast" goodput --model models/tiny.json --plan "$work/plan.json" --topology topologies/localhost-cpu.json \
  --tokens "$tokens" --job-mtbf-hours 1000 --step-time-s "$step_s" --storage-gbps 1 --restart-s 0 \
  --checkpoint-every "$every" --out "$work/g0" >/dev/null
gbps=$(python3 -c "import json; c=json.load(open('$work/g0/goodput.json'))['checkpoint']; print(c['node_bytes_max']/$write_s/1e9)")
reload_s=$(python3 -c "import json; c=json.load(open('$work/g0/goodput.json'))['checkpoint']; print(c['node_bytes_max']/($gbps*1e9))")
"$build/stepcast" goodput --model models/tiny.json --plan "$work/plan.json" --topology topologies/localhost-cpu.json \
  --tokens "$tokens" --job-mtbf-hours 1000 --step-time-s "$step_s" --storage-gbps "$gbps" \
  --restart-s "$(python3 -c "print(max(0.0, $failure_s - $reload_s))")" --checkpoint-every "$every" \
  --failure-at-steps "$failures" --out "$work/g" >/dev/null
python3 - "$work/g/goodput.json" "$work/attempts.jsonl" "$t6" "$t7" "$start_s" "$failure_s" "$clean_s" <<'EOF'
import json, sys
g = json.load(open(sys.argv[1]))
attempts = [json.loads(l) for l in open(sys.argv[2])]
t6, t7, start, failure, clean = map(float, sys.argv[3:])
s = g["scripted"]
# goodput's time starts with the job running: the first launch is added to it.
predicted = s["time"]["time_to_train_s"] + start
measured = t7 - t6
print(f"steps {g['steps']}, checkpoint every {g['interval']['chosen_steps']}, failures at steps {s['failure_at_steps']}")
print(f"step {g['step_time_s']:.4f} s, start {start:.3f} s, a failure (noticed, job ended, relaunched) {failure:.3f} s, checkpoint write "
      f"{g['checkpoint']['write_s']:.4f} s (measured without failures; that run took {clean:.2f} s)")
print(f"resumed from  predicted {s['resumed_from_steps']}  measured {[a['resumed_from_step'] for a in attempts[1:]]}")
print(f"wall time     predicted {predicted:.2f} s  measured {measured:.2f} s  error {100 * (predicted / measured - 1):+.1f}%")
print(f"  parts (predicted): compute {s['time']['compute_s']:.2f}, checkpoints {s['time']['checkpoint_s']:.2f}, "
      f"lost work {s['time']['lost_work_s']:.2f}, restarts {s['time']['restart_reload_s']:.2f} + first launch {start:.2f}")
EOF
