#!/usr/bin/env bash
# ctest "deepspeed: exported configs pass DeepSpeed's own parser": the DeepSpeed configs `plan`
# exports for a dense model (GPT-3 13B on 64 A100: ZeRO-2/3, hybrid sharding, pipelines) and a
# mixture of experts (Mixtral 8x7B on 64 H100) through `scripts/megatron-check.sh --deepspeed`
# (DeepSpeed 0.19.8's DeepSpeedConfig: every section parsed, the batch-size triangle for the plan's
# data-parallel world), each equal to its plan. Skips (77) where that check is not set up: it
# needs torch and DeepSpeed from pip, which stepcast's own dependencies do not include.
set -euo pipefail
build=$1
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
check="$src/scripts/megatron-check.sh"
"$check" --probe >/dev/null || exit $?
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$build/stepcast" plan --model "$src/models/gpt3-13b.json" --topology "$src/topologies/dgx-a100-80gb.json" \
  --nodes 8 --global-batch-size 512 --out "$out/gpt3-13b" > "$out/plan-gpt3.log"
"$build/stepcast" plan --model "$src/models/mixtral-8x7b.json" --topology "$src/topologies/dgx-h100.json" \
  --nodes 8 --global-batch-size 256 --out "$out/mixtral-8x7b" > "$out/plan-mixtral.log"
files=("$out"/*/*.deepspeed.json)
[ "${#files[@]}" -ge 10 ] || { echo "expected 10 exports, found ${#files[@]}"; exit 1; }
"$check" --deepspeed "${files[@]}"
