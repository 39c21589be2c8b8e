// The CPU executor: the interpreter of exec/executor.hpp. One Interpreter<T> per rank; each op
// is dispatched on (kind, name, phase, grad) to a kernel of cpu_kernels.hpp or a collective of
// mpi_collectives.hpp, on buffers the arena holds under the names the program gives them.
#include "executor.hpp"

#include <malloc.h>
#include <mpi.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <thread>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <numeric>
#include <sstream>

#include "arena.hpp"
#include "backend.hpp"
#include "checkpoint.hpp"
#include "cpu_backend.hpp"
#include "mpi_check.hpp"
#include "sha256.hpp"
#include "watchdog.hpp"
#include "cpu_kernels.hpp"
#include "data.hpp"
#include "errors.hpp"
#include "lower.hpp"
#include "memory.hpp"
#include "mpi_collectives.hpp"
#include "param_layout.hpp"
#include "program_inputs.hpp"
#include "program_stats.hpp"
#include "shard_layout.hpp"

namespace stepcast {

namespace {

double resident_bytes(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field, 0) == 0) return std::stod(line.substr(std::strlen(field))) * 1024.0;
  }
  return 0;
}

// The process's anonymous memory, exactly: smaps_rollup walks the page tables. (VmRSS and VmHWM
// in /proc/self/status come from per-CPU counters that may lag by tens of pages: on this
// machine's kernel a 4 MiB step's high-water mark varied by 0–110 KB from run to run.)
double exact_anonymous_bytes() {
  std::ifstream rollup("/proc/self/smaps_rollup");
  std::string line;
  while (std::getline(rollup, line)) {
    if (line.rfind("Anonymous:", 0) == 0) return std::stod(line.substr(10)) * 1024.0;
  }
  STEPCAST_CHECK(false, "no Anonymous: line in /proc/self/smaps_rollup");
}

// VmHWM := VmRSS (Linux ≥ 4.0: "5" to clear_refs resets the resident high-water mark).
void reset_peak_resident_bytes() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  STEPCAST_CHECK(bool(clear), "cannot reset the resident high-water mark (/proc/self/clear_refs)");
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// "weights.L3" → "L3"; "wfull.L3.mb0.forward" → "L3"; "gradfull.L3.mb0" → "L3".
std::string group_of_buffer(const std::string& name) {
  size_t dot = name.find('.');
  std::string rest = name.substr(dot + 1);
  size_t next = rest.find('.');
  return next == std::string::npos ? rest : rest.substr(0, next);
}

// T activations and weights, G weight gradients, W the wide class (see backend.hpp).
template <class T, class G, class W>
class Interpreter {
 public:
  Interpreter(const StepProgram& program, const ModelConfig& model, const Plan& plan,
              const RunOptions& options, int64_t rank, Backend<T, G, W>& backend)
      : p_(program), model_(model), plan_(plan), options_(options), rank_(rank),
        grid_(program.grid()), coord_(grid_.coord(rank)), role_(program.role_of_rank(rank)),
        shards_(plan.zero_stage, plan.dp_size), backend_(backend) {
    t_ = plan.tp_size;
    s_ = model.seq_length;
    b_ = plan.micro_batch_size;
    h_ = model.hidden_size;
    s_local_ = plan.sequence_parallel ? s_ / t_ : s_;
    vocab_local_ = padded_vocab_size(model, t_) / t_;
    shape_ = cpu::AttentionShape{s_, b_, model.num_attention_heads / t_,
                                 model.num_key_value_heads / t_, model.head_dim()};
    scale_ = 1.0 / std::sqrt(double(model.head_dim()));
    source_ = make_token_source(model.vocab_size, s_, options.corpus_path, options.seed);
    // The data loader's host staging for one microbatch (sample-major as the source writes it,
    // then [s][b] as the kernels read it); the microbatch's buffers are the program's.
    batch_tokens_.assign(size_t(b_ * s_), 0);
    batch_targets_.assign(size_t(b_ * s_), 0);
    staged_.assign(size_t(b_ * s_), 0);
    batch_samples_.assign(size_t(b_), 0);
    // Parameter groups present on this role, from its persistent allocs.
    for (const Op& op : role_.ops) {
      if (op.kind == OpKind::alloc && op.persistent && op.buffer.rfind("weights.", 0) == 0) {
        groups_.push_back(op.buffer.substr(8));
      }
    }
    for (const auto& g : groups_) layouts_[g] = param_group_layout(model, t_, g);
    zero_.assign(role_.ops.size(), 0);
    pending_async_.assign(role_.ops.size(), 0);
    mark_buffers_to_zero();
    trace_ops_ = std::getenv("STEPCAST_TRACE_OPS") != nullptr;
    // Test hooks for the fault tests: STEPCAST_TEST_HANG=RANK:OP makes rank RANK sleep before op
    // OP of its first step; STEPCAST_TEST_DIE=RANK:STEP kills rank RANK as step STEP begins.
    if (const char* hang = std::getenv("STEPCAST_TEST_HANG")) {
      long long r = -1, o = -1;
      if (std::sscanf(hang, "%lld:%lld", &r, &o) == 2 && r == rank_) hang_op_ = int32_t(o);
    }
    if (const char* die = std::getenv("STEPCAST_TEST_DIE")) {
      long long r = -1, k = -1;
      if (std::sscanf(die, "%lld:%lld", &r, &k) == 2 && r == rank_) die_step_ = k;
    }
  }

  // The arena's layout and its index of buffer names: host bookkeeping that grows with the
  // program (a few hundred bytes per buffer), not the step's memory; made before the measured
  // baseline.
  void index_arena() {
    arena_.index(role_, plan_arena(role_));
    arena_indexed_ = true;
  }
  void create_arena() {
    if (!arena_indexed_) index_arena();
    arena_memory_ = backend_.allocate(arena_.extent_bytes());
    arena_.place(arena_memory_);
    initialize_parameters();
  }

  ~Interpreter() {
    if (arena_memory_) backend_.release(arena_memory_);
  }

  // One training step; returns the loss on this rank's share (summed), the caller reduces it.
  double step(int64_t step_index, std::vector<OpRecord>* records, double step_start) {
    step_ = step_index;
    if (step_index == die_step_) {
      std::fprintf(stderr, "stepcast run: rank %lld: STEPCAST_TEST_DIE: killing this rank\n",
                   (long long)rank_);
      std::fflush(stderr);
      std::raise(SIGKILL);
    }
    loss_sum_ = 0;
    zero_persistent_grads();
    for (const Op& op : role_.ops) {
      double start = 0;
      if (records) {
        backend_.synchronize();
        start = backend_.now_s() - step_start;
      }
      if (trace_ops_) {
        std::fprintf(stderr, "rank %lld step %lld op %d %s %s tag %lld\n", (long long)rank_,
                     (long long)step_index, op.id, to_string(op.kind), to_string(op.name),
                     (long long)op.tag);
      }
      if (op.id == hang_op_) {
        std::fprintf(stderr, "stepcast run: rank %lld: STEPCAST_TEST_HANG: sleeping in op %d\n",
                     (long long)rank_, op.id);
        std::this_thread::sleep_for(std::chrono::hours(1));
      }
      if (op.kind != OpKind::alloc && op.kind != OpKind::free) {
        backend_.set_current("op " + std::to_string(op.id) + " (" + to_string(op.kind) + " " +
                             to_string(op.name) + ")");
      }
      // Collectives of the communication stream run on while later ops that do not depend on
      // them proceed (a GPU backend; the CPU's calls are no-ops).
      for (int32_t d : op.deps) {
        if (pending_async_[size_t(d)]) {
          backend_.wait_async(d);
          pending_async_[size_t(d)] = 0;
        }
      }
      const bool async = op.stream == Stream::comm && is_collective(op.kind);
      if (async) backend_.begin_async(op.id);
      execute(op);
      if (async) {
        backend_.end_async(op.id);
        pending_async_[size_t(op.id)] = 1;
      }
      if (records) {
        backend_.synchronize();
        double end = backend_.now_s() - step_start;
        records->push_back({rank_, op.id, start, end, start});
      }
    }
    backend_.finish_sends();
    backend_.synchronize();
    std::fill(pending_async_.begin(), pending_async_.end(), 0);
    return loss_sum_;
  }

