#!/usr/bin/env bash
# ctest "megatron: exported launch lines pass Megatron-LM's own validation": the top plans `plan`
# exports for a dense model (GPT-3 13B on 64 A100: ZeRO-2/3 as Megatron-FSDP, hybrid sharding,
# interleaved layouts) and mixtures of experts (Mixtral 8x7B on 64 H100: ep, etp; Qwen3-30B-A3B
# on 32 H100: a head width of its own, --kv-channels) through
# scripts/megatron-check.sh (Megatron-LM's parse_args, validate_args and config checks at the
# commit the export cites, and the GPTModel its arguments build, whose parameters must be the
# plan's). Skips (77) where that check is not set up: it needs torch and
# Megatron-LM from pip and git, which stepcast's own dependencies do not include.
set -euo pipefail
build=$1
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
check="$src/scripts/megatron-check.sh"
"$check" --probe || exit $?
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$build/stepcast" plan --model "$src/models/gpt3-13b.json" --topology "$src/topologies/dgx-a100-80gb.json" \
  --nodes 8 --global-batch-size 512 --out "$out/gpt3-13b" > "$out/plan-gpt3.log"
"$build/stepcast" plan --model "$src/models/mixtral-8x7b.json" --topology "$src/topologies/dgx-h100.json" \
  --nodes 8 --global-batch-size 256 --out "$out/mixtral-8x7b" > "$out/plan-mixtral.log"
"$build/stepcast" plan --model "$src/models/qwen3-30b-a3b.json" --topology "$src/topologies/dgx-h100.json" \
  --nodes 4 --global-batch-size 256 --top 2 --out "$out/qwen3-30b-a3b" > "$out/plan-qwen3.log"
files=("$out"/*/*.megatron.txt)
[ "${#files[@]}" -ge 12 ] || { echo "expected 12 exports, found ${#files[@]}"; exit 1; }
# Every file accepted, and none describing another plan or model than the one simulated
# (Megatron's derived sizes and the parameters of the GPTModel it builds against the plan's).
rc=0
"$check" "${files[@]}" | tee "$out/check.log" || rc=$?
[ "$rc" -eq 0 ] || exit "$rc"
if grep -q "differs from the plan" "$out/check.log"; then
  echo "an export differs from its plan (above)"
  exit 1
fi
