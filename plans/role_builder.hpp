// Appends ops to one role's list and keeps the buffer bookkeeping the lowering relies on: who
// last wrote and who read each live buffer, so every op's deps are derived from its dataflow
// (read-after-write, write-after-read, write-after-write) and every free waits for the last
// user. Internal to the lowering (plans/lower*.cpp); the interpreters only see the ops.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "program.hpp"

namespace stepcast {

// What a lowering keeps of each op: all of it (the program), or what a memory walk reads
// (memory.hpp's walk_role_memory: the alloc and free ops, their sizes and classes, in list order)
// — the other ops keep their kind, stream and figures but not their operands' names or their
// deps, and memory ops not their buffer's name. The list and its order are the same.
enum class RoleDetail { full, memory_walk };

class RoleBuilder {
 public:
  explicit RoleBuilder(Role& role, RoleDetail detail = RoleDetail::full) : role_(role), detail_(detail) {}

  // Appends `op` (its id, deps are filled in here) and returns its id. `extra_deps` are ids the
  // dataflow does not show (e.g. "after the whole backward").
  int32_t emit(Op op, const std::vector<int32_t>& extra_deps = {});

  // alloc op for `name`; its stream becomes the stream of the first op that writes it.
  int32_t alloc(BufferName name, BufferClass buffer_class, Dtype dtype,
                OpShape shape, Phase phase, bool persistent = false);
  // free op after every reader and writer of `name`, on the stream of its last user.
  int32_t free(BufferName name, Phase phase);
  // Frees each name in order.
  void free_all(const std::vector<BufferName>& names, Phase phase);

  bool is_live(BufferName name) const;
  double live_bytes(BufferName name) const;
  Dtype live_dtype(BufferName name) const;  // of a live buffer
  OpShape live_shape(BufferName name) const;
  int32_t last_op() const { return int32_t(role_.ops.size()) - 1; }
  // The last compute-side op (not alloc/free, not a pipeline transfer): a dependency on a free
  // orders nothing, since interpreters treat memory ops as done once their users are, and one on
  // a send would wait for the peer to receive it (last_op() when there is none).
  int32_t last_timed_op() const {
    for (int32_t i = last_op(); i >= 0; --i) {
      OpKind k = role_.ops[size_t(i)].kind;
      if (k != OpKind::alloc && k != OpKind::free && k != OpKind::send && k != OpKind::recv) return i;
    }
    return last_op();
  }
  const Role& role() const { return role_; }
  // Sets an emitted op's bytes moved (an op whose traffic is not its buffers' sizes).
  void set_bytes(int32_t op, double bytes) { role_.ops[size_t(op)].bytes = bytes; }

 private:
  struct BufferState {
    int32_t alloc_op = -1;
    bool stream_set = false;
    int32_t last_writer = -1;
    std::vector<int32_t> readers;  // since the last write
    int32_t last_user = -1;
    Stream last_user_stream = Stream::compute;  // role_.ops[last_user].stream
    double bytes = 0;
    BufferClass buffer_class = BufferClass::activations;  // of its alloc op
  };
  BufferState& state(BufferName name, const char* use);
  Role& role_;
  RoleDetail detail_;
  std::unordered_map<BufferName, BufferState> buffers_;  // keyed by handle: no text hashed per operand
  std::vector<BufferState*> operand_states_;  // emit's, kept for its capacity
};

}  // namespace stepcast
