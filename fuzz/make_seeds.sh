#!/usr/bin/env bash
# Regenerates the seeds that stepcast itself writes (fuzz/corpus/{program_json,step_result,
# checkpoint_manifest,checkpoint_latest,lower}/) from small plans of the tiny model: after a
# format changes, so that the seeds stay inputs the loaders accept. Needs build/ (scripts/build.sh).
# The other seeds are shipped files (copied here too) or fixed texts in the tools' formats.
set -euo pipefail
cd "$(dirname "$0")/.."
stepcast=$PWD/build/stepcast
corpus=$PWD/fuzz/corpus
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Shipped files, as they are.
cp models/*.json "$corpus/model/"
cp examples/*.json "$corpus/plan/"
cp topologies/*.json "$corpus/topology/"
cp profiles/*.json "$corpus/profile/"
cp sweeps/*.json "$corpus/sweep/"

# One-layer and two-layer variants of the tiny model, and plans small enough for quick seeds.
without_notes() { grep -v '^ *"notes":' "$1"; }
without_notes models/tiny.json | sed 's/"num_hidden_layers": 4/"num_hidden_layers": 1/' >"$work/tiny-1l.json"
without_notes models/tiny.json | sed 's/"num_hidden_layers": 4/"num_hidden_layers": 2/' >"$work/tiny-2l.json"
plan() { echo "{\"name\": \"$1\", \"micro_batch_size\": 1, \"dtype\": \"fp32\", \"dropout\": 0.0, $2}" >"$work/$1.json"; }
plan single '"global_batch_size": 1'
plan tp2-sp '"tp_size": 2, "global_batch_size": 1, "sequence_parallel": true'
plan pp2 '"pp_size": 2, "global_batch_size": 2'
plan dp2-zero1 '"dp_size": 2, "zero_stage": 1, "global_batch_size": 2'
cpu=topologies/localhost-cpu.json
for pair in single:tiny-1l tp2-sp:tiny-1l pp2:tiny-2l dp2-zero1:tiny-1l; do
  p=${pair%%:*} m=${pair##*:}
  "$stepcast" lower --model "$work/$m.json" --topology $cpu --plan "$work/$p.json" --out "$work/lower-$p" >/dev/null
  cp "$work/lower-$p/program.json" "$corpus/program_json/$p.json"
done

# A prediction (with and without op records), a measurement and a checkpoint of a 2-rank run.
"$stepcast" simulate --model "$work/tiny-1l.json" --topology $cpu --plan "$work/dp2-zero1.json" \
  --out "$work/sim" >/dev/null 2>&1
"$stepcast" simulate --model "$work/tiny-1l.json" --topology $cpu --plan "$work/dp2-zero1.json" \
  --no-records --out "$work/sim-no-records" >/dev/null 2>&1
bash scripts/mpirun -np 2 "$stepcast" run --model "$work/tiny-1l.json" --topology $cpu \
  --plan "$work/dp2-zero1.json" --backend cpu --steps 4 --out "$work/run" \
  --checkpoint-dir "$work/checkpoints" --checkpoint-every 2 >/dev/null 2>&1
cp "$work/sim/prediction.json" "$corpus/step_result/prediction.json"
cp "$work/sim-no-records/prediction.json" "$corpus/step_result/prediction-no-records.json"
cp "$work/run/measurement.json" "$corpus/step_result/measurement.json"
cp "$work/checkpoints/step-00000004/manifest.json" "$corpus/checkpoint_manifest/manifest-2-ranks.json"
cp "$work/checkpoints/latest" "$corpus/checkpoint_latest/latest"

# plan → lower → memory documents: {"model", "topology", "plan"}, shipped files and variants.
document() {  # NAME MODEL TOPOLOGY PLAN-FILE-OR-TEXT
  local plan_text
  if [ -f "$4" ]; then plan_text=$(without_notes "$4"); else plan_text=$4; fi
  printf '{"model": %s,\n"topology": %s,\n"plan": %s}\n' "$(without_notes "$2")" \
    "$(without_notes "$3")" "$plan_text" >"$corpus/lower/$1.json"
}
tiny=models/tiny.json h100=topologies/dgx-h100.json
document tiny-cpu $tiny $cpu examples/tiny-cpu.json
document tiny-cpu-3d $tiny $h100 examples/tiny-cpu-3d.json
document tiny-1l-single "$work/tiny-1l.json" $cpu "$work/single.json"
document tiny-interleaved $tiny $h100 '{"tp_size": 2, "pp_size": 2, "dp_size": 2, "schedule": "interleaved_1f1b",
  "virtual_pp_size": 2, "micro_batch_size": 1, "global_batch_size": 8, "sequence_parallel": true,
  "attention_impl": "flash", "recompute": "selective", "zero_stage": 1, "overlap_grad_reduce": true,
  "overlap_param_gather": true, "dtype": "bf16"}'
document tiny-gpipe-zero3 $tiny $h100 '{"pp_size": 4, "dp_size": 2, "schedule": "gpipe", "micro_batch_size": 1,
  "global_batch_size": 4, "recompute": "full", "zero_stage": 3, "dtype": "bf16", "grad_dtype": "bf16"}'
document tiny-gpt-zero2 models/tiny-gpt.json topologies/dgx-a100-80gb.json '{"tp_size": 2, "pp_size": 2,
  "dp_size": 2, "zero_stage": 2, "order": "dp-tp-pp", "layers_per_stage": [1, 3], "micro_batch_size": 2,
  "global_batch_size": 8, "dtype": "fp16", "grad_bucket_bytes": 65536, "overlap_grad_reduce": true}'
document gpt2-124m-h200 models/gpt2-124m.json topologies/h200-1gpu.json '{"micro_batch_size": 1,
  "global_batch_size": 2, "attention_impl": "flash", "dtype": "bf16"}'
echo "make_seeds: wrote $(find "$corpus" -type f | wc -l) seeds, $(du -sh "$corpus" | cut -f1)"