  std::map<std::string, int64_t> algorithms_used() const { return backend_.algorithms_used(); }

  // The state a checkpoint holds: every persistent weights and optimizer buffer, in op order,
  // as host mirrors (download_state fills them; upload_state writes them back).
  StateBuffers state_buffers() {
    StateBuffers out;
    for_each_state_buffer([&](const Op& op, size_t i) {
      if (host_state_.size() <= i) host_state_.emplace_back(size_t(arena_.bytes_of(op.id)));
      out.push_back({op.buffer, {host_state_[i].data(), arena_.bytes_of(op.id)}});
    });
    return out;
  }
  StateBuffers download_state() {
    StateBuffers state = state_buffers();
    for_each_state_buffer([&](const Op& op, size_t i) {
      backend_.download(state[i].second.first, arena_.at(op.id), state[i].second.second);
    });
    return state;
  }
  void upload_state() {
    StateBuffers state = state_buffers();
    for_each_state_buffer([&](const Op& op, size_t i) {
      backend_.upload(arena_.at(op.id), state[i].second.first, state[i].second.second);
    });
  }

 private:
  template <class F>
  void for_each_state_buffer(F&& f) {
    size_t i = 0;
    for (const Op& op : role_.ops) {
      if (op.kind != OpKind::alloc || !op.persistent) continue;
      if (op.buffer_class != BufferClass::weights && op.buffer_class != BufferClass::optimizer) continue;
      f(op, i++);
    }
  }

  // ---- buffers ----
  // As X: T unless the buffer's class says G or W (the program's alloc dtype, checked).
  template <class X = T>
  X* buf(const std::string& name, const Op& op) {
    STEPCAST_CHECK(dtype_bytes(dtype(name, op)) == int(sizeof(X)),
                   "buffer " + name + " is " + to_string(dtype(name, op)) + ", read as " +
                   std::to_string(sizeof(X)) + "-byte elements");
    return reinterpret_cast<X*>(arena_.buffer(name, op.id));
  }
  uint8_t* mask(const std::string& name, const Op& op) {
    return reinterpret_cast<uint8_t*>(arena_.buffer(name, op.id));
  }
  Dtype dtype(const std::string& name, const Op& op) const {
    return role_.ops[size_t(arena_.alloc_of(name, op.id))].dtype;
  }
  // Elements of the buffer, in its own dtype.
  int64_t count(const std::string& name, const Op& op) {
    return arena_.bytes_of(arena_.alloc_of(name, op.id)) / int64_t(dtype_bytes(dtype(name, op)));
  }
  const std::string& in(const Op& op, size_t i) const { return op.inputs.at(i); }
  const std::string& out(const Op& op, size_t i) const { return op.outputs.at(i); }
  bool reads(const Op& op, const std::string& name) const {
    return std::find(op.inputs.begin(), op.inputs.end(), name) != op.inputs.end();
  }
  // A slice of a parameter group's (full, unsharded) buffer: weights, wfull, grads or gradfull.
  template <class X = T>
  X* slice(const std::string& buffer, const Op& op, const std::string& tensor) {
    const GroupLayout& layout = layouts_.at(group_of_buffer(buffer));
    return buf<X>(buffer, op) + layout.at(tensor).offset;
  }

  // Buffers whose first writer accumulates into them (+=) are zeroed when allocated.
  void mark_buffers_to_zero() {
    std::map<std::string, int32_t> last_alloc;
    std::map<std::string, bool> written;
    for (const Op& op : role_.ops) {
      if (op.kind == OpKind::alloc) {
        last_alloc[op.buffer] = op.id;
        written[op.buffer] = false;
        if (op.buffer_class == BufferClass::grads ||
            (op.buffer_class == BufferClass::comm && !is_comm_scratch(op.buffer))) {
          zero_[op.id] = 1;  // (staging is overwritten before it is read)
        }
        continue;
      }
      for (const auto& name : op.outputs) {
        auto it = written.find(name);
        if (it == written.end() || it->second) continue;
        it->second = true;
        bool accumulates = reads(op, name) || op.grad == Grad::wgrad || op.kind == OpKind::norm ||
                           op.kind == OpKind::embedding;
        if (accumulates) zero_[last_alloc[name]] = 1;
      }
    }
  }

  void zero_persistent_grads() {
    for (const Op& op : role_.ops) {
      if (op.kind == OpKind::alloc && op.persistent && op.buffer_class == BufferClass::grads) {
        backend_.zero(arena_.at(op.id), arena_.bytes_of(op.id));
      }
    }
  }

  // ---- ZeRO shards (shard_layout.hpp) ----
  int64_t dp_rank() const { return coord_.dp; }
  // The elements of a group this rank updates, and where element `e` of the group sits in the
  // rank's `state` buffer (at e − first of what the buffer holds).
  ShardRange owned(int64_t elements) const { return shards_.owned(elements, dp_rank()); }
  int64_t held_first(ShardedState state, int64_t elements) const {
    return shards_.held(state, elements, dp_rank()).first;
  }

  void initialize_parameters() {
    for (const Op& op : role_.ops) {
      if (op.kind != OpKind::alloc || !op.persistent) continue;
      if (op.buffer.rfind("weights.", 0) != 0 && op.buffer.rfind("optimizer.", 0) != 0) continue;
      bool weights = op.buffer.rfind("weights.", 0) == 0;
      std::string group = group_of_buffer(op.buffer);
      const GroupLayout& layout = layouts_.at(group);
      // Which elements of the full local buffer this buffer holds.
      auto [first, last] = shards_.held(weights ? ShardedState::weights : ShardedState::optimizer,
                                        layout.elements, dp_rank());
      // Optimizer moments start at zero (the arena is zeroed); a master copy [m | v | master]
      // starts at the weights' values, in W, so the T weights are its rounding.
      int64_t states = optimizer_states(op);
      if (!weights && states < 3) continue;
      if (weights) {
        upload_initial_values<T>(arena_.at(op.id), group, layout, first, last);
      } else {
        int64_t state_n = arena_.bytes_of(op.id) / int64_t(sizeof(W)) / states;
        upload_initial_values<W>(arena_.at(op.id) + 2 * state_n * int64_t(sizeof(W)), group,
                                 layout, first, last);
      }
    }
  }

  // Elements [first, last) of a group's initial parameters, as X, into backend memory at dst
  // (one host buffer of X at a time: the host's high-water mark is part of the measured peak).
  template <class X>
  void upload_initial_values(char* dst, const std::string& group, const GroupLayout& layout,
                             int64_t first, int64_t last) {
    std::vector<X> host(size_t(last - first));
    for (const TensorSlice& tensor : layout.tensors) {
      for (int64_t e = std::max(first, tensor.offset);
           e < std::min(last, tensor.offset + tensor.elements()); ++e) {
        int64_t local = e - tensor.offset;
        host[size_t(e - first)] = X(initial_parameter(model_, t_, coord_.tp, group, tensor,
                                                      local / tensor.cols, local % tensor.cols,
                                                      options_.seed));
      }
    }
    backend_.upload(dst, host.data(), int64_t(host.size() * sizeof(X)));
  }

  // Adam's two moments, plus the master weights when the weights are 16-bit (lowering's shape
  // {elements, states} of the optimizer buffer).
  static int64_t optimizer_states(const Op& alloc) {
    return alloc.shape.size() == 2 ? alloc.shape[1] : 2;
  }

