// Models, plans and predictions for the published rows; see published_rows.hpp.
#include "published_rows.hpp"

#include <cmath>
#include <iomanip>
#include <limits>
#include <sstream>

#include "collective.hpp"
#include "collective_cost.hpp"

namespace stepcast::cli {

double megatron_iteration_flops(const MegatronRow& row) {
  const double B = double(row.batch), s = double(row.seq_length), l = double(row.layers),
               h = double(row.hidden), V = double(row.vocab_size);
  return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
}

namespace {

// 51200 → "51,200", as the paper prints it.
std::string with_thousands(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

}  // namespace

Json megatron_model_json(const MegatronRow& row) {
  std::ostringstream notes;
  notes << "Narayanan et al., SC'21, Table 1 row " << row.params_billion << "B: " << row.layers
        << " layers, hidden " << row.hidden << ", " << row.heads << " heads; V = "
        << with_thousands(row.vocab_size) << " and s = " << row.seq_length
        << " (section 5.1). GPT architecture as Megatron-LM's.";
  return {{"name", row.name},
          {"notes", notes.str()},
          {"hidden_size", row.hidden},
          {"num_hidden_layers", row.layers},
          {"num_attention_heads", row.heads},
          {"intermediate_size", 4 * row.hidden},
          {"vocab_size", row.vocab_size},
          {"max_position_embeddings", row.seq_length},
          {"seq_length", row.seq_length},
          {"norm_type", "layernorm"},
          {"mlp_type", "gelu"},
          {"position_embedding_type", "learned"},
          {"use_bias", true},
          {"tie_word_embeddings", true}};
}

int64_t megatron_virtual_pp_size(const MegatronRow& row) {
  if (row.layers_per_virtual_stage == 0) return 1;
  return row.layers / row.pp / row.layers_per_virtual_stage;
}

std::string megatron_plan_rule() {
  return "TP and PP as Table 1; dp = GPUs / (TP·PP); micro batch, virtual pipeline stages and "
         "DDP as the authors' launch script gives them per row (Megatron-LM examples/sc21/"
         "run_table_1.sh): the interleaved 1F1B schedule where it sets "
         "--num-layers-per-virtual-pipeline-stage, plain 1F1B otherwise; --DDP-impl torch (1.7B to "
         "18.4B): the data-parallel all-reduce in PyTorch DDP's 25 MiB buckets during the last "
         "microbatch's backward pass (no_sync on the others), --DDP-impl local: after the backward "
         "pass; pipeline sends and receives block the next compute under both schedules (2021's "
         "_communicate: one batch_isend_irecv, each request waited, then torch.cuda.synchronize; "
         "the code of the authors' scripts had no overlap option), in Megatron's batches under the "
         "interleaved schedule; each pipeline transfer split over tp and all-gathered after it "
         "(--scatter-gather-tensors-in-pipeline, on by default then); no fused gradient accumulation "
         "(each later microbatch's weight gradients added into .grad by autograd: "
         "gradient_accumulation_fusion false); the loss as separate PyTorch ops on the logits cast "
         "to fp32 (mpu/cross_entropy.py: cross_entropy_loss_fusion false); full recompute (--checkpoint-activations); fp16 weights, activations and gradients "
         "(--fp16); ZeRO 0; materialized attention (no FlashAttention in 2021); dropout 0.1; no "
         "sequence parallelism (introduced after SC'21).";
}

Json megatron_plan_json(const MegatronRow& row) {
  int64_t v = megatron_virtual_pp_size(row);
  bool torch_ddp = row.ddp_impl == "torch";
  Json plan = {{"name", row.name + "-sc21"},
          {"notes", "Plan rule of `stepcast validate --sweep published`: " + megatron_plan_rule()},
          {"tp_size", row.tp},
          {"pp_size", row.pp},
          {"dp_size", row.dp()},
          {"zero_stage", 0},
          {"micro_batch_size", row.micro_batch},
          {"global_batch_size", row.batch},
          {"schedule", v > 1 ? "interleaved_1f1b" : "1f1b"},
          {"virtual_pp_size", v},
          {"recompute", "full"},
          {"sequence_parallel", false},
          {"dtype", "fp16"},
          {"grad_dtype", "fp16"},
          {"attention_impl", "materialized"},
          {"dropout", 0.1},
          {"overlap_grad_reduce", torch_ddp},
          {"overlap_param_gather", false},
          // megatron/p2p_communication.py _communicate at commit de7dc40f88 ("scripts for sc21",
          // Aug 2021): batch_isend_irecv, req.wait() for every request, torch.cuda.synchronize().
          {"overlap_p2p_comm", false},
          // --scatter-gather-tensors-in-pipeline: on by default at de7dc40f88 (megatron/arguments.py,
          // a store_false flag; commit 72e4230bb5 turned it on), not passed by run_table_1.sh.
          {"scatter_gather_tensors_in_pipeline", true},
          // No fused weight-gradient accumulation in 2021: each microbatch's weight gradients are
          // fresh tensors that autograd's AccumulateGrad adds into .grad (local DDP without
          // contiguous buffers, as run_table_1.sh ran it; torch DDP under no_sync).
          {"gradient_accumulation_fusion", false},
          // vocab_parallel_cross_entropy(output.float(), labels) (megatron/model/gpt_model.py,
          // without --fp16-lm-cross-entropy), then max, sub_, exp, sum, div_ on the fp32 copy
          // (megatron/mpu/cross_entropy.py); no fused loss in 2021.
          {"cross_entropy_loss_fusion", false}};
  // PyTorch DDP's bucket_cap_mb default (25 MiB), which Megatron-LM 2021 did not change.
  if (torch_ddp) plan["grad_bucket_bytes"] = 25 << 20;
  return plan;
}

Topology nccl_row_topology(const NcclRow& row, const Topology& shipped) {
  Topology t = shipped;
  t.num_nodes = int(row.nodes);
  if (row.devices_per_node > 0) t.node.devices_per_node = int(row.devices_per_node);
  if (row.nics_per_node > 0) t.fabric.nics_per_node = int(row.nics_per_node);
  return t;
}

NcclPrediction predict_nccl(const NcclRow& row, const Topology& topology,
                            const DeviceProfile& profile) {
  Topology system = apply_link_fractions(nccl_row_topology(row, topology), profile);
  LinkFigures links = link_figures(system);
  GroupShape shape;
  shape.nodes = row.nodes;
  shape.members_per_node = system.node.devices_per_node;
  shape.size = shape.nodes * shape.members_per_node;
  NcclPrediction p;
  Algorithm algorithm = choose_algorithm(OpKind::all_reduce, row.bytes, shape, links);
  CollectiveCostModel model(profile, nccl_row_topology(row, topology));
  double r = model.correction(OpKind::all_reduce, algorithm, row.bytes, shape);
  p.algorithm = to_string(algorithm);
  if (const MeasuredCollective* table = model.table_for(OpKind::all_reduce, shape, row.bytes)) {
    std::ostringstream label;
    label << p.algorithm << " × " << std::setprecision(3) << r << " (" << table->shape.size << " ranks on "
          << table->shape.nodes << (table->shape.nodes == 1 ? " node" : " nodes") << ", " << table->source << ")";
    p.algorithm = label.str();
  }
  p.time_s = model.time_s(OpKind::all_reduce, algorithm, row.bytes, shape);
  p.algbw_bytes_per_s = row.bytes / p.time_s;
  p.busbw_bytes_per_s = p.algbw_bytes_per_s * bus_bandwidth_factor(OpKind::all_reduce, shape.size);
  return p;
}

double relative_error(double predicted, double published) {
  return (predicted - published) / published;
}

double mean_absolute(const std::vector<double>& errors) {
  if (errors.empty()) return std::numeric_limits<double>::quiet_NaN();
  double sum = 0;
  for (double e : errors) sum += std::abs(e);
  return sum / double(errors.size());
}

}  // namespace stepcast::cli
