// The published multi-GPU results `validate --sweep published` predicts, as read from their data
// file (data/published.json, see data/README.md): Megatron-LM SC'21 Table 1 rows and nccl-tests
// all_reduce bus bandwidths, each with its source. Holds figures only; what stepcast makes of
// them (models, plans, predictions) is in published_rows.hpp. Units: SI (bytes, bytes/s), except
// Table 1's TFLOP/s per GPU, kept as printed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "json_input.hpp"

namespace stepcast::cli {

// One row of Narayanan et al., SC'21, Table 1.
struct MegatronRow {
  std::string name;  // "megatron-1.7b"
  double params_billion = 0;
  int64_t heads = 0, hidden = 0, layers = 0;
  int64_t tp = 1, pp = 1, gpus = 1, batch = 1;
  double published_tflops_per_gpu = 0;  // TFLOP/s per GPU, eq. 3's FLOPs (recompute counted)
  // How the authors launched the row (examples/sc21/run_table_1.sh): MBS, the layers of one
  // virtual pipeline stage (0: the script sets none, plain 1F1B), --DDP-impl.
  int64_t micro_batch = 1, layers_per_virtual_stage = 0;
  std::string ddp_impl;  // "torch" (all-reduce in buckets during the last backward) or "local"
  // The table's common settings (§5.1) and hardware (§5), the same for every row.
  int64_t vocab_size = 0, seq_length = 0, gpus_per_node = 0;
  int64_t dp() const { return gpus / (tp * pp); }  // DERIVED: the paper does not print it
  int64_t nodes() const { return (gpus + gpus_per_node - 1) / gpus_per_node; }
};

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

struct PublishedFigures {
  std::string file;
  std::string megatron_source;  // the table's citation
  std::string megatron_launch_source;  // where each row's micro batch, DDP and virtual stages come from
  std::vector<MegatronRow> megatron;
  std::string nccl_source;  // the table's summary; every row cites its own source too
  std::vector<NcclRow> nccl;
};

inline constexpr int64_t kPublishedFiguresFormatVersion = 1;
inline constexpr const char* kPublishedFiguresRelativePath = "data/published.json";

// Strict reading: every key checked, row names unique across both tables; InputError naming the
// file, the key, the value and what is valid.
PublishedFigures parse_published_figures(const Json& json, const std::string& file);
PublishedFigures load_published_figures(const std::string& path);

}  // namespace stepcast::cli
