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
#include "megatron_export.hpp"
#include "model.hpp"
#include "plan.hpp"
#include "quick_estimate.hpp"
#include "search_probe.hpp"
#include "topology.hpp"

namespace stepcast {

// The space searched. Every plan uses every device (tp·pp·dp = devices, as Megatron does); tp
// ranges over the divisors of devices_per_node (TP stays in a node), pp over the divisors of
// devices / tp. Fixed choices, not searched: dtype bf16 (fp32 where the device has no bf16
// peak), dropout 0.1, materialized attention, overlap_grad_reduce when dp > 1,
// overlap_param_gather when zero_stage ≥ 1 and dp > 1, Megatron's default buckets and layer split.
// Hybrid sharding: a ZeRO plan whose dp group leaves the node is also tried with its shards kept
// inside a node (dp_shard_size = devices_per_node / tp, replicas across nodes), as HSDP does.
struct SearchSpace {
  int64_t global_batch_size = 0;
  std::vector<int64_t> micro_batch_sizes{1, 2, 4, 8};
  std::vector<int> zero_stages{0, 1, 2, 3};
  bool hybrid_sharding = true;
  std::vector<int64_t> virtual_pp_sizes{2, 3, 4};  // interleaved_1f1b variants when pp > 1
  bool include_gpipe = false;
  AttentionImpl attention_impl = AttentionImpl::materialized;
  Fp8Recipe fp8;  // every candidate's (plan --fp8): off, or e4m3 / hybrid with Megatron's defaults
  // Context-parallel sizes tried (each with cp_comm_types); empty: 1 and, with flash attention, the powers of two
  // up to 32 that leave each cp rank at least 8,192 tokens (sequences of 16,384 and more).
  std::vector<int64_t> context_parallel_sizes;
  // How cp > 1 candidates exchange K/V (the first is the one cp 1 plans carry): Megatron's three.
  std::vector<CpCommType> cp_comm_types = {CpCommType::p2p, CpCommType::all_gather, CpCommType::a2a};
  double dropout = 0.1;
  double max_memory_fraction = 1.0;  // fits ⇔ peak + reserved ≤ fraction · capacity
  // Prune what Megatron-LM cannot run as simulated (megatron_arguments' runnable is false).
  bool megatron_runnable_only = false;
  // Mixtures of experts (the model has experts; ignored otherwise). Expert-parallel sizes tried:
  // empty, every divisor of the experts that, times the etp size, divides a stage's tp·cp·dp
  // ranks; expert-tensor-parallel sizes: empty, 1 and tp (Megatron's default); the dispatchers;
  // and what every candidate carries besides (moe: capacity factor, routing, seed; its ep, etp
  // and dispatcher are the searched ones).
  std::vector<int64_t> expert_parallel_sizes;
  std::vector<int64_t> expert_tensor_parallel_sizes;
  std::vector<MoeDispatcher> moe_dispatchers = {MoeDispatcher::alltoall, MoeDispatcher::allgather};
  MoePlan moe;
  // Mixture-of-experts candidates lowered exactly, in the screen's order, until this many fit
  // (check_moe_candidates); 0: every candidate.
  int64_t moe_lowered_plans = 64;
};

struct Candidate {
  Plan plan;                    // resolved by validate_plan when it passed
  std::string pruned;           // empty: kept; else the reason's category, e.g. "global_batch_size: not divisible"
  std::string pruned_detail;    // the full message
  bool memory_checked = false;
  // Peak bytes per device (runtime allowance included) as `stepcast memory` computes it less the
  // arena's placement (the screen walks shortened programs, whose layout differs; memory.hpp):
  // exact when peak_exact (its stages were walked), otherwise only its bounds are known and
  // peak_bytes_max is the upper bound (the lower bound for a plan pruned on it).
  bool peak_exact = false;
  double peak_bytes_max = 0;
  double peak_lower_bytes = 0;
  double peak_upper_bytes = 0;
  bool peak_is_lower_bound = false;  // pruned on a lower bound (or one walked stage) alone
  int64_t walked_stages = 0;         // stages lowered to decide (memory path)
  bool whole_step_walk = false;      // walks lower every microbatch (lowering keeps send staging)
  std::vector<StageMemoryBounds> stage_bounds;
  double reserved_bytes = 0;
  double capacity_bytes = 0;
  QuickEstimate estimate;
  std::optional<double> step_time_s;  // from the evaluator
  // Objective energy: joules per step from the estimate and the device's power (the pre-rank),
  // and from the simulation where it ran (set by the caller after search).
  double estimate_energy_j = 0;
  std::optional<double> energy_per_step_j;
  std::string evaluation_error;       // when the evaluator threw
  bool kept() const { return pruned.empty(); }
};

// Every combination of the space, validated: those validate_plan refuses are pruned with the
// category of its InputError (key and reason, numbers left out) and the full message.
std::vector<Candidate> enumerate_candidates(const ModelConfig& model, const Topology& topology,
                                            const SearchSpace& space);

// The plan whose program the quick estimate reads: the same plan with num_microbatches capped at
// 2·pp_size (a multiple of pp_size, more than pp_size) when the plan has more; gpipe keeps every
// microbatch. No 1f1b or interleaved stage has more passes in flight, so the layers in flight
// (the memory bounds' schedule) are the whole step's, and the peak is the whole program's unless
// lowering keeps buffers to the step's end (send staging): then walks take the whole step.
// A mixture of experts keeps the step's routing draws (MoePlan::draw_microbatches) for its
// dropless buffers. Unequal replicas (microbatches_per_replica) are walked as equal replicas of the
// busiest one's microbatches.
Plan memory_path_plan(const Plan& plan);

// Checks one kept candidate's memory and, when it fits, its quick estimate (probe_estimate).
// The verdict is `stepcast memory`'s against max_memory_fraction, decided on the stages' bounds
// (search_probe.hpp) where they do not straddle the limit and by walking the memory of the
// stages whose bounds do (lower_role on memory_path_plan). Prunes it "does not fit in memory".
void check_candidate(Candidate& candidate, const ModelConfig& model, const Topology& topology,
                     const SearchSpace& space, const ComputeCostModel& cost_model,
                     ProbeCache& probes);
// The memory half of check_candidate (safe to run on several threads).
void check_candidate_memory(Candidate& candidate, const ModelConfig& model,
                            const Topology& topology, const SearchSpace& space, ProbeCache& probes);

using Progress = std::function<void(int64_t done, int64_t total)>;
void check_candidates(std::vector<Candidate>& candidates, const ModelConfig& model,
                      const Topology& topology, const SearchSpace& space,
                      const ComputeCostModel& cost_model, int jobs, const Progress& progress);

// Prunes `candidate` "does not fit in memory": `what` peaks at (or needs at least) `peak` bytes,
// more than `allowed`; peak_bytes_max and its lower bound set to `peak`.
void prune_for_memory(Candidate& candidate, double peak, double allowed, const std::string& what);

// Mixtures of experts (search_moe.cpp): no probe (a MoE layer's groups and buffers are not the
// dense layer's; its rows follow the routing draws). The stages' persistent bytes
// (stage_persistent_bytes) prune first; a candidate they do not prune has the memory path's
// program lowered once: every stage walked (peak_exact, `memory`'s verdict) and, with a cost
// model, the quick estimate read from the same program (check_moe_candidate; check_candidate_memory
// and check_candidate take this path for a MoE model). Lowering a large MoE model's candidates
// takes a fraction of a second each, so check_moe_candidates (on `jobs` threads) lowers them in
// the order of a screen — those the dense twin's kept activations (each MLP as wide as what a
// token passes through) say fit first, then by the twin's probe estimate plus the dispatch and
// combine over ep — until space.moe_lowered_plans fit; the
// rest are pruned "not lowered: below the best the MoE screen ranks", with their rank.
void check_moe_candidate(Candidate& candidate, const ModelConfig& model, const Topology& topology,
                         const SearchSpace& space, const ComputeCostModel* cost_model);
void check_moe_candidates(const std::vector<Candidate*>& kept, const ModelConfig& model, const Topology& topology,
                          const SearchSpace& space, const ComputeCostModel& cost_model, int jobs,
                          const Progress& progress);
// The quick estimate of a validated plan: probe_estimate, or for a MoE model quick_estimate on
// the memory path's lowered program.
QuickEstimate candidate_estimate(const Plan& plan, const ModelConfig& model, const Topology& topology,
                                 ProbeCache& probes, const ComputeCostModel& cost_model);

// `stepcast memory`'s peak of a checked candidate: walks the stages whose upper bound reaches
// the largest lower bound (no other stage can hold the peak) and sets peak_exact.
void resolve_peak(Candidate& candidate, const ModelConfig& model, const Topology& topology);

// For --objective memory: resolves the peak of every kept candidate that can be among the
// `count` smallest (lower bound ≤ the count-th smallest upper bound).
void resolve_smallest_peaks(std::vector<Candidate>& candidates, int64_t count,
                            const ModelConfig& model, const Topology& topology, int jobs);

// Returns step_time_s of a plan; may throw (recorded as evaluation_error).
using Evaluator = std::function<double(const Plan&)>;

enum class Objective { time, memory, energy };

// Ranks the kept candidates by quick estimate (objective time), by peak memory (objective
// memory: the exact peak where resolved, else the lower bound; ties by estimate) or by
// estimate_energy_j (objective energy; ties by estimate), evaluates the best `evaluate_count` with `evaluate` on `jobs`
// threads, and returns every kept candidate: for time, evaluated ones first by their
// step_time_s, then the rest by estimate; for memory and energy, that order (energy: the caller
// re-ranks by the simulations' energy, see rank_by_energy). Pruned ones are left out.
// With evaluate_stride > 0, every evaluate_stride-th candidate after the first evaluate_count
// (in the ranking order) is evaluated too: a sample over the whole range, for studying the
// estimate's quality.
std::vector<Candidate> search(std::vector<Candidate> candidates, const Evaluator& evaluate,
                              int64_t evaluate_count, int jobs, const Progress& progress,
                              Objective objective = Objective::time, int64_t evaluate_stride = 0);

// The estimated energy of one step (step_energy of every device alike): idle power for the estimated step, and
// power_busy_w - power_idle_w more while the critical stage computes (its compute and optimizer).
double estimate_energy_j(const QuickEstimate& estimate, int64_t devices, double power_idle_w, double power_busy_w);

// Objective energy after the simulations: those with a simulated energy first, fewest joules
// first, then the rest in their order (by estimate_energy_j).
void rank_by_energy(std::vector<Candidate>& ranked);

// Spearman's rank correlation of two equally long series (ties get their average rank);
// NaN with fewer than two points or a constant series.
double spearman_rank_correlation(const std::vector<double>& x, const std::vector<double>& y);

// Amdahl's serial fraction f from scaling points (x = n₀/n, y = 1/speedup against the run on
// n₀): the least-squares fit of y = f + (1 − f)·x, f = Σ(1 − x)(y − x) / Σ(1 − x)². NaN without
// a point where x ≠ 1.
double amdahl_serial_fraction(const std::vector<std::pair<double, double>>& xy);

// Counts of pruned candidates per reason category.
std::map<std::string, int64_t> pruned_counts(const std::vector<Candidate>& candidates);

// "tp8-pp1-dp8-z1-mbs1-1f1b-selective-sp"; with experts "-ep8" and, where they differ from
// Megatron's defaults, "-etp1" (etp ≠ tp) and "-agd" (the allgather dispatcher).
std::string plan_name(const Plan& plan);

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
