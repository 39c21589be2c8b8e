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
  if (row.pp == 1) return 1;
  int64_t layers_per_stage = row.layers / row.pp;
  return layers_per_stage % 2 == 0 ? 2 : layers_per_stage;
}

std::string megatron_plan_rule() {
  return "TP and PP as Table 1; dp = GPUs / (TP·PP); micro batch 1 (Table 1 does not state it; "
         "1 is the one size that divides every row's batch into a multiple of PP microbatches, as "
         "the interleaved schedule needs); interleaved 1F1B with 2 model chunks per stage "
         "(one layer per chunk where a stage's layers are odd: 76.1B, 529.6B), 1F1B without a "
         "pipeline; "
         "full recompute; fp16 weights, activations and gradients (Megatron-LM's --fp16 with its "
         "local DDP, 2021); ZeRO 0; the data-parallel all-reduce after the backward pass; "
         "materialized attention (no FlashAttention in 2021); dropout 0.1; no sequence "
         "parallelism (introduced after SC'21).";
}

Json megatron_plan_json(const MegatronRow& row) {
  int64_t v = megatron_virtual_pp_size(row);
  return {{"name", row.name + "-sc21"},
          {"notes", "Plan rule of `stepcast validate --sweep published`: " + megatron_plan_rule()},
          {"tp_size", row.tp},
          {"pp_size", row.pp},
          {"dp_size", row.dp()},
          {"zero_stage", 0},
          {"micro_batch_size", 1},
          {"global_batch_size", row.batch},
          {"schedule", row.pp > 1 ? "interleaved_1f1b" : "1f1b"},
          {"virtual_pp_size", v},
          {"recompute", "full"},
          {"sequence_parallel", false},
          {"dtype", "fp16"},
          {"grad_dtype", "fp16"},
          {"attention_impl", "materialized"},
          {"dropout", 0.1},
          {"overlap_grad_reduce", false},
          {"overlap_param_gather", false}};
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
  if (const MeasuredCollective* table = model.table_for(OpKind::all_reduce, shape)) {
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
