// Arena planning and lookup; see arena.hpp.
#include "arena.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>

#include "errors.hpp"

namespace stepcast {

ArenaPlan plan_arena(const Role& role, int64_t alignment) {
  ArenaPlan plan;
  plan.offset_of_op.assign(role.ops.size(), -1);
  std::map<int64_t, int64_t> free_blocks;  // offset → size (coalesced)
  std::unordered_map<std::string, std::pair<int64_t, int64_t>> live;  // name → (offset, size)
  int64_t top = 0, live_bytes = 0;
  auto round_up = [&](double bytes) {
    int64_t b = int64_t(bytes);
    return std::max<int64_t>(alignment, (b + alignment - 1) / alignment * alignment);
  };
  for (const Op& op : role.ops) {
    if (op.kind == OpKind::alloc) {
      int64_t size = round_up(op.bytes);
      int64_t offset = -1;
      for (auto it = free_blocks.begin(); it != free_blocks.end(); ++it) {
        if (it->second >= size) {
          offset = it->first;
          int64_t rest = it->second - size;
          free_blocks.erase(it);
          if (rest > 0) free_blocks[offset + size] = rest;
          break;
        }
      }
      if (offset < 0) {
        offset = top;
        top += size;
      }
      plan.offset_of_op[op.id] = offset;
      live[op.buffer] = {offset, size};
      live_bytes += int64_t(op.bytes);
      plan.live_peak_bytes = std::max(plan.live_peak_bytes, live_bytes);
    } else if (op.kind == OpKind::free) {
      auto it = live.find(op.buffer);
      STEPCAST_CHECK(it != live.end(), "arena frees an unknown buffer " + op.buffer);
      auto [offset, size] = it->second;
      live.erase(it);
      live_bytes -= int64_t(op.bytes);
      // Insert and coalesce with neighbours.
      auto next = free_blocks.lower_bound(offset);
      if (next != free_blocks.end() && offset + size == next->first) {
        size += next->second;
        next = free_blocks.erase(next);
      }
      if (next != free_blocks.begin()) {
        auto prev = std::prev(next);
        if (prev->first + prev->second == offset) {
          prev->second += size;
          continue;
        }
      }
      free_blocks[offset] = size;
    }
  }
  plan.extent_bytes = top;
  return plan;
}

void Arena::create(const Role& role, const ArenaPlan& plan, char* memory) {
  plan_ = plan;
  base_ = memory;
  STEPCAST_CHECK(base_ != nullptr, "the arena needs memory");
  bytes_.assign(role.ops.size(), 0);
  for (const Op& op : role.ops) {
    if (op.kind != OpKind::alloc) continue;
    bytes_[op.id] = int64_t(op.bytes);
    allocs_of_name_[op.buffer].push_back(op.id);
  }
}

int32_t Arena::alloc_of(const std::string& name, int32_t now) const {
  auto it = allocs_of_name_.find(name);
  STEPCAST_CHECK(it != allocs_of_name_.end(), "no buffer named " + name);
  const auto& ids = it->second;
  auto pos = std::upper_bound(ids.begin(), ids.end(), now);
  STEPCAST_CHECK(pos != ids.begin(), "buffer " + name + " used before its alloc");
  return *std::prev(pos);
}


}  // namespace stepcast
