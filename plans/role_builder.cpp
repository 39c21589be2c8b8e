// Dataflow-derived dependencies for the lowering; see role_builder.hpp.
#include "role_builder.hpp"

#include <algorithm>

#include "errors.hpp"

namespace stepcast {

RoleBuilder::BufferState& RoleBuilder::state(const std::string& name, const char* use) {
  auto it = buffers_.find(name);
  STEPCAST_CHECK(it != buffers_.end(),
                 std::string("lowering ") + use + " buffer '" + name + "' that is not allocated");
  return it->second;
}

bool RoleBuilder::is_live(const std::string& name) const { return buffers_.count(name) > 0; }

double RoleBuilder::live_bytes(const std::string& name) const {
  auto it = buffers_.find(name);
  return it == buffers_.end() ? 0 : it->second.bytes;
}

Dtype RoleBuilder::live_dtype(const std::string& name) const {
  auto it = buffers_.find(name);
  STEPCAST_CHECK(it != buffers_.end(), "lowering asks the dtype of buffer '" + name +
                                           "' that is not allocated");
  return role_.ops[size_t(it->second.alloc_op)].dtype;
}

const std::vector<int64_t>& RoleBuilder::live_shape(const std::string& name) const {
  auto it = buffers_.find(name);
  STEPCAST_CHECK(it != buffers_.end(), "lowering asks the shape of buffer '" + name + "' that is not allocated");
  return role_.ops[size_t(it->second.alloc_op)].shape;
}

int32_t RoleBuilder::emit(Op op, const std::vector<int32_t>& extra_deps) {
  int32_t id = int32_t(role_.ops.size());
  op.id = id;
  std::vector<int32_t> deps = extra_deps;
  for (const auto& name : op.inputs) {
    BufferState& s = state(name, "reads");
    if (s.last_writer >= 0) deps.push_back(s.last_writer);
    else deps.push_back(s.alloc_op);
  }
  for (const auto& name : op.outputs) {
    BufferState& s = state(name, "writes");
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
  for (const auto& name : op.inputs) {
    BufferState& s = state(name, "reads");
    s.readers.push_back(id);
    s.last_user = id;
  }
  for (const auto& name : op.outputs) {
    BufferState& s = state(name, "writes");
    s.last_writer = id;
    s.readers.clear();
    s.last_user = id;
  }
  role_.ops.push_back(std::move(op));
  return id;
}

int32_t RoleBuilder::alloc(const std::string& name, BufferClass buffer_class, Dtype dtype,
                           std::vector<int64_t> shape, Phase phase, bool persistent) {
  STEPCAST_CHECK(!is_live(name), "lowering allocates buffer '" + name + "' twice");
  Op op;
  op.kind = OpKind::alloc;
  op.stream = Stream::compute;
  op.phase = phase;
  op.buffer = name;
  op.buffer_class = buffer_class;
  op.dtype = dtype;
  op.shape = std::move(shape);
  double elements = 1;
  for (int64_t d : op.shape) elements *= double(d);
  op.bytes = elements * dtype_bytes(dtype);
  op.persistent = persistent;
  int32_t id = int32_t(role_.ops.size());
  op.id = id;
  BufferState s;
  s.alloc_op = id;
  s.last_user = id;
  s.bytes = op.bytes;
  s.stream_set = persistent;  // persistent buffers exist before the step: no stream to join
  buffers_[name] = s;
  role_.ops.push_back(std::move(op));
  return id;
}

int32_t RoleBuilder::free(const std::string& name, Phase phase) {
  BufferState& s = state(name, "frees");
  Op op;
  op.kind = OpKind::free;
  op.phase = phase;
  op.buffer = name;
  op.bytes = s.bytes;
  op.buffer_class = role_.ops[s.alloc_op].buffer_class;
  op.stream = s.last_user >= 0 ? role_.ops[s.last_user].stream : Stream::compute;
  std::vector<int32_t> deps = s.readers;
  deps.push_back(s.last_writer >= 0 ? s.last_writer : s.alloc_op);
  std::sort(deps.begin(), deps.end());
  deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
  op.deps = deps;
  int32_t id = int32_t(role_.ops.size());
  op.id = id;
  buffers_.erase(name);
  role_.ops.push_back(std::move(op));
  return id;
}

void RoleBuilder::free_all(const std::vector<std::string>& names, Phase phase) {
  for (const auto& n : names) free(n, phase);
}

}  // namespace stepcast
