// What program.json's writer (program_json.cpp) and reader (program_json_read.cpp) share.
#pragma once

#include <string_view>
#include <unordered_map>

#include "program.hpp"

namespace stepcast {

// The alloc op of each live buffer of a role, as its ops are walked in order (keys: the ops' names).
using LiveAllocs = std::unordered_map<BufferName, const Op*>;

inline void track_alloc(LiveAllocs& live, const Op& op) {
  if (op.kind == OpKind::alloc) live[op.buffer] = &op;
}

}  // namespace stepcast
