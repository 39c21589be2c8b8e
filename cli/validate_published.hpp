// `stepcast validate --sweep published`: predicts published multi-GPU results from the shipped
// datasheet profiles (profiles/*.json), never fitted to them, and reports each row's error:
// Megatron-LM SC'21 Table 1 (TFLOP/s per GPU) and nccl-tests bus bandwidths, both transcribed in
// ../shared/data/reference-figures.md. Table 1 rows are simulated in child processes
// (`stepcast simulate`, one SimGrid engine per process); nccl-tests rows come from the collective
// cost model (plans/collective_cost.hpp) on the matching topology and profile. A component section
// per profile predicts every published component figure the profile holds (components.hpp).
// Errors are (predicted − published) / published; means are of their absolute values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "json_input.hpp"
#include "profile.hpp"
#include "topology.hpp"

namespace stepcast::cli {

// One row of Narayanan et al., SC'21, Table 1. Common settings (§5.1): V = 51,200, s = 2048.
struct MegatronRow {
  std::string name;  // "megatron-1.7b"
  double params_billion = 0;
  int64_t heads = 0, hidden = 0, layers = 0;
  int64_t tp = 1, pp = 1, gpus = 1, batch = 1;
  double published_tflops_per_gpu = 0;  // TFLOP/s per GPU, eq. 3's FLOPs (recompute counted)
  int64_t dp() const { return gpus / (tp * pp); }  // DERIVED: the paper does not print it
};
const std::vector<MegatronRow>& megatron_table1();

constexpr int64_t kMegatronVocab = 51200;
constexpr int64_t kMegatronSeqLength = 2048;

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

// A published nccl-tests bus bandwidth (all_reduce) and the system it was measured on.
struct NcclRow {
  std::string name;         // "nccl-149-dgx-a100"
  std::string system;       // as the source describes it
  std::string source;       // issue and grade
  std::string topology;     // topologies/NAME.json the prediction uses
  std::string profile;      // profiles/NAME.json
  int64_t nodes = 1;
  int64_t devices_per_node = 0;  // 0: the topology's (an H200 node is built from h200-1gpu)
  int64_t nics_per_node = 0;     // 0: the topology's
  double bytes = 0;              // message size the figure was read at
  std::string bytes_note;        // how the size is known
  double published_busbw_bytes_per_s = 0;
  // "": a prediction; otherwise why the row stays out of the mean (an algorithm stepcast does not
  // model, or the row being the very figure a profile cites).
  std::string excluded;
};
const std::vector<NcclRow>& nccl_table();

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

struct PublishedOptions {
  std::vector<std::string> rows;  // row names to run (Megatron and nccl); empty: all
  int jobs = 2;                    // concurrent child simulations
  // Profiles from this folder instead of the repository's profiles/ (an ablation: the same
  // profiles with a component taken out); empty: profiles/.
  std::string profile_dir;
  // An earlier published.json: each Table 1 row shows its error and breakdown there beside now.
  std::string baseline;
};

// Writes OUT_DIR/published.md, published.json and published.html; prints a line per row.
// Returns 0 when every row ran, 1 when a simulation failed (recorded in the report).
int validate_published(const std::string& out_dir);
int validate_published(const std::string& out_dir, const PublishedOptions& options);

}  // namespace stepcast::cli
