// The interpreter (interpreter.hpp): construction, the step loop, buffers, the parameters' initial
// values, the data a microbatch reads, and the dispatch of each op to its family.
#include "interpreter.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "errors.hpp"
#include "lower.hpp"
#include "units.hpp"

namespace stepcast {

namespace {

// body(from, to) over [0, n) in one contiguous range per thread: as many threads as the host has
// cores, each with at least 2^20 elements (fewer elements run on the calling thread).
template <class Body>
void parallel_ranges(int64_t n, const Body& body) {
  const int64_t threads = std::clamp<int64_t>(n >> 20, 1, std::max(1u, std::thread::hardware_concurrency()));
  parallel_for(threads, int(threads), [&](int64_t i) { body(n * i / threads, n * (i + 1) / threads); });
}

}  // namespace

std::string group_of_buffer(const std::string& name) {
  size_t dot = name.find('.');
  std::string rest = name.substr(dot + 1);
  size_t next = rest.find('.');
  return next == std::string::npos ? rest : rest.substr(0, next);
}

template <class T, class G, class W>
Interpreter<T, G, W>::Interpreter(const StepProgram& program, const ModelConfig& model, const Plan& plan,
                                  const RunOptions& options, int64_t rank, Backend<T, G, W>& backend)
    : p_(program),
      model_(model),
      plan_(plan),
      options_(options),
      rank_(rank),
      grid_(program.grid()),
      coord_(grid_.coord(rank)),
      role_(program.role_of_rank(rank)),
      shards_(plan.zero_stage, plan.dp_cp_size(), program.dp_shard_size),
      expert_shards_(plan.zero_stage, grid_.edp_size(), grid_.edp_shard_size()),
      backend_(backend) {
  t_ = plan.tp_size;
  cp_ = plan.cp_size;
  s_full_ = model.seq_length;
  s_ = s_full_ / cp_;
  b_ = plan.micro_batch_size;
  h_ = model.hidden_size;
  s_local_ = plan.sequence_parallel ? s_ / t_ : s_;
  vocab_local_ = padded_vocab_size(model, t_) / t_;
  kv_heads_local_ = model.num_key_value_heads / t_;
  scale_ = 1.0 / std::sqrt(double(model.head_dim()));
  source_ = make_token_source(model.vocab_size, s_full_, options.corpus_path, options.seed);
  // The data loader's host staging for one microbatch (sample-major as the source writes it,
  // then [s][b] as the kernels read it, this cp rank's chunks); the buffers are the program's.
  batch_tokens_.assign(size_t(b_ * s_full_), 0);
  batch_targets_.assign(size_t(b_ * s_full_), 0);
  for (int64_t r = 0; r < s_; ++r) q_positions_.push_back(position(coord_.cp, r));
  ulysses_ = cp_ > 1 && plan.cp_comm_type == CpCommType::a2a;
  for (int64_t c = 0; ulysses_ && c < cp_; ++c) {
    for (int64_t r = 0; r < s_; ++r) a2a_positions_.push_back(position(c, r));
  }
  staged_.assign(size_t(b_ * s_), 0);
  batch_samples_.assign(size_t(b_), 0);
  // Every op's operands by slot; op ids are their indices in the role.
  operands_.reserve(role_.ops.size());
  for (size_t i = 0; i < role_.ops.size(); ++i) {
    STEPCAST_CHECK(role_.ops[i].id == int32_t(i), "op ids of a role are their positions");
    operands_.emplace_back(role_.ops[i]);
  }
  // Parameter groups present on this role, from its persistent allocs.
  for (const Op& op : role_.ops) {
    if (op.kind == OpKind::alloc && op.persistent && op.buffer.rfind("weights.", 0) == 0) {
      groups_.push_back(op.buffer.substr(8));
    }
  }
  ep_index_ = grid_.ep_rank(rank);
  etp_index_ = grid_.stage_index(rank) % grid_.etp_size();
  moe_row_ = etp_index_ * grid_.ep_size() + ep_index_;
  edp_index_ = grid_.stage_index(rank) / (grid_.etp_size() * grid_.ep_size());
  moe_local_ = model.is_moe() ? model.num_experts / grid_.ep_size() : 0;
  if (plan.zero_stage == 0 && model.is_moe()) moe_norm_shares();
  for (const auto& g : groups_) {
    layouts_[g] = is_expert_group(g) ? expert_group_layout(model, grid_.ep_size(), ep_index_, grid_.etp_size())
                                     : param_group_layout(model, t_, g);
    if (program.fp8.param_gather && g[0] == 'L') {  // the layer's weights buffer: its tensors but the FP8 weights
      GroupLayout& kept = kept_layouts_[g];
      for (TensorSlice tensor : layouts_[g].tensors) {
        if (is_fp8_weight(tensor.name)) continue;
        tensor.offset = kept.elements;
        kept.elements += tensor.elements();
        kept.tensors.push_back(tensor);
      }
    }
  }
  pending_async_.assign(role_.ops.size(), 0);
  fills_ = zero_fills(role_);
  fill_at_alloc_.assign(role_.ops.size(), 0);
  for (int32_t id : fills_.untouched) fill_at_alloc_[size_t(id)] = !role_.ops[size_t(id)].persistent;
  trace_ops_ = std::getenv("STEPCAST_TRACE_OPS") != nullptr;
}

// ZeRO-0 with experts: the norm is summed by the program's grad_norm all_reduces in turn (over
// the model group, then ep, and etp where it reaches past tp: lower_grads.cpp), so rank x's share
// arrives mult(x) times (the paths back through those groups), and a tensor is held by several
// of the ranks summed: dense ones by the dp × cp replicas (cp ranks hold the same dense weights),
// replicated ones (norms, router) by a stage's tp ranks too, experts by their edp group. Each is
// counted by the lowest such rank, scaled by 1/mult.
template <class T, class G, class W>
void Interpreter<T, G, W>::moe_norm_shares() {
  std::vector<GroupKind> sums;
  for (const Op& op : role_.ops) {
    if (op.name == OpName::grad_norm && op.kind == OpKind::all_reduce) sums.push_back(op.group);
  }
  std::map<int64_t, int64_t> mult{{rank_, 1}};
  for (auto kind = sums.rbegin(); kind != sums.rend(); ++kind) {
    std::map<int64_t, int64_t> before;
    for (const auto& [y, paths] : mult) {
      for (int64_t x : grid_.group(*kind, y)) before[x] += paths;
    }
    mult = std::move(before);
  }
  norm_weight_ = 1.0 / double(mult.at(rank_));
  auto lowest = [&](const std::vector<int64_t>& holders) {
    int64_t first = -1;
    for (int64_t x : holders) {
      if (mult.count(x) && (first < 0 || x < first)) first = x;
    }
    return first;
  };
  std::vector<int64_t> stage;
  for (int64_t r = 0; r < grid_.world_size(); ++r) {
    if (grid_.coord(r).pp == coord_.pp) stage.push_back(r);
  }
  norm_counts_dense_ = lowest(grid_.group(GroupKind::dp_cp, rank_)) == rank_;
  norm_counts_replicated_ = lowest(stage) == rank_;
  norm_counts_experts_ = lowest(grid_.group(GroupKind::edp, rank_)) == rank_;
  moe_norm_ = true;
}

template <class T, class G, class W>
Interpreter<T, G, W>::~Interpreter() {
  if (arena_memory_) backend_.release(arena_memory_);
}

template <class T, class G, class W>
void Interpreter<T, G, W>::index_arena() {
  arena_.index(role_, plan_arena(role_));
  arena_indexed_ = true;
}

template <class T, class G, class W>
void Interpreter<T, G, W>::create_arena() {
  if (!arena_indexed_) index_arena();
  arena_memory_ = backend_.allocate(arena_.extent_bytes());
  arena_.place(arena_memory_);
  initialize_parameters();
}

template <class T, class G, class W>
double Interpreter<T, G, W>::step(int64_t step_index, std::vector<OpRecord>* records, double step_start) {
  step_ = step_index;
  backend_.begin_step(step_index);
  loss_sum_ = 0;
  moe_dropped_ = 0;
  fill_untouched_persistent();
  for (const Op& op : role_.ops) {
    double start = 0;
    if (records) {
      backend_.synchronize();
      start = backend_.now_s() - step_start;
    }
    if (trace_ops_) {
      std::fprintf(stderr, "rank %lld step %lld op %d %s %s tag %lld\n", (long long)rank_, (long long)step_index, op.id,
                   to_string(op.kind), to_string(op.name), (long long)op.tag);
    }
    backend_.begin_op(op);
    if (op.kind != OpKind::alloc && op.kind != OpKind::free) {
      backend_.set_current("op " + std::to_string(op.id) + " (" + to_string(op.kind) + " " + to_string(op.name) + ")");
    }
    // Collectives of the communication stream run on while later ops that do not depend on
    // them proceed (a GPU backend; the CPU's calls are no-ops). An op that depends on a pipeline
    // send (a plan without overlap_p2p_comm) waits until the posted sends are done.
    const bool memory_op = op.kind == OpKind::alloc || op.kind == OpKind::free;
    for (int32_t d : op.deps) {
      if (pending_async_[size_t(d)] == kAsyncCollective) {
        backend_.wait_async(d);
        pending_async_[size_t(d)] = 0;
      } else if (pending_async_[size_t(d)] == kPostedSend && !memory_op) {
        backend_.finish_sends();
        for (int32_t s : posted_sends_) pending_async_[size_t(s)] = 0;
        posted_sends_.clear();
      }
    }
    // The buffers this op is the first to touch this step, filled with zeros (zero_fill.hpp):
    // their fill is part of the op's record (the simulator charges it the every-step ones).
    for (int32_t alloc : fills_.fills_before[size_t(op.id)]) backend_.zero(arena_.at(alloc), arena_.bytes_of(alloc));
    const bool async = op.stream == Stream::comm && is_collective(op.kind);
    if (async) backend_.begin_async(op.id);
    if (rank_ == options_.slowdown_rank && is_compute(op.kind)) {
      // A straggler: the op's own duration stretched by the factor, the extra spun here, so the
      // op's cost keeps its place in the step (a sleep would free the core; --slowdown, README).
      backend_.synchronize();
      const double op_start = backend_.now_s();
      execute(op);
      backend_.synchronize();
      const double until = op_start + (backend_.now_s() - op_start) * options_.slowdown_factor;
      while (backend_.now_s() < until) {
      }
    } else {
      execute(op);
    }
    if (async) {
      backend_.end_async(op.id);
      pending_async_[size_t(op.id)] = kAsyncCollective;
    } else if (op.kind == OpKind::send) {
      pending_async_[size_t(op.id)] = kPostedSend;
      posted_sends_.push_back(op.id);
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
  posted_sends_.clear();
  return loss_sum_;
}

template <class T, class G, class W>
StateBuffers Interpreter<T, G, W>::state_buffers() {
  StateBuffers out;
  for_each_state_buffer([&](const Op& op, size_t i) {
    if (host_state_.size() <= i) host_state_.emplace_back(size_t(arena_.bytes_of(op.id)));
    out.push_back({op.buffer, {host_state_[i].data(), arena_.bytes_of(op.id)}});
  });
  return out;
}

template <class T, class G, class W>
StateBuffers Interpreter<T, G, W>::download_state() {
  StateBuffers state = state_buffers();
  for_each_state_buffer([&](const Op& op, size_t i) {
    backend_.download(state[i].second.first, arena_.at(op.id), state[i].second.second);
  });
  return state;
}

template <class T, class G, class W>
void Interpreter<T, G, W>::upload_state() {
  StateBuffers state = state_buffers();
  for_each_state_buffer([&](const Op& op, size_t i) {
    backend_.upload(arena_.at(op.id), state[i].second.first, state[i].second.second);
  });
}

template <class T, class G, class W>
void Interpreter<T, G, W>::check_element_size(const std::string& name, const Op& op, int bytes) const {
  STEPCAST_CHECK(dtype_bytes(dtype(name, op)) == bytes, "buffer " + name + " is " + to_string(dtype(name, op)) +
                                                            ", read as " + std::to_string(bytes) + "-byte elements");
}

template <class T, class G, class W>
void Interpreter<T, G, W>::fill_untouched_persistent() {
  for (int32_t id : fills_.untouched) {
    if (role_.ops[size_t(id)].persistent) backend_.zero(arena_.at(id), arena_.bytes_of(id));
  }
}

template <class T, class G, class W>
void Interpreter<T, G, W>::initialize_parameters() {
  for (const Op& op : role_.ops) {
    if (op.kind != OpKind::alloc || !op.persistent) continue;
    if (op.buffer == "fp8.scale") {  // FP8 scales start at 1, as Transformer Engine's
      upload_ones(op);
      continue;
    }
    if (op.buffer.rfind("weights.", 0) != 0 && op.buffer.rfind("optimizer.", 0) != 0) continue;
    bool weights = op.buffer.rfind("weights.", 0) == 0;
    std::string group = group_of_buffer(op.buffer);
    const GroupLayout& layout = layouts_.at(group);
    // Which elements of the full local buffer this buffer holds.
    auto [first, last] =
        shards(group).held(weights ? ShardedState::weights : ShardedState::optimizer, layout.elements,
                           shard_rank(group));
    // Optimizer moments start at zero (the arena is zeroed); a master copy [m | v | master]
    // starts at the weights' values, in W, so the T weights are its rounding.
    int64_t states = optimizer_states(op);
    if (!weights && states < 3) continue;
    if (weights && kept_layouts_.count(group)) {
      const GroupLayout& kept = kept_layouts_.at(group);
      upload_initial_values<T>(arena_.at(op.id), group, kept, 0, kept.elements);
    } else if (weights) {
      upload_initial_values<T>(arena_.at(op.id), group, layout, first, last);
    } else {
      int64_t state_n = arena_.bytes_of(op.id) / int64_t(sizeof(W)) / states;
      upload_initial_values<W>(arena_.at(op.id) + 2 * state_n * int64_t(sizeof(W)), group, layout, first, last);
    }
  }
  if (p_.fp8.param_gather) prime_fp8_params();
}

template <class T, class G, class W>
void Interpreter<T, G, W>::upload_ones(const Op& alloc) {
  std::vector<W> ones(size_t(arena_.bytes_of(alloc.id) / int64_t(sizeof(W))), W(1));
  backend_.upload(arena_.at(alloc.id), ones.data(), int64_t(ones.size() * sizeof(W)));
}

// Elements [first, last) of a group's initial parameters, as X, into backend memory at dst
// (one host buffer of X at a time: the host's high-water mark is part of the measured peak).
template <class T, class G, class W>
template <class X>
void Interpreter<T, G, W>::upload_initial_values(char* dst, const std::string& group, const GroupLayout& layout,
                                                 int64_t first, int64_t last) {
  std::vector<X> host(size_t(last - first));
  for (const TensorSlice& tensor : layout.tensors) {
    const int64_t begin = std::max(first, tensor.offset), end = std::min(last, tensor.offset + tensor.elements());
    if (begin >= end) continue;
    const int64_t slice_rank = is_expert_group(group) ? etp_index_ : coord_.tp;  // expert groups: by etp
    const TensorInitializer init(model_, t_, slice_rank, group, tensor, options_.seed);
    // A billion-parameter model draws billions of values: spread them over the host's cores.
    parallel_ranges(end - begin, [&](int64_t from, int64_t to) {
      int64_t local = begin + from - tensor.offset, row = local / tensor.cols, col = local % tensor.cols;
      for (int64_t e = begin + from; e < begin + to; ++e) {
        host[size_t(e - first)] = X(init.at(row, col));
        if (++col == tensor.cols) col = 0, ++row;
      }
    });
  }
  backend_.upload(dst, host.data(), int64_t(host.size() * sizeof(X)));
}

// Adam's two moments, plus the master weights when the weights are 16-bit (lowering's shape
// {elements, states} of the optimizer buffer).
template <class T, class G, class W>
int64_t Interpreter<T, G, W>::optimizer_states(const Op& alloc) {
  return alloc.shape.size() == 2 ? alloc.shape[1] : 2;
}

template <class T, class G, class W>
int64_t Interpreter<T, G, W>::position(int64_t cp_rank, int64_t r) const {
  if (cp_ == 1) return r;
  const int64_t chunk = s_ / 2;  // seq / (2·cp)
  return r < chunk ? cp_rank * chunk + r : (2 * cp_ - 1 - cp_rank) * chunk + (r - chunk);
}

template <class T, class G, class W>
std::vector<typename Interpreter<T, G, W>::PositionRun> Interpreter<T, G, W>::position_runs(int64_t first,
                                                                                           int64_t rows) const {
  std::vector<PositionRun> runs;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t pos = position(coord_.cp, first + r);
    if (!runs.empty() && runs.back().s0 + runs.back().rows == pos) {
      ++runs.back().rows;
    } else {
      runs.push_back({r, 1, pos});
    }
  }
  return runs;
}

// The alloc of a data buffer hands over this step's microbatch: the token source fills the
// staging (once per microbatch: its tokens, targets and samples may all live on one rank),
// which is uploaded into the program's buffer.
template <class T, class G, class W>
void Interpreter<T, G, W>::load_data(const Op& alloc, DataBuffer what) {
  int32_t mb = data_buffer_microbatch(alloc.buffer);
  if (staged_step_ != step_ || staged_microbatch_ != mb) {
    fill_microbatch(*source_, step_, plan_.global_batch_size, b_, plan_.dp_size, dp_rank(), mb, s_full_,
                    batch_tokens_.data(), batch_targets_.data(), batch_samples_.data(), plan_.microbatches_per_replica);
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
    for (int64_t si = 0; si < s_; ++si) staged_[size_t(si * b_ + bi)] = from[size_t(bi * s_full_ + q_positions_[si])];
  }
  STEPCAST_CHECK(arena_.bytes_of(alloc.id) == int64_t(staged_.size() * sizeof(int32_t)),
                 "data buffer " + alloc.buffer + " is not [seq_length, micro_batch_size] int32");
  backend_.upload(dst, staged_.data(), arena_.bytes_of(alloc.id));
}

// Sample indices in the step, read by the dropout masks (none without dropout).
template <class T, class G, class W>
const int64_t* Interpreter<T, G, W>::samples(const Op& op) {
  if (plan_.dropout == 0) return nullptr;
  return buf<int64_t>(data_buffer_name(op.microbatch, DataBuffer::samples), op);
}

template <class T, class G, class W>
void Interpreter<T, G, W>::execute(const Op& op) {
  switch (op.kind) {
    case OpKind::alloc:
      // Persistent buffers (weights, grads, optimizer state) live across steps.
      if (fill_at_alloc_[size_t(op.id)]) backend_.zero(arena_.at(op.id), arena_.bytes_of(op.id));
      if (DataBuffer what = data_buffer_kind(op.buffer); what != DataBuffer::none) load_data(op, what);
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
      return collective(op);
    case OpKind::broadcast:
      STEPCAST_CHECK(false, "the executor has no broadcast (not lowered yet)");
      return;
    case OpKind::embedding:
      return embedding(op);
    case OpKind::norm:
      return norm(op);
    case OpKind::gemm:
      return gemm(op);
    case OpKind::attention:
      return attention(op);
    case OpKind::activation:
      return activation(op);
    case OpKind::loss:
      return loss(op);
    case OpKind::optimizer_step:
      return optimizer(op);
  }
}

#define STEPCAST_INSTANTIATE(T, G, W) template class Interpreter<T, G, W>;
STEPCAST_FOR_EACH_STORAGE(STEPCAST_INSTANTIATE)
#undef STEPCAST_INSTANTIATE

}  // namespace stepcast
