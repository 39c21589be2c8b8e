#!/usr/bin/env bash
# The quick estimate against `simulate` on GPT-3 13B on 64 A100 (8 DGX nodes), global batch 512
# as examples/gpt3-13b-a100-64.json: re-simulates the estimate's best BENCH_QUALITY_TOP plans (default
# 20) and every BENCH_QUALITY_STRIDE-th plan after them (default 1: every plan that fits; 25 gives
# a sample of about 160 over the whole ranking in about a tenth of the time; every plan, 3,999,
# took 37 min on the 2-core machine), then prints whether
# the estimate's first plan is simulate's best or within 2% of it, and Spearman's rank
# correlation between estimate and simulate over the simulated plans (stepcast plan prints both).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/stepcast ] || bash scripts/build.sh >/dev/null
bin=${STEPCAST:-build/stepcast}
top=${BENCH_QUALITY_TOP:-20}
stride=${BENCH_QUALITY_STRIDE:-1}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
start=$(date +%s)
"$bin" plan --model models/gpt3-13b.json --topology topologies/dgx-a100-80gb.json --nodes 8 --attention materialized \
  --global-batch-size 512 --evaluate "$top" --evaluate-stride "$stride" --top 10 --out "$out" \
  >"$out/log" 2>"$out/err" || { cat "$out/err"; exit 1; }
grep -E "candidates, |plans fit|^searched" "$out/log"
sed -n '/^plan  /,/^searched/p' "$out/log" | grep -v '^searched'
line=$(grep "Spearman" "$out/log")
echo "$line"
within=$(echo "$line" | sed -n 's/.*within \([0-9.]*\)%.*/\1/p')
if echo "$line" | grep -q "the same plan"; then
  echo "quality: the estimate's first plan is simulate's best (target: best or within 2%)"
elif [ -n "$within" ] && awk -v w="$within" 'BEGIN { exit !(w <= 2) }'; then
  echo "quality: the estimate's first plan is within $within% of simulate's best (target: 2%)"
else
  echo "quality: the estimate's first plan is $within% slower than simulate's best (target: 2%): MISSED"
fi
echo "wall $(( $(date +%s) - start )) s"
