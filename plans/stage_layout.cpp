// A stage's parameter groups and persistent bytes; see stage_layout.hpp.
#include "stage_layout.hpp"

#include "search_probe.hpp"

namespace stepcast {

StageLayout stage_layout(const LowerContext& c, int64_t stage) {
  const Plan& plan = c.plan;
  StageLayout s;
  for (int64_t chunk = 0; chunk < plan.virtual_pp_size; ++chunk) {
    int64_t vs = c.virtual_stage(stage, chunk);
    int64_t n = plan.layers_per_stage[size_t(vs)];
    s.chunk_layers.push_back(n);
    if (vs == 0) {
      s.has_first = true;
      s.first_chunk = chunk;
      s.groups.push_back({c.vocab_local * c.h, 0, chunk, Group::embedding});
      if (c.model.position == PositionKind::learned) {
        int64_t e = c.model.max_position_embeddings * c.h;
        s.groups.push_back({e, e, chunk, Group::position});
      }
    }
    for (int64_t l = 0; l < n; ++l) {
      const int64_t layer = c.first_layer(vs) + l;
      s.groups.push_back({c.layer_params_local(layer), c.layer_sp_replicated(layer), chunk, Group::layer});
      // A MoE layer's routed experts: a group of their own, sharded over edp (the MoE planner's
      // persistent bound only; the probe path takes dense models).
      if (c.model.is_moe_layer(layer)) s.groups.push_back({c.expert_params_local(), 0, chunk, Group::expert});
    }
    if (vs == c.num_virtual_stages - 1) {
      s.has_last = true;
      s.last_chunk = chunk;
      s.groups.push_back({c.norm_params(), c.norm_params(), chunk, Group::final_norm});
      if (!(c.model.tie_word_embeddings && plan.pp_size == 1)) {
        s.groups.push_back({c.vocab_local * c.h, 0, chunk, Group::output});
      }
    }
  }
  return s;
}

double persistent_bytes(const LowerContext& c, const StageLayout& s) {
  double act = dtype_bytes(c.act), grad = dtype_bytes(c.grad), wide = dtype_bytes(c.wide);
  double states = act < 4 ? 3 : 2;
  double total = 0;
  for (const Group& g : s.groups) {
    const ShardLayout& shards = g.kind == Group::expert ? c.expert_shards : c.shards;
    // fp8_param_gather: a layer's linear weights in FP8 only, with a master copy, its other tensors
    // whole (lowering's ParamGroup; under ZeRO-3 the codes sharded).
    const int64_t fp8_only = c.plan.fp8.param_gather && g.kind == Group::layer ? c.layer_linear_weights() : 0;
    int64_t w = fp8_only > 0 ? g.elements - fp8_only : shards.buffer_elements(ShardedState::weights, g.elements);
    int64_t gr = shards.buffer_elements(ShardedState::grads, g.elements);
    int64_t o = shards.buffer_elements(ShardedState::optimizer, g.elements);
    total += double(w) * act + double(gr) * grad + double(o) * (fp8_only > 0 ? 3 : states) * wide;
    // The FP8 weight copy of a layer (and of its experts) and its transpose, unless ZeRO-3 shards
    // the weights (the copies are then cast at each use, search_probe's transient bytes).
    const bool fp8_copy = (g.kind == Group::layer || g.kind == Group::expert) && !shards.sharded(ShardedState::weights);
    if (c.fp8 && fp8_copy) {
      total += storage_bytes(c.fp8_weights, double(g.elements)) * (c.fp8_weights_transposed ? 2 : 1);
    } else if (fp8_only > 0) {
      total += storage_bytes(c.fp8_weights, double(shards.buffer_elements(ShardedState::weights, g.elements)));
    }
  }
  if (c.fp8 && !c.block_scaled) {  // every layer's scale and amax slots (and delayed scaling's history) on every rank
    const double slots = double(c.fp8_slots.count());
    total += slots * wide * (2 + (c.plan.fp8.delayed() ? double(c.plan.fp8.amax_history_len) : 0.0));
  }
  return total;
}

std::vector<double> stage_persistent_bytes(const Plan& real_plan, const ModelConfig& model, const Topology& topology) {
  Plan plan = real_plan;
  plan.moe.draw_microbatches = -1;  // (parameters only: no routing draws for the buffers)
  LowerContext c(model, topology, plan);
  std::vector<double> out;
  for (int64_t stage = 0; stage < plan.pp_size; ++stage) out.push_back(persistent_bytes(c, stage_layout(c, stage)));
  return out;
}

}  // namespace stepcast
