#!/usr/bin/env bash
# ctest "torchtitan: exported job configs pass TorchTitan's own parser": the TorchTitan job
# configs `plan` exports for Llama 3 8B on 16 H100 and 70B on 64 H100 (flash attention, no
# dropout, so that TorchTitan can run them: FSDP2 and HSDP, tp, pp with its model parts) through
# `scripts/megatron-check.sh --torchtitan` (TorchTitan 0.2.2's ConfigManager, which refuses
# unknown keys, and the llama3 model each names, built on the meta device: its parameters must
# be the plan's), each equal to its plan. Skips (77) where that check is not set up: it needs
# torch and TorchTitan from pip, which stepcast's own dependencies do not include.
set -euo pipefail
build=$1
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
check="$src/scripts/megatron-check.sh"
"$check" --probe >/dev/null || exit $?
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for case in llama3-8b:2:256 llama3-70b:8:512; do
  IFS=: read -r model nodes batch <<< "$case"
  "$build/stepcast" plan --model "$src/models/$model.json" --topology "$src/topologies/dgx-h100.json" \
    --nodes "$nodes" --global-batch-size "$batch" --attention flash --dropout 0 --out "$out/$model" \
    > "$out/plan-$model.log"
done
files=("$out"/*/*.torchtitan.toml)
[ "${#files[@]}" -ge 10 ] || { echo "expected 10 exports, found ${#files[@]}"; exit 1; }
"$check" --torchtitan "${files[@]}"
