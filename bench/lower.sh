#!/usr/bin/env bash
# Wall time and peak memory of `stepcast lower` for the two headline plans (issue: each under
# 5 s and 1 GB on a 2-core machine). Prints one row per plan; the limits are printed, not asserted.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/stepcast ] || bash scripts/build.sh >/dev/null
command -v /usr/bin/time >/dev/null || { echo "needs /usr/bin/time: bash scripts/install-deps.sh"; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
printf "%-28s %8s %10s %10s %12s %8s\n" case devices wall_s peak_MB program_MB ops
run() {
  local label=$1 model=$2 topology=$3 plan=$4
  /usr/bin/time -f "%e %M" -o "$out/time" build/stepcast lower --model "$model" \
    --topology "$topology" --plan "$plan" --out "$out/$label" >"$out/log"
  read -r wall rss_kb <"$out/time"
  local devices ops size
  devices=$(grep -o '^ranks [0-9]*' "$out/log" | cut -d' ' -f2)
  ops=$(grep -c '"kind"' "$out/$label/program.json" || true)
  size=$(du -m "$out/$label/program.json" | cut -f1)
  printf "%-28s %8s %10s %10d %12s %8s\n" "$label" "$devices" "$wall" $((rss_kb / 1024)) "$size" "$ops"
}
run gpt3-175b-a100-1024 models/gpt3-175b.json topologies/dgx-a100-80gb.json examples/gpt3-175b-a100-1024.json
run llama3-405b-h100-16384 models/llama3-405b.json topologies/dgx-h100.json examples/llama3-405b-h100-16384.json
echo "limits: wall_s <= 5, peak_MB <= 1024 (issue 2)"
