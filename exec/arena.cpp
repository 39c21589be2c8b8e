// The arena's lookup; see arena.hpp.
#include "arena.hpp"

#include <algorithm>
#include <iterator>

#include "errors.hpp"

namespace stepcast {

void Arena::place(char* memory) {
  base_ = memory;
  STEPCAST_CHECK(base_ != nullptr, "the arena needs memory");
}

void Arena::index(const Role& role, const ArenaPlan& plan) {
  plan_ = plan;
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