  // The alloc of a data buffer hands over this step's microbatch: the token source fills the
  // staging (once per microbatch: its tokens, targets and samples may all live on one rank),
  // which is uploaded into the program's buffer.
  void load_data(const Op& alloc, DataBuffer what) {
    int32_t mb = data_buffer_microbatch(alloc.buffer);
    if (staged_step_ != step_ || staged_microbatch_ != mb) {
      fill_microbatch(*source_, step_, plan_.global_batch_size, b_, plan_.dp_size, dp_rank(), mb, s_,
                      batch_tokens_.data(), batch_targets_.data(), batch_samples_.data());
      staged_step_ = step_;
      staged_microbatch_ = mb;
    }
    char* dst = arena_.at(alloc.id);
    if (what == DataBuffer::samples) {
      STEPCAST_CHECK(arena_.bytes_of(alloc.id) == int64_t(batch_samples_.size() * sizeof(int64_t)),
                     "samples buffer " + alloc.buffer + " is not [micro_batch_size] int64");
      backend_.upload(dst, batch_samples_.data(), arena_.bytes_of(alloc.id));
      return;
    }
    const std::vector<int32_t>& from = what == DataBuffer::tokens ? batch_tokens_ : batch_targets_;
    for (int64_t bi = 0; bi < b_; ++bi) {
      for (int64_t si = 0; si < s_; ++si) staged_[size_t(si * b_ + bi)] = from[size_t(bi * s_ + si)];
    }
    STEPCAST_CHECK(arena_.bytes_of(alloc.id) == int64_t(staged_.size() * sizeof(int32_t)),
                   "data buffer " + alloc.buffer + " is not [seq_length, micro_batch_size] int32");
    backend_.upload(dst, staged_.data(), arena_.bytes_of(alloc.id));
  }
  // Sample indices in the step, read by the dropout masks (none without dropout).
  const int64_t* samples(const Op& op) {
    if (plan_.dropout == 0) return nullptr;
    return buf<int64_t>(data_buffer_name(op.microbatch, DataBuffer::samples), op);
  }
  int64_t s0() const { return plan_.sequence_parallel ? coord_.tp * s_local_ : 0; }
  cpu::Dropout dropout(const Op& op, cpu::DropoutSite site) const {
    return cpu::Dropout{plan_.dropout, options_.seed, step_, op.layer, site};
  }

  // ---- dispatch ----
  void execute(const Op& op) {
    switch (op.kind) {
      case OpKind::alloc:
        // Persistent buffers (weights, grads, optimizer state) live across steps.
        if (zero_[op.id] && !op.persistent) backend_.zero(arena_.at(op.id), arena_.bytes_of(op.id));
        if (DataBuffer what = data_buffer_kind(op.buffer); what != DataBuffer::none) {
          load_data(op, what);
        }
        return;
      case OpKind::free:
        return;
      case OpKind::send:
      case OpKind::recv:
        return p2p(op);
      case OpKind::all_reduce:
      case OpKind::reduce_scatter:
      case OpKind::all_gather:
        return collective(op);
      case OpKind::all_to_all:
      case OpKind::broadcast:
        STEPCAST_CHECK(false, "the CPU backend has no all_to_all or broadcast (not lowered yet)");
        return;
      case OpKind::embedding: return embedding(op);
      case OpKind::norm: return norm(op);
      case OpKind::gemm: return gemm(op);
      case OpKind::attention: return attention(op);
      case OpKind::activation: return activation(op);
      case OpKind::loss: return loss(op);
      case OpKind::optimizer_step: return optimizer(op);
    }
  }

  // Pipeline transfers: the backend posts sends without waiting (and completes them at the end
  // of the step); receives block, watched.
  void p2p(const Op& op) {
    int64_t stage = coord_.pp;
    RankCoord peer = coord_;
    peer.pp = op.peer == Peer::pp_next ? (stage + 1) % plan_.pp_size
                                       : (stage + plan_.pp_size - 1) % plan_.pp_size;
    int peer_rank = int(grid_.rank(peer));
    const std::string& name = op.kind == OpKind::send ? in(op, 0) : out(op, 0);
    if (op.kind == OpKind::send) {
      // The send goes from the program's staging copy (comm class, live to the end of the step,
      // when finish_sends completes it), so the tensor's memory may be reused at once.
      // Without one (GPU topologies) it goes from the tensor itself.
      if (op.outputs.empty()) {
        backend_.send(buf(name, op), count(name, op), peer_rank, op.tag);
        return;
      }
      const std::string& staging = out(op, 0);
      backend_.copy(buf(staging, op), buf(name, op), count(name, op) * element_bytes(name, op));
      backend_.send(buf(staging, op), count(name, op), peer_rank, op.tag);
    } else {
      backend_.recv(buf(name, op), count(name, op), peer_rank, op.tag);
    }
  }

  // The buffers of a collective, in their (common) dtype.
  // (The op's comm scratch, its last output, is not one of them.)
  std::vector<Span<void>> spans(const std::vector<std::string>& names, const Op& op) {
    std::vector<Span<void>> out;
    for (const auto& n : names) {
      if (!is_comm_scratch(n)) out.push_back({arena_.buffer(n, op.id), count(n, op)});
    }
    return out;
  }
  Dtype dtype_of_all(const std::vector<std::string>& names, const Op& op) const {
    Dtype first = dtype(names.at(0), op);
    for (const auto& n : names) {
      STEPCAST_CHECK(dtype(n, op) == first,
                     std::string("collective ") + to_string(op.name) + " mixes dtypes");
    }
    return first;
  }
  int64_t element_bytes(const std::string& name, const Op& op) const {
    return dtype_bytes(dtype(name, op));
  }

  void collective(const Op& op) {
    // Host backends pack and receive chunks in the program's scratch for this op (comm class).
    if (!op.outputs.empty() && is_comm_scratch(op.outputs.back())) {
      int32_t scratch = arena_.alloc_of(op.outputs.back(), op.id);
      backend_.set_collective_scratch(arena_.at(scratch), arena_.bytes_of(scratch));
    }
    if (op.kind == OpKind::all_reduce) {
      if (op.name == OpName::sp_replicated_grads) {
        // Only the replicated part of each buffer (trailing elements of layers, whole groups
        // of replicated tensors); grads are full here (the CPU backend refuses SP with ZeRO ≥ 2).
        std::vector<Span<void>> parts;
        for (const auto& name : op.inputs) {
          const GroupLayout& layout = layouts_.at(group_of_buffer(name));
          for (const TensorSlice& tensor : layout.tensors) {
            if (tensor.replicated) parts.push_back({buf<G>(name, op) + tensor.offset, tensor.elements()});
          }
        }
        backend_.all_reduce(op.group, op.algorithm, dtype_of<G>(), parts);
        return;
      }
      backend_.all_reduce(op.group, op.algorithm, dtype_of_all(op.outputs, op), spans(op.outputs, op));
      return;
    }
    if (op.kind == OpKind::reduce_scatter) {
      if (op.name == OpName::grad_bucket) {
        if (shards_.sharded(ShardedState::grads)) {
          // inputs: (gradfull, shard) pairs; the reduced chunk is added into the shard.
          std::vector<Span<void>> full;
          for (size_t i = 0; i < op.inputs.size(); i += 2) full.push_back({buf<G>(in(op, i), op), count(in(op, i), op)});
          backend_.reduce_scatter(op.group, dtype_of<G>(), full);
          for (size_t i = 0; i < op.inputs.size(); i += 2) {
            G* f = buf<G>(in(op, i), op);
            G* shard = buf<G>(in(op, i + 1), op);
            auto [first, last] = shards_.slice(count(in(op, i), op), dp_rank());
            backend_.add(shard, f + first, last - first);
          }
          return;
        }
        backend_.reduce_scatter(op.group, dtype_of_all(op.outputs, op), spans(op.outputs, op));
        return;
      }
      // Sequence-parallel reduce_scatter: a [s, b, h] partial sum → this rank's s/t rows.
      char* full = arena_.buffer(in(op, 0), op.id);
      int64_t n = count(in(op, 0), op), e = element_bytes(in(op, 0), op);
      backend_.reduce_scatter(op.group, dtype(in(op, 0), op), {{full, n}});
      auto [first, last] = chunk_range(n, backend_.group_size(op.group), backend_.group_index(op.group));
      backend_.copy(arena_.buffer(out(op, 0), op.id), full + first * e, (last - first) * e);
      return;
    }
    // all_gather
    if (op.name == OpName::param_gather) {
      backend_.all_gather(op.group, dtype_of_all(op.outputs, op), spans(op.outputs, op));
      return;
    }
    // zero3_param_gather (the weight shard), the sequence-parallel gathers and the loss
    // statistics: this rank's part → chunk `index` of the full buffer, then gather in place.
    char* part = arena_.buffer(in(op, 0), op.id);
    char* full = arena_.buffer(out(op, 0), op.id);
    int64_t n = count(out(op, 0), op), e = element_bytes(out(op, 0), op);
    bool zero3 = op.name == OpName::zero3_param_gather;
    // zero3: this rank's weight slice; otherwise its chunk of the group (sequence, statistics).
    ShardRange part_range = zero3 ? shards_.slice(n, dp_rank()) : ShardRange{};
    if (!zero3) {
      std::tie(part_range.first, part_range.last) =
          chunk_range(n, backend_.group_size(op.group), backend_.group_index(op.group));
    }
    auto [first, last] = part_range;
    backend_.copy(full + first * e, part, (last - first) * e);
    backend_.all_gather(op.group, dtype(out(op, 0), op), {{full, n}});
  }

