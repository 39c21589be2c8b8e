// `stepcast validate --sweep published`: predicts published multi-GPU results from the shipped
// datasheet profiles (profiles/*.json), never fitted to them, and reports each row's error:
// Megatron-LM SC'21 Table 1 (TFLOP/s per GPU) and nccl-tests bus bandwidths, both read at run time
// from data/published.json (published_figures.hpp), each figure with its source. Table 1
// rows are simulated in child processes
// (`stepcast simulate`, one SimGrid engine per process); nccl-tests rows come from the collective
// cost model (published_rows.hpp) on the matching topology and profile. A component section
// per profile predicts every published component figure the profile holds (components.hpp).
// Errors are (predicted − published) / published; means are of their absolute values.
#pragma once

#include <string>
#include <vector>

#include "simulation_request.hpp"

namespace stepcast::cli {

struct PublishedOptions {
  std::vector<std::string> rows;  // row names to run (Megatron and nccl); empty: all
  int jobs = 2;                    // concurrent child simulations
  // Profiles from this folder instead of the repository's profiles/ (an ablation: the same
  // profiles with a component taken out); empty: profiles/.
  std::string profile_dir;
  // An earlier published.json: each Table 1 row shows its error and breakdown there beside now.
  std::string baseline;
  // The published figures from this file instead of the repository's data/published.json.
  std::string figures_file;
};

// Writes OUT_DIR/published.md, published.json and published.html; prints a line per row.
// Returns 0 when every row ran, 1 when a simulation failed (recorded in the report). The Table 1
// rows' simulations run through `runner`, options.jobs at a time on each of its ranks.
int validate_published(const std::string& out_dir, const PublishedOptions& options, SimulationRunner& runner);

}  // namespace stepcast::cli
