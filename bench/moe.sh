#!/usr/bin/env bash
# Mixtures of experts (issue 15): memory per rank and simulated step of expert layouts on H100
# topologies, how the step moves with routing skew, and simulate's wall time. Mixtral 8x7B on 64
# H100 under ep 1, 2, 4, 8 (its example plan otherwise); Qwen3-235B-A22B on 256 H100 (tp 2, pp 8,
# dp 16) under ep 4, 8, 16 and the allgather dispatcher; the same Qwen3 plan with moe_routing skew
# 0 to 1.5 (expert e's share ∝ 1/(e+1)^skew); the DeepSeek-V3-shaped example on 2,048 H100 last
# (20 minutes on the 2-core machine with the all_to_all rail-staged: 42 M activities; leave it out
# with SKIP_DEEPSEEK=1). Figures are printed, nothing is asserted.
# BUILD=DIR picks the build directory (default build/). SKEW_REPORT=DIR also runs compare-strategies
# on Mixtral 8x7B / 64 H100 with --moe-skew-sweep and writes its report (the chart of step time
# against the routing skew, a line per expert layout) to DIR/report.html.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${BUILD:-build}/stepcast
[ -x "$bin" ] || bash scripts/build.sh >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); $("$bin" --version | head -1)"

# plan FILE BASE KEY=VALUE...: the base plan with keys replaced (values as JSON).
plan() {
  local file=$1 base=$2
  shift 2
  python3 - "$base" "$file" "$@" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
for kv in sys.argv[3:]:
    k, v = kv.split("=", 1)
    plan[k] = json.loads(v)
plan["name"] = sys.argv[2].rsplit("/", 1)[-1][:-5]
json.dump(plan, open(sys.argv[2], "w"))
PY
}

# row LABEL MODEL NODES PLAN: peak memory of the fullest rank, step time, MFU, load ratio, wall.
row() {
  local label=$1 model=$2 nodes=$3 file=$4
  local peak step
  peak=$("$bin" memory --model "models/$model.json" --topology topologies/dgx-h100.json --nodes "$nodes" --plan "$file" 2>/dev/null |
    sed -n 's/^peak \([0-9.]* [GMK]iB\).*/\1/p')
  /usr/bin/time -f "%e" -o "$tmp/wall" "$bin" simulate --model "models/$model.json" --topology topologies/dgx-h100.json \
    --nodes "$nodes" --plan "$file" --no-scaling >"$tmp/log" 2>&1 || { cat "$tmp/log"; exit 1; }
  step=$(sed -n 's/^step time \([0-9.e+-]*\) s.*/\1/p' "$tmp/log")
  local mfu load
  mfu=$(sed -n 's/.*MFU \([0-9.e+-]*\),.*/\1/p' "$tmp/log")
  load=$(sed -n 's/.*takes \([0-9.e+-]*\)× the mean on average.*/\1/p' "$tmp/log")
  printf "%-40s peak %-11s step %9.4f s  MFU %.3f  load ratio %-8s simulate %s s\n" "$label" "$peak" "$step" "$mfu" "$load" "$(cat "$tmp/wall")"
}

echo "== Mixtral 8x7B, 64 H100 (tp 2 sp, pp 4, dp 8): expert parallel size"
for ep in 1 2 4 8; do
  plan "$tmp/mixtral-ep$ep.json" examples/mixtral-8x7b-h100-64-ep8.json expert_model_parallel_size=$ep
  row "ep $ep" mixtral-8x7b 8 "$tmp/mixtral-ep$ep.json"
done

q='{"tp_size": 2, "pp_size": 8, "dp_size": 16, "zero_stage": 1, "micro_batch_size": 1, "global_batch_size": 256, "recompute": "full", "sequence_parallel": true, "dtype": "bf16", "attention_impl": "flash", "dropout": 0.0, "overlap_grad_reduce": true, "expert_tensor_parallel_size": 1}'
echo "$q" >"$tmp/qwen-base.json"
echo "== Qwen3-235B-A22B, 256 H100 (tp 2 sp, pp 8, dp 16): ep and the dispatcher"
for ep in 4 8 16; do
  plan "$tmp/qwen-ep$ep.json" "$tmp/qwen-base.json" expert_model_parallel_size=$ep
  row "ep $ep alltoall" qwen3-235b-a22b 32 "$tmp/qwen-ep$ep.json"
done
plan "$tmp/qwen-ag.json" "$tmp/qwen-base.json" expert_model_parallel_size=16 'moe_token_dispatcher_type="allgather"'
row "ep 16 allgather" qwen3-235b-a22b 32 "$tmp/qwen-ag.json"
echo "== Qwen3-235B-A22B, 256 H100, ep 16: routing skew (dropless)"
for s in 0 0.25 0.5 1.0 1.5; do
  plan "$tmp/qwen-skew$s.json" "$tmp/qwen-base.json" expert_model_parallel_size=16 'moe_routing="skew"' moe_routing_skew=$s
  row "skew $s" qwen3-235b-a22b 32 "$tmp/qwen-skew$s.json"
done
plan "$tmp/qwen-cap.json" "$tmp/qwen-base.json" expert_model_parallel_size=16 'moe_routing="skew"' moe_routing_skew=1.0 moe_expert_capacity_factor=1.25
row "skew 1.0, capacity 1.25 (dropping)" qwen3-235b-a22b 32 "$tmp/qwen-cap.json"
if [ -z "${SKIP_DEEPSEEK:-}" ]; then
  echo "== DeepSeek-V3-shaped, 2,048 H100 (pp 16, dp 128, ep 64)"
  row "ep 64" deepseek-v3-shaped 256 examples/deepseek-v3-shaped-h100-2048-ep64.json
fi
if [ -n "${SKEW_REPORT:-}" ]; then
  echo "== Mixtral 8x7B, 64 H100: expert layouts under routing skew (compare-strategies --moe-skew-sweep)"
  "$bin" compare-strategies --model models/mixtral-8x7b.json --topology topologies/dgx-h100.json --nodes 8 \
    --global-batch-size 256 --attention flash --dropout 0 --moe-skew-sweep 0,0.5,1,1.5 --out "$SKEW_REPORT" |
    sed -n '/^routing skew/,/^memory by class/p'
  echo "report: $SKEW_REPORT/report.html"
fi
