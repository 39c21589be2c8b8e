// Lowering of a plan into the StepProgram: one role per pipeline stage, its persistent buffers
// (weights, gradients, optimizer state, sharded by ZeRO stage), the schedule's forward and
// backward passes with their pipeline sends and receives, the data-parallel gradient reduction in
// buckets, and the optimizer step. Layer internals are in lower_layer.cpp.
#include "lower.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include "errors.hpp"
#include "lower_context.hpp"
#include "schedule.hpp"

namespace stepcast {

int64_t padded_vocab_size(const ModelConfig& model, int64_t tp_size) {
  return (model.vocab_size + tp_size - 1) / tp_size * tp_size;
}

LowerContext::LowerContext(const ModelConfig& m, const Topology& topo, const Plan& p)
    : model(m), topology(topo), plan(p), grid(p.tp_size, p.dp_size, p.pp_size, p.order),
      links(link_figures(topo)), shards(p.zero_stage, p.dp_size) {
  s = m.seq_length;
  b = p.micro_batch_size;
  h = m.hidden_size;
  t = p.tp_size;
  d = m.head_dim();
  f = m.intermediate_size;
  s_local = p.sequence_parallel ? s / t : s;
  heads_local = m.num_attention_heads / t;
  kv_local = m.num_key_value_heads / t;
  qkv_width = (heads_local + 2 * kv_local) * d;
  f_local = f / t;
  vocab_padded = padded_vocab_size(m, t);
  vocab_local = vocab_padded / t;
  act = p.activation_dtype();
  grad = p.grad_dtype;
  wide = act == Dtype::fp64 ? Dtype::fp64 : Dtype::fp32;
  dropout = p.dropout > 0;
  num_virtual_stages = p.pp_size * p.virtual_pp_size;
}

int64_t LowerContext::norm_params() const {
  return model.norm == NormKind::layernorm ? 2 * h : h;
}

int64_t LowerContext::layer_params_local() const {
  int64_t gated = model.mlp == MlpKind::swiglu ? 2 : 1;
  int64_t column = h * qkv_width + gated * h * f_local;                  // qkv, mlp_up (+gate)
  int64_t row = heads_local * d * h + f_local * h;                       // attn_out, mlp_down
  int64_t column_bias = model.use_bias ? qkv_width + gated * f_local : 0;
  return column + row + column_bias + layer_sp_replicated();
}

int64_t LowerContext::layer_sp_replicated() const {
  int64_t row_bias = model.use_bias ? 2 * h : 0;  // attn_out and mlp_down biases
  return 2 * norm_params() + row_bias;
}

int64_t LowerContext::first_layer(int64_t vs) const {
  int64_t first = 0;
  for (int64_t i = 0; i < vs; ++i) first += plan.layers_per_stage[i];
  return first;
}

// ---- OpEmitter ----

double OpEmitter::buffer_bytes(const std::vector<std::string>& names) const {
  double total = 0;
  for (const auto& n : names) total += rb_.live_bytes(n);
  return total;
}

int32_t OpEmitter::gemm(const OpSite& at, OpName name, Grad grad,
                        int64_t m, int64_t n, int64_t k, std::vector<std::string> inputs,
                        std::vector<std::string> outputs) {
  Op op;
  op.kind = OpKind::gemm;
  op.stream = Stream::compute;
  op.phase = at.phase;
  op.name = name;
  op.grad = grad;
  op.layer = at.layer;
  op.microbatch = at.microbatch;
  op.chunk = at.chunk;
  op.batch = 1;
  op.m = m;
  op.n = n;
  op.k = k;
  op.flops = 2.0 * double(m) * double(n) * double(k);
  // Operands in the activation dtype; a weight gradient is accumulated in the gradient dtype.
  double out_bytes = grad == Grad::wgrad ? dtype_bytes(ctx_.grad) : dtype_bytes(ctx_.act);
  op.bytes = (double(m) * k + double(k) * n) * dtype_bytes(ctx_.act) + double(m) * n * out_bytes;
  op.inputs = std::move(inputs);
  op.outputs = std::move(outputs);
  return rb_.emit(std::move(op));
}

int32_t OpEmitter::compute(const OpSite& at, OpKind kind, OpName name, double flops,
                           std::vector<std::string> inputs, std::vector<std::string> outputs,
                           const std::vector<int32_t>& extra_deps) {
  Op op;
  op.kind = kind;
  op.stream = Stream::compute;
  op.phase = at.phase;
  op.name = name;
  op.layer = at.layer;
  op.microbatch = at.microbatch;
  op.chunk = at.chunk;
  op.flops = flops;
  // Bytes moved: activation buffers read and written; parameter buffers count only where the
  // op is the optimizer (see emit_optimizer), not for a norm reading a whole layer's weights.
  std::vector<std::string> moved;
  for (const auto& v : {std::cref(inputs), std::cref(outputs)}) {
    for (const auto& n : v.get()) {
      if (n.rfind("weights.", 0) == 0 || n.rfind("grads.", 0) == 0 || n.rfind("wfull.", 0) == 0 ||
          n.rfind("gradfull.", 0) == 0) {
        continue;
      }
      moved.push_back(n);
    }
  }
  op.bytes = buffer_bytes(moved);
  op.inputs = std::move(inputs);
  op.outputs = std::move(outputs);
  return rb_.emit(std::move(op), extra_deps);
}

int32_t OpEmitter::attention(const OpSite& at, OpName name, double flops,
                             std::vector<std::string> inputs, std::vector<std::string> outputs) {
  int32_t id = compute(at, OpKind::attention, name, flops, std::move(inputs), std::move(outputs));
  Op& op = const_cast<Op&>(rb_.role().ops[id]);
  op.batch = ctx_.b * ctx_.heads_local;
  op.m = ctx_.s;
  op.n = ctx_.s;
  op.k = ctx_.d;
  return id;
}

int64_t OpEmitter::group_size(GroupKind group) const {
  return int64_t(ctx_.grid.group(group, first_rank_).size());
}

int32_t OpEmitter::collective(const OpSite& at, OpKind kind, GroupKind group, Stream stream,
                              OpName name, double bytes,
                              std::vector<std::string> inputs, std::vector<std::string> outputs,
                              const std::vector<int32_t>& extra_deps) {
  GroupShape shape = group_shape(ctx_.grid, group, first_rank_, ctx_.topology.node.devices_per_node);
  if (shape.size <= 1) return -1;
  Op op;
  op.kind = kind;
  op.stream = stream;
  op.phase = at.phase;
  op.name = name;
  op.layer = at.layer;
  op.microbatch = at.microbatch;
  op.chunk = at.chunk;
  op.group = group;
  op.bytes = bytes;
  op.algorithm = choose_algorithm(kind, bytes, shape, ctx_.links);
  // On a host (ranks on CPU cores sharing memory), the scratch the CPU backend packs and
  // receives chunks in: a comm buffer of the program, live around the op alone, written by it
  // (its last output; see is_comm_scratch), so `memory` and the simulator count it and the
  // executor takes it from the arena. NCCL works in place; its buffers are runtime memory.
  std::string scratch;
  if (ctx_.topology.node.intra_node.kind == IntraNodeKind::shared_memory) {
    const std::string& payload = outputs.empty() ? inputs.at(0) : outputs.at(0);
    Dtype dtype = rb_.live_dtype(payload);
    int64_t elements = int64_t(bytes / dtype_bytes(dtype) + 0.5);
    scratch = comm_scratch_prefix() + std::string(to_string(name)) + "." + std::to_string(rb_.last_op() + 2);  // op id
    rb_.alloc(scratch, BufferClass::comm, dtype,
              {collective_scratch_elements(kind, op.algorithm, shape, elements)}, at.phase);
    outputs.push_back(scratch);
  }
  op.inputs = std::move(inputs);
  op.outputs = std::move(outputs);
  int32_t id = rb_.emit(std::move(op), extra_deps);
  if (!scratch.empty()) rb_.free(scratch, at.phase);
  return id;
}

int32_t OpEmitter::p2p(const OpSite& at, OpKind kind, Peer peer, int64_t tag, double bytes,
                       const std::string& buffer, const std::string& staging) {
  Op op;
  op.kind = kind;
  op.stream = Stream::p2p;
  op.phase = at.phase;
  op.name = kind == OpKind::send ? OpName::send : OpName::recv;
  op.microbatch = at.microbatch;
  op.chunk = at.chunk;
  op.peer = peer;
  op.tag = tag;
  op.bytes = bytes;
  if (kind == OpKind::send) op.inputs = {buffer};
  else op.outputs = {buffer};
  if (!staging.empty()) op.outputs = {staging};  // a send writes its staging copy
  return rb_.emit(std::move(op));
}

namespace {

// Parameters that live together: one layer, the embeddings, the final norm, the output layer.
struct ParamGroup {
  std::string name;           // "L12", "embedding", "position", "final_norm", "output"
  int64_t elements = 0;       // per tensor-parallel rank, before ZeRO sharding
  int64_t sp_replicated = 0;  // elements whose gradients need a tp all_reduce under SP
  int64_t chunk = 0;
  bool tied_copy = false;     // output layer that is the last stage's copy of the embedding
};

std::string layer_group_name(int64_t layer) {
  std::string name = "L";  // appended, not "L" + ...: GCC 12 warns falsely (-Wrestrict) on that
  name += std::to_string(layer);
  return name;
}

class RoleLowering {
 public:
  RoleLowering(const LowerContext& ctx, Role& role)
      : c_(ctx), plan_(ctx.plan), role_(role), rb_(role),
        e_(ctx, rb_, ctx.grid.rank(RankCoord{0, 0, role.pp_stage})) {}

