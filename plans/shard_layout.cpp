// The ZeRO shard arithmetic of shard_layout.hpp.
#include "shard_layout.hpp"

#include <algorithm>

#include "errors.hpp"

namespace stepcast {

ShardLayout::ShardLayout(int64_t zero_stage, int64_t dp_size, int64_t shard_size)
    : zero_stage_(zero_stage), dp_size_(dp_size), shard_size_(shard_size == 0 ? dp_size : shard_size) {
  STEPCAST_CHECK(zero_stage >= 0 && zero_stage <= 3, "ZeRO stage outside 0–3");
  STEPCAST_CHECK(dp_size >= 1, "dp_size below 1");
  STEPCAST_CHECK(shard_size_ >= 1 && dp_size % shard_size_ == 0, "shard group size does not divide dp_size");
}

bool ShardLayout::sharded(ShardedState state) const {
  switch (state) {
    // A shard group of one rank holds the whole group: nothing to gather before each use (a
    // gather over one rank is no op of the program, which would leave the gathered copy unset).
    case ShardedState::weights: return zero_stage_ >= 3 && shard_size_ > 1;
    case ShardedState::grads: return zero_stage_ >= 2;
    case ShardedState::optimizer: return zero_stage_ >= 1;
  }
  return false;
}

int64_t ShardLayout::buffer_elements(ShardedState state, int64_t group_elements) const {
  return sharded(state) ? (group_elements + shard_size_ - 1) / shard_size_ : group_elements;
}

ShardRange ShardLayout::slice(int64_t group_elements, int64_t dp_rank) const {
  STEPCAST_CHECK(dp_rank >= 0 && dp_rank < dp_size_, "dp rank outside the group");
  int64_t size = (group_elements + shard_size_ - 1) / shard_size_;
  int64_t first = std::min(group_elements, dp_rank % shard_size_ * size);
  return {first, std::min(group_elements, first + size)};
}

ShardRange ShardLayout::held(ShardedState state, int64_t group_elements, int64_t dp_rank) const {
  return sharded(state) ? slice(group_elements, dp_rank) : ShardRange{0, group_elements};
}

}  // namespace stepcast