  void embedding(const Op& op) {
    int64_t v0 = coord_.tp * vocab_local_;
    bool backward = op.phase == Phase::backward;
    if (op.name == OpName::word && !backward) {
      backend_.embedding_forward(buf<int32_t>(in(op, 1), op), slice(in(op, 0), op, "embedding.weight"),
                             buf(out(op, 0), op), s_, b_, h_, v0, vocab_local_);
    } else if (op.name == OpName::word) {
      backend_.embedding_backward(buf<int32_t>(in(op, 3), op), buf(in(op, 0), op),
                              slice<G>(out(op, 0), op, "embedding.weight"), s_, b_, h_, v0,
                              vocab_local_);
    } else if (!backward) {  // position_dropout forward: inputs [x, (position)] → [out, (mask)]
      T* x = buf(out(op, 0), op);
      backend_.copy(x, buf(in(op, 0), op), s_local_ * b_ * h_ * int64_t(sizeof(T)));
      if (model_.position == PositionKind::learned) {
        backend_.position_add_forward(x, slice(in(op, 1), op, "position.weight"), s_local_, b_, h_,
                                  s0(), model_.max_position_embeddings);
      }
      if (plan_.dropout > 0) {
        backend_.dropout_add_forward(x, nullptr, x, mask(out(op, 1), op), s_local_, b_, h_,
                                    dropout(op, cpu::DropoutSite::embedding), s0(),
                                    samples(op));
      }
    } else {  // backward: inputs [g, (mask)] → [(grads.position), d]
      T* g = buf(in(op, 0), op);
      T* d = buf(op.outputs.back(), op);
      int64_t n = s_local_ * b_ * h_;
      if (plan_.dropout > 0) backend_.dropout_backward(g, mask(in(op, 1), op), d, n, plan_.dropout);
      else backend_.copy(d, g, n * int64_t(sizeof(T)));
      if (model_.position == PositionKind::learned) {
        backend_.position_add_backward(d, slice<G>(out(op, 0), op, "position.weight"), s_local_, b_, h_,
                                   s0(), model_.max_position_embeddings);
      }
    }
  }

  std::string norm_prefix(const Op& op) const {
    switch (op.name) {
      case OpName::input_norm: return "ln1";
      case OpName::post_attn_norm: return "ln2";
      case OpName::final_norm: return "final_norm";
      default: break;
    }
    fail_invariant(__FILE__, __LINE__, std::string("unknown norm ") + to_string(op.name));
  }

  void norm(const Op& op) {
    std::string prefix = norm_prefix(op);
    int64_t rows = s_local_ * b_;
    bool layer = model_.norm == NormKind::layernorm;
    double eps = model_.norm_eps;
    if (op.phase != Phase::backward) {  // [x, w] → [y]
      T* w = slice(in(op, 1), op, prefix + ".weight");
      T* bias = layer ? slice(in(op, 1), op, prefix + ".bias") : nullptr;
      if (layer) backend_.layernorm_forward(buf(in(op, 0), op), w, bias, buf(out(op, 0), op), rows, h_, eps);
      else backend_.rmsnorm_forward(buf(in(op, 0), op), w, buf(out(op, 0), op), rows, h_, eps);
      return;
    }
    // [x, d_y, w, g] → [g (+= dx), grads (+= dw, db)]
    T* x = buf(in(op, 0), op);
    T* dy = buf(in(op, 1), op);
    T* w = slice(in(op, 2), op, prefix + ".weight");
    T* dx = buf(out(op, 0), op);
    G* dw = slice<G>(out(op, 1), op, prefix + ".weight");
    if (layer) {
      backend_.layernorm_backward(x, w, dy, dx, dw, slice<G>(out(op, 1), op, prefix + ".bias"), rows, h_, eps);
    } else {
      backend_.rmsnorm_backward(x, w, dy, dx, dw, rows, h_, eps);
    }
  }

  // The weight tensor and shape of a GEMM: y[tokens, out] = x[tokens, in] · W[out, in]^T.
  struct Linear {
    std::string tensor;
    std::string bias;  // column-parallel bias added in the GEMM ("" when none)
    int64_t in, out;
  };
  Linear linear(const Op& op) const {
    int64_t qkv = shape_.qkv_width(), heads = shape_.heads * shape_.d;
    int64_t f = model_.intermediate_size / t_;
    bool b = model_.use_bias;
    switch (op.name) {
      case OpName::qkv: return {"qkv.weight", b ? "qkv.bias" : "", h_, qkv};
      case OpName::attn_out: return {"attn_out.weight", "", heads, h_};
      case OpName::mlp_up: return {"mlp_up.weight", b ? "mlp_up.bias" : "", h_, f};
      case OpName::mlp_gate: return {"mlp_gate.weight", b ? "mlp_gate.bias" : "", h_, f};
      case OpName::mlp_down: return {"mlp_down.weight", "", f, h_};
      case OpName::logits: return {"embedding.weight", "", h_, vocab_local_};
      default: break;
    }
    fail_invariant(__FILE__, __LINE__, std::string("unknown gemm ") + to_string(op.name));
  }

  void gemm(const Op& op) {
    Linear l = linear(op);
    int64_t tokens = s_ * b_;
    if (op.grad == Grad::none) {  // [x, w] → [y]
      T* w = slice(in(op, 1), op, l.tensor);
      T* bias = l.bias.empty() ? nullptr : slice(in(op, 1), op, l.bias);
      T* y = buf(out(op, 0), op);
      backend_.linear_forward(buf(in(op, 0), op), w, bias, y, tokens, l.in, l.out);
      if (op.name == OpName::logits) mask_padded_vocab(y, tokens);
    } else if (op.grad == Grad::dgrad) {  // [dy, w (, dx)] → [dx]
      backend_.linear_backward_data(buf(in(op, 0), op), slice(in(op, 1), op, l.tensor),
                                buf(out(op, 0), op), tokens, l.in, l.out, reads(op, out(op, 0)));
    } else {  // wgrad: [x, dy] → [grads]
      G* dbias = l.bias.empty() ? nullptr : slice<G>(out(op, 0), op, l.bias);
      backend_.linear_backward_weight(buf(in(op, 1), op), buf(in(op, 0), op),
                                  slice<G>(out(op, 0), op, l.tensor), dbias, tokens, l.in, l.out);
    }
  }

  // Padded vocabulary rows (tp must divide the vocabulary) never win the softmax.
  void mask_padded_vocab(T* logits, int64_t tokens) {
    int64_t v0 = coord_.tp * vocab_local_;
    int64_t valid = std::max<int64_t>(0, std::min(vocab_local_, model_.vocab_size - v0));
    if (valid == vocab_local_) return;
    backend_.fill_columns(logits, tokens, vocab_local_, valid, T(-1e30));
  }

  int64_t head0() const { return coord_.tp * shape_.heads; }

