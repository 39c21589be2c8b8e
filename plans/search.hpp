// The planner: enumerate every plan of a model on a topology, prune what cannot run (each with
// the reason validate_plan or the memory model gives), rank the rest with the quick estimate and
// re-time the most promising with an evaluator passed in by the caller (the command line passes
// `simulate` in a child process; tests pass a fake), so plans/ never depends on sim/.
// Pure functions over data, except that check_candidates and search run their work on `jobs`
// threads; the evaluator must be safe to call from two threads at once.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cost_model.hpp"
#include "model.hpp"
#include "plan.hpp"
#include "quick_estimate.hpp"
#include "topology.hpp"

namespace stepcast {

// The space searched. Every plan uses every device (tp·pp·dp = devices, as Megatron does); tp
// ranges over the divisors of devices_per_node (TP stays in a node), pp over the divisors of
// devices / tp. Fixed choices, not searched: dtype bf16 (fp32 where the device has no bf16
// peak), dropout 0.1, materialized attention, overlap_grad_reduce when dp > 1,
// overlap_param_gather when zero_stage ≥ 1 and dp > 1, Megatron's default buckets and layer split.
struct SearchSpace {
  int64_t global_batch_size = 0;
  std::vector<int64_t> micro_batch_sizes{1, 2, 4, 8};
  std::vector<int> zero_stages{0, 1, 2, 3};
  std::vector<int64_t> virtual_pp_sizes{2, 3, 4};  // interleaved_1f1b variants when pp > 1
  bool include_gpipe = false;
  double max_memory_fraction = 1.0;  // fits ⇔ peak + reserved ≤ fraction · capacity
};

struct Candidate {
  Plan plan;                    // resolved by validate_plan when it passed
  std::string pruned;           // empty: kept; else the reason's category, e.g. "global_batch_size: not divisible"
  std::string pruned_detail;    // the full message
  bool memory_checked = false;
  double peak_bytes_max = 0;    // memory_report's, on the planner's memory path
  bool peak_is_lower_bound = false;  // pruned on weights and optimizer state alone (not lowered)
  double reserved_bytes = 0;
  double capacity_bytes = 0;
  QuickEstimate estimate;
  std::optional<double> step_time_s;  // from the evaluator
  std::string evaluation_error;       // when the evaluator threw
  bool kept() const { return pruned.empty(); }
};

// Every combination of the space, validated: those validate_plan refuses are pruned with the
// category of its InputError (key and reason, numbers left out) and the full message.
std::vector<Candidate> enumerate_candidates(const ModelConfig& model, const Topology& topology,
                                            const SearchSpace& space);

// The plan the memory path lowers: the same plan with num_microbatches capped at 2·pp_size
// (a multiple of pp_size, more than pp_size) when the plan has more. For 1f1b and interleaved
// schedules no stage holds more than that many passes in flight, so the peak is the same;
// gpipe keeps every microbatch. Lowering cost then no longer grows with the batch.
Plan memory_path_plan(const Plan& plan);

// Checks one kept candidate's memory (memory_report of memory_path_plan's program, against
// max_memory_fraction) and, when it fits, its quick estimate. Prunes it "does not fit in
// memory" otherwise. A candidate whose weights and optimizer state alone exceed the memory is
// pruned without lowering.
void check_candidate(Candidate& candidate, const ModelConfig& model, const Topology& topology,
                     const SearchSpace& space, const ComputeCostModel& cost_model);

using Progress = std::function<void(int64_t done, int64_t total)>;
void check_candidates(std::vector<Candidate>& candidates, const ModelConfig& model,
                      const Topology& topology, const SearchSpace& space,
                      const ComputeCostModel& cost_model, int jobs, const Progress& progress);

// Returns step_time_s of a plan; may throw (recorded as evaluation_error).
using Evaluator = std::function<double(const Plan&)>;

enum class Objective { time, memory };

// Ranks the kept candidates by quick estimate (objective time) or by peak memory (objective
// memory, ties by estimate), evaluates the best `evaluate_count` with `evaluate` on `jobs`
// threads, and returns every kept candidate: for time, evaluated ones first by their
// step_time_s, then the rest by estimate; for memory, the memory order. Pruned ones are left out.
std::vector<Candidate> search(std::vector<Candidate> candidates, const Evaluator& evaluate,
                              int64_t evaluate_count, int jobs, const Progress& progress,
                              Objective objective = Objective::time);

// Counts of pruned candidates per reason category.
std::map<std::string, int64_t> pruned_counts(const std::vector<Candidate>& candidates);

// "tp8-pp1-dp8-z1-mbs1-1f1b-selective-sp"
std::string plan_name(const Plan& plan);

// Megatron-LM's command-line arguments for the plan; notes for what Megatron-LM has no flag for.
struct MegatronArguments {
  std::vector<std::string> arguments;
  std::vector<std::string> notes;
};
MegatronArguments megatron_arguments(const Plan& plan, const ModelConfig& model);

// What would make a plan fit: the plan with zero_stage 3, with full recompute, with
// micro_batch_size 1, with flash attention, and on twice the nodes (dp doubled), each checked
// with the memory path. Changes that do not validate are reported with their reason.
struct FitSuggestion {
  std::string change;
  bool fits = false;
  double peak_bytes_max = 0;
  std::string note;  // why it could not be checked
};
std::vector<FitSuggestion> suggest_fits(const Plan& plan, const ModelConfig& model,
                                        const Topology& topology, const SearchSpace& space);

}  // namespace stepcast
