// The planner's quick analytical estimate of one step's time, from a lowered StepProgram: no
// simulation, no contention. It ranks candidates; `simulate` re-times the most promising.
// Formula (seconds), with m = num_microbatches, p = pp_size, v = virtual_pp_size:
//   t_mb(stage)  = Σ cost-model time of the stage's compute ops of microbatch 0 (forward,
//                  backward, recompute, every chunk) + Σ time of its tp collectives of
//                  microbatch 0 (exposed: they sit between the GEMMs that need them)
//                  + pipeline sends of microbatch 0 (bytes / link bandwidth + latency, times
//                  the profile's measured send table's correction where it has one:
//                  collective_cost.hpp's p2p_time_s, as the simulator's send flows take it)
//                  (collective times as the simulator costs them without contention:
//                  collective_cost.hpp's uncontended_collective_s — the profile's link fractions
//                  and measured tables; links with the link fractions)
//                  + dp collectives of microbatch 0 (ZeRO-3 gathers: counted as exposed)
//                  (mixtures of experts, dropless: the experts' grouped GEMMs on the busiest ep
//                  rank, each expert's GEMM with its expected rows — routed copies × its
//                  layer's routing share, or averaged over the measured samples a histogram
//                  gives (at most 64 a layer), which the simulator replays — as the simulator
//                  costs a draw; dispatch and combine all_to_alls as exposed, like tp's, times
//                  the busiest rank's expected load over the mean (the samples' mean);
//                  under a capacity buffers are padded, so the ops as lowered. The experts' edp
//                  reductions and gathers count as dp's)
//                  (context parallelism: the gathers and all-to-alls over cp as exposed, like
//                  tp's; the p2p ring's receives by CpRingClock: what the attention blocks
//                  between a send and its receive do not hide)
//   pipeline     = max_stage t_mb · m / (1 − f),  f = ideal_bubble_fraction(schedule, p, v, m)
//   (dp collectives of microbatch 0 with overlap_grad_reduce and no ZeRO-3 gathers among them:
//    the reductions go on beside the next microbatch on the comm stream, so ((m − 1) · max(0,
//    dp − compute of a microbatch) + max(0, dp − its backward)) / m of them per microbatch; a
//    microbatch's ZeRO-3 gathers are needed in it, so with them max(0, dp − its backward))
//   dp_exposed   = Σ time of the step-level dp collectives (gradient reduction, parameter
//                  gather); with overlap_grad_reduce only what one microbatch's backward cannot
//                  hide: max(dp / buckets, dp − backward of one microbatch)
//   optimizer    = Σ cost-model time of the step-level compute ops (grad norm, AdamW)
//   step_time_s  = pipeline + dp_exposed + optimizer  (taken on the slowest stage)
// The program may be lowered with fewer microbatches than the plan (planner's memory path):
// only microbatch 0 and step-level ops are read, and m comes from `num_microbatches`.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "collective.hpp"
#include "cost_model.hpp"
#include "plan.hpp"
#include "program.hpp"
#include "topology.hpp"

