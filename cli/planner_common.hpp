// What the planner's commands (plan, compare-strategies, scale) share: progress lines, the
// search's refusals (no valid plan for the batch, no plan that fits, a model larger than the
// cluster) computed from the candidates, and number formatting.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <boost/program_options.hpp>

#include "model.hpp"
#include "search.hpp"
#include "topology.hpp"

namespace stepcast::cli {

// "\rWHAT: done/total (p%)" on stderr, every 10%.
Progress progress_printer(const std::string& what);

std::string fixed(double value, int digits);

// The search space of the command line's --global-batch-size, --max-memory-fraction, --dropout
// (absent: the model's stated dropout, else Megatron-LM's 0.1; dropout_from says which),
// --attention (materialized | flash, else InputError) and, where the command has it,
// --include-gpipe.
SearchSpace search_space_from(const boost::program_options::variables_map& vm, const ModelConfig& model);
// Where the search's dropout came from: "--dropout", "the model's attention_dropout" (its keys),
// or "Megatron-LM's default".
std::string dropout_from(const boost::program_options::variables_map& vm, const ModelConfig& model);
// "attention flash, dropout 0.1 (Megatron-LM's default)": the header line's words for them.
std::string attention_and_dropout(const SearchSpace& space, const std::string& dropout_source);
// --attention's and --dropout's help, shared by plan and compare-strategies.
inline constexpr const char* kAttentionHelp =
    "attention_impl of every candidate: flash (default, as Megatron-LM's --attention-backend auto, which "
    "runs fused attention on GPUs) or materialized (the scores kept: Megatron's local backend)";
inline constexpr const char* kDropoutHelp =
    "dropout of every candidate (default: the rate the model's config states where its dropout keys agree, "
    "e.g. Llama's attention_dropout 0.0, else Megatron-LM's 0.1)";

// The head of plan.json, strategies.json and scale.json, as simulate's prediction has it:
// schema_version, command, stepcast_version, git_commit, simulate_mode, and inputs (the files,
// the model and topology as read, and `inputs` besides).
Json planner_envelope(const std::string& command, const ModelConfig& model,
                      const Topology& topology, const std::string& sim_mode, Json inputs);

// --sim-mode of plan, compare-strategies and scale: how their child simulations run, simulate's
// "approx" (default: tensor parallelism folded even beside other groups in the node) or "fast".
void add_sim_mode_option(boost::program_options::options_description& options);
std::string sim_mode_from(const boost::program_options::variables_map& vm);  // InputError if bad

// Throws InputError when the model's 16 bytes per parameter exceed the whole cluster's memory,
// naming the nodes that would hold it.
void check_cluster_memory(const ModelConfig& model, const Topology& topology);
// The expert-layout options of plan and compare-strategies: --ep and --etp (comma lists of the
// sizes tried), --moe-dispatcher (alltoall, allgather or both), --moe-capacity-factor and
// --moe-routing-skew (what every candidate carries), --moe-lowered (SearchSpace::moe_lowered_plans). search_space_from reads them where the
// command has them (InputError naming the option and what is valid).
void add_moe_search_options(boost::program_options::options_description& options);
// A dense model given expert options: InputError naming the option and the model (nothing to
// lay out), rather than options silently ignored.
void refuse_moe_options_on_dense(const boost::program_options::variables_map& vm, const ModelConfig& model);

// Throws InputError when no candidate passed validation: the counts per reason and, when the
// batch size is the reason, the nearest batch sizes below and above that some plan accepts
// (each validated).
void refuse_no_valid_plan(const std::vector<Candidate>& candidates, const ModelConfig& model,
                          const Topology& topology, const SearchSpace& space);

// Throws InputError when no candidate fits: the plan with the smallest peak and which of the
// changes of suggest_fits make it fit, each checked.
void refuse_no_fit(const std::vector<Candidate>& candidates, const ModelConfig& model,
                   const Topology& topology, const SearchSpace& space);

// Tokens per step and MFU of a plan at `step_time_s`.
double tokens_per_step(const ModelConfig& model, const Plan& plan);
double model_flops_utilization(const ModelConfig& model, const Topology& topology, const Plan& plan,
                               double step_time_s);

}  // namespace stepcast::cli