  void lower() {
    collect_param_groups();
    alloc_persistent();
    if (plan_.overlap_param_gather && (plan_.zero_stage == 1 || plan_.zero_stage == 2)) {
      // Parameters updated by the previous step's optimizer are gathered as this step starts,
      // overlapping the forward pass (Megatron's overlap_param_gather).
      emit_param_gathers(Phase::forward);
    }
    ScheduleShape shape{plan_.pp_size, plan_.virtual_pp_size, plan_.num_microbatches()};
    std::vector<PassAction> actions = schedule_actions(plan_.schedule, shape, role_.pp_stage);
    std::map<int64_t, size_t> last_backward;  // chunk → index of its last backward action
    for (size_t i = 0; i < actions.size(); ++i) {
      if (!actions[i].forward) last_backward[actions[i].chunk] = i;
    }
    for (size_t i = 0; i < actions.size(); ++i) {
      const PassAction& a = actions[i];
      if (a.forward) emit_chunk_forward(a.microbatch, a.chunk);
      else emit_chunk_backward(a.microbatch, a.chunk, last_backward[a.chunk] == i);
    }
    // After the whole backward pass (no overlap): on its last timed op, not on a free.
    for (auto& bucket : deferred_buckets_) emit_bucket(bucket, {rb_.last_timed_op()});
    deferred_buckets_.clear();
    emit_finalize_grads();
    emit_optimizer();
    if (!plan_.overlap_param_gather && (plan_.zero_stage == 1 || plan_.zero_stage == 2)) {
      emit_param_gathers(Phase::optimizer);
    }
    rb_.free_all(send_staging_, Phase::optimizer);  // the step's sends are complete here
  }

