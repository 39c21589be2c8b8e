// The FP8 part of a pipeline stage's step level in the planner's cheap path (search_probe.cpp),
// as lowering emits it: delayed scaling's amax all_reduce over every rank and its scale update
// (emit_fp8_scale_update); fp8_param_gather's casts of each layer's FP8 weights from the master
// shard, under current scaling after their amax and its all_reduce over the shard group
// (emit_fp8_param_casts), and the AdamW bytes it spares (emit_optimizer). Internal to plans/.
#pragma once

#include <utility>
#include <vector>

#include "cost_model.hpp"
#include "stage_layout.hpp"

namespace stepcast {

struct Fp8StepLevel {
  double spared_adamw_bytes = 0;                          // taken off AdamW's bytes
  double compute_s = 0;                                   // the scale update, the casts
  std::vector<std::pair<GroupKind, double>> all_reduces;  // (group, bytes), each its own op
};

Fp8StepLevel fp8_step_level(const LowerContext& c, const StageLayout& s, const ComputeCostModel& cost_model);

}  // namespace stepcast
