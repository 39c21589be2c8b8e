// The planner's cheap path: judging a candidate plan without lowering it. A probe lowers one
// transformer layer, the embedding and the loss once per (tp_size, sequence_parallel,
// micro_batch_size, recompute) with the same code as lower_program, and every candidate with
// those four shares it; closed forms over the plan's parameter groups and schedule do the rest:
//   - memory bounds per pipeline stage, lower ≤ `memory`'s peak ≤ upper (bytes, runtime
//     allowance included); the search walks a stage (lower_role) only when the device's limit
//     lies between them, so its verdict is `memory`'s;
//   - the quick estimate (quick_estimate.hpp's formula), the same figure quick_estimate gives
//     on the lowered program (tests check both).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "cost_model.hpp"
#include "model.hpp"
#include "plan.hpp"
#include "program.hpp"
#include "quick_estimate.hpp"
#include "topology.hpp"

namespace stepcast {

// What one layer, the embedding and the loss of microbatch 0 cost and keep, for one
// (tp_size, sequence_parallel, micro_batch_size, recompute) (and attention_impl, dropout).
struct LayerProbe {
  std::vector<Op> layer_ops;      // one layer: compute ops and tp collectives (fwd, bwd, recompute)
  std::vector<Op> embedding_ops;  // the first virtual stage's ops outside layers
  std::vector<Op> loss_ops;       // the last virtual stage's ops outside layers
  double kept_bytes = 0;          // a layer's activations kept for backward, its input included
  double layer_peak_bytes = 0;    // highest transient level of one layer's forward then backward
                                  // (input, output and incoming gradient included)
  bool send_staging = false;      // lowering keeps a staging copy of every pipeline send to the
                                  // end of the step (seen in the probe's program)
};

// Probes by key, built on first use. Safe to call from several threads.
class ProbeCache {
 public:
  ProbeCache(const ModelConfig& model, const Topology& topology) : model_(model), topology_(topology) {}
  const LayerProbe& get(const Plan& plan);

 private:
  const ModelConfig& model_;
  const Topology& topology_;
  std::mutex mutex_;
  std::map<std::tuple<int64_t, bool, int64_t, int, int, double, int64_t, int, int, int, int, bool>,
           std::unique_ptr<LayerProbe>>
      probes_;
};

// Bounds on one stage's peak (bytes, runtime allowance included) and its persistent bytes
// (weights, gradients, optimizer state: exact).
struct StageMemoryBounds {
  int64_t stage = 0;
  double persistent_bytes = 0;
  double lower_bytes = 0;
  double upper_bytes = 0;
};

// Bounds for every stage of a validated plan. The layers in flight come from memory_path_plan's
// schedule (the same most as the whole step's); buffers that grow with the step's microbatches
// (send staging) are bounded with the plan's own count.
std::vector<StageMemoryBounds> stage_memory_bounds(const Plan& plan, const ModelConfig& model,
                                                   const Topology& topology,
                                                   const LayerProbe& probe);

// Weights, gradients and optimizer state each stage of a validated plan holds for the whole step
// (bytes, exact: the persistent buffers lowering allocates, a MoE layer's experts sharded over
// edp): a lower bound on the stage's peak for any model, experts included.
std::vector<double> stage_persistent_bytes(const Plan& plan, const ModelConfig& model, const Topology& topology);

// The quick estimate of a validated plan from its probe.
QuickEstimate probe_estimate(const Plan& plan, const ModelConfig& model, const Topology& topology,
                             const LayerProbe& probe, const ComputeCostModel& cost_model);

}  // namespace stepcast