 private:
  struct Bucket {
    std::vector<const ParamGroup*> groups;
    int32_t microbatch = -1;
    int64_t chunk = 0;
    double bytes = 0;
  };

  void collect_param_groups() {
    const ModelConfig& m = c_.model;
    for (int64_t chunk = 0; chunk < plan_.virtual_pp_size; ++chunk) {
      int64_t vs = c_.virtual_stage(role_.pp_stage, chunk);
      role_.chunks_virtual_stages.push_back(vs);
      if (vs == 0) {
        groups_.push_back({"embedding", c_.vocab_local * c_.h, 0, chunk, false});
        if (m.position == PositionKind::learned) {
          groups_.push_back({"position", m.max_position_embeddings * c_.h,
                             m.max_position_embeddings * c_.h, chunk, false});
        }
      }
      int64_t first = c_.first_layer(vs);
      for (int64_t l = first; l < first + plan_.layers_per_stage[vs]; ++l) {
        groups_.push_back({layer_group_name(l), c_.layer_params_local(),
                           c_.layer_sp_replicated(), chunk, false});
      }
      if (vs == c_.num_virtual_stages - 1) {
        groups_.push_back({"final_norm", c_.norm_params(), c_.norm_params(), chunk, false});
        bool shares_embedding = m.tie_word_embeddings && plan_.pp_size == 1;
        if (!shares_embedding) {
          groups_.push_back({"output", c_.vocab_local * c_.h, 0, chunk, m.tie_word_embeddings});
        }
      }
    }
    for (const auto& g : groups_) group_index_[g.name] = &g;
  }

  const ParamGroup& group(const std::string& name) const { return *group_index_.at(name); }

  // Elements of a group held by this rank for weights, gradients and optimizer state.
  int64_t weight_elements(const ParamGroup& g) const {
    return c_.shards.buffer_elements(ShardedState::weights, g.elements);
  }
  int64_t grad_elements(const ParamGroup& g) const {
    return c_.shards.buffer_elements(ShardedState::grads, g.elements);
  }
  int64_t optimizer_elements(const ParamGroup& g) const {
    return c_.shards.buffer_elements(ShardedState::optimizer, g.elements);
  }
  // Optimizer state per parameter: Adam's two moments, plus a master copy of the weights when
  // they are kept in a 16-bit dtype; all in fp32 (fp64 for fp64 weights).
  int64_t optimizer_states() const { return dtype_bytes(c_.act) < 4 ? 3 : 2; }
  Dtype optimizer_dtype() const { return c_.wide; }

  void alloc_persistent() {
    for (const auto& g : groups_) {
      rb_.alloc("weights." + g.name, BufferClass::weights, c_.act, {weight_elements(g)},
                Phase::forward, true);
      rb_.alloc("grads." + g.name, BufferClass::grads, c_.grad, {grad_elements(g)},
                Phase::forward, true);
      rb_.alloc("optimizer." + g.name, BufferClass::optimizer, optimizer_dtype(),
                {optimizer_elements(g), optimizer_states()}, Phase::forward, true);
    }
  }

  double act_bytes(const std::vector<int64_t>& shape) const {
    double n = 1;
    for (auto v : shape) n *= double(v);
    return n * dtype_bytes(c_.act);
  }

  // ZeRO-3: gather a group's full weights before use (prefetching the next with
  // overlap_param_gather); other stages read the persistent buffer.
  std::string weights_for(const ParamGroup& g, const OpSite& at,
                          const ParamGroup* prefetch_next) {
    if (!c_.shards.sharded(ShardedState::weights)) return "weights." + g.name;
    auto gather = [&](const ParamGroup& target) {
      std::string full = "wfull." + target.name + ".mb" + std::to_string(at.microbatch) + "." +
                         to_string(at.phase);
      if (rb_.is_live(full)) return full;
      rb_.alloc(full, BufferClass::weights, c_.act, {target.elements}, at.phase);
      e_.collective(at, OpKind::all_gather, GroupKind::dp, Stream::comm, OpName::zero3_param_gather,
                    double(target.elements) * dtype_bytes(c_.act), {"weights." + target.name},
                    {full});
      return full;
    };
    std::string full = gather(g);
    if (plan_.overlap_param_gather && prefetch_next) gather(*prefetch_next);
    return full;
  }

  void release_weights(const std::string& name, Phase phase) {
    if (name.rfind("wfull.", 0) == 0) rb_.free(name, phase);
  }

  // ZeRO-2/3: a group's full gradient for one microbatch lives in a transient buffer until its
  // bucket is reduce_scattered into the persistent shard.
  std::string grads_for(const ParamGroup& g, int32_t microbatch) {
    if (!c_.shards.sharded(ShardedState::grads)) return "grads." + g.name;
    std::string full = "gradfull." + g.name + ".mb" + std::to_string(microbatch);
    if (!rb_.is_live(full)) {
      rb_.alloc(full, BufferClass::comm, c_.grad, {g.elements}, Phase::backward);
    }
    return full;
  }