  void attention(const Op& op) {
    bool backward = op.phase == Phase::backward;
    int64_t square = shape_.b * shape_.heads * shape_.s * shape_.s;
    cpu::Dropout drop = dropout(op, cpu::DropoutSite::attention_probs);
    const cpu::Dropout* drop_ptr = plan_.dropout > 0 ? &drop : nullptr;
    if (!backward) {
      if (op.name == OpName::score) {
        backend_.attention_score_forward(buf(in(op, 0), op), buf(out(op, 0), op), shape_, scale_);
      } else if (op.name == OpName::softmax) {
        backend_.softmax_forward(buf(in(op, 0), op), buf(out(op, 0), op), square / shape_.s, shape_.s);
      } else if (op.name == OpName::dropout) {
        backend_.attention_dropout_forward(buf(in(op, 0), op), buf(out(op, 0), op),
                                       mask(out(op, 1), op), shape_, drop, head0(),
                                       samples(op));
      } else if (op.name == OpName::value) {
        backend_.attention_value_forward(buf(in(op, 0), op), buf(in(op, 1), op), buf(out(op, 0), op), shape_);
      } else {  // flash: [qkv] → [ctx, lse]
        backend_.flash_attention_forward(buf(in(op, 0), op), buf(out(op, 0), op), buf<W>(out(op, 1), op),
                                     shape_, scale_, drop_ptr, head0(), samples(op));
      }
      return;
    }
    if (op.name == OpName::value) {  // [d_ctx, probs_used, qkv] → [d_probs_used, d_qkv]
      backend_.attention_value_backward(buf(in(op, 0), op), buf(in(op, 1), op), buf(in(op, 2), op),
                                    buf(out(op, 0), op), buf(out(op, 1), op), shape_);
    } else if (op.name == OpName::dropout) {
      backend_.dropout_backward(buf(in(op, 0), op), mask(in(op, 1), op), buf(out(op, 0), op), square,
                            plan_.dropout);
    } else if (op.name == OpName::softmax) {
      backend_.softmax_backward(buf(in(op, 0), op), buf(in(op, 1), op), buf(out(op, 0), op),
                            square / shape_.s, shape_.s);
    } else if (op.name == OpName::score) {  // [d_scores, qkv, d_qkv] → [d_qkv]
      backend_.attention_score_backward(buf(in(op, 0), op), buf(in(op, 1), op), buf(out(op, 0), op),
                                    shape_, scale_);
    } else {  // flash: [qkv, ctx, lse, d_ctx] → [d_qkv]
      backend_.flash_attention_backward(buf(in(op, 0), op), buf(in(op, 1), op), buf<W>(in(op, 2), op),
                                    buf(in(op, 3), op), buf(out(op, 0), op), shape_, scale_,
                                    drop_ptr, head0(), samples(op));
    }
  }

  void activation(const Op& op) {
    bool backward = op.phase == Phase::backward;
    int64_t wide = s_ * b_ * (model_.intermediate_size / t_);
    int64_t local = s_local_ * b_ * h_;
    if (op.name == OpName::rotary) {
      if (backward) backend_.rotary_backward(buf(out(op, 0), op), shape_, model_.rope_theta, 0);
      else backend_.rotary_forward(buf(out(op, 0), op), shape_, model_.rope_theta, 0);
    } else if (op.name == OpName::gelu) {
      if (backward) backend_.gelu_backward(buf(in(op, 0), op), buf(in(op, 1), op), buf(out(op, 0), op), wide);
      else backend_.gelu_forward(buf(in(op, 0), op), buf(out(op, 0), op), wide);
    } else if (op.name == OpName::swiglu) {
      if (backward) {
        backend_.swiglu_backward(buf(in(op, 0), op), buf(in(op, 1), op), buf(in(op, 2), op),
                             buf(out(op, 0), op), buf(out(op, 1), op), wide);
      } else {
        backend_.swiglu_forward(buf(in(op, 0), op), buf(in(op, 1), op), buf(out(op, 0), op), wide);
      }
    } else if (op.name == OpName::dropout_add && !backward) {
      // [branch, residual, w] → [out, (mask)]: the row-parallel bias first.
      bool attention_branch = ends_with(out(op, 0), "x_mid");
      T* branch = buf(in(op, 0), op);
      if (model_.use_bias) {
        const T* bias = slice(in(op, 2), op, attention_branch ? "attn_out.bias" : "mlp_down.bias");
        backend_.add_rows(branch, bias, s_local_ * b_, h_);
      }
      cpu::Dropout drop = dropout(op, attention_branch ? cpu::DropoutSite::attention_residual
                                                       : cpu::DropoutSite::mlp_residual);
      if (plan_.dropout == 0) drop.p = 0;
      uint8_t* m = op.outputs.size() > 1 ? mask(out(op, 1), op) : nullptr;  // none: no dropout
      backend_.dropout_add_forward(branch, buf(in(op, 1), op), buf(out(op, 0), op), m, s_local_, b_, h_,
                               drop, s0(), samples(op));
    } else if (op.name == OpName::dropout_add) {  // [g, mask, wg] → [d, (wg)]
      T* d = buf(out(op, 0), op);
      backend_.dropout_backward(buf(in(op, 0), op), mask(in(op, 1), op), d, local, plan_.dropout);
      if (model_.use_bias) add_bias_grad(op, d, in(op, 2));
    } else if (op.name == OpName::mlp_bias_grad || op.name == OpName::attn_bias_grad) {
      // [g, wg] → [wg]
      add_bias_grad(op, buf(in(op, 0), op), in(op, 1));
    } else {
      STEPCAST_CHECK(false, std::string("unknown activation op ") + to_string(op.name));
    }
  }

  // Row-parallel bias gradient from the local tokens of a residual branch: the mlp branch's
  // dropout reads mask2, the attention branch's mask1; without dropout the op's name says.
  void add_bias_grad(const Op& op, const T* d, const std::string& grads) {
    bool mlp = op.name == OpName::mlp_bias_grad ||
               (op.name == OpName::dropout_add && ends_with(op.inputs.at(1), "mask2"));
    G* db = slice<G>(grads, op, mlp ? "mlp_down.bias" : "attn_out.bias");
    backend_.sum_rows(d, db, s_local_ * b_, h_);
  }

  void loss(const Op& op) {
    int64_t tokens = s_ * b_;
    int64_t v0 = coord_.tp * vocab_local_;
    const int32_t* targets = buf<int32_t>(in(op, 1), op);
    if (op.name == OpName::cross_entropy_stats) {  // [logits, targets] → [stats]
      backend_.cross_entropy_stats(buf(in(op, 0), op), targets, buf<W>(out(op, 0), op), tokens, v0,
                                   vocab_local_);
      return;
    }
    if (op.phase == Phase::backward) {  // [softmax, targets] → [d_logits]
      double scale = 1.0 / double(plan_.global_batch_size * s_);
      backend_.cross_entropy_backward(buf<W>(in(op, 0), op), targets, buf(out(op, 0), op), tokens,
                                      v0, vocab_local_, scale);
      return;
    }
    // [logits, targets, (stats_all)] → [softmax, token_loss, (stats: one tp rank)]
    const T* logits = buf(in(op, 0), op);
    const W* stats_all = nullptr;
    if (op.inputs.size() > 2) {
      stats_all = buf<W>(in(op, 2), op);
    } else {
      W* stats = buf<W>(out(op, 2), op);
      backend_.cross_entropy_stats(logits, targets, stats, tokens, v0, vocab_local_);
      stats_all = stats;
    }
    W* token_loss = buf<W>(out(op, 1), op);
    backend_.cross_entropy_forward(logits, stats_all, t_, buf<W>(out(op, 0), op), token_loss, tokens,
                                   vocab_local_);
    // Each tp rank computes the same per-token loss: count it once.
    if (coord_.tp == 0) loss_sum_ += backend_.sum(token_loss, tokens);
  }

  // ---- optimizer ----
  bool counted_in_norm(const std::string& group, const TensorSlice& tensor) const {
    if (tensor.replicated && coord_.tp != 0) return false;  // tp duplicates counted once
    if (group == "output" && model_.tie_word_embeddings) return false;  // the embedding's copy
    return true;
  }

