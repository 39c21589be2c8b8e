#!/usr/bin/env bash
# Supervises a `stepcast run` job: when it fails (a rank died, a node went away: mpirun ends the
# job), it starts it again from the last complete checkpoint (run --resume), until the run ends
# or --max-restarts restarts have been spent. Bad input (exit 2) is not retried: it would fail
# again. The job's own command line is given after `--` and must write checkpoints
# (--checkpoint-dir DIR --checkpoint-every K); its --steps is the step to stop after, so every
# attempt ends at the same step.
#
#   scripts/train-with-restarts.sh [--max-restarts N] [--log FILE] -- \
#       scripts/mpirun -np 2 build/stepcast run --model M --plan P --steps 100 \
#       --checkpoint-dir ck --checkpoint-every 10
#
# --log FILE gets one JSON line per attempt: {"attempt", "resumed_from_step", "start_s",
# "end_s", "exit_code"} (seconds since the epoch), the record `stepcast goodput
# --failure-at-steps` predicts (README: checked on real runs).
set -uo pipefail

max_restarts=10
log=/dev/null
while [[ $# -gt 0 && $1 != -- ]]; do
  case $1 in
    --max-restarts) max_restarts=${2:?--max-restarts needs a number}; shift 2 ;;
    --log) log=${2:?--log needs a file}; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "train-with-restarts.sh: unknown option '$1'; valid: --max-restarts N, --log FILE, then -- COMMAND" >&2; exit 2 ;;
  esac
done
if [[ $# -lt 2 || $1 != -- ]]; then
  echo "train-with-restarts.sh: no command: give it after -- (see --help)" >&2
  exit 2
fi
shift
if ! [[ $max_restarts =~ ^[0-9]+$ ]]; then
  echo "train-with-restarts.sh: --max-restarts '$max_restarts': valid: a count >= 0" >&2
  exit 2
fi
command=("$@")
checkpoint_dir=
for ((i = 0; i < ${#command[@]}; ++i)); do
  case ${command[i]} in
    --checkpoint-dir) checkpoint_dir=${command[i + 1]:-} ;;
    --checkpoint-dir=*) checkpoint_dir=${command[i]#--checkpoint-dir=} ;;
    --resume|--resume=*) echo "train-with-restarts.sh: the command has --resume: the supervisor adds it" >&2; exit 2 ;;
  esac
done
if [[ -z $checkpoint_dir ]]; then
  echo "train-with-restarts.sh: the command has no --checkpoint-dir DIR: nothing to restart from" >&2
  exit 2
fi
: >"$log" 2>/dev/null || { echo "train-with-restarts.sh: --log $log: cannot write it" >&2; exit 2; }

restarts=0
attempt=1
while :; do
  resume=()
  resumed_from=0
  if [[ -f $checkpoint_dir/latest ]]; then
    # `latest` reads "step-NNNNNNNN SHA256"; run verifies it, this only reports the step.
    step_dir=$(cut -d' ' -f1 "$checkpoint_dir/latest")
    resumed_from=$((10#${step_dir#step-}))
    resume=(--resume "$checkpoint_dir")
  fi
  start=$(date +%s.%N)
  "${command[@]}" "${resume[@]}"
  code=$?
  end=$(date +%s.%N)
  printf '{"attempt": %d, "resumed_from_step": %d, "start_s": %s, "end_s": %s, "exit_code": %d}\n' \
    "$attempt" "$resumed_from" "$start" "$end" "$code" >>"$log"
  if [[ $code -eq 0 ]]; then
    echo "train-with-restarts.sh: done after $restarts restart(s)" >&2
    exit 0
  fi
  if [[ $code -eq 2 ]]; then
    echo "train-with-restarts.sh: the job refused its input (exit 2): not restarting" >&2
    exit 2
  fi
  if [[ $restarts -ge $max_restarts ]]; then
    echo "train-with-restarts.sh: the job failed (exit $code) and $restarts restart(s) are spent: giving up" >&2
    exit "$code"
  fi
  restarts=$((restarts + 1))
  attempt=$((attempt + 1))
  echo "train-with-restarts.sh: the job failed (exit $code); restart $restarts of at most $max_restarts" >&2
done