  // A send's staging copy (comm class): the tensor it sends may be freed and reused at once,
  // while the send completes only when the peer receives. It lives to the end of the step, where
  // the executor completes every send, so no rank waits for a peer before freeing memory.
  // Only on a host topology, where the CPU backend needs it. On GPUs the CUDA backend copies into
  // staging of its own on its p2p stream (runtime memory, not the program's; see README).
  std::string send_staging(int32_t mb, int64_t chunk, const char* pass, std::vector<int64_t> shape,
                           Phase phase) {
    if (c_.topology.node.intra_node.kind != IntraNodeKind::shared_memory) return "";
    std::string name = comm_scratch_prefix() + std::string("send.") + tag_name(pass, mb, chunk);
    rb_.alloc(name, BufferClass::comm, c_.act, std::move(shape), phase);
    send_staging_.push_back(name);
    return name;
  }

  std::string tag_name(const char* what, int32_t mb, int64_t chunk) const {
    return "mb" + std::to_string(mb) + ".c" + std::to_string(chunk) + "." + what;
  }
  int64_t p2p_tag(int32_t mb, int64_t sender_vs, bool backward) const {
    return (int64_t(mb) * c_.num_virtual_stages + sender_vs) * 2 + (backward ? 1 : 0);
  }
  std::vector<const ParamGroup*> layer_groups(int64_t vs) const {
    std::vector<const ParamGroup*> out;
    int64_t first = c_.first_layer(vs);
    for (int64_t l = first; l < first + plan_.layers_per_stage[vs]; ++l) {
      out.push_back(&group(layer_group_name(l)));
    }
    return out;
  }

  void emit_chunk_forward(int32_t mb, int64_t chunk) {
    int64_t vs = c_.virtual_stage(role_.pp_stage, chunk);
    OpSite at{Phase::forward, -1, mb, int32_t(chunk)};
    std::vector<int64_t> local = {c_.s_local, c_.b, c_.h};
    if (c_.dropout && chunk == 0) {  // the masks of every chunk of this microbatch read them
      rb_.alloc(data_buffer_name(mb, DataBuffer::samples), BufferClass::activations, Dtype::int64,
                {c_.b}, Phase::forward);
    }
    std::string x;
    if (vs == 0) {
      x = emit_embedding_forward(at);
    } else {
      x = tag_name("in", mb, chunk);
      rb_.alloc(x, BufferClass::activations, c_.act, local, Phase::forward);
      e_.p2p(at, OpKind::recv, Peer::pp_prev, p2p_tag(mb, vs - 1, false), act_bytes(local), x);
    }
    chunk_input_[{mb, chunk}] = x;
    auto layers = layer_groups(vs);
    for (size_t i = 0; i < layers.size(); ++i) {
      OpSite lat = at;
      lat.layer = int32_t(std::stoi(layers[i]->name.substr(1)));
      const ParamGroup* next = i + 1 < layers.size() ? layers[i + 1] : nullptr;
      std::string w = weights_for(*layers[i], lat, next);
      x = emit_layer_forward(e_, lat, x, {w, ""}, KeepMode::per_plan);
      release_weights(w, Phase::forward);
    }
    if (vs == c_.num_virtual_stages - 1) {
      emit_loss_forward(at, x);
    } else {
      e_.p2p(at, OpKind::send, Peer::pp_next, p2p_tag(mb, vs, false), act_bytes(local), x,
             send_staging(mb, chunk, "forward", local, Phase::forward));
      rb_.free(x, Phase::forward);
    }
  }

  void emit_chunk_backward(int32_t mb, int64_t chunk, bool last_for_chunk) {
    int64_t vs = c_.virtual_stage(role_.pp_stage, chunk);
    OpSite at{Phase::backward, -1, mb, int32_t(chunk)};
    std::vector<int64_t> local = {c_.s_local, c_.b, c_.h};
    bool reduce_now = plan_.zero_stage >= 2 || last_for_chunk;
    std::string g = tag_name("grad", mb, chunk);
    if (vs == c_.num_virtual_stages - 1) {
      emit_loss_backward(at, g);
      if (reduce_now) {
        for (const char* name : {"output", "final_norm"}) {
          if (group_index_.count(name)) grads_ready(group(name), mb, chunk);
        }
      }
    } else {
      rb_.alloc(g, BufferClass::activations, c_.act, local, Phase::backward);
      e_.p2p(at, OpKind::recv, Peer::pp_next, p2p_tag(mb, vs + 1, true), act_bytes(local), g);
    }
    auto layers = layer_groups(vs);
    for (size_t i = layers.size(); i-- > 0;) {
      const ParamGroup& pg = *layers[i];
      OpSite lat = at;
      lat.layer = int32_t(std::stoi(pg.name.substr(1)));
      const ParamGroup* next = i > 0 ? layers[i - 1] : nullptr;
      std::string w = weights_for(pg, lat, next);
      std::string x_in = i == 0 ? chunk_input_.at({mb, chunk}) : layer_prefix(mb, lat.layer - 1) + "out";
      emit_layer_backward(e_, lat, x_in, g, {w, grads_for(pg, mb)});
      release_weights(w, Phase::backward);
      if (reduce_now) grads_ready(pg, mb, chunk);
    }
    chunk_input_.erase({mb, chunk});
    if (vs == 0) {
      emit_embedding_backward(at, g);
      if (reduce_now) {
        for (const char* name : {"position", "embedding"}) {
          if (group_index_.count(name)) grads_ready(group(name), mb, chunk);
        }
      }
    } else {
      e_.p2p(at, OpKind::send, Peer::pp_prev, p2p_tag(mb, vs, true), act_bytes(local), g,
             send_staging(mb, chunk, "backward", local, Phase::backward));
      rb_.free(g, Phase::backward);
    }
    if (c_.dropout && chunk == 0) rb_.free(data_buffer_name(mb, DataBuffer::samples), Phase::backward);
    if (reduce_now) {
      flush_bucket();
      for (auto& bucket : deferred_pass_buckets_) emit_bucket(bucket, {rb_.last_timed_op()});
      deferred_pass_buckets_.clear();
    }
  }