  void optimizer(const Op& op) {
    if (op.name == OpName::grad_accumulate) {  // dp 1, ZeRO ≥ 2: the full gradient is the shard
      G* full = buf<G>(in(op, 0), op);
      G* shard = buf<G>(out(op, 0), op);
      int64_t n = count(out(op, 0), op);
      backend_.add(shard, full, n);
      return;
    }
    if (op.name == OpName::grad_norm) {
      double sum = 0;
      for (const auto& name : op.inputs) {
        std::string group = group_of_buffer(name);
        const GroupLayout& layout = layouts_.at(group);
        auto [first, last] = owned(layout.elements);
        int64_t base = held_first(ShardedState::grads, layout.elements);
        const G* g = buf<G>(name, op);
        for (const TensorSlice& tensor : layout.tensors) {
          if (!counted_in_norm(group, tensor)) continue;
          int64_t a = std::max(first, tensor.offset), z = std::min(last, tensor.offset + tensor.elements());
          if (a < z) sum += backend_.grad_norm_sq(g + (a - base), z - a);
        }
      }
      W value = W(sum);
      backend_.upload(buf<W>(out(op, 0), op), &value, sizeof(W));
      return;
    }
    STEPCAST_CHECK(op.name == OpName::adamw,
                   std::string("unknown optimizer op ") + to_string(op.name));
    W norm_sq = 0;
    backend_.download(&norm_sq, buf<W>("grad_norm_sq", op), sizeof(W));
    double norm = std::sqrt(double(norm_sq));
    last_grad_norm_ = norm;
    double clip = cpu::clip_coefficient(norm, options_.max_grad_norm);
    cpu::AdamW config{options_.lr, options_.beta1, options_.beta2, options_.adam_eps, 0.0};
    for (const auto& group : groups_) {
      const GroupLayout& layout = layouts_.at(group);
      auto [first, last] = owned(layout.elements);
      T* w = buf("weights." + group, op) + (first - held_first(ShardedState::weights, layout.elements));
      G* g = buf<G>("grads." + group, op) + (first - held_first(ShardedState::grads, layout.elements));
      const std::string state_name = "optimizer." + group;
      W* state = buf<W>(state_name, op);
      // [m | v (| master)], each state_n long.
      int64_t states = optimizer_states(role_.ops[size_t(arena_.alloc_of(state_name, op.id))]);
      int64_t state_n = count(state_name, op) / states;
      int64_t at = first - held_first(ShardedState::optimizer, layout.elements);
      W* m = state + at;
      W* v = state + state_n + at;
      W* master = states == 3 ? state + 2 * state_n + at : nullptr;
      for (const TensorSlice& tensor : layout.tensors) {
        int64_t a = std::max(first, tensor.offset), z = std::min(last, tensor.offset + tensor.elements());
        if (a >= z) continue;
        config.weight_decay = tensor.decay ? options_.weight_decay : 0.0;
        int64_t o = a - first;
        backend_.adamw_step(w + o, master ? master + o : nullptr, g + o, m + o, v + o, z - a,
                            config, step_ + 1, clip);
      }
    }
  }

 public:
  double last_grad_norm_ = 0;
  void disable_test_hooks() {  // the memory warm-up's throwaway interpreter
    hang_op_ = -1;
    die_step_ = -1;
  }

 private:
  const StepProgram& p_;
  const ModelConfig& model_;
  const Plan& plan_;
  const RunOptions& options_;
  int64_t rank_;
  RankGrid grid_;
  RankCoord coord_;
  const Role& role_;
  ShardLayout shards_;
  Backend<T, G, W>& backend_;
  Arena arena_;
  char* arena_memory_ = nullptr;
  int64_t t_, s_, b_, h_, s_local_, vocab_local_;
  cpu::AttentionShape shape_;
  double scale_;
  std::unique_ptr<TokenSource> source_;
  bool arena_indexed_ = false;
  std::vector<int32_t> batch_tokens_, batch_targets_, staged_;  // one microbatch, host staging
  std::vector<int64_t> batch_samples_;
  int64_t staged_step_ = -1;  // the microbatch the staging holds
  int32_t staged_microbatch_ = -1;
  std::vector<std::vector<char>> host_state_;  // checkpoint mirrors of the state buffers
  std::vector<std::string> groups_;
  std::map<std::string, GroupLayout> layouts_;
  std::vector<char> zero_;
  std::vector<char> pending_async_;  // per op: an async collective not yet waited for

  int64_t step_ = 0;
  double loss_sum_ = 0;
  bool trace_ops_ = false;  // STEPCAST_TRACE_OPS: print every op before it runs (debugging hangs)
  int32_t hang_op_ = -1;
  int64_t die_step_ = -1;
};

// Test hook for the fault tests: STEPCAST_TEST_STOP=RANK:POINT stops rank RANK (SIGSTOP, as a
// debugger or a frozen node would) at POINT: "checkpoint" (before it writes its checkpoint file)
// or "gather" (before the per-op records go to rank 0, the last exchange of a run).
void test_stop_point(int rank, const char* point) {
  const char* stop = std::getenv("STEPCAST_TEST_STOP");
  if (!stop) return;
  long long r = -1;
  char name[32] = {0};
  if (std::sscanf(stop, "%lld:%31s", &r, name) == 2 && r == rank && std::strcmp(name, point) == 0) {
    write_stderr_line("stepcast run: rank " + std::to_string(rank) + ": STEPCAST_TEST_STOP: stopping at " +
                      point + "\n");
    std::raise(SIGSTOP);
  }
}

