// A pipeline stage's parameter groups as lowering makes them (RoleLowering::collect_param_groups)
// and their persistent bytes: what the planner's probe path (search_probe.cpp) and its
// mixture-of-experts path (search_moe.cpp) read without lowering. Internal to plans/.
#pragma once

#include <cstdint>
#include <vector>

#include "lower_context.hpp"

namespace stepcast {

struct Group {
  int64_t elements = 0;  // per tp rank, before ZeRO
  int64_t sp_replicated = 0;
  int64_t chunk = 0;
  enum Kind { embedding, position, layer, final_norm, output, expert } kind = layer;
};

struct StageLayout {
  std::vector<Group> groups;  // in lowering order
  std::vector<int64_t> chunk_layers;
  bool has_first = false, has_last = false;
  int64_t first_chunk = -1, last_chunk = -1;
};

// The groups of `stage` in lowering order (a MoE layer's experts a group of their own after it).
StageLayout stage_layout(const LowerContext& c, int64_t stage);
// Weights, gradients and optimizer state of the groups (ZeRO shards; experts over edp; FP8 copies).
double persistent_bytes(const LowerContext& c, const StageLayout& s);

}  // namespace stepcast