  // ---- embedding and loss ----

  std::string emit_embedding_forward(const OpSite& at) {
    std::string prefix = "mb" + std::to_string(at.microbatch) + ".emb.";
    std::vector<int64_t> full = {c_.s, c_.b, c_.h};
    std::vector<int64_t> local = {c_.s_local, c_.b, c_.h};
    std::string word = prefix + "word";
    rb_.alloc(word, BufferClass::workspace, c_.act, full, at.phase);
    // Vocab-parallel lookup of the microbatch's token ids (from the sample mapping): each tp
    // rank fills the rows of its vocabulary shard, zeros elsewhere; the reduction completes it.
    std::string ew = weights_for(group("embedding"), at, nullptr);
    std::string ids = data_buffer_name(at.microbatch, DataBuffer::tokens);
    rb_.alloc(ids, BufferClass::activations, Dtype::int32, {c_.s, c_.b}, at.phase);
    e_.compute(at, OpKind::embedding, OpName::word, 0, {ew, ids}, {word});
    release_weights(ew, at.phase);
    std::string reduced = word;
    double bytes = act_bytes(full);
    if (plan_.sequence_parallel) {
      reduced = prefix + "word_rs";
      rb_.alloc(reduced, BufferClass::workspace, c_.act, local, at.phase);
      e_.collective(at, OpKind::reduce_scatter, GroupKind::tp, Stream::compute, OpName::tp_embedding,
                    bytes, {word}, {reduced});
      rb_.free(word, at.phase);
    } else {
      e_.collective(at, OpKind::all_reduce, GroupKind::tp, Stream::compute, OpName::tp_embedding, bytes,
                    {word}, {word});
    }
    std::string out = prefix + "out";
    rb_.alloc(out, BufferClass::activations, c_.act, local, at.phase);
    std::vector<std::string> outputs = {out};
    if (c_.dropout) {
      rb_.alloc(prefix + "mask", BufferClass::activations, Dtype::fp8, local, at.phase);
      outputs.push_back(prefix + "mask");
    }
    std::vector<std::string> inputs = {reduced};
    std::string pw;
    if (c_.model.position == PositionKind::learned) {
      pw = weights_for(group("position"), at, nullptr);
      inputs.push_back(pw);
    }
    e_.compute(at, OpKind::embedding, OpName::position_dropout, 3.0 * c_.s_local * c_.b * c_.h, inputs,
               outputs);
    rb_.free(reduced, at.phase);
    if (!pw.empty()) release_weights(pw, at.phase);
    return out;
  }

  void emit_embedding_backward(const OpSite& at, const std::string& g) {
    std::string prefix = "mb" + std::to_string(at.microbatch) + ".emb.";
    std::vector<int64_t> full = {c_.s, c_.b, c_.h};
    std::vector<int64_t> local = {c_.s_local, c_.b, c_.h};
    std::string d = g;
    std::vector<std::string> inputs = {g};
    std::vector<std::string> outputs;
    if (c_.dropout) inputs.push_back(prefix + "mask");
    if (c_.model.position == PositionKind::learned) outputs.push_back(grads_for(group("position"), at.microbatch));
    if (c_.dropout || !outputs.empty()) {
      d = prefix + "d_out";
      rb_.alloc(d, BufferClass::workspace, c_.act, local, at.phase);
      outputs.push_back(d);
      e_.compute(at, OpKind::embedding, OpName::position_dropout, 3.0 * c_.s_local * c_.b * c_.h,
                 inputs, outputs);
      if (c_.dropout) rb_.free(prefix + "mask", at.phase);
      rb_.free(g, at.phase);
    }
    std::string d_full = d;
    if (plan_.sequence_parallel) {
      d_full = prefix + "d_full";
      rb_.alloc(d_full, BufferClass::workspace, c_.act, full, at.phase);
      e_.collective(at, OpKind::all_gather, GroupKind::tp, Stream::compute, OpName::sp_embedding,
                    act_bytes(full), {d}, {d_full});
      rb_.free(d, at.phase);
    }
    std::string eg = grads_for(group("embedding"), at.microbatch);
    std::string ew = weights_for(group("embedding"), at, nullptr);
    std::string ids = data_buffer_name(at.microbatch, DataBuffer::tokens);
    e_.compute(at, OpKind::embedding, OpName::word, 0, {d_full, ew, eg, ids}, {eg});
    rb_.free(d_full, at.phase);
    rb_.free(ids, at.phase);
    release_weights(ew, at.phase);
  }

