#!/usr/bin/env bash
# Wall time and peak memory of `stepcast simulate --mode fast` on the two headline plans (issue:
# GPT-3 175B on 1,024 A100 within 10 s and 2 GB, Llama-3 405B on 16,384 H100 within 30 s, on a
# 2-core machine), the predictions themselves, and how wall time grows with the device count when
# only dp_size grows (GPT-3 175B's tp 8 × pp 8 replica, 16 microbatches per dp rank, 64 to 16,384
# devices). Limits are printed next to the figures, not asserted. About 1 minute on 2 cores.
# BUILD=DIR picks the build directory (default build/).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
[ -x "$build/stepcast" ] || bash scripts/build.sh >/dev/null
command -v /usr/bin/time >/dev/null || { echo "needs /usr/bin/time: bash scripts/install-deps.sh"; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# simulate LABEL ARGS...: runs fast mode; leaves the log in $out/LABEL.log and "wall_s peak_kB"
# in $out/LABEL.time.
simulate() {
  local label=$1
  shift
  /usr/bin/time -f "%e %M" -o "$out/$label.time" "$build/stepcast" simulate --mode fast "$@" \
    >"$out/$label.log" 2>&1 || { cat "$out/$label.log"; exit 1; }
}
# field LABEL: activities from the "simulated N ranks, A activities in W s" line.
activities() { awk '/^simulated / { print $4 }' "$out/$1.log"; }

headline() {
  local label=$1 wall_limit=$2 mb_limit=$3
  shift 3
  simulate "$label" "$@" --no-scaling
  local wall kb
  read -r wall kb <"$out/$label.time"
  printf "%-24s %8s %8s %10s %8d %9s %11s\n" "$label" "$wall" "$wall_limit" "$(activities "$label")" \
    $((kb / 1024)) "$mb_limit" "$(awk '/^simulated / { print $2 }' "$out/$label.log")"
}

echo "== fast mode on the headline plans (--no-scaling)"
printf "%-24s %8s %8s %10s %8s %9s %11s\n" case wall_s limit_s activities peak_MB limit_MB sim_ranks
headline gpt3-175b-a100-1024 10 2048 --model models/gpt3-175b.json \
  --topology topologies/dgx-a100-80gb.json --plan examples/gpt3-175b-a100-1024.json \
  --profile profiles/a100-sxm4-80gb.json
headline llama3-405b-h100-16384 30 - --model models/llama3-405b.json \
  --topology topologies/dgx-h100.json --plan examples/llama3-405b-h100-16384.json \
  --profile profiles/h100-sxm.json

echo
echo "== the predictions (critical rank's breakdown, s)"
for label in gpt3-175b-a100-1024 llama3-405b-h100-16384; do
  echo "$label:"
  grep -E '^(step time|tokens/s)' "$out/$label.log" | sed 's/^/  /'
done

echo
echo "== with scaling efficiency (adds the dp_size 1 reference run, in a child process)"
simulate scaling --model models/gpt3-175b.json --topology topologies/dgx-a100-80gb.json \
  --plan examples/gpt3-175b-a100-1024.json --profile profiles/a100-sxm4-80gb.json
read -r wall kb <"$out/scaling.time"
efficiency=$(grep -o 'scaling efficiency [0-9.e+-]*' "$out/scaling.log" | awk '{ print $3 }')
echo "gpt3-175b-a100-1024: scaling efficiency $efficiency, wall $wall s in all (both runs)"

echo
echo "== wall time against devices: GPT-3 175B, tp 8 × pp 8 (interleaved, vpp 3), dp grows,"
echo "   16 microbatches per dp rank, DGX A100 nodes, fast mode, --no-scaling"
printf "%8s %6s %10s %8s %10s %8s %12s %8s\n" devices dp wall_s growth activities peak_MB step_s mfu
previous=""
for dp in 1 2 4 8 16 32 64 128 256; do
  devices=$((64 * dp))
  plan="$out/gpt3-175b-dp$dp.json"
  sed -e "s/\"dp_size\": *[0-9]*/\"dp_size\": $dp/" \
    -e "s/\"global_batch_size\": *[0-9]*/\"global_batch_size\": $((16 * dp))/" \
    -e "s/\"name\": *\"[^\"]*\"/\"name\": \"gpt3-175b-dp$dp\"/" \
    examples/gpt3-175b-a100-1024.json >"$plan"
  label="sweep-$dp"
  simulate "$label" --model models/gpt3-175b.json --topology topologies/dgx-a100-80gb.json \
    --nodes $((devices / 8)) --plan "$plan" --profile profiles/a100-sxm4-80gb.json --no-scaling
  read -r wall kb <"$out/$label.time"
  growth=-
  [ -n "$previous" ] && growth=$(awk -v a="$wall" -v b="$previous" 'BEGIN { printf "%.2f", (b > 0) ? a / b : 0 }')
  step=$(awk '/^step time / { print $3 }' "$out/$label.log")
  mfu=$(grep -o 'MFU [0-9.e+-]*' "$out/$label.log" | awk '{ print $2 }' | tr -d ,)
  printf "%8d %6d %10s %8s %10s %8d %12s %8s\n" "$devices" "$dp" "$wall" "$growth" \
    "$(activities "$label")" $((kb / 1024)) "$step" "$mfu"
  previous=$wall
done
echo "growth: wall time over the previous row's (a doubling of devices)"