namespace stepcast {

class CollectiveCostModel;  // collective_cost.hpp

struct QuickEstimate {
  double step_time_s = 0;
  double compute_s = 0;        // m · compute per microbatch on the critical stage
  double tp_comm_s = 0;        // m · exposed tp collectives on the critical stage
  double pp_comm_s = 0;        // m · pipeline sends on the critical stage
  double bubble_s = 0;
  double dp_comm_s = 0;        // exposed dp communication (step-level and per-microbatch)
  double optimizer_s = 0;
  int64_t critical_stage = 0;
  // Mixtures of experts, on the critical stage (parts of tp_comm_s and compute_s above): m · the
  // expert-parallel collectives (dispatch and combine, ep and etp groups), and m · the expert
  // GEMMs' time on the busiest ep rank beyond the ops as lowered (the mean load): the routing's
  // expected imbalance, and the GEMMs' efficiency at its rows per expert (negative where fewer,
  // larger GEMMs run faster).
  double ep_comm_s = 0;
  double expert_imbalance_s = 0;
  // Context parallelism, on the critical stage (part of tp_comm_s above): m · the cp exchanges
  // exposed (the ring's waits, the gathers and all-to-alls over cp).
  double cp_comm_s = 0;
  // Payload bytes one rank sends per step by group kind ("tp", "dp", "pp", "embedding",
  // "model", "world"; "ep", "etp", "edp" with experts), the largest over stages, as
  // program_stats counts them. Filled by the planner (probe_estimate, and the MoE path's
  // candidate_estimate and check_moe_candidate); quick_estimate leaves it empty.
  std::map<std::string, double> comm_bytes_per_rank_max;
};

// The formula's inputs for one stage (seconds): what quick_estimate reads from a role's ops and
// probe_estimate (search_probe.hpp) computes without lowering.
struct StageTimes {
  int64_t stage = 0;
  double compute_mb_s = 0;   // compute ops of microbatch 0
  double backward_mb_s = 0;  // of which backward (what overlapped reduction can hide behind)
  double tp_mb_s = 0;        // tp / embedding / other non-dp collectives of microbatch 0
  double pp_mb_s = 0;        // sends of microbatch 0
  double dp_mb_s = 0;        // dp collectives of microbatch 0 (ZeRO-2/3 every pass)
  double zero3_mb_s = 0;     // of which ZeRO-3's parameter gathers
  double dp_step_s = 0;      // dp collectives once per step (buckets of the last pass, gathers)
  int64_t dp_step_ops = 0;
  double step_level_s = 0;   // optimizer compute and step-level collectives outside dp
  double ep_mb_s = 0;         // of tp_mb_s: ep and etp collectives of microbatch 0
  double imbalance_mb_s = 0;  // of compute_mb_s: the busiest ep rank's expert GEMMs beyond the ops as lowered
  double cp_mb_s = 0;         // of tp_mb_s: cp collectives and the ring's exposed waits
};

// The context-parallel ring (cp_comm_type p2p) over one microbatch's ops in program order, as
// every cp rank runs them in lockstep and as the interpreters post transfers: a send starts once
// its block is here, after the transfers its link (to cp_next, one direction) already carries;
// its receive (the same tag, from cp_prev, sent at the same moment) is posted and the block
// arrives with the send; the compute stream waits only at the first op that reads the block.
// Those waits are the ring's exposed time.
class CpRingClock {
 public:
  // A transfer takes `sends`' point-to-point time (CollectiveCostModel::p2p_time_s: the link
  // with the profile's link fractions, and its measured send table where it has one) on the
  // ring's slowest hop: across nodes where the ring spans them. `sends` outlives the clock.
  CpRingClock(const CollectiveCostModel& sends, bool across_nodes) : sends_(&sends), across_(across_nodes) {}
  // An op of the compute stream taking `seconds`, after the ring blocks it reads.
  void compute(const Op& op, double seconds);
  void transfer(const Op& op);  // a ring send or receive (is_cp_ring_transfer)
  double exposed_s() const { return exposed_; }

 private:
  double ready_s(std::span<const BufferName> buffers) const;  // when they are all here

  const CollectiveCostModel* sends_;
  bool across_;
  double now_ = 0, link_free_ = 0, exposed_ = 0;
  std::map<int64_t, double> sent_;                // tag → when the block sent with it arrives
  std::map<std::string, double> arriving_;        // received buffer → when it is here
};

// Whether an op is a ring transfer of context parallelism (a send to cp_next, a receive from
// cp_prev).
bool is_cp_ring_transfer(const Op& op);
// The ring's clock from a rank of `grid`: across nodes when its cp group spans nodes.
CpRingClock cp_ring_clock(const RankGrid& grid, int64_t rank, int64_t devices_per_node,
                          const CollectiveCostModel& sends);

// Each pipeline stage's compute speed on `topology`: the smallest compute speed factor among
// its ranks' devices (the slowest device paces its tensor-parallel group and the stage's
// reductions). Empty on a topology of equal devices.
std::vector<double> stage_speeds(const Plan& plan, const Topology& topology);

// The same over the ranks of data-parallel replica `dp_rank` only (-1: every replica, as
// stage_speeds), and each replica's speed (its slowest device's factor). Empty on a topology of
// equal devices.
std::vector<double> stage_speeds(const Plan& plan, const Topology& topology, int64_t dp_rank);
std::vector<double> replica_speeds(const Plan& plan, const Topology& topology);

// combine_stage_times for the plan's replicas: with unequal replicas (microbatches_per_replica),
// the slowest of each replica's estimate over its own microbatches and stage speeds.
QuickEstimate combine_replica_times(const std::vector<StageTimes>& stages, const Plan& plan, const Topology& topology);

// The formula over the stages' times; the slowest stage is the estimate. With stage_speed (one
// per stage), a stage's compute takes 1 / its speed of its cost (its optimizer step and
// collectives as costed).
QuickEstimate combine_stage_times(const std::vector<StageTimes>& stages, const Plan& plan,
                                  int64_t num_microbatches, const std::vector<double>& stage_speed = {});

QuickEstimate quick_estimate(const StepProgram& program, const Plan& plan,
                             int64_t num_microbatches, const Topology& topology,
                             const ComputeCostModel& cost_model);

}  // namespace stepcast