  // Final norm, logits (vocab-parallel) and cross-entropy. The tp ranks exchange per-token
  // (max, sum of exp, target logit) of their vocabulary shard with one all_gather, so the
  // loss needs no MAX reduction.
  void emit_loss_forward(const OpSite& at, const std::string& x) {
    std::string p = "mb" + std::to_string(at.microbatch) + ".loss.";
    std::vector<int64_t> local = {c_.s_local, c_.b, c_.h};
    std::vector<int64_t> full = {c_.s, c_.b, c_.h};
    std::vector<int64_t> logits_shape = {c_.s, c_.b, c_.vocab_local};
    std::string targets = data_buffer_name(at.microbatch, DataBuffer::targets);
    rb_.alloc(targets, BufferClass::activations, Dtype::int32, {c_.s, c_.b}, at.phase);
    rb_.alloc(p + "lnf", BufferClass::activations, c_.act, local, at.phase);
    std::string nw = weights_for(group("final_norm"), at, nullptr);
    e_.compute(at, OpKind::norm, OpName::final_norm, 8.0 * c_.s_local * c_.b * c_.h, {x, nw},
               {p + "lnf"});
    release_weights(nw, at.phase);
    std::string lnf = gather_sequence(at, p + "lnf", p + "lnf_full", OpName::sp_final_norm);
    rb_.alloc(p + "logits", BufferClass::workspace, c_.act, logits_shape, at.phase);
    std::string ow = weights_for(output_group(), at, nullptr);
    e_.gemm(at, OpName::logits, Grad::none, c_.s * c_.b, c_.vocab_local, c_.h, {lnf, ow}, {p + "logits"});
    release_weights(ow, at.phase);
    if (lnf != p + "lnf") rb_.free(lnf, at.phase);
    double tokens = double(c_.s) * c_.b;
    // [logits, targets, (stats_all)] → [softmax, per-token loss, (stats: one tp rank)]
    std::vector<std::string> loss_inputs = {p + "logits", targets};
    std::vector<std::string> loss_outputs = {p + "softmax", p + "token_loss"};
    rb_.alloc(p + "stats", BufferClass::workspace, c_.wide, {3, c_.s, c_.b}, at.phase);
    if (c_.t > 1) {
      e_.compute(at, OpKind::loss, OpName::cross_entropy_stats, 3.0 * tokens * c_.vocab_local,
                 {p + "logits", targets}, {p + "stats"});
      rb_.alloc(p + "stats_all", BufferClass::workspace, c_.wide, {c_.t, 3, c_.s, c_.b},
                at.phase);
      e_.collective(at, OpKind::all_gather, GroupKind::tp, Stream::compute, OpName::tp_cross_entropy,
                    double(c_.t) * 3 * tokens * dtype_bytes(c_.wide), {p + "stats"},
                    {p + "stats_all"});
      rb_.free(p + "stats", at.phase);
      loss_inputs.push_back(p + "stats_all");
    } else {
      loss_outputs.push_back(p + "stats");
    }
    rb_.alloc(p + "softmax", BufferClass::activations, c_.wide, logits_shape, at.phase);
    rb_.alloc(p + "token_loss", BufferClass::workspace, c_.wide, {c_.s, c_.b}, at.phase);
    e_.compute(at, OpKind::loss, OpName::cross_entropy, 5.0 * tokens * c_.vocab_local, loss_inputs,
               loss_outputs);
    rb_.free(p + "logits", at.phase);
    rb_.free(p + "token_loss", at.phase);
    rb_.free(c_.t > 1 ? p + "stats_all" : p + "stats", at.phase);
    loss_input_[at.microbatch] = x;
  }

  void emit_loss_backward(const OpSite& at, const std::string& g) {
    std::string p = "mb" + std::to_string(at.microbatch) + ".loss.";
    std::vector<int64_t> local = {c_.s_local, c_.b, c_.h};
    std::vector<int64_t> full = {c_.s, c_.b, c_.h};
    double tokens = double(c_.s) * c_.b;
    rb_.alloc(p + "d_logits", BufferClass::workspace, c_.act, {c_.s, c_.b, c_.vocab_local},
              at.phase);
    std::string targets = data_buffer_name(at.microbatch, DataBuffer::targets);
    e_.compute(at, OpKind::loss, OpName::cross_entropy, 2.0 * tokens * c_.vocab_local,
               {p + "softmax", targets}, {p + "d_logits"});
    rb_.free(p + "softmax", at.phase);
    rb_.free(targets, at.phase);
    rb_.alloc(p + "d_lnf_full", BufferClass::workspace, c_.act, full, at.phase);
    std::string ow = weights_for(output_group(), at, nullptr);
    e_.gemm(at, OpName::logits, Grad::dgrad, c_.s * c_.b, c_.h, c_.vocab_local, {p + "d_logits", ow},
            {p + "d_lnf_full"});
    release_weights(ow, at.phase);
    std::string lnf = gather_sequence(at, p + "lnf", p + "lnf_full", OpName::sp_final_norm);
    std::string og = output_grads(at.microbatch);
    e_.gemm(at, OpName::logits, Grad::wgrad, c_.h, c_.vocab_local, c_.s * c_.b, {lnf, p + "d_logits"},
            {og});
    rb_.free(p + "d_logits", at.phase);
    if (lnf != p + "lnf") rb_.free(lnf, at.phase);
    rb_.free(p + "lnf", at.phase);
    std::string d_lnf = p + "d_lnf_full";
    double bytes = act_bytes(full);
    if (plan_.sequence_parallel) {
      d_lnf = p + "d_lnf";
      rb_.alloc(d_lnf, BufferClass::workspace, c_.act, local, at.phase);
      e_.collective(at, OpKind::reduce_scatter, GroupKind::tp, Stream::compute, OpName::tp_logits,
                    bytes, {p + "d_lnf_full"}, {d_lnf});
      rb_.free(p + "d_lnf_full", at.phase);
    } else {
      e_.collective(at, OpKind::all_reduce, GroupKind::tp, Stream::compute, OpName::tp_logits, bytes,
                    {d_lnf}, {d_lnf});
    }
    rb_.alloc(g, BufferClass::activations, c_.act, local, at.phase);
    std::string x = loss_input_.at(at.microbatch);
    std::string ng = grads_for(group("final_norm"), at.microbatch);
    std::string nw = weights_for(group("final_norm"), at, nullptr);
    e_.compute(at, OpKind::norm, OpName::final_norm, 10.0 * c_.s_local * c_.b * c_.h,
               {x, d_lnf, nw, ng}, {g, ng});
    release_weights(nw, at.phase);
    rb_.free(d_lnf, at.phase);
    rb_.free(x, at.phase);
    loss_input_.erase(at.microbatch);
  }

