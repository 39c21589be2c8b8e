// The interpreter's communication and optimizer ops (interpreter.hpp): pipeline transfers,
// collectives (tensor, sequence and data parallel, ZeRO's gathers and reduce-scatters) and the
// optimizer (gradient accumulation into shards, the gradient norm, AdamW), reading operands by
// slot and ZeRO slices from shard_layout.hpp.
#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>

#include "cpu_kernels.hpp"  // clip_coefficient, a host function
#include "errors.hpp"
#include "interpreter.hpp"
#include "mpi_collectives.hpp"
#include "parameter_server.hpp"

namespace stepcast {

// Pipeline transfers: the backend posts sends without waiting (and completes them at the end
// of the step); receives block, watched.
template <class T, class G, class W>
void Interpreter<T, G, W>::p2p(const Op& op) {
  if (op.peer == Peer::ps_server) return ps_transfer(op);
  int peer = int(peer_rank(grid_, rank_, op.peer));
  if (op.kind == OpKind::recv) {  // [] → [x]
    const std::string& x = out(op, "x");
    backend_.recv(buf(x, op), count(x, op), peer, op.tag);
    return;
  }
  // [x] → [(staging)]. The send goes from the program's staging copy (comm class, live to the end
  // of the step, when finish_sends completes it), so the tensor's memory may be reused at once.
  // Without one (GPU topologies) it goes from the tensor itself.
  // A send on the tp group carries this rank's 1/tp of the flattened tensor (Megatron-LM v2's
  // split_tensor_into_1d_equal_chunks); the receiving stage all-gathers the slices (pp_gather).
  const std::string& x = in(op, "x");
  int64_t n = count(x, op), offset = 0;
  if (op.group == GroupKind::tp) {
    n /= backend_.group_size(GroupKind::tp);
    offset = n * backend_.group_index(GroupKind::tp);
  }
  if (!operands(op).has_out("staging")) {
    backend_.send(buf(x, op) + offset, n, peer, op.tag);
    return;
  }
  const std::string& staging = out(op, "staging");
  backend_.copy(buf(staging, op), buf(x, op) + offset, n * element_bytes(x, op));
  backend_.send(buf(staging, op), n, peer, op.tag);
}

// A worker's transfer with parameter server op.server (rank world + server): its slice of a
// group's weights (param_pull), of the group's gradient (grad_push), or the gradient norm's
// square (norm_push). The CPU backend sends and receives in the weights' type, which is every
// buffer's there (check_cpu_backend).
template <class T, class G, class W>
void Interpreter<T, G, W>::ps_transfer(const Op& op) {
  STEPCAST_CHECK(sizeof(G) == sizeof(T) && sizeof(W) == sizeof(T), "parameter servers need one dtype for every buffer");
  const int peer = int(grid_.world_size() + op.server);
  if (op.name == OpName::norm_push) {
    backend_.send(reinterpret_cast<T*>(buf<W>(in(op, "norm_sq"), op)), 1, peer, op.tag);
    return;
  }
  const bool pull = op.name == OpName::param_pull;
  const std::string& name = pull ? out(op, "weights") : in(op, "grads");
  auto [first, last] = server_slice(count(name, op), p_.parameter_servers, op.server);
  T* data = reinterpret_cast<T*>(arena_.buffer(name, op.id)) + first;
  if (pull) backend_.recv(data, last - first, peer, op.tag);
  else backend_.send(data, last - first, peer, op.tag);
}

// The buffers of a collective, in their (common) dtype; the op's comm scratch is not one of them.
template <class T, class G, class W>
std::vector<Span<void>> Interpreter<T, G, W>::spans(std::span<const BufferName> names, const Op& op) {
  std::vector<Span<void>> out;
  for (const auto& n : names) {
    if (!is_comm_scratch(n)) out.push_back({arena_.buffer(n, op.id), count(n, op)});
  }
  return out;
}

template <class T, class G, class W>
Dtype Interpreter<T, G, W>::dtype_of_all(std::span<const BufferName> names, const Op& op) const {
  STEPCAST_CHECK(!names.empty(), std::string("collective ") + to_string(op.name) + " has no buffers");
  Dtype first = dtype(names[0], op);
  for (const auto& n : names) {
    STEPCAST_CHECK(dtype(n, op) == first, std::string("collective ") + to_string(op.name) + " mixes dtypes");
  }
  return first;
}

template <class T, class G, class W>
void Interpreter<T, G, W>::collective(const Op& op) {
  if (op.name == OpName::fp8_amax) return fp8_step_end(op);
  if (op.kind == OpKind::all_to_all && operands(op).has_in("counts")) return moe_all_to_all(op);
  if (op.kind == OpKind::all_gather && operands(op).has_in("counts")) moe_etp_gather(op);  // then the rows
  if (op.kind == OpKind::all_gather && op.name == OpName::moe_route_gather) return moe_gather_route(op);
  if (op.kind == OpKind::all_to_all) {  // [x] → [y], block i of x to member i
    const std::string& x = in(op, "x");
    const std::string& y = out(op, "y");
    backend_.all_to_all(op.group, dtype(x, op), {arena_.buffer(x, op.id), count(x, op)},
                        {arena_.buffer(y, op.id), count(y, op)});
    return;
  }
  // Host backends pack and receive chunks in the program's scratch for this op (comm class).
  if (operands(op).has_out("scratch")) {
    int32_t scratch = arena_.alloc_of(out(op, "scratch"), op.id);
    backend_.set_collective_scratch(arena_.at(scratch), arena_.bytes_of(scratch));
  }
  if (op.kind == OpKind::all_reduce) {
    if (op.name == OpName::sp_replicated_grads) {
      // [grads…] → [grads…]: only the replicated part of each buffer (trailing elements of
      // layers, whole groups of replicated tensors); grads are full here (under ZeRO-2/3 each
      // microbatch's full gradient, before its reduce_scatter).
      std::vector<Span<void>> parts;
      for (const auto& name : operands(op).ins("grads")) {
        for (const TensorSlice& tensor : layouts_.at(group_of_buffer(name)).tensors) {
          if (tensor.replicated) parts.push_back({buf<G>(name, op) + tensor.offset, tensor.elements()});
        }
      }
      backend_.all_reduce(op.group, op.algorithm, dtype_of<G>(), parts);
      return;
    }
    if (op.name == OpName::replica_grads && !shards_.sharded(ShardedState::grads)) {
      // [grads…] → [grads…], ZeRO-1 under hybrid sharding: the gradients are full buffers, and
      // only this rank's slice holds the reduce_scatter's result; that slice is all-reduced.
      std::vector<Span<void>> parts;
      for (const auto& name : operands(op).ins("grads")) {
        auto [first, last] = owned(count(name, op), group_of_buffer(name));
        parts.push_back({buf<G>(name, op) + first, last - first});
      }
      backend_.all_reduce(op.group, op.algorithm, dtype_of<G>(), parts);
      return;
    }
    // [x] → [x], [norm_sq] → [norm_sq] or [grads…] → [grads…], reduced in place.
    backend_.all_reduce(op.group, op.algorithm, dtype_of_all(op.outputs, op), spans(op.outputs, op));
    return;
  }
  if (op.kind == OpKind::reduce_scatter) {
    if (op.name == OpName::grad_bucket) {
      if (shards_.sharded(ShardedState::grads)) {
        // [grads…] as (full gradient, shard) pairs; the reduced chunk is added into the shard.
        std::vector<BufferName> grads = operands(op).ins("grads");
        std::vector<Span<void>> full;
        for (size_t i = 0; i < grads.size(); i += 2) full.push_back({buf<G>(grads[i], op), count(grads[i], op)});
        backend_.reduce_scatter(op.group, dtype_of<G>(), full);
        for (size_t i = 0; i < grads.size(); i += 2) {
          G* f = buf<G>(grads[i], op);
          G* shard = buf<G>(grads[i + 1], op);
          const std::string group = group_of_buffer(grads[i]);
          auto [first, last] = shards(group).slice(count(grads[i], op), shard_rank(group));
          backend_.add(shard, f + first, last - first);
        }
        return;
      }
      backend_.reduce_scatter(op.group, dtype_of_all(op.outputs, op), spans(op.outputs, op));
      return;
    }
    // Sequence-parallel reduce_scatter [x] → [y]: a [s, b, h] partial sum → this rank's s/t rows.
    const std::string& x = in(op, "x");
    char* full = arena_.buffer(x, op.id);
    int64_t n = count(x, op), e = element_bytes(x, op);
    backend_.reduce_scatter(op.group, dtype(x, op), {{full, n}});
    auto [first, last] = chunk_range(n, backend_.group_size(op.group), backend_.group_index(op.group));
    backend_.copy(arena_.buffer(out(op, "y"), op.id), full + first * e, (last - first) * e);
    return;
  }
  // all_gather
  if (op.name == OpName::param_gather) {  // [weights…] → [weights…], in place
    for (const BufferName& name : operands(op).outs("weights")) {
      if (kept_layouts_.count(group_of_buffer(name)) && name.rfind("weights.", 0) == 0) return gather_by_sum(op);
    }
    backend_.all_gather(op.group, dtype_of_all(op.outputs, op), spans(op.outputs, op));
    return;
  }
  // zero3_param_gather [shard] → [full]: this rank's weight slice; the sequence-parallel gathers
  // and the loss statistics [x] → [y]: its chunk of the group. The part goes to its place in the
  // full buffer, which is then gathered in place.
  bool zero3 = op.name == OpName::zero3_param_gather;
  const std::string& part_name = in(op, zero3 ? "shard" : "x");
  const std::string& full_name = out(op, zero3 ? "full" : "y");
  char* part = arena_.buffer(part_name, op.id);
  char* full = arena_.buffer(full_name, op.id);
  // (A block-scaled buffer's codes and scales are gathered as its bytes: its shards are whole bands.)
  const bool blocks = is_block_scaled(dtype(full_name, op));
  int64_t n = blocks ? arena_.bytes_of(arena_.alloc_of(full_name, op.id)) : count(full_name, op);
  int64_t e = blocks ? 1 : element_bytes(full_name, op);
  const std::string group = group_of_buffer(full_name);
  ShardRange part_range = zero3 ? shards(group).slice(n, shard_rank(group)) : ShardRange{};
  if (!zero3) {
    std::tie(part_range.first, part_range.last) =
        chunk_range(n, backend_.group_size(op.group), backend_.group_index(op.group));
  }
  auto [first, last] = part_range;
  backend_.copy(full + first * e, part, (last - first) * e);
  backend_.all_gather(op.group, dtype(full_name, op), {{full, n}});
}

// param_gather of weights buffers some of which hold a layer's kept tensors (fp8_param_gather): a
// rank's shard of the group is its owned elements, uneven pieces of those buffers, so each rank
// zeroes what it does not own and the buffers are summed over the group (exact: one term is not
// zero). The program costs the gather's bytes.
template <class T, class G, class W>
void Interpreter<T, G, W>::gather_by_sum(const Op& op) {
  std::vector<BufferName> names = operands(op).outs("weights");
  for (const BufferName& name : names) {
    const std::string group = group_of_buffer(name);
    const GroupLayout& layout = buffer_layout(name);
    auto [first, last] = owned(layouts_.at(group).elements, group);
    T* w = buf(name, op);
    for (const TensorSlice& t : layout.tensors) {
      const TensorSlice& full = layouts_.at(group).at(t.name);  // where the shards cut it
      const int64_t a = std::clamp(first - full.offset, int64_t(0), t.elements());
      const int64_t z = std::clamp(last - full.offset, a, t.elements());
      backend_.zero(w + t.offset, a * int64_t(sizeof(T)));
      backend_.zero(w + t.offset + z, (t.elements() - z) * int64_t(sizeof(T)));
    }
  }
  backend_.all_reduce(op.group, Algorithm::ring, dtype_of_all(names, op), spans(names, op));
}

template <class T, class G, class W>
bool Interpreter<T, G, W>::counted_in_norm(const std::string& group, const TensorSlice& tensor) const {
  // An expert tensor whole on every etp rank (the down projection's bias) counted on the first.
  if (is_expert_group(group) && tensor.replicated && etp_index_ != 0) return false;
  if (moe_norm_) {
    if (group == "output" && model_.tie_word_embeddings) return false;
    return is_expert_group(group) ? norm_counts_experts_
                                  : tensor.replicated ? norm_counts_replicated_ : norm_counts_dense_;
  }
  if (is_expert_group(group)) return true;
  if (tensor.replicated && coord_.tp != 0) return false;              // tp duplicates counted once
  if (group == "output" && model_.tie_word_embeddings) return false;  // the embedding's copy
  return true;
}

template <class T, class G, class W>
void Interpreter<T, G, W>::optimizer(const Op& op) {
  if (op.name == OpName::fp8_scale_update) return fp8_step_end(op);
  if (op.name == OpName::grad_accumulate) {  // [full, shard] → [shard]: dp 1, ZeRO ≥ 2
    const std::string& shard = out(op, "shard");
    backend_.add(buf<G>(shard, op), buf<G>(in(op, "full"), op), count(shard, op));
    return;
  }
  if (op.name == OpName::grad_stash) {  // [from] → [to]: asynchronous dp's gradient moved a slot on
    const std::string& to = out(op, "to");
    const int64_t bytes = arena_.bytes_of(arena_.alloc_of(to, op.id));
    backend_.copy(arena_.buffer(to, op.id), arena_.buffer(in(op, "from"), op.id), bytes);
    return;
  }
  if (op.name == OpName::grad_norm) {  // [grads…] → [norm_sq]: Σ g² over what this rank owns
    std::vector<std::pair<const G*, int64_t>> ranges;
    for (const auto& name : operands(op).ins("grads")) {
      std::string group = group_of_buffer(name);
      const GroupLayout& layout = layouts_.at(group);
      auto [first, last] = owned(layout.elements, group);
      int64_t base = held_first(ShardedState::grads, layout.elements, group);
      const G* g = buf<G>(name, op);
      for (const TensorSlice& tensor : layout.tensors) {
        if (!counted_in_norm(group, tensor)) continue;
        int64_t a = std::max(first, tensor.offset), z = std::min(last, tensor.offset + tensor.elements());
        if (a < z) ranges.emplace_back(g + (a - base), z - a);
      }
    }
    W value = W(backend_.grad_norm_sq(ranges) * norm_weight_);
    backend_.upload(buf<W>(out(op, "norm_sq"), op), &value, sizeof(W));
    return;
  }
  // [grads…, states…, norm_sq] → [states…, weights…]: group i's gradient, state and weights.
  STEPCAST_CHECK(op.name == OpName::adamw, std::string("unknown optimizer op ") + to_string(op.name));
  // Asynchronous data parallelism: the gradient of step t is applied in step t + k; steps before
  // k have none to apply, and Adam counts its steps from the first update.
  const int64_t update = step_ - p_.async_staleness;
  if (update < 0) return;
  W norm_sq = 0;
  backend_.download(&norm_sq, buf<W>(in(op, "norm_sq"), op), sizeof(W));
  double norm = std::sqrt(double(norm_sq));
  last_grad_norm_ = norm;
  double clip = cpu::clip_coefficient(norm, options_.max_grad_norm);
  cpu::AdamW config{options_.lr, options_.beta1, options_.beta2, options_.adam_eps, 0.0};
  const std::vector<BufferName> grads = operands(op).ins("grads");
  const std::vector<BufferName> states = operands(op).outs("states");
  const std::vector<BufferName> weights = operands(op).outs("weights");
  for (size_t i = 0; i < grads.size(); ++i) {
    const std::string group = group_of_buffer(grads[i]);
    const GroupLayout& layout = layouts_.at(group);
    auto [first, last] = owned(layout.elements, group);
    // fp8_param_gather: a layer's FP8 weights have their master only (fp8_param_cast writes their
    // codes), its other tensors their places in the kept layout.
    const auto kept = kept_layouts_.find(group);
    const bool fp8_params = kept != kept_layouts_.end();
    T* w = buf(weights.at(i), op);
    if (!fp8_params) w += first - held_first(ShardedState::weights, layout.elements, group);
    G* g = buf<G>(grads[i], op) + (first - held_first(ShardedState::grads, layout.elements, group));
    W* state = buf<W>(states.at(i), op);
    // [m | v (| master)], each state_n long.
    int64_t n_states = optimizer_states(role_.ops[size_t(arena_.alloc_of(states[i], op.id))]);
    int64_t state_n = count(states[i], op) / n_states;
    int64_t at = first - held_first(ShardedState::optimizer, layout.elements, group);
    W* m = state + at;
    W* v = state + state_n + at;
    W* master = n_states == 3 ? state + 2 * state_n + at : nullptr;
    STEPCAST_CHECK(!fp8_params || master, "a layer with FP8 parameters has a master copy (optimizer." + group + ")");
    for (const TensorSlice& tensor : layout.tensors) {
      int64_t a = std::max(first, tensor.offset), z = std::min(last, tensor.offset + tensor.elements());
      if (a >= z) continue;
      config.weight_decay = tensor.decay ? options_.weight_decay : 0.0;
      int64_t o = a - first;
      T* param = !fp8_params                     ? w + o
                 : kept->second.has(tensor.name) ? w + kept->second.at(tensor.name).offset + (a - tensor.offset)
                                                 : nullptr;
      backend_.adamw_step(param, master ? master + o : nullptr, g + o, m + o, v + o, z - a, config, update + 1, clip);
    }
  }
}

#define STEPCAST_INSTANTIATE_COMM(T, G, W)                                                                  \
  template void Interpreter<T, G, W>::p2p(const Op&);                                                       \
  template void Interpreter<T, G, W>::ps_transfer(const Op&);                                               \
  template std::vector<Span<void>> Interpreter<T, G, W>::spans(std::span<const BufferName>, const Op&); \
  template Dtype Interpreter<T, G, W>::dtype_of_all(std::span<const BufferName>, const Op&) const;      \
  template void Interpreter<T, G, W>::collective(const Op&);                                                \
  template bool Interpreter<T, G, W>::counted_in_norm(const std::string&, const TensorSlice&) const;        \
  template void Interpreter<T, G, W>::optimizer(const Op&);                                                 \
  template void Interpreter<T, G, W>::gather_by_sum(const Op&);
STEPCAST_FOR_EACH_STORAGE(STEPCAST_INSTANTIATE_COMM)
#undef STEPCAST_INSTANTIATE_COMM

}  // namespace stepcast
