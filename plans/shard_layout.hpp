// Which part of a parameter group a rank holds: its weights, gradients and optimizer state under
// ZeRO stage 0–3 over the data-parallel ranks, or over blocks of shard_size consecutive dp ranks
// under hybrid sharding (rank_grid.hpp's dp_shard group; the blocks hold identical replicas). Tensor parallelism has already split the group
// (`elements` are per tp rank, see param_layout.hpp); context and expert parallelism would add
// their own split here. Pure arithmetic in elements, used by the lowering (buffer sizes), the
// planner's memory probe and the executor (the slice each rank updates).
#pragma once

#include <cstdint>

namespace stepcast {

// What a rank keeps of a parameter group.
enum class ShardedState { weights, grads, optimizer };

// Elements [first, last) of a group, in the group's (tp-local) element order.
struct ShardRange {
  int64_t first = 0;
  int64_t last = 0;
  int64_t size() const { return last - first; }
  bool operator==(const ShardRange&) const = default;
};

class ShardLayout {
 public:
  // shard_size divides dp_size (0: dp_size).
  ShardLayout(int64_t zero_stage, int64_t dp_size, int64_t shard_size = 0);

  // Whether a rank holds a 1/shard_size slice of `state` (ZeRO-1 the optimizer state, ZeRO-2 also the
  // gradients, ZeRO-3 also the weights, where the slice is not the whole group) or all of it.
  bool sharded(ShardedState state) const;
  // Elements of the persistent buffer a rank allocates for `state`: the group, or its slice
  // rounded up (every rank allocates the same size; the last slice may hold fewer elements).
  int64_t buffer_elements(ShardedState state, int64_t group_elements) const;
  // The slice of dp rank `dp_rank`: chunk dp_rank mod shard_size of ceil(elements / shard_size)
  // elements.
  ShardRange slice(int64_t group_elements, int64_t dp_rank) const;
  // The elements of the group a rank's `state` buffer holds: its slice when sharded, else all.
  ShardRange held(ShardedState state, int64_t group_elements, int64_t dp_rank) const;
  // The elements a rank updates in the optimizer step: its slice from ZeRO-1 on, else all.
  ShardRange owned(int64_t group_elements, int64_t dp_rank) const {
    return held(ShardedState::optimizer, group_elements, dp_rank);
  }

  int64_t zero_stage() const { return zero_stage_; }
  int64_t dp_size() const { return dp_size_; }
  int64_t shard_size() const { return shard_size_; }

 private:
  int64_t zero_stage_;
  int64_t dp_size_;
  int64_t shard_size_;
};

}  // namespace stepcast