  std::string gather_sequence(const OpSite& at, const std::string& local_name,
                              const std::string& full_name, OpName what) {
    if (!plan_.sequence_parallel) return local_name;
    rb_.alloc(full_name, BufferClass::workspace, c_.act, {c_.s, c_.b, c_.h}, at.phase);
    e_.collective(at, OpKind::all_gather, GroupKind::tp, Stream::compute, what,
                  act_bytes({c_.s, c_.b, c_.h}), {local_name}, {full_name});
    return full_name;
  }

  const ParamGroup& output_group() const {
    return group(group_index_.count("output") ? "output" : "embedding");
  }
  std::string output_grads(int32_t mb) { return grads_for(output_group(), mb); }

  // ---- data-parallel gradient reduction ----

  void grads_ready(const ParamGroup& g, int32_t mb, int64_t chunk) {
    if (plan_.dp_size == 1) {
      if (plan_.zero_stage >= 2) pending_full_.push_back({&g, mb});
      return;
    }
    if (current_.groups.empty()) {
      current_.microbatch = mb;
      current_.chunk = chunk;
    }
    current_.groups.push_back(&g);
    current_.bytes += double(g.elements) * dtype_bytes(c_.grad);
    if (current_.bytes >= plan_.grad_bucket_bytes) flush_bucket();
  }

  void flush_bucket() {
    // dp_size == 1 with ZeRO-2/3: the full gradient is the shard; copy it in (no communication).
    for (auto& [g, mb] : pending_full_) {
      std::string full = grads_for(*g, mb);
      OpSite at{Phase::backward, -1, mb, int32_t(g->chunk)};
      e_.compute(at, OpKind::optimizer_step, OpName::grad_accumulate, double(g->elements),
                 {full, "grads." + g->name}, {"grads." + g->name});
      rb_.free(full, Phase::backward);
    }
    pending_full_.clear();
    if (current_.groups.empty()) return;
    bool overlap = plan_.overlap_grad_reduce;
    if (overlap || plan_.zero_stage >= 2) {
      // ZeRO-2/3 reduce after every microbatch (that is what frees the full gradient); without
      // overlap the reduction still waits for the whole pass of this microbatch.
      if (overlap) emit_bucket(current_, {});
      else deferred_pass_buckets_.push_back(current_);
    } else {
      deferred_buckets_.push_back(current_);
    }
    current_ = Bucket{};
  }

  void emit_bucket(const Bucket& bucket, const std::vector<int32_t>& extra_deps) {
    OpSite at{Phase::backward, -1, bucket.microbatch, int32_t(bucket.chunk)};
    std::vector<std::string> inputs, outputs;
    for (const ParamGroup* g : bucket.groups) {
      if (plan_.zero_stage >= 2) {
        inputs.push_back(grads_for(*g, bucket.microbatch));
        inputs.push_back("grads." + g->name);  // the shard accumulates across microbatches
      } else {
        inputs.push_back("grads." + g->name);
      }
      outputs.push_back("grads." + g->name);
    }
    OpKind kind = plan_.zero_stage == 0 ? OpKind::all_reduce : OpKind::reduce_scatter;
    e_.collective(at, kind, GroupKind::dp, Stream::comm, OpName::grad_bucket, bucket.bytes, inputs,
                  outputs, extra_deps);
    if (plan_.zero_stage >= 2) {
      for (const ParamGroup* g : bucket.groups) rb_.free(grads_for(*g, bucket.microbatch), Phase::backward);
    }
  }

  void emit_finalize_grads() {
    // Deferred per-pass ZeRO-2/3 buckets are emitted at the end of each pass in order.
    OpSite at{Phase::optimizer, -1, -1, -1};
    if (c_.model.tie_word_embeddings && plan_.pp_size > 1) {
      const char* group_name = group_index_.count("embedding") ? "embedding"
                         : group_index_.count("output")  ? "output"
                                                         : nullptr;
      if (group_name) {
        const ParamGroup& g = group(group_name);
        e_.collective(at, OpKind::all_reduce, GroupKind::embedding, Stream::comm,
                      OpName::tied_embedding_grads, double(grad_elements(g)) * dtype_bytes(c_.grad),
                      {"grads." + g.name}, {"grads." + g.name});
      }
    }
    if (plan_.sequence_parallel) {
      std::vector<std::string> names;
      double elements = 0;
      for (const auto& g : groups_) {
        if (g.sp_replicated == 0) continue;
        names.push_back("grads." + g.name);
        elements += double(g.sp_replicated);
      }
      e_.collective(at, OpKind::all_reduce, GroupKind::tp, Stream::comm, OpName::sp_replicated_grads,
                    elements * dtype_bytes(c_.grad), names, names);
    }
  }

