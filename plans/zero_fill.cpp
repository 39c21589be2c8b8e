// The zero fills of a role's buffers (zero_fill.hpp).
#include "zero_fill.hpp"

#include <algorithm>
#include <map>
#include <string>

namespace stepcast {
namespace {

bool reads(const Op& op, const std::string& name) {
  return std::find(op.inputs.begin(), op.inputs.end(), name) != op.inputs.end();
}

bool touches(const Op& op, const std::string& name) {
  return reads(op, name) || std::find(op.outputs.begin(), op.outputs.end(), name) != op.outputs.end();
}

}  // namespace

ZeroFills zero_fills(const Role& role) {
  const size_t n = role.ops.size();
  ZeroFills z;
  z.filled.assign(n, 0);
  z.fills_before.assign(n, {});
  z.step_fills_before.assign(n, {});
  z.bytes_before.assign(n, 0);
  std::map<std::string, int32_t> last_alloc;
  std::map<std::string, bool> written;
  for (const Op& op : role.ops) {
    if (op.kind == OpKind::alloc) {
      last_alloc[op.buffer] = op.id;
      written[op.buffer] = false;
      const bool grads = op.buffer_class == BufferClass::grads;
      if (op.persistent) {
        if (grads && !is_stale_grads(op.buffer)) z.filled[size_t(op.id)] = 1;
      } else if (grads || (op.buffer_class == BufferClass::comm && !is_comm_scratch(op.buffer))) {
        z.filled[size_t(op.id)] = 1;
      }
      continue;
    }
    for (const auto& name : op.outputs) {
      auto it = written.find(name);
      if (it == written.end() || it->second) continue;
      it->second = true;
      const Op& alloc = role.ops[size_t(last_alloc[name])];
      bool accumulates =
          reads(op, name) || op.grad == Grad::wgrad || op.kind == OpKind::norm || op.kind == OpKind::embedding;
      if (accumulates && !alloc.persistent) z.filled[size_t(alloc.id)] = 1;
    }
  }
  // The first toucher of each filled alloc: after it in list order (a persistent buffer's, in the
  // step's list from its start: the persistent allocs come first).
  for (const Op& alloc : role.ops) {
    if (!z.filled[size_t(alloc.id)]) continue;
    const std::string& name = alloc.buffer;
    int32_t first = -1;
    for (size_t i = size_t(alloc.id) + 1; i < n && first < 0; ++i) {
      const Op& op = role.ops[i];
      if (op.kind == OpKind::alloc || op.kind == OpKind::free) {
        if (op.buffer == alloc.buffer) break;  // freed or allocated again before any use
        continue;
      }
      if (touches(op, name)) first = op.id;
    }
    if (first < 0) {
      z.untouched.push_back(alloc.id);
      continue;
    }
    z.fills_before[size_t(first)].push_back(alloc.id);
    if (alloc.persistent) z.step_fills_before[size_t(first)].push_back(alloc.id);
    z.bytes_before[size_t(first)] += alloc.bytes;
  }
  return z;
}

}  // namespace stepcast
