// Dataflow-derived dependencies for the lowering; see role_builder.hpp.
#include "role_builder.hpp"

#include <algorithm>

#include "errors.hpp"

namespace stepcast {

RoleBuilder::BufferState& RoleBuilder::state(BufferName name, const char* use) {
  auto it = buffers_.find(name);
  STEPCAST_CHECK(it != buffers_.end(),
                 std::string("lowering ") + use + " buffer '" + name + "' that is not allocated");
  return it->second;
}

bool RoleBuilder::is_live(BufferName name) const { return buffers_.count(name) > 0; }

double RoleBuilder::live_bytes(BufferName name) const {
  auto it = buffers_.find(name);
  return it == buffers_.end() ? 0 : it->second.bytes;
}

Dtype RoleBuilder::live_dtype(BufferName name) const {
  auto it = buffers_.find(name);
  STEPCAST_CHECK(it != buffers_.end(), "lowering asks the dtype of buffer '" + name +
                                           "' that is not allocated");
  return role_.ops[size_t(it->second.alloc_op)].dtype;
}

OpShape RoleBuilder::live_shape(BufferName name) const {
  auto it = buffers_.find(name);
  STEPCAST_CHECK(it != buffers_.end(), "lowering asks the shape of buffer '" + name + "' that is not allocated");
  return role_.ops[size_t(it->second.alloc_op)].shape;
}

int32_t RoleBuilder::emit(Op op, const std::vector<int32_t>& extra_deps) {
  int32_t id = int32_t(role_.ops.size());
  op.id = id;
  if (detail_ == RoleDetail::memory_walk) {  // the operands must be live all the same
    for (const auto& name : op.inputs) state(name, "reads");
    for (const auto& name : op.outputs) state(name, "writes");
    op.inputs.clear();
    op.outputs.clear();
    role_.ops.push_back(std::move(op));
    return id;
  }
  // The operands' states, looked up once (the map's nodes stay put: nothing is added below).
  std::vector<BufferState*>& operands = operand_states_;
  operands.clear();
  for (const auto& name : op.inputs) operands.push_back(&state(name, "reads"));
  for (const auto& name : op.outputs) operands.push_back(&state(name, "writes"));
  const size_t inputs = op.inputs.size();
  std::vector<int32_t> deps = extra_deps;
  for (size_t i = 0; i < inputs; ++i) {
    const BufferState& s = *operands[i];
    if (s.last_writer >= 0) deps.push_back(s.last_writer);
    else deps.push_back(s.alloc_op);
  }
  for (size_t i = inputs; i < operands.size(); ++i) {
    BufferState& s = *operands[i];
    deps.push_back(s.last_writer >= 0 ? s.last_writer : s.alloc_op);
    deps.insert(deps.end(), s.readers.begin(), s.readers.end());
    if (!s.stream_set) {
      role_.ops[s.alloc_op].stream = op.stream;
      s.stream_set = true;
    }
  }
  std::sort(deps.begin(), deps.end());
  deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
  deps.erase(std::remove(deps.begin(), deps.end(), id), deps.end());
  op.deps = std::move(deps);
  for (size_t i = 0; i < inputs; ++i) {
    BufferState& s = *operands[i];
    s.readers.push_back(id);
    s.last_user = id;
    s.last_user_stream = op.stream;
  }
  for (size_t i = inputs; i < operands.size(); ++i) {
    BufferState& s = *operands[i];
    s.last_writer = id;
    s.readers.clear();
    s.last_user = id;
    s.last_user_stream = op.stream;
  }
  role_.ops.push_back(std::move(op));
  return id;
}

int32_t RoleBuilder::alloc(BufferName name, BufferClass buffer_class, Dtype dtype,
                           OpShape shape, Phase phase, bool persistent) {
  Op op;
  op.kind = OpKind::alloc;
  op.stream = Stream::compute;
  op.phase = phase;
  if (detail_ == RoleDetail::full) op.buffer = name;
  op.buffer_class = buffer_class;
  op.dtype = dtype;
  op.shape = shape;
  double elements = 1;
  for (int64_t d : op.shape) elements *= double(d);
  op.bytes = storage_bytes(dtype, elements);
  op.persistent = persistent;
  int32_t id = int32_t(role_.ops.size());
  op.id = id;
  auto [it, added] = buffers_.try_emplace(name);
  STEPCAST_CHECK(added, "lowering allocates buffer '" + name + "' twice");
  BufferState& s = it->second;
  s.alloc_op = id;
  s.last_user = id;
  s.last_user_stream = op.stream;
  s.bytes = op.bytes;
  s.buffer_class = buffer_class;
  s.stream_set = persistent;  // persistent buffers exist before the step: no stream to join
  role_.ops.push_back(std::move(op));
  return id;
}

int32_t RoleBuilder::free(BufferName name, Phase phase) {
  auto it = buffers_.find(name);
  STEPCAST_CHECK(it != buffers_.end(), "lowering frees buffer '" + name + "' that is not allocated");
  BufferState& s = it->second;
  Op op;
  op.kind = OpKind::free;
  op.phase = phase;
  op.bytes = s.bytes;
  op.buffer_class = s.buffer_class;
  op.stream = s.last_user >= 0 ? s.last_user_stream : Stream::compute;
  if (detail_ == RoleDetail::full) {
    op.buffer = name;
    std::vector<int32_t> deps = std::move(s.readers);
    deps.push_back(s.last_writer >= 0 ? s.last_writer : s.alloc_op);
    std::sort(deps.begin(), deps.end());
    deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
    op.deps = std::move(deps);
  }
  int32_t id = int32_t(role_.ops.size());
  op.id = id;
  buffers_.erase(it);
  role_.ops.push_back(std::move(op));
  return id;
}

void RoleBuilder::free_all(const std::vector<BufferName>& names, Phase phase) {
  for (const auto& n : names) free(n, phase);
}

}  // namespace stepcast