// Every rank writes its file; rank 0 writes the manifest once every file is on disk, then
// `latest`. A rank that cannot write (a full or read-only disk) stops every rank, each with one
// line; every wait is under the watchdog.
template <class T, class G, class W>
void save_checkpoint(Interpreter<T, G, W>& interpreter, const StepProgram& program, const Plan& plan,
                     const std::string& dir, int64_t steps_done, ControlChannel& control) {
  std::string step_dir = dir + "/" + step_dir_name(steps_done);
  const std::string what = "the checkpoint after step " + std::to_string(steps_done);
  control.agree("creating " + what, [&] {
    if (control.rank() != 0) return;
    std::error_code error;
    std::filesystem::create_directories(step_dir, error);
    if (error) throw InputError(step_dir + ": cannot create the checkpoint directory: " + error.message());
  });
  CheckpointIdentity identity{control.rank(), control.size(), steps_done, program.program_sha256};
  std::pair<int64_t, std::string> written;
  test_stop_point(control.rank(), "checkpoint");
  control.agree("writing " + what, [&] {
    written = write_rank_checkpoint(step_dir, identity, interpreter.download_state());
  });
  // Each rank's size and hash to rank 0 (a hash as 8 numbers of 32 bits, exact in a double).
  std::vector<double> mine{double(written.first)};
  for (size_t i = 0; i < 64; i += 8) mine.push_back(double(std::stoul(written.second.substr(i, 8), nullptr, 16)));
  std::vector<std::vector<double>> all = control.gather(mine, "gathering the hashes of " + what);
  control.agree("the manifest of " + what, [&] {
    if (control.rank() != 0) return;
    CheckpointManifest manifest;
    manifest.plan = plan.name;
    manifest.program_sha256 = program.program_sha256;
    manifest.steps_done = steps_done;
    manifest.world_size = control.size();
    for (int r = 0; r < control.size(); ++r) {
      const std::vector<double>& v = all[size_t(r)];
      char hex[65];
      for (size_t i = 0; i < 8; ++i) {
        std::snprintf(hex + 8 * i, 9, "%08lx", static_cast<unsigned long>(v.at(i + 1)));
      }
      manifest.files.push_back({r, rank_file_name(r), int64_t(v.at(0)), std::string(hex, 64)});
    }
    std::string text = checkpoint_manifest_text(manifest);
    write_file_atomically(step_dir + "/manifest.json", text);
    write_file_atomically(dir + "/latest",
                          checkpoint_latest_text({step_dir_name(steps_done), manifest.manifest_sha256}));
  });
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// run_with_backend on inputs already read from the program.
template <class T, class G, class W>
RunOutput run_on_backend(const StepProgram& program, const ModelConfig& model, const Plan& plan,
                         const Topology& topology, const RunOptions& options,
                         Backend<T, G, W>& backend_ref) {
  int rank = 0, size = 0;
  STEPCAST_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  STEPCAST_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size));
  RunOutput output;
  Backend<T, G, W>* backend = &backend_ref;
  Interpreter<T, G, W> interpreter(program, model, plan, options, rank, *backend);
  ControlChannel control(options.watchdog_s);  // before the memory baseline: not step memory
  // Per-op records of the instrumented step: measurement machinery, faulted in before the
  // memory baseline (no allocation inside the step).
  std::vector<OpRecord> records(program.role_of_rank(rank).ops.size());
  records.clear();
  // ---- measured memory, host backends (see warm_up_host_memory; a device backend reports its
  // allocator's peak): measured = anonymous memory after the steps − here, after the warm-up
  // step and before the arena (VmHWM over the steps − VmRSS here beside it). The peak counts from after the arena is allocated and the parameters are
  // initialised (their transient host copies are not step memory).
  const bool host_memory = backend->device_peak_bytes() < 0;
  interpreter.index_arena();
  if (host_memory) malloc_trim(0);
  double rss_before = resident_bytes("VmRSS:");
  double mapped_before = resident_bytes("RssFile:") + resident_bytes("RssShmem:");
  double anonymous_before = host_memory ? exact_anonymous_bytes() : 0;
  interpreter.create_arena();
  int64_t first_step = 0;
  if (!options.resume_dir.empty()) {
    CheckpointInfo info;
    // Every rank verifies the pointer and the manifest, and its own file; if anything fails on
    // any rank, every rank refuses the checkpoint.
    control.agree("reading the checkpoint in " + options.resume_dir, [&] {
      info = find_checkpoint(options.resume_dir, program.program_sha256, size);
      CheckpointIdentity identity{rank, size, info.step, program.program_sha256};
      read_rank_checkpoint(info.path, info.manifest.files.at(size_t(rank)), identity,
                           interpreter.state_buffers());
    });
    interpreter.upload_state();
    first_step = info.step;
    if (rank == 0 && !options.quiet) {
      std::cout << "resumed from " << info.path << " after step " << info.step << "\n";
    }
  }
  output.first_step = first_step;
  double tokens_per_step = double(program.tokens_per_step);
  output.losses.reserve(size_t(options.steps));
  output.step_times_s.reserve(size_t(options.steps));
  int64_t steps = options.steps - first_step;  // --steps is the step to stop after
  if (steps < 1) {
    throw InputError("--steps " + std::to_string(options.steps) + ": the checkpoint already has " +
                     std::to_string(first_step) + " steps; valid: more than " +
                     std::to_string(first_step));
  }
  // The first step run warms up; the last (when there are 3 or more) is instrumented; the rest
  // are timed. k counts the steps of this run; the step index is first_step + k.
  int64_t instrumented = steps >= 3 ? steps - 1 : -1;
  double heap_after_first = 0;
  if (host_memory) {
    malloc_trim(0);
    reset_peak_resident_bytes();  // the peak from here on: the steps
  }
  for (int64_t k = 0; k < steps; ++k) {
    control.barrier("the start of step " + std::to_string(first_step + k + 1));
    double heap_before = double(mallinfo2().uordblks);
    double start = backend->now_s();
    double local_loss =
        interpreter.step(first_step + k, k == instrumented ? &records : nullptr, start);
    double local_time = backend->now_s() - start;
    // Heap bytes the step left allocated (our code allocates nothing after step 1; what remains
    // is the MPI library's own request and buffer pools).
    if (k >= 1) heap_after_first += double(mallinfo2().uordblks) - heap_before;
    const std::string after = "the end of step " + std::to_string(first_step + k + 1);
    double step_time = control.max(local_time, after);
    double loss_sum = control.sum(local_loss, after);
    double loss = loss_sum / tokens_per_step;
    output.losses.push_back(loss);
    output.step_times_s.push_back(step_time);
    if (rank == 0 && !options.quiet) {
      std::cout << "step " << first_step + k + 1 << "/" << options.steps << "  loss " << loss
                << "  step time "
                << step_time << " s  grad norm " << interpreter.last_grad_norm_
                << (k == 0 ? "  (warm-up)" : k == instrumented ? "  (instrumented)" : "") << "\n"
                << std::flush;
    }
    int64_t done = first_step + k + 1;
    if (options.checkpoint_every > 0 && done % options.checkpoint_every == 0) {
      save_checkpoint(interpreter, program, plan, options.checkpoint_dir, done, control);
      if (rank == 0 && !options.quiet) std::cout << "checkpoint after step " << done << "\n";
    }
  }
  output.heap_growth_after_first_step_bytes = heap_after_first;
  // A device backend measures its own memory. (The host's high-water mark leaves out the
  // file-backed and shared pages first faulted in during the steps, which no allocation made.)
  // The measured peak on the host: the anonymous pages the steps added, counted exactly at their
  // end — every page a step touches stays resident (the arena is never returned; our code
  // allocates nothing in a step, the heap figure above checks it), so the end holds the peak.
  // The kernel's high-water mark is reported beside it: it also sees pages freed again within a
  // step, but through the approximate counters.
  double mapped_growth =
      resident_bytes("RssFile:") + resident_bytes("RssShmem:") - mapped_before;
  if (backend->device_peak_bytes() >= 0) {
    output.measured_peak_bytes = backend->device_peak_bytes();
  } else {
    output.measured_peak_bytes = exact_anonymous_bytes() - anonymous_before;
    output.resident_high_water_bytes =
        resident_bytes("VmHWM:") - rss_before - std::max(0.0, mapped_growth);
  }

  // Per-op records and measured memory to rank 0.
  std::vector<double> mine;
  mine.reserve(3 + records.size() * 5);
  mine.push_back(output.measured_peak_bytes);
  mine.push_back(output.resident_high_water_bytes);
  mine.push_back(output.heap_growth_after_first_step_bytes);
  for (const OpRecord& o : records) {
    for (double v : {double(o.rank), double(o.id), o.start_s, o.end_s, o.ready_s}) mine.push_back(v);
  }
  test_stop_point(rank, "gather");
  std::vector<std::vector<double>> gathered = control.gather(mine, "gathering the per-op records");
  std::vector<double> peaks, growth, high_water, all;
  for (const std::vector<double>& v : gathered) {
    peaks.push_back(v.at(0));
    high_water.push_back(v.at(1));
    growth.push_back(v.at(2));
    all.insert(all.end(), v.begin() + 3, v.end());
  }
  if (rank != 0) return output;

  StepResult& r = output.result;
  r.source = "executor";
  std::vector<double> timed(output.step_times_s.begin() + (steps > 1 ? 1 : 0),
                            output.step_times_s.begin() + (instrumented >= 0 ? instrumented : steps));
  if (timed.empty()) timed = output.step_times_s;
  r.step_time_s = median(timed);
  for (size_t i = 0; i < all.size(); i += 5) {
    r.ops.push_back({int64_t(all[i]), int32_t(all[i + 1]), all[i + 2], all[i + 3], all[i + 4]});
  }
  fill_ready_times(program, r.ops);  // clocks are aligned: every rank starts the step together
  // Breakdown on the rank whose instrumented step ended last.
  if (!r.ops.empty()) {
    std::map<int64_t, double> end_of_rank;
    double step_end = 0;
    for (const auto& o : r.ops) {
      end_of_rank[o.rank] = std::max(end_of_rank[o.rank], o.end_s);
      step_end = std::max(step_end, o.end_s);
    }
    for (const auto& [rk, e] : end_of_rank) {
      if (e == step_end) r.critical_rank = rk;
    }
    const Role& role = program.role_of_rank(r.critical_rank);
    std::vector<OpRecord> critical(role.ops.size());
    for (const auto& o : r.ops) {
      if (o.rank == r.critical_rank) critical[size_t(o.id)] = o;
    }
    r.breakdown = breakdown_of_rank(role, critical, 0, step_end);
  }
  ProgramStats stats = program_stats(program);
  double peak = topology.node.device.peak_for(plan.param_dtype, topology.file);
  double model_flops = model_flops_per_token(model) * tokens_per_step;
  r.tokens_per_s = tokens_per_step / r.step_time_s;
  r.mfu = model_flops / r.step_time_s / (double(size) * peak);
  r.hfu = stats.matrix_flops_per_step / r.step_time_s / (double(size) * peak);
  MemoryReport memory = memory_report(program, topology);
  r.memory = memory_to_json(memory);
  Json measured = Json::array();
  double measured_max = 0;
  for (int rk = 0; rk < size; ++rk) {
    measured.push_back({{"rank", rk}, {"measured_peak_bytes", peaks[size_t(rk)]},
                        {"heap_growth_after_first_step_bytes", growth[size_t(rk)]}});
    if (high_water[size_t(rk)] >= 0) {
      measured.back()["resident_high_water_bytes"] = high_water[size_t(rk)];
    }
    measured_max = std::max(measured_max, peaks[size_t(rk)]);
  }
  r.memory["measured"] = measured;
  r.memory["measured_peak_bytes_max"] = measured_max;
  Json device = backend->device_memory();
  if (!device.empty()) r.memory["device_rank0"] = device;

  r.program_sha256 = program.program_sha256;
  r.extra = {{"losses", output.losses},
             {"first_step", first_step},
             {"step_times_s", output.step_times_s},
             {"step_time_min_s", *std::min_element(timed.begin(), timed.end())},
             {"step_time_max_s", *std::max_element(timed.begin(), timed.end())},
             {"timed_steps", timed.size()},
             {"backend", backend->name()},
             {"dtype", to_string(plan.param_dtype)},
             {"grad_dtype", to_string(plan.grad_dtype)},
             {"collectives", options.collectives_mpi ? "mpi" : "program"},
             {"collective_algorithms_used", interpreter.algorithms_used()},
             {"hyperparameters",
              {{"lr", options.lr}, {"beta1", options.beta1}, {"beta2", options.beta2},
               {"eps", options.adam_eps}, {"weight_decay", options.weight_decay},
               {"max_grad_norm", options.max_grad_norm}, {"seed", options.seed}}}};
  return output;
}

}  // namespace

