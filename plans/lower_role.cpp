// The lowering of one pipeline stage's role: its parameter groups and persistent buffers
// (weights, gradients, optimizer state, sharded by ZeRO stage), then the schedule's forward and
// backward chunk passes with their pipeline sends and receives (lower_role.hpp lists the rest).
#include "lower_role.hpp"

#include <map>

#include "errors.hpp"
#include "pipeline_exchange.hpp"
#include "schedule.hpp"

namespace stepcast {

void RoleLowering::lower() {
  collect_param_groups();
  alloc_persistent();
  if (plan_.overlap_param_gather && (plan_.zero_stage == 1 || plan_.zero_stage == 2)) {
    // Parameters updated by the previous step's optimizer are gathered as this step starts,
    // overlapping the forward pass (Megatron's overlap_param_gather).
    emit_param_gathers(Phase::forward);
  }
  if (plan_.bounded_delay()) emit_async_reductions();
  if (ps()) emit_param_pulls();
  ScheduleShape shape{plan_.pp_size, plan_.virtual_pp_size, role_.num_microbatches};
  std::vector<PassAction> actions = schedule_actions(plan_.schedule, shape, role_.pp_stage);
  // Room for the ops at once: a layer's forward or backward pass is a few dozen ops (64 on GPT-3
  // with selective recompute), and growing a vector of 10^5 ops moves them all each time. An
  // estimate on the high side costs address space only: the pages are touched as ops arrive.
  int64_t layers = 0;
  for (int64_t vs : role_.chunks_virtual_stages) layers += plan_.layers_per_stage[size_t(vs)];
  role_.ops.reserve(size_t(int64_t(actions.size()) * 128 * std::max<int64_t>(1, layers) /
                               std::max<int64_t>(1, plan_.virtual_pp_size) + 4096));
  std::map<int64_t, size_t> last_backward;  // chunk → index of its last backward action
  for (size_t i = 0; i < actions.size(); ++i) {
    if (!actions[i].forward) last_backward[actions[i].chunk] = i;
  }
  if (plan_.schedule == ScheduleKind::interleaved_1f1b && !plan_.overlap_p2p_comm) {
    emit_exchanges(shape, actions, last_backward);
  } else {
    for (size_t i = 0; i < actions.size(); ++i) {
      const PassAction& a = actions[i];
      if (a.forward) emit_chunk_forward(a.microbatch, a.chunk, false);
      else emit_chunk_backward(a.microbatch, a.chunk, last_backward[a.chunk] == i, false);
    }
  }
  // After the whole backward pass (no overlap): on its last timed op, not on a free.
  for (auto& bucket : deferred_buckets_) emit_bucket(bucket, {rb_.last_timed_op()});
  deferred_buckets_.clear();
  emit_finalize_grads();
  if (ps()) {
    emit_pushes();
  } else {
    emit_optimizer();
  }
  if (plan_.bounded_delay()) emit_async_stash();
  emit_fp8_scale_update();
  emit_fp8_param_casts();
  // (ZeRO-3 under fp8_param_gather: the layers' kept tensors, whole on every rank.)
  if ((!plan_.overlap_param_gather && (plan_.zero_stage == 1 || plan_.zero_stage == 2)) ||
      (plan_.zero_stage == 3 && plan_.fp8.param_gather)) {
    emit_param_gathers(Phase::optimizer);
  }
  rb_.free_all(send_staging_, Phase::optimizer);  // the step's sends are complete here
  rb_.free_all(e_.deferred_frees(), Phase::optimizer);
}

void RoleLowering::collect_param_groups() {
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
      groups_.push_back({layer_group_name(l), c_.layer_params_local(l), c_.layer_sp_replicated(l), chunk, false});
      if (plan_.fp8.param_gather) groups_.back().fp8_elements = c_.layer_linear_weights();
      if (m.is_moe_layer(l)) groups_.push_back({expert_group_name(l), c_.expert_params_local(), 0, chunk, false, true});
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

void RoleLowering::alloc_persistent() {
  for (const auto& g : groups_) {
    rb_.alloc("weights." + g.name, BufferClass::weights, c_.act, {weight_elements(g)},
              Phase::forward, true);
    rb_.alloc("grads." + g.name, BufferClass::grads, c_.grad, {grad_elements(g)},
              Phase::forward, true);
    for (int64_t slot = 0; plan_.bounded_delay() && slot < plan_.async_staleness; ++slot) {
      rb_.alloc(stale_grads(g, slot), BufferClass::grads, c_.grad, {grad_elements(g)}, Phase::forward, true);
    }
    if (!ps()) {  // a parameter server's workers keep no optimizer state
      rb_.alloc("optimizer." + g.name, BufferClass::optimizer, optimizer_dtype(),
                {optimizer_elements(g), optimizer_states(g)}, Phase::forward, true);
    }
    // Transformer Engine's FP8 weight copy of a layer, cast once a step (fp8_weights), and where
    // the device needs it its transposed copy (fp8_weights_transpose).
    // (Under ZeRO-3 cast from the gathered weights at each use instead: fp8_weights_for.)
    // fp8_param_gather: the codes are the parameters, under ZeRO-3 this rank's shard of them.
    const bool fp8_copy = g.name[0] == 'L' || g.name[0] == 'X';  // a layer's, and a MoE layer's experts' too
    const bool sharded = shards_of(g).sharded(ShardedState::weights);
    if (c_.fp8 && fp8_copy && (!sharded || g.fp8_elements > 0)) {
      const int64_t codes = sharded ? shards_of(g).buffer_elements(ShardedState::weights, g.elements) : g.elements;
      rb_.alloc(fp8_weights_name(g), BufferClass::weights, c_.fp8_weights, {codes}, Phase::forward, true);
      if (c_.fp8_weights_transposed && !sharded) {
        rb_.alloc(fp8_weights_t_name(g), BufferClass::weights, c_.fp8_weights, {g.elements}, Phase::forward, true);
      }
    }
  }
  if (c_.fp8 && !c_.block_scaled) {  // every layer's slots on every rank: the amax all_reduce runs over the world
    const int64_t slots = c_.fp8_slots.count();
    rb_.alloc("fp8.scale", BufferClass::weights, c_.wide, {slots}, Phase::forward, true);
    rb_.alloc("fp8.amax", BufferClass::weights, c_.wide, {slots}, Phase::forward, true);
    if (plan_.fp8.delayed()) {
      rb_.alloc("fp8.history", BufferClass::weights, c_.wide, {slots, plan_.fp8.amax_history_len}, Phase::forward,
                true);
    }
  }
}

std::string RoleLowering::weights_for(const ParamGroup& g, const OpSite& at) {
  // (fp8_param_gather: the kept tensors are whole; the codes are gathered by gather_fp8_params.)
  if (!shards_of(g).sharded(ShardedState::weights) || g.fp8_elements > 0) return "weights." + g.name;
  std::string full = "wfull." + g.name + use_suffix(at);
  if (rb_.is_live(full)) return full;
  rb_.alloc(full, BufferClass::weights, c_.act, {g.elements}, at.phase);
  e_.collective(at, OpKind::all_gather, shard_group(g), Stream::comm, OpName::zero3_param_gather,
                double(g.elements) * dtype_bytes(c_.act), {"weights." + g.name}, {full});
  return full;
}

const ParamGroup* RoleLowering::layer_weights_for(const ParamGroup& layer, const OpSite& lat, const ParamGroup* next,
                                                  LayerParams& lp) {
  auto experts_of = [&](const ParamGroup& g) -> const ParamGroup* {
    const int64_t l = std::stoi(g.name.substr(1));
    return c_.model.is_moe_layer(l) ? &group(expert_group_name(l)) : nullptr;
  };
  const ParamGroup* experts = experts_of(layer);
  lp.weights = weights_for(layer, lat);
  if (experts) lp.expert_weights = weights_for(*experts, lat);
  if (next && plan_.overlap_param_gather) {
    for (const ParamGroup* g : {next, experts_of(*next)}) {
      if (g) weights_for(*g, lat);  // (unsharded: nothing to gather)
      if (g && g->fp8_elements > 0 && shards_of(*g).sharded(ShardedState::weights)) gather_fp8_params(*g, lat);
    }
  }
  return experts;
}

std::string RoleLowering::grads_for(const ParamGroup& g, int32_t microbatch) {
  if (!shards_of(g).sharded(ShardedState::grads)) {
    // Unfused accumulation: the first microbatch writes the gradient in place (set_to_none before
    // the step, so autograd keeps the fresh gradient), the later ones a part that
    // accumulate_unfused adds in.
    if (plan_.gradient_accumulation_fusion || microbatch == 0) return "grads." + g.name;
    std::string part = "gradmb." + g.name + ".mb" + std::to_string(microbatch);
    if (!rb_.is_live(part)) {
      rb_.alloc(part, BufferClass::grads, c_.grad, {grad_elements(g)}, Phase::backward);
      unfused_.push_back({&g, microbatch});
    }
    return part;
  }
  std::string full = "gradfull." + g.name + ".mb" + std::to_string(microbatch);
  if (!rb_.is_live(full)) {
    rb_.alloc(full, BufferClass::comm, c_.grad, {g.elements}, Phase::backward);
  }
  return full;
}

std::string RoleLowering::send_staging(int32_t mb, int64_t chunk, const char* pass, std::vector<int64_t> shape,
                                       Phase phase) {
  if (c_.topology.node.intra_node.kind != IntraNodeKind::shared_memory) return "";
  std::string name = comm_scratch_prefix() + std::string("send.") + tag_name(pass, mb, chunk);
  rb_.alloc(name, BufferClass::comm, c_.act, std::move(shape), phase);
  send_staging_.push_back(name);
  return name;
}

std::vector<const ParamGroup*> RoleLowering::layer_groups(int64_t vs) const {
  std::vector<const ParamGroup*> out;
  int64_t first = c_.first_layer(vs);
  for (int64_t l = first; l < first + plan_.layers_per_stage[vs]; ++l) {
    out.push_back(&group(layer_group_name(l)));
  }
  return out;
}

void RoleLowering::emit_exchanges(const ScheduleShape& shape, const std::vector<PassAction>& actions,
                                  const std::map<int64_t, size_t>& last_backward) {
  size_t i = 0;  // index into `actions`: the exchanges compute the same passes in the same order
  for (const PassExchange& x : interleaved_exchanges(shape, role_.pp_stage)) {
    std::string output, input_grad;  // what this round's forward and backward passes send
    for (const PassAction& a : x.passes) {
      STEPCAST_CHECK(i < actions.size() && actions[i] == a, "exchange rounds out of the schedule's order");
      if (a.forward) output = emit_chunk_forward(int32_t(a.microbatch), a.chunk, true);
      else input_grad = emit_chunk_backward(int32_t(a.microbatch), a.chunk, last_backward.at(a.chunk) == i, true);
      ++i;
    }
    // Megatron posts send_prev, recv_prev, send_next, recv_next as one batch_isend_irecv and waits
    // for all four (p2p_communication.py _communicate, 2021; _batched_p2p_ops today): the next
    // compute op waits for every transfer here (OpEmitter::p2p). Sends go first in the list so that
    // an interpreter that blocks on a receive in list order has posted this round's sends.
    if (x.send_prev) send_backward(int32_t(x.send_prev->microbatch), x.send_prev->chunk, input_grad);
    if (x.send_next) send_forward(int32_t(x.send_next->microbatch), x.send_next->chunk, output);
    if (x.recv_prev) recv_forward(int32_t(x.recv_prev->microbatch), x.recv_prev->chunk);
    if (x.recv_next) recv_backward(int32_t(x.recv_next->microbatch), x.recv_next->chunk);
    gather_received();  // after the batch, as _communicate gathers after its wait
  }
  STEPCAST_CHECK(i == actions.size(), "exchange rounds miss passes of the schedule");
}

// The receive of a chunk pass's input (forward) or output gradient (backward) into `name`; under
// scatter_gather_tensors_in_pipeline into a 1/tp slice, gathered over tp by gather_received.
void RoleLowering::recv_activation(const OpSite& at, const std::string& name, Peer peer, int64_t tag) {
  std::vector<int64_t> local = {c_.s_local, c_.b, c_.h};
  rb_.alloc(name, BufferClass::activations, c_.act, local, at.phase);
  if (!scatter_gather()) {
    e_.p2p(at, OpKind::recv, peer, tag, act_bytes(local), name);
    return;
  }
  std::string part = name + "_part";
  rb_.alloc(part, BufferClass::activations, c_.act, {c_.s_local * c_.b * c_.h / c_.t}, at.phase);
  e_.p2p(at, OpKind::recv, peer, tag, act_bytes(local) / double(c_.t), part);
  pending_gathers_.push_back({at, part, name});
}

void RoleLowering::gather_received() {
  for (const PendingGather& g : pending_gathers_) {
    e_.collective(g.at, OpKind::all_gather, GroupKind::tp, Stream::compute, OpName::pp_gather,
                  act_bytes({c_.s_local, c_.b, c_.h}), {g.part}, {g.full});
    rb_.free(g.part, g.at.phase);
  }
  pending_gathers_.clear();
}

// The send of `name`, or of this rank's 1/tp slice of it under scatter_gather_tensors_in_pipeline.
void RoleLowering::send_activation(const OpSite& at, const std::string& name, Peer peer, int64_t tag,
                                   const char* pass) {
  std::vector<int64_t> local = {c_.s_local, c_.b, c_.h};
  bool slice = scatter_gather();
  std::vector<int64_t> sent = slice ? std::vector<int64_t>{c_.s_local * c_.b * c_.h / c_.t} : local;
  e_.p2p(at, OpKind::send, peer, tag, act_bytes(sent), name,
         send_staging(at.microbatch, at.chunk, pass, sent, at.phase), true, slice);
  rb_.free(name, at.phase);
}

std::string RoleLowering::recv_forward(int32_t mb, int64_t chunk) {
  int64_t vs = c_.virtual_stage(role_.pp_stage, chunk);
  std::string x = tag_name("in", mb, chunk);
  recv_activation({Phase::forward, -1, mb, int32_t(chunk)}, x, Peer::pp_prev, p2p_tag(mb, vs - 1, false));
  return x;
}

void RoleLowering::send_forward(int32_t mb, int64_t chunk, const std::string& x) {
  int64_t vs = c_.virtual_stage(role_.pp_stage, chunk);
  send_activation({Phase::forward, -1, mb, int32_t(chunk)}, x, Peer::pp_next, p2p_tag(mb, vs, false), "forward");
}

std::string RoleLowering::recv_backward(int32_t mb, int64_t chunk) {
  int64_t vs = c_.virtual_stage(role_.pp_stage, chunk);
  std::string g = tag_name("grad", mb, chunk);
  recv_activation({Phase::backward, -1, mb, int32_t(chunk)}, g, Peer::pp_next, p2p_tag(mb, vs + 1, true));
  return g;
}

void RoleLowering::send_backward(int32_t mb, int64_t chunk, const std::string& g) {
  int64_t vs = c_.virtual_stage(role_.pp_stage, chunk);
  send_activation({Phase::backward, -1, mb, int32_t(chunk)}, g, Peer::pp_prev, p2p_tag(mb, vs, true), "backward");
}

std::string RoleLowering::emit_chunk_forward(int32_t mb, int64_t chunk, bool exchanged) {
  int64_t vs = c_.virtual_stage(role_.pp_stage, chunk);
  OpSite at{Phase::forward, -1, mb, int32_t(chunk)};
  if (c_.dropout && chunk == 0) {  // the masks of every chunk of this microbatch read them
    rb_.alloc(data_buffer_name(mb, DataBuffer::samples), BufferClass::activations, Dtype::int64,
              {c_.b}, Phase::forward);
  }
  std::string x;
  if (vs == 0) {
    x = emit_embedding_forward(at);
  } else if (exchanged) {  // received in an earlier round
    x = tag_name("in", mb, chunk);
    STEPCAST_CHECK(rb_.is_live(x), "forward of " + x + " before its receive");
  } else {
    x = recv_forward(mb, chunk);
    gather_received();
  }
  chunk_input_[{mb, chunk}] = x;
  auto layers = layer_groups(vs);
  for (size_t i = 0; i < layers.size(); ++i) {
    OpSite lat = at;
    lat.layer = int32_t(std::stoi(layers[i]->name.substr(1)));
    const ParamGroup* next = i + 1 < layers.size() ? layers[i + 1] : nullptr;
    LayerParams lp{"", "", ""};
    const ParamGroup* experts = layer_weights_for(*layers[i], lat, next, lp);
    const std::string& w = lp.weights;
    Fp8Copies f8, fe8;
    if (c_.fp8) {
      f8 = fp8_weights_for(lat, *layers[i], w, double(layers[i]->elements - c_.layer_sp_replicated(lat.layer)));
      if (experts) fe8 = fp8_weights_for(lat, *experts, lp.expert_weights, double(experts->elements));
      lp.fp8_weights = f8.w8;
      lp.expert_fp8_weights = fe8.w8;
    }
    x = emit_layer_forward(e_, lat, x, lp, KeepMode::per_plan);
    release_fp8_weights(f8, Phase::forward);
    release_fp8_weights(fe8, Phase::forward);
    release_weights(w, Phase::forward);
    release_weights(lp.expert_weights, Phase::forward);
  }
  if (vs == c_.num_virtual_stages - 1) {
    emit_loss_forward(at, x);
    return "";
  }
  if (exchanged) return x;  // sent at the end of the round
  send_forward(mb, chunk, x);
  return "";
}

RoleLowering::Fp8Copies RoleLowering::fp8_weights_for(const OpSite& lat, const ParamGroup& g, const std::string& w,
                                                       double linear) {
  if (!shards_of(g).sharded(ShardedState::weights)) {
    Fp8Copies copies{fp8_weights_name(g), c_.fp8_weights_transposed ? fp8_weights_t_name(g) : ""};
    if (fp8_weights_cast_.insert(g.name).second) cast_fp8_weights(lat, g, w, linear, copies);
    if (lat.phase != Phase::backward) copies.w8t.clear();  // (the dgrads read it)
    return copies;
  }
  // Named as the gathered weights they are cast from: "fp8w.L3.mb0.forward" (group L3); under
  // fp8_param_gather the codes gathered, and on a device that needs it their transposed copy.
  const std::string use = use_suffix(lat);
  const bool params = g.fp8_elements > 0;
  Fp8Copies copies{params ? gather_fp8_params(g, lat) : "fp8w." + g.name + use, "", true};
  if (!params) rb_.alloc(copies.w8, BufferClass::weights, c_.fp8_weights, {g.elements}, lat.phase);
  if (c_.fp8_weights_transposed && lat.phase == Phase::backward) {
    copies.w8t = fp8_transposed_copy_name(g.name) + use;
    rb_.alloc(copies.w8t, BufferClass::weights, c_.fp8_weights, {g.elements}, lat.phase);
  }
  cast_fp8_weights(lat, g, w, linear, copies);
  return copies;
}

std::string RoleLowering::gather_fp8_params(const ParamGroup& g, const OpSite& at) {
  const std::string full = "fp8w." + g.name + use_suffix(at);
  if (rb_.is_live(full)) return full;
  rb_.alloc(full, BufferClass::weights, c_.fp8_weights, {g.elements}, at.phase);
  e_.collective(at, OpKind::all_gather, shard_group(g), Stream::comm, OpName::zero3_param_gather,
                double(g.fp8_elements), {fp8_weights_name(g)}, {full});
  return full;
}

void RoleLowering::release_fp8_weights(const Fp8Copies& copies, Phase phase) {
  if (!copies.transient) return;
  for (const std::string& name : {copies.w8, copies.w8t}) {
    if (!name.empty()) rb_.free(name, phase);
  }
}

// Transformer Engine's cast of a group's weights to its FP8 copy `into.w8` (and its transposed copy
// into.w8t where the device reads FP8 row-wise only); `linear`: the elements the linear layers read.
void RoleLowering::cast_fp8_weights(const OpSite& lat, const ParamGroup& g, const std::string& w, double linear,
                                    const Fp8Copies& into) {
  const std::string& w8 = into.w8;
  if (c_.block_scaled) {
    // The row-wise copy; MXFP8's column-wise one from the same weights (read once), blockwise
    // tiles' transposed from the row-wise copy (a tile's scale serves both ways).
    const Fp8WeightsCast cost = block_weights_cast(linear, c_.act, c_.fp8_weights);
    int32_t id = e_.compute(lat, OpKind::activation, OpName::fp8_weights, cost.flops, {w}, {w8});
    Op& op = const_cast<Op&>(role_.ops[size_t(id)]);
    op.fp8_slots = {c_.fp8_slots.first_slot(lat.layer, g.expert), -1};
    op.bytes = cost.bytes;
    if (!into.w8t.empty()) {
      const bool mx = plan_.fp8.mx();
      int32_t t = e_.compute(lat, OpKind::activation, OpName::fp8_weights_transpose, mx ? cost.flops : 0,
                             {mx ? w : w8}, {into.w8t});
      const_cast<Op&>(role_.ops[size_t(t)]).bytes = cost.transpose_bytes;
    }
    return;
  }
  // Current scaling: each weight's amax first (a second read), its scale written.
  const bool current = !plan_.fp8.delayed();
  const Fp8WeightsCast cost = fp8_weights_cast(linear, c_.act, current);
  if (g.fp8_elements > 0) {  // fp8_param_gather: the codes are the parameters; only the transposed copy is made
    if (into.w8t.empty()) return;
    int32_t t = e_.compute(lat, OpKind::activation, OpName::fp8_weights_transpose, 0, {w8}, {into.w8t});
    const_cast<Op&>(role_.ops[size_t(t)]).bytes = cost.transpose_bytes;
    return;
  }
  std::vector<BufferName> outputs = {w8, "fp8.amax"};
  if (current) outputs.push_back("fp8.scale");
  int32_t id = e_.compute(lat, OpKind::activation, OpName::fp8_weights, cost.flops, {w, "fp8.scale", "fp8.amax"},
                          outputs);
  Op& op = const_cast<Op&>(role_.ops[size_t(id)]);
  // The layer's first slot, its weights' kinds added (experts under current scaling: the layer's
  // first expert slot, kind k of local expert l at k·E_l + l after it: Fp8SlotLayout).
  op.fp8_slots = {c_.fp8_slots.first_slot(lat.layer, g.expert), -1};
  op.bytes = cost.bytes;
  if (!into.w8t.empty()) {  // read once, written transposed
    int32_t t = e_.compute(lat, OpKind::activation, OpName::fp8_weights_transpose, 0, {w8}, {into.w8t});
    const_cast<Op&>(role_.ops[size_t(t)]).bytes = cost.transpose_bytes;
  }
}

std::string RoleLowering::emit_chunk_backward(int32_t mb, int64_t chunk, bool last_for_chunk, bool exchanged) {
  int64_t vs = c_.virtual_stage(role_.pp_stage, chunk);
  OpSite at{Phase::backward, -1, mb, int32_t(chunk)};
  bool reduce_now = plan_.zero_stage >= 2 || last_for_chunk;
  std::string g = tag_name("grad", mb, chunk);
  if (vs == c_.num_virtual_stages - 1) {
    emit_loss_backward(at, g);
    accumulate_unfused();
    if (reduce_now) {
      for (const char* name : {"output", "final_norm"}) {
        if (group_index_.count(name)) grads_ready(group(name), mb, chunk, last_for_chunk);
      }
    }
  } else if (exchanged) {  // received in an earlier round
    STEPCAST_CHECK(rb_.is_live(g), "backward of " + g + " before its receive");
  } else {
    recv_backward(mb, chunk);
    gather_received();
  }
  auto layers = layer_groups(vs);
  for (size_t i = layers.size(); i-- > 0;) {
    const ParamGroup& pg = *layers[i];
    OpSite lat = at;
    lat.layer = int32_t(std::stoi(pg.name.substr(1)));
    const ParamGroup* next = i > 0 ? layers[i - 1] : nullptr;
    std::string x_in = i == 0 ? chunk_input_.at({mb, chunk}) : layer_prefix(mb, lat.layer - 1) + "out";
    LayerParams lp{"", "", "", ""};
    const ParamGroup* experts = layer_weights_for(pg, lat, next, lp);
    const std::string& w = lp.weights;
    lp.grads = grads_for(pg, mb);
    if (experts) lp.expert_grads = grads_for(*experts, mb);
    Fp8Copies f8, fe8;
    if (c_.fp8) {
      f8 = fp8_weights_for(lat, pg, w, double(pg.elements - c_.layer_sp_replicated(lat.layer)));
      if (experts) fe8 = fp8_weights_for(lat, *experts, lp.expert_weights, double(experts->elements));
      lp.fp8_weights = f8.w8;
      lp.fp8_weights_t = f8.w8t;
      lp.expert_fp8_weights = fe8.w8;
      lp.expert_fp8_weights_t = fe8.w8t;
    }
    emit_layer_backward(e_, lat, x_in, g, lp);
    release_fp8_weights(f8, Phase::backward);
    release_fp8_weights(fe8, Phase::backward);
    accumulate_unfused();
    release_weights(w, Phase::backward);
    release_weights(lp.expert_weights, Phase::backward);
    if (reduce_now) grads_ready(pg, mb, chunk, last_for_chunk);
    if (reduce_now && experts) grads_ready(*experts, mb, chunk, last_for_chunk);
  }
  chunk_input_.erase({mb, chunk});
  std::string sent;
  if (vs == 0) {
    emit_embedding_backward(at, g);
    accumulate_unfused();
    if (reduce_now) {
      for (const char* name : {"position", "embedding"}) {
        if (group_index_.count(name)) grads_ready(group(name), mb, chunk, last_for_chunk);
      }
    }
  } else if (exchanged) {
    sent = g;  // sent at the end of the round
  } else {
    send_backward(mb, chunk, g);
  }
  if (c_.dropout && chunk == 0) rb_.free(data_buffer_name(mb, DataBuffer::samples), Phase::backward);
  if (reduce_now) {
    flush_bucket();
    for (auto& bucket : deferred_pass_buckets_) emit_bucket(bucket, {rb_.last_timed_op()});
    deferred_pass_buckets_.clear();
  }
  return sent;
}


// Delayed scaling's end of step: the step's amax of every slot maximised over every rank (each
// rank's own layers' slots hold its amax, the others 0), then each slot's history and scale.
void RoleLowering::emit_fp8_scale_update() {
  if (!plan_.fp8.delayed()) return;  // (current scaling sets each scale at its cast)
  OpSite at{Phase::optimizer, -1, -1, -1};
  const double slots = double(c_.model.num_hidden_layers) * kFp8SlotsPerLayer;
  e_.collective(at, OpKind::all_reduce, GroupKind::world, Stream::compute, OpName::fp8_amax,
                slots * dtype_bytes(c_.wide), {"fp8.amax"}, {"fp8.amax"});
  int32_t id = e_.compute(at, OpKind::optimizer_step, OpName::fp8_scale_update, slots * (plan_.fp8.amax_history_len + 4),
                          {"fp8.amax", "fp8.history", "fp8.scale"}, {"fp8.history", "fp8.scale", "fp8.amax"});
  const_cast<Op&>(role_.ops[size_t(id)]).bytes = slots * (plan_.fp8.amax_history_len * 2 + 4) * dtype_bytes(c_.wide);
}

// fp8_param_gather: each layer's FP8 weights cast from this rank's master shard after the update
// (delayed scaling: with the scales just updated, the shard's amax into its slot for the next
// update's maximum over every rank), as Megatron-LM's quantize_param_shard and Transformer Engine's
// cast_master_weights_to_fp8; current scaling takes each weight's amax over its shards first (the
// shard group's maximum of every slot) and its scale from it. The codes are gathered after.
void RoleLowering::emit_fp8_param_casts() {
  if (!plan_.fp8.param_gather) return;
  OpSite at{Phase::optimizer, -1, -1, -1};
  const bool current = plan_.fp8.current();
  auto shard = [&](const ParamGroup& g) {  // the FP8 weights' elements this rank updates
    return double(optimizer_elements(g)) * double(g.fp8_elements) / double(g.elements);
  };
  auto first_slot = [&](const ParamGroup& g) { return c_.fp8_slots.first_slot(std::stoi(g.name.substr(1)), false); };
  for (bool cast : {false, true}) {
    if (!cast && !current) continue;
    for (const auto& g : groups_) {
      if (g.fp8_elements == 0) continue;
      const std::string master = "optimizer." + g.name;
      std::vector<BufferName> outputs = {"fp8.amax"};
      if (cast) outputs = current ? std::vector<BufferName>{fp8_weights_name(g), "fp8.amax", "fp8.scale"}
                                  : std::vector<BufferName>{fp8_weights_name(g), "fp8.amax"};
      const std::vector<BufferName> inputs =
          cast ? std::vector<BufferName>{master, "fp8.scale", "fp8.amax"} : std::vector<BufferName>{master, "fp8.amax"};
      const Fp8WeightsCast cost = fp8_param_cost(shard(g), c_.wide, cast);
      int32_t id = e_.compute(at, OpKind::activation, cast ? OpName::fp8_param_cast : OpName::fp8_param_absmax,
                              cost.flops, inputs, outputs);
      Op& op = const_cast<Op&>(role_.ops[size_t(id)]);
      op.fp8_slots = {first_slot(g), -1};
      op.bytes = cost.bytes;
    }
    if (!cast) {
      e_.collective(at, OpKind::all_reduce, shard_group(), Stream::compute, OpName::fp8_amax,
                    double(c_.fp8_slots.count()) * dtype_bytes(c_.wide), {"fp8.amax"}, {"fp8.amax"});
    }
  }
}

}  // namespace stepcast
