#!/usr/bin/env bash
# The ctests that check `plan`'s exports with the frameworks' own code, through
# scripts/megatron-check.sh (set up by its --setup: torch, DeepSpeed, TorchTitan and Megatron-LM
# from pip and git, which stepcast's own dependencies do not include; skips, 77, elsewhere).
# Usage: framework_export_check.sh megatron|deepspeed|torchtitan BUILD_DIR
#   megatron    the top plans of GPT-3 13B on 64 A100 (ZeRO-2/3 as Megatron-FSDP, hybrid sharding,
#               interleaved layouts), Mixtral 8x7B on 64 H100 (ep, etp) and Qwen3-30B-A3B on 32
#               H100 (a head width of its own, --kv-channels): Megatron-LM's argument and config
#               checks at the commit the export cites, and the GPTModel the arguments build
#   deepspeed   the GPT-3 13B and Mixtral plans' DeepSpeed configs: DeepSpeed 0.19.8's parser
#   torchtitan  Llama 3 8B on 16 H100 and 70B on 64 H100 with flash attention and no dropout, so
#               that TorchTitan can run them: TorchTitan 0.2.2's parser and the llama3 model built
# Every file must be accepted and equal to its plan (derived sizes, batch sizes, parameters).
set -euo pipefail
framework=$1
build=$2
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
check="$src/scripts/megatron-check.sh"
"$check" --probe >/dev/null || exit $?
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
plan() {  # MODEL TOPOLOGY NODES BATCH [plan options]
  local model=$1 topology=$2 nodes=$3 batch=$4
  shift 4
  "$build/stepcast" plan --model "$src/models/$model.json" --topology "$src/topologies/$topology.json" \
    --nodes "$nodes" --global-batch-size "$batch" --out "$out/$model" "$@" > "$out/plan-$model.log"
}
case $framework in
  megatron)
    plan gpt3-13b dgx-a100-80gb 8 512
    plan mixtral-8x7b dgx-h100 8 256
    plan qwen3-30b-a3b dgx-h100 4 256 --top 2
    files=("$out"/*/*.megatron.txt) option=() least=12 ;;
  deepspeed)
    plan gpt3-13b dgx-a100-80gb 8 512
    plan mixtral-8x7b dgx-h100 8 256
    files=("$out"/*/*.deepspeed.json) option=(--deepspeed) least=10 ;;
  torchtitan)
    plan llama3-8b dgx-h100 2 256 --attention flash --dropout 0
    plan llama3-70b dgx-h100 8 512 --attention flash --dropout 0
    files=("$out"/*/*.torchtitan.toml) option=(--torchtitan) least=10 ;;
  *) echo "usage: $0 megatron|deepspeed|torchtitan BUILD_DIR"; exit 2 ;;
esac
[ "${#files[@]}" -ge "$least" ] || { echo "expected $least exports, found ${#files[@]}"; exit 1; }
rc=0
"$check" "${option[@]}" "${files[@]}" | tee "$out/check.log" || rc=$?
[ "$rc" -eq 0 ] || exit "$rc"
if grep -q "differs from the plan" "$out/check.log"; then
  echo "an export differs from its plan (above)"
  exit 1
fi
