#!/usr/bin/env bash
# `stepcast plan` on the issue's headline searches: GPT-3 175B on 1,024 A100 (global batch 1536;
# issue 17's target: at most 10 s on a 2-core machine with the default re-simulations; 43 s at
# e2a8976) and Llama-3 405B on 16,384 H100 (global batch 2048, sequence 8192; at most 20 s), each
# as the search alone (--evaluate 0: enumerate, memory
# verdicts, quick estimate) and with the default re-simulation of the best (2·top = 10 plans,
# `simulate --mode approx` in child processes, two at a time). Prints wall time, peak memory, the
# candidate counts and the top plans. Limits are printed, not asserted: the cores are shared.
# BENCH_PLAN_EVALUATE overrides the number of re-simulated plans in the second run of each case.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/stepcast ] || bash scripts/build.sh >/dev/null
command -v /usr/bin/time >/dev/null || { echo "needs /usr/bin/time: bash scripts/install-deps.sh"; exit 1; }
bin=${STEPCAST:-build/stepcast}
evaluate=${BENCH_PLAN_EVALUATE:-10}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
run() {
  local label=$1 limit=$2
  shift 2
  /usr/bin/time -f "%e %M" -o "$out/time" "$bin" plan "$@" --out "$out/$label" >"$out/$label.log" 2>"$out/$label.err" ||
    { cat "$out/$label.err"; exit 1; }
  read -r wall rss_kb <"$out/time"
  echo "== $label: wall $wall s (limit $limit s), peak $((rss_kb / 1024)) MB"
  grep -E "candidates, |plans fit|^memory:|^searched|Spearman" "$out/$label.log" | sed 's/^/   /'
  sed -n '/^plan  /,/^searched/p' "$out/$label.log" | grep -v '^searched' | sed 's/^/   /'
}
# GPT-3 as Megatron-LM trained it in 2021 (SC'21): materialized attention, dropout 0.1.
gpt3=(--model models/gpt3-175b.json --topology topologies/dgx-a100-80gb.json --global-batch-size 1536
      --attention materialized --dropout 0.1)
llama=(--model models/llama3-405b.json --topology topologies/dgx-h100.json --global-batch-size 2048)
run gpt3-175b-a100-1024-search 10 "${gpt3[@]}" --evaluate 0
run gpt3-175b-a100-1024-evaluate-$evaluate 10 "${gpt3[@]}" --evaluate "$evaluate"
# Llama 3 trains with flash attention and no dropout (examples/llama3-405b-h100-16384.json: the
# search's defaults for it); materialized attention with dropout 0.1 is searched too, for comparison.
run llama3-405b-h100-16384-search 20 "${llama[@]}" --attention flash --dropout 0 --evaluate 0
run llama3-405b-h100-16384-evaluate-$evaluate 20 "${llama[@]}" --attention flash --dropout 0 --evaluate "$evaluate"
run llama3-405b-h100-16384-materialized-search 20 "${llama[@]}" --attention materialized --dropout 0.1 --evaluate 0