  void emit_optimizer() {
    OpSite at{Phase::optimizer, -1, -1, -1};
    std::vector<std::string> grads, states, weights;
    double shard_elements = 0;
    for (const auto& g : groups_) {
      grads.push_back("grads." + g.name);
      states.push_back("optimizer." + g.name);
      weights.push_back("weights." + g.name);
      shard_elements += double(optimizer_elements(g));
    }
    rb_.alloc("grad_norm_sq", BufferClass::comm, c_.wide, {1}, Phase::optimizer);
    std::vector<std::string> norm_out = {"grad_norm_sq"};
    e_.compute(at, OpKind::optimizer_step, OpName::grad_norm, 2 * shard_elements, grads, norm_out);
    // Gradients replicated over dp (ZeRO-0) are counted once: the norm is summed over the
    // model's tp × pp ranks; sharded gradients are summed over every rank.
    GroupKind norm_group = plan_.zero_stage == 0 ? GroupKind::model : GroupKind::world;
    e_.collective(at, OpKind::all_reduce, norm_group, Stream::compute, OpName::grad_norm,
                  dtype_bytes(c_.wide), norm_out, norm_out);
    std::vector<std::string> inputs = grads;
    inputs.insert(inputs.end(), states.begin(), states.end());
    inputs.push_back("grad_norm_sq");
    std::vector<std::string> outputs = states;
    outputs.insert(outputs.end(), weights.begin(), weights.end());
    // AdamW with clipping: read gradient, moments, master weight; write moments, master, weight.
    int32_t id = e_.compute(at, OpKind::optimizer_step, OpName::adamw, 14 * shard_elements, inputs,
                            outputs);
    double per_param = dtype_bytes(c_.grad) + 2 * optimizer_states() * 4.0 + dtype_bytes(c_.act);
    const_cast<Op&>(rb_.role().ops[id]).bytes = per_param * shard_elements;
    rb_.free("grad_norm_sq", Phase::optimizer);
  }

  void emit_param_gathers(Phase phase) {
    OpSite at{phase, -1, -1, -1};
    std::vector<std::string> names;
    double bytes = 0;
    auto flush = [&]() {
      if (names.empty()) return;
      e_.collective(at, OpKind::all_gather, GroupKind::dp, Stream::comm, OpName::param_gather, bytes,
                    names, names);
      names.clear();
      bytes = 0;
    };
    double bucket_bytes = plan_.grad_bucket_bytes / dtype_bytes(c_.grad) * dtype_bytes(c_.act);
    for (const auto& g : groups_) {
      names.push_back("weights." + g.name);
      bytes += double(g.elements) * dtype_bytes(c_.act);
      if (bytes >= bucket_bytes) flush();
    }
    flush();
  }

  const LowerContext& c_;
  const Plan& plan_;
  Role& role_;
  RoleBuilder rb_;
  OpEmitter e_;
  std::vector<ParamGroup> groups_;
  std::map<std::string, const ParamGroup*> group_index_;
  std::map<std::pair<int32_t, int64_t>, std::string> chunk_input_;
  std::vector<std::string> send_staging_;  // freed at the end of the step
  std::map<int32_t, std::string> loss_input_;
  Bucket current_;
  std::vector<Bucket> deferred_buckets_;
  std::vector<Bucket> deferred_pass_buckets_;
  std::vector<std::pair<const ParamGroup*, int32_t>> pending_full_;
};

}  // namespace

StepProgram lower_program(const ModelConfig& model, const Topology& topology, const Plan& plan) {
  LowerContext ctx(model, topology, plan);
  StepProgram program;
  program.model = model_to_json(model);
  program.topology = topology_to_json(topology);
  program.topology.erase("profile");  // the program does not depend on what costs it
  program.plan = plan_to_json(plan);
  program.tp_size = plan.tp_size;
  program.dp_size = plan.dp_size;
  program.pp_size = plan.pp_size;
  program.order = plan.order;
  program.devices_per_node = topology.node.devices_per_node;
  program.num_microbatches = plan.num_microbatches();
  program.tokens_per_step = plan.global_batch_size * model.seq_length;
  program.roles.resize(plan.pp_size);
  for (int64_t p = 0; p < plan.pp_size; ++p) {
    Role& role = program.roles[p];
    role.index = int32_t(p);
    role.pp_stage = p;
    RoleLowering(ctx, role).lower();
  }
  return program;
}

Role lower_role(const ModelConfig& model, const Topology& topology, const Plan& plan,
                int64_t stage) {
  LowerContext ctx(model, topology, plan);
  Role role;
  role.index = int32_t(stage);
  role.pp_stage = stage;
  RoleLowering(ctx, role).lower();
  return role;
}

}  // namespace stepcast

namespace stepcast {

double layer_activation_bytes(const ModelConfig& model, const Plan& plan) {
  // A one-node topology big enough for the plan; only the collectives' algorithm depends on it.
  Topology topology;
  topology.name = "layer_activation_bytes";
  topology.num_nodes = 1;
  topology.node.devices_per_node = int(plan.world_size());
  topology.node.intra_node.bandwidth_bytes_per_s = 1;
  topology.fabric.nics_per_node = 1;
  topology.fabric.nic_bandwidth_bytes_per_s = 1;
  topology.fabric.switch_radix = 2;
  LowerContext ctx(model, topology, plan);
  Role role;
  RoleBuilder rb(role);
  OpEmitter e(ctx, rb, 0);
  rb.alloc("weights.L0", BufferClass::weights, ctx.act, {ctx.layer_params_local()}, Phase::forward,
           true);
  rb.alloc("x_in", BufferClass::activations, ctx.act, {ctx.s_local, ctx.b, ctx.h}, Phase::forward);
  OpSite at{Phase::forward, 0, 0, 0};
  std::string out = emit_layer_forward(e, at, "x_in", {"weights.L0", ""}, KeepMode::per_plan);
  // What is still allocated, less the weights and the output (the next layer's input).
  double live = 0;
  for (const Op& op : role.ops) {
    if (op.persistent) continue;
    if (op.kind == OpKind::alloc) live += op.bytes;
    if (op.kind == OpKind::free) live -= op.bytes;
  }
  return live - rb.live_bytes(out);
}

}  // namespace stepcast
