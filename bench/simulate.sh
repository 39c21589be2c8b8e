#!/usr/bin/env bash
# Wall time and peak memory of `stepcast simulate`. First the cases of issue 17's table as a user
# runs them — the whole command with its default outputs (--out DIR: prediction.json, trace.json,
# and the dp_size 1 reference run for scaling efficiency); targets: GPT-3 175B on 1,024 A100 within
# 3 s, every other case and a 12,288-GPU GPT-3-shaped plan within 10 s, peak memory within 2 GB on
# the 2-core machine. Then fast mode alone on the headline plans (--no-scaling, no outputs: issue:
# GPT-3 175B / 1,024 A100 within 10 s and 2 GB, Llama-3 405B / 16,384 H100 within 30 s), the
# predictions themselves, and how wall time grows with the device count when only dp_size grows
# (GPT-3 175B's tp 8 × pp 8 replica, 16 microbatches per dp rank, 64 to 16,384 devices). Limits
# are printed next to the figures, not asserted: the cores are shared, so the CPU seconds (user +
# system, the child's included) are printed too. About 3 minutes on 2 cores. To compare builds,
# run each after `sync; echo 3 > /proc/sys/vm/drop_caches` (root): on this VM a page cache full of
# earlier outputs and builds doubled the 1T case's wall (system time 11 s against 2 s).
# BUILD=DIR picks the build directory (default build/); STEPCAST=FILE the binary (default
# DIR/stepcast), e.g. an earlier build's for a before/after table.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
bin=${STEPCAST:-$build/stepcast}
[ -x "$bin" ] || bash scripts/build.sh >/dev/null
command -v /usr/bin/time >/dev/null || { echo "needs /usr/bin/time: bash scripts/install-deps.sh"; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); $("$bin" --version | head -1)"

# whole LABEL WALL_LIMIT ARGS...: `simulate ARGS --out DIR` as a user runs it (default outputs and
# mode: auto, which is approx where fast mode would simulate 256 ranks or more); prints wall, CPU
# seconds, peak memory, the outputs' sizes and the mode that ran.
whole() {
  local label=$1 wall_limit=$2
  shift 2
  /usr/bin/time -f "%e %U %S %M" -o "$out/$label.time" "$bin" simulate "$@" --out "$out/$label" \
    >"$out/$label.log" 2>&1 || { cat "$out/$label.log"; exit 1; }
  local wall user sys kb
  read -r wall user sys kb <"$out/$label.time"
  printf "%-28s %7s %7s %7s %8d %8s %13s %7s\n" "$label" "$wall" "$wall_limit" \
    "$(awk -v u="$user" -v s="$sys" 'BEGIN { printf "%.1f", u + s }')" $((kb / 1024)) 2048 \
    "$(du -sm "$out/$label" | awk '{ print $1 }') MB" \
    "$(grep -o 'mode (auto) [a-z]*' "$out/$label.log" | awk '{ print $3 }')"
  rm -rf "${out:?}/$label"
}
a100=(--topology topologies/dgx-a100-80gb.json)
echo "== issue 17's cases: the whole command with its default outputs (--out DIR)"
printf "%-28s %7s %7s %7s %8s %8s %13s %7s\n" case wall_s limit_s cpu_s peak_MB limit_MB outputs mode
whole gpt3-175b-a100-1024 3 --model models/gpt3-175b.json "${a100[@]}" \
  --plan examples/gpt3-175b-a100-1024.json
whole gpt3-175b-a100-1024-1f1b 10 --model models/gpt3-175b.json "${a100[@]}" \
  --plan bench/inputs/gpt3-175b-a100-1024-1f1b.json
whole megatron-1t-a100-512 10 --model bench/inputs/megatron-1t.json "${a100[@]}" --nodes 64 \
  --plan bench/inputs/megatron-1t-a100-512.json
whole megatron-530b-a100-2240 10 --model bench/inputs/megatron-530b.json "${a100[@]}" --nodes 280 \
  --plan bench/inputs/megatron-530b-a100-2240.json
whole llama3-405b-h100-16384 10 --model models/llama3-405b.json --topology topologies/dgx-h100.json \
  --plan examples/llama3-405b-h100-16384.json
sed -e 's/"dp_size": *[0-9]*/"dp_size": 192/' -e 's/"global_batch_size": *[0-9]*/"global_batch_size": 18432/' \
  -e 's/"name": *"[^"]*"/"name": "gpt3-175b-a100-12288"/' examples/gpt3-175b-a100-1024.json >"$out/dp192.json"
whole gpt3-175b-a100-12288 10 --model models/gpt3-175b.json "${a100[@]}" --nodes 1536 \
  --plan "$out/dp192.json"
echo

# simulate LABEL ARGS...: runs fast mode; leaves the log in $out/LABEL.log and "wall_s peak_kB"
# in $out/LABEL.time.
simulate() {
  local label=$1
  shift
  /usr/bin/time -f "%e %M" -o "$out/$label.time" "$bin" simulate --mode fast "$@" \
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