template <class T, class G, class W>
RunOutput run_with_backend(const StepProgram& program, const RunOptions& options,
                           Backend<T, G, W>& backend) {
  ProgramInputs in = program_inputs(program);
  return run_on_backend(program, in.model, in.plan, in.topology, options, backend);
}

template RunOutput run_with_backend<float, float, float>(const StepProgram&, const RunOptions&,
                                                         Backend<float>&);
template RunOutput run_with_backend<double, double, double>(const StepProgram&, const RunOptions&,
                                                            Backend<double>&);
template RunOutput run_with_backend<bf16, float, float>(const StepProgram&, const RunOptions&,
                                                        Backend<bf16, float, float>&);
template RunOutput run_with_backend<bf16, bf16, float>(const StepProgram&, const RunOptions&,
                                                       Backend<bf16, bf16, float>&);

namespace {

// The measured peak on the host is the kernel's count of the process's anonymous memory
// (smaps_rollup, exact), not the arena's bookkeeping: it sees every page a step touches, in the
// arena or not.
// What is not the step's — code pages faulted in, OpenBLAS's packing buffers, MPI's shared-memory
// segments and request pools — is left out by running one throwaway step first, on a throwaway
// backend and arena that are then destroyed: the baseline is the process after it (heap
// trimmed), so whatever the real backend or interpreter allocates for its steps is counted.
template <class T>
void warm_up_host_memory(const StepProgram& program, const ModelConfig& model, const Plan& plan,
                         const RunOptions& options, int rank) {
  std::unique_ptr<Backend<T>> backend = make_cpu_backend<T>(
      program.grid(), rank, program.devices_per_node, options.collectives_mpi, options.watchdog_s);
  Interpreter<T, T, T> warm_up(program, model, plan, options, rank, *backend);
  warm_up.disable_test_hooks();
  warm_up.create_arena();
  ControlChannel control(options.watchdog_s);
  control.barrier("the warm-up step");
  // As a measured step goes, instrumented, with the reductions and the formatting of the step's
  // line that follow it: the code pages of these paths are then resident in the baseline, not
  // faulted in — and perhaps dropped again — during the steps.
  std::vector<OpRecord> records;
  records.reserve(program.role_of_rank(rank).ops.size());
  double start = backend->now_s();
  double loss = warm_up.step(0, &records, start);
  double time = backend->now_s() - start;
  double max_time = control.max(time, "the end of the warm-up step");
  double loss_sum = control.sum(loss, "the end of the warm-up step");
  std::ostringstream line;
  line << "step 1/1  loss " << loss_sum << "  step time " << max_time << " s  grad norm "
       << warm_up.last_grad_norm_ << "  (warm-up)\n";
  (void)mallinfo2();
  control.barrier("the warm-up step");
}

template <class T>
RunOutput run_cpu(const StepProgram& program, const ModelConfig& model, const Plan& plan,
                  const Topology& topology, const RunOptions& options) {
  int rank = 0;
  STEPCAST_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  warm_up_host_memory<T>(program, model, plan, options, rank);
  std::unique_ptr<Backend<T>> backend = make_cpu_backend<T>(
      program.grid(), rank, program.devices_per_node, options.collectives_mpi, options.watchdog_s);
  return run_on_backend<T, T, T>(program, model, plan, topology, options, *backend);
}

}  // namespace

CheckpointInfo find_checkpoint(const std::string& dir, const std::string& program_sha256,
                               int64_t world_size) {
  std::string latest_file = dir + "/latest";
  if (!std::filesystem::is_regular_file(latest_file)) {
    throw InputError(dir + ": no complete checkpoint (no 'latest' file)");
  }
  CheckpointLatest latest = parse_checkpoint_latest(read_text_file(latest_file), latest_file);
  CheckpointInfo info;
  info.path = dir + "/" + latest.step_dir;
  std::string manifest_file = info.path + "/manifest.json";
  info.manifest = parse_checkpoint_manifest(read_text_file(manifest_file), manifest_file);
  const CheckpointManifest& m = info.manifest;
  if (m.manifest_sha256 != latest.manifest_sha256) {
    throw InputError(manifest_file + ": its hash " + m.manifest_sha256.substr(0, 12) + " is not the one " +
                     latest_file + " names (" + latest.manifest_sha256.substr(0, 12) +
                     "): the manifest was replaced");
  }
  if (step_dir_name(m.steps_done) != latest.step_dir) {
    throw_input_error(manifest_file, "steps_done", std::to_string(m.steps_done),
                      "is not the step of its directory " + latest.step_dir,
                      "the manifest stepcast wrote there");
  }
  if (m.program_sha256 != program_sha256) {
    throw_input_error(manifest_file, "program_sha256", "\"" + m.program_sha256 + "\"",
                      "a checkpoint of plan '" + m.plan + "', not of this program (" + program_sha256 + ")",
                      "a checkpoint of the same model, topology and plan");
  }
  if (m.world_size != world_size) {
    throw_input_error(manifest_file, "world_size", std::to_string(m.world_size),
                      "this run has " + std::to_string(world_size) + " ranks",
                      "a checkpoint of the same plan");
  }
  info.step = m.steps_done;
  return info;
}

void check_cpu_backend(const Plan& plan, const Topology& topology) {
  if (plan.param_dtype != Dtype::fp32 && plan.param_dtype != Dtype::fp64) {
    throw_input_error(plan.file, "dtype", std::string("\"") + to_string(plan.param_dtype) + "\"",
                      "the CPU backend computes in fp32 or fp64", "\"fp32\" or \"fp64\"");
  }
  if (plan.grad_dtype != plan.param_dtype) {
    throw_input_error(plan.file, "grad_dtype", std::string("\"") + to_string(plan.grad_dtype) + "\"",
                      "the CPU backend keeps gradients in the parameter dtype",
                      std::string("\"") + to_string(plan.param_dtype) + "\"");
  }
  if (plan.sequence_parallel && plan.zero_stage >= 2) {
    throw_input_error(plan.file, "zero_stage", std::to_string(plan.zero_stage),
                      "the CPU backend does not combine sequence_parallel with sharded gradients",
                      "0 or 1 with sequence_parallel");
  }
  if (topology.node.intra_node.kind != IntraNodeKind::shared_memory) {
    // Lowering gives sends and collectives their host staging and scratch only on a host
    // topology; without them the CPU backend's posted sends would read reused memory.
    throw InputError(topology.file + ": key 'node.intra_node.kind' = \"" +
                     to_string(topology.node.intra_node.kind) +
                     "\": the CPU backend runs on a host topology (\"shared_memory\", e.g. "
                     "topologies/localhost-cpu.json)");
  }
}

RunOutput run_program(const StepProgram& program, const RunOptions& options) {
  ProgramInputs in = program_inputs(program);
  check_cpu_backend(in.plan, in.topology);
  if (in.plan.param_dtype == Dtype::fp64) {
    return run_cpu<double>(program, in.model, in.plan, in.topology, options);
  }
  return run_cpu<float>(program, in.model, in.plan, in.topology, options);
}

}  // namespace stepcast
