// The FP8 part of a stage's step level for the planner's cheap path; see search_fp8_step.hpp.
#include "search_fp8_step.hpp"

namespace stepcast {

Fp8StepLevel fp8_step_level(const LowerContext& c, const StageLayout& s, const ComputeCostModel& cost_model) {
  const Plan& plan = c.plan;
  const double wide = dtype_bytes(c.wide);
  Fp8StepLevel out;
  if (plan.fp8.delayed()) {  // the end of the step's amax over every rank, then the scales' update
    const double slots = double(c.model.num_hidden_layers) * kFp8SlotsPerLayer;
    const double len = double(plan.fp8.amax_history_len);
    out.all_reduces.push_back({GroupKind::world, slots * wide});
    Op update;
    update.kind = OpKind::optimizer_step;
    update.phase = Phase::optimizer;
    update.name = OpName::fp8_scale_update;
    update.flops = slots * (len + 4);
    update.bytes = slots * (2 * len + 4) * wide;
    out.compute_s += cost_model.op_time_s(update);
  }
  if (!plan.fp8.param_gather) return out;
  const double linear = double(c.layer_linear_weights());
  const bool current = plan.fp8.current();
  for (const Group& g : s.groups) {
    if (g.kind != Group::layer) continue;
    const double shard = double(c.shards.buffer_elements(ShardedState::optimizer, g.elements)) * linear /
                         double(g.elements);
    out.spared_adamw_bytes += adamw_spared_bytes(c.act) * shard;
    Op op;
    op.kind = OpKind::activation;
    op.phase = Phase::optimizer;
    for (bool cast : {false, true}) {
      if (!cast && !current) continue;
      const Fp8WeightsCast cost = fp8_param_cost(shard, c.wide, cast);
      op.name = cast ? OpName::fp8_param_cast : OpName::fp8_param_absmax;
      op.flops = cost.flops;
      op.bytes = cost.bytes;
      out.compute_s += cost_model.op_time_s(op);
    }
  }
  if (current) {
    const GroupKind shard_group = plan.num_distributed_optimizer_instances > 1 ? GroupKind::dp_shard
                                  : plan.cp_size > 1                           ? GroupKind::dp_cp
                                                                               : GroupKind::dp;
    out.all_reduces.push_back({shard_group, double(c.fp8_slots.count()) * wide});
  }
  return out;
}

}  // namespace stepcast
