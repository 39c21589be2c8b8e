// What stepcast makes of each published row: the model and plan a Megatron-LM SC'21 Table 1 row
// is simulated with (the plan rule fills what the table does not state), and the collective cost
// model's prediction of an nccl-tests row. Pure functions: no files, no SimGrid, no printing.
// Errors are (predicted − published) / published; means are of their absolute values.
#pragma once

#include <string>
#include <vector>

#include "json_input.hpp"
#include "profile.hpp"
#include "published_figures.hpp"
#include "topology.hpp"

namespace stepcast::cli {

// FLOPs per iteration, SC'21 eq. 3: 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)).
double megatron_iteration_flops(const MegatronRow& row);
// The model (GPT: LayerNorm, 4h GeLU MLP, learned positions, biases, tied embeddings).
Json megatron_model_json(const MegatronRow& row);
// The plan rule (the table states TP, PP, the interleaved schedule and full recompute; the rest
// is chosen here and printed in the report): micro batch 1, dp = GPUs / (TP·PP),
// virtual_pp_size = megatron_virtual_pp_size, fp16 weights and gradients, ZeRO 0, gradient
// all-reduce after the backward pass, materialized attention, dropout 0.1, no sequence
// parallelism (all as Megatron-LM ran in 2021).
Json megatron_plan_json(const MegatronRow& row);
// 1 without a pipeline; else 2 model chunks per stage when the stage's layers divide by 2, or
// one layer per chunk otherwise.
int64_t megatron_virtual_pp_size(const MegatronRow& row);
std::string megatron_plan_rule();  // the rule in words, for the report

struct NcclPrediction {
  std::string algorithm;
  double time_s = 0;
  double algbw_bytes_per_s = 0;
  double busbw_bytes_per_s = 0;
};
// The collective cost model on the row's system: choose_algorithm and collective_time_s on the
// topology after the profile's link fractions, corrected by the profile's measured tables
// (collective_cost.hpp; the table and factor named in `algorithm`), busbw = bytes / time · 2(n−1)/n.
NcclPrediction predict_nccl(const NcclRow& row, const Topology& topology,
                            const DeviceProfile& profile);
// The row's system: the topology with the row's nodes, devices and NICs per node.
Topology nccl_row_topology(const NcclRow& row, const Topology& shipped);

double relative_error(double predicted, double published);
double mean_absolute(const std::vector<double>& errors);  // NaN when empty

}  // namespace stepcast::cli
