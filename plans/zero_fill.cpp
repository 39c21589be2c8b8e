// The zero fills of a role's buffers (zero_fill.hpp).
#include "zero_fill.hpp"

#include <algorithm>
#include <string>
#include <unordered_map>

namespace stepcast {
namespace {

bool reads(const Op& op, const BufferName& name) {
  return std::find(op.inputs.begin(), op.inputs.end(), name) != op.inputs.end();
}

}  // namespace

ZeroFills zero_fills(const Role& role) {
  const size_t n = role.ops.size();
  ZeroFills z;
  z.filled.assign(n, 0);
  z.fills_before.assign(n, {});
  z.step_fills_before.assign(n, {});
  z.bytes_before.assign(n, 0);
  // By buffer (its interned handle): its latest alloc, and whether an op has written it since.
  std::unordered_map<uint32_t, int32_t> last_alloc;
  std::unordered_map<uint32_t, bool> written;
  for (const Op& op : role.ops) {
    if (op.kind == OpKind::alloc) {
      last_alloc[op.buffer.handle()] = op.id;
      written[op.buffer.handle()] = false;
      const bool grads = op.buffer_class == BufferClass::grads;
      if (op.persistent) {
        if (grads && !is_stale_grads(op.buffer)) z.filled[size_t(op.id)] = 1;
      } else if (grads || (op.buffer_class == BufferClass::comm && !is_comm_scratch(op.buffer))) {
        z.filled[size_t(op.id)] = 1;
      }
      continue;
    }
    for (const BufferName& name : op.outputs) {
      auto it = written.find(name.handle());
      if (it == written.end() || it->second) continue;
      it->second = true;
      const Op& alloc = role.ops[size_t(last_alloc.at(name.handle()))];
      bool accumulates =
          reads(op, name) || op.grad == Grad::wgrad || op.kind == OpKind::norm || op.kind == OpKind::embedding;
      if (accumulates && !alloc.persistent) z.filled[size_t(alloc.id)] = 1;
    }
  }
  // The first toucher of each filled alloc, in one pass over the list: a filled alloc waits in
  // `pending` until an op reads or writes its buffer; an alloc or free of the buffer before that
  // leaves it untouched. (A persistent buffer's alloc comes before the step's ops.)
  std::unordered_map<uint32_t, int32_t> pending;
  for (const Op& op : role.ops) {
    if (op.kind == OpKind::alloc || op.kind == OpKind::free) {
      if (auto it = pending.find(op.buffer.handle()); it != pending.end()) {
        z.untouched.push_back(it->second);
        pending.erase(it);
      }
      if (op.kind == OpKind::alloc && z.filled[size_t(op.id)]) pending[op.buffer.handle()] = op.id;
      continue;
    }
    auto touch = [&](const BufferName& name) {
      auto it = pending.find(name.handle());
      if (it == pending.end()) return;
      z.fills_before[size_t(op.id)].push_back(it->second);
      pending.erase(it);
    };
    for (const BufferName& name : op.inputs) touch(name);
    for (const BufferName& name : op.outputs) touch(name);
  }
  for (const auto& [handle, alloc] : pending) z.untouched.push_back(alloc);
  // In alloc order (the order the executor fills them, and the cost model sums them).
  std::sort(z.untouched.begin(), z.untouched.end());
  for (const Op& op : role.ops) {
    std::vector<int32_t>& before = z.fills_before[size_t(op.id)];
    std::sort(before.begin(), before.end());
    for (int32_t alloc : before) {
      const Op& a = role.ops[size_t(alloc)];
      if (a.persistent) z.step_fills_before[size_t(op.id)].push_back(alloc);
      z.bytes_before[size_t(op.id)] += a.bytes;
    }
  }
  return z;
}

}  // namespace stepcast
