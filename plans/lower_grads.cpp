// A role's data-parallel gradient reduction in buckets (all_reduce, or reduce_scatter under ZeRO),
// the tied-embedding and sequence-parallel gradient all_reduces, the optimizer step (gradient
// norm, AdamW) and the ZeRO-1/2 parameter gathers (under fp8_param_gather also ZeRO-3's kept tensors).
#include "lower_role.hpp"

namespace stepcast {

void RoleLowering::grads_ready(const ParamGroup& g, int32_t mb, int64_t chunk, bool last_pass) {
  if (plan_.async_dp()) return;  // reduced in the next step (emit_async_reductions), or pushed (emit_pushes)
  if (sp_reduced_per_microbatch(g)) {
    // Sharded gradients under SP: the replicated tensors' gradients are summed over tp in this
    // microbatch's full gradient, before its reduce_scatter (as FSDP with sequence-parallel
    // tensor parallelism reduces a norm weight's partial gradient in each backward).
    OpSite at{Phase::backward, -1, mb, int32_t(chunk)};
    std::string full = grads_for(g, mb);
    e_.collective(at, OpKind::all_reduce, GroupKind::tp, Stream::comm, OpName::sp_replicated_grads,
                  double(g.sp_replicated) * dtype_bytes(c_.grad), {full}, {full});
  }
  const int64_t reduced_over = g.expert ? c_.grid.edp_size() : plan_.dp_cp_size();
  // A shard group of one rank: under ZeRO-2/3 the full gradient is the shard; it is copied in (no
  // communication), and only hybrid sharding's replicas (if any) still reduce it in a bucket.
  if (shard_ranks(g.expert) == 1 && shards_of(g).zero_stage() >= 2) pending_full_.push_back({&g, mb});
  if (reduced_over == 1) return;
  Bucket& current = g.expert ? current_expert_ : current_;
  if (current.groups.empty()) {
    current.microbatch = mb;
    current.chunk = chunk;
    current.last_pass = last_pass;
    current.expert = g.expert;
  }
  current.groups.push_back(&g);
  current.bytes += double(g.elements) * dtype_bytes(c_.grad);
  if (current.bytes >= plan_.grad_bucket_bytes) flush_bucket();
}

// [part, grads] → [grads]: an elementwise add reading both and writing the sum; `part` freed.
void RoleLowering::accumulate_grads(const OpSite& at, const ParamGroup& g, const std::string& part) {
  const double elements = double(grad_elements(g));
  int32_t id = e_.compute(at, OpKind::optimizer_step, OpName::grad_accumulate, elements, {part, "grads." + g.name},
                          {"grads." + g.name});
  const_cast<Op&>(rb_.role().ops[size_t(id)]).bytes = 3 * elements * dtype_bytes(c_.grad);
  rb_.free(part, Phase::backward);
}

void RoleLowering::accumulate_unfused() {
  for (const auto& [g, mb] : unfused_) {
    accumulate_grads(OpSite{Phase::backward, -1, mb, int32_t(g->chunk)}, *g, grads_for(*g, mb));
  }
  unfused_.clear();
}

void RoleLowering::flush_bucket() {
  // A shard group of one rank with ZeRO-2/3: the full gradient is the shard; copy it in.
  for (auto& [g, mb] : pending_full_) {
    std::string full = grads_for(*g, mb);
    OpSite at{Phase::backward, -1, mb, int32_t(g->chunk)};
    accumulate_grads(at, *g, full);
  }
  pending_full_.clear();
  for (Bucket* current : {&current_, &current_expert_}) {
    if (current->groups.empty()) continue;
    bool overlap = plan_.overlap_grad_reduce;
    if (overlap || plan_.zero_stage >= 2) {
      // ZeRO-2/3 reduce after every microbatch (that is what frees the full gradient); without
      // overlap the reduction still waits for the whole pass of this microbatch.
      if (overlap) emit_bucket(*current, {});
      else deferred_pass_buckets_.push_back(*current);
    } else {
      deferred_buckets_.push_back(*current);
    }
    *current = Bucket{};
  }
}

void RoleLowering::emit_bucket(const Bucket& bucket, const std::vector<int32_t>& extra_deps) {
  if (shard_ranks(bucket.expert) == 1) {
    // Nothing to reduce inside the instance (grads_ready copied ZeRO-2/3's gradients in): the
    // replicas' all_reduce only.
    if (hybrid() && bucket.last_pass) emit_replica_reduction(bucket);
    return;
  }
  OpSite at{Phase::backward, -1, bucket.microbatch, int32_t(bucket.chunk)};
  std::vector<BufferName> inputs, outputs;
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
  e_.collective(at, kind, shard_group(bucket.expert), Stream::comm, OpName::grad_bucket, bucket.bytes, inputs,
                outputs, extra_deps);
  if (plan_.zero_stage >= 2) {
    for (const ParamGroup* g : bucket.groups) rb_.free(grads_for(*g, bucket.microbatch), Phase::backward);
  }
  if (hybrid() && bucket.last_pass) emit_replica_reduction(bucket);
}

void RoleLowering::emit_replica_reduction(const Bucket& bucket) {
  // Megatron's order (param_and_grad_buffer.py, start_grad_sync): the bucket's reduce_scatter
  // inside the instance, then the shard's all_reduce across instances, on the same stream. Under
  // ZeRO-2/3 the shards accumulate every pass and are all-reduced after the last one only.
  OpSite at{Phase::backward, -1, bucket.microbatch, int32_t(bucket.chunk)};
  std::vector<BufferName> names;
  double bytes = 0;
  for (const ParamGroup* g : bucket.groups) {
    names.push_back("grads." + g->name);
    bytes += double(shards_of(*g).buffer_elements(ShardedState::optimizer, g->elements)) * dtype_bytes(c_.grad);
  }
  const GroupKind replicas = bucket.expert ? GroupKind::edp_replica : GroupKind::dp_replica;
  e_.collective(at, OpKind::all_reduce, replicas, Stream::comm, OpName::replica_grads, bytes,
                names, names);
}

void RoleLowering::emit_finalize_grads() {
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
    std::vector<BufferName> names;
    double elements = 0;
    for (const auto& g : groups_) {
      if (g.sp_replicated == 0 || sp_reduced_per_microbatch(g)) continue;
      names.push_back("grads." + g.name);
      elements += double(g.sp_replicated);
    }
    if (!names.empty()) {
      e_.collective(at, OpKind::all_reduce, GroupKind::tp, Stream::comm, OpName::sp_replicated_grads,
                    elements * dtype_bytes(c_.grad), names, names);
    }
  }
}

bool RoleLowering::sp_reduced_per_microbatch(const ParamGroup& g) const {
  return plan_.sequence_parallel && g.sp_replicated > 0 && !plan_.async_dp() &&
         shards_of(g).sharded(ShardedState::grads);
}

void RoleLowering::emit_optimizer() {
  OpSite at{Phase::optimizer, -1, -1, -1};
  std::vector<BufferName> grads, states, weights;
  double shard_elements = 0, fp8_shard = 0;
  for (const auto& g : groups_) {
    grads.push_back(optimizer_grads(g));
    states.push_back("optimizer." + g.name);
    weights.push_back("weights." + g.name);
    shard_elements += double(optimizer_elements(g));
    fp8_shard += double(optimizer_elements(g)) * double(g.fp8_elements) / double(g.elements);
  }
  // The gradient pass before the update and AdamW: their bytes as gradient_pass_bytes and
  // adamw_bytes say (Megatron-LM's mixed-precision optimizer).
  rb_.alloc("grad_norm_sq", BufferClass::comm, c_.wide, {1}, Phase::optimizer);
  std::vector<BufferName> norm_out = {"grad_norm_sq"};
  int32_t norm = e_.compute(at, OpKind::optimizer_step, OpName::grad_norm, 2 * shard_elements, grads, norm_out);
  const_cast<Op&>(rb_.role().ops[size_t(norm)]).bytes = gradient_pass_bytes(c_.act, c_.grad) * shard_elements;
  // Gradients replicated over dp (ZeRO-0) are counted once: the norm is summed over the
  // model's tp × pp ranks; sharded gradients are summed over every rank.
  // Under hybrid sharding the replicas hold the same shards: one optimizer instance counts them.
  GroupKind norm_group = plan_.zero_stage == 0 ? GroupKind::model : hybrid() ? GroupKind::instance : GroupKind::world;
  e_.collective(at, OpKind::all_reduce, norm_group, Stream::compute, OpName::grad_norm,
                dtype_bytes(c_.wide), norm_out, norm_out);
  // Expert gradients differ over ep as well (ZeRO-0: the model group holds one ep rank's experts):
  // their part of the norm is summed over ep too, and over etp where an etp group reaches past the
  // tp group (the other slices of its experts sit on other dp or cp ranks). The executor counts
  // each tensor once over the ranks these sums reach (interpreter.cpp, moe_norm_shares).
  if (c_.model.is_moe() && plan_.zero_stage == 0) {
    e_.collective(at, OpKind::all_reduce, GroupKind::ep, Stream::compute, OpName::grad_norm, dtype_bytes(c_.wide),
                  norm_out, norm_out);
    if (!c_.grid.etp_within_model_groups()) {
      e_.collective(at, OpKind::all_reduce, GroupKind::etp, Stream::compute, OpName::grad_norm, dtype_bytes(c_.wide),
                    norm_out, norm_out);
    }
  }
  std::vector<BufferName> inputs = grads;
  inputs.insert(inputs.end(), states.begin(), states.end());
  inputs.push_back("grad_norm_sq");
  std::vector<BufferName> outputs = states;
  outputs.insert(outputs.end(), weights.begin(), weights.end());
  // AdamW with clipping: read gradient, moments, master weight; write moments, master, weight.
  // (fp8_param_gather: no 16-bit copy of the FP8 weights written from a second read of the master;
  // fp8_param_cast reads it.)
  int32_t id = e_.compute(at, OpKind::optimizer_step, OpName::adamw, 14 * shard_elements, inputs,
                          outputs);
  const_cast<Op&>(rb_.role().ops[id]).bytes =
      adamw_bytes(c_.act, c_.grad) * shard_elements - adamw_spared_bytes(c_.act) * fp8_shard;
  rb_.free("grad_norm_sq", Phase::optimizer);
}

void RoleLowering::emit_async_reductions() {
  // In the order the backward pass made them ready (the last layers first), in buckets of the
  // plan's size, expert groups apart (they reduce over edp).
  OpSite at{Phase::forward, -1, -1, -1};
  for (bool expert : {false, true}) {
    const int64_t reduced_over = expert ? c_.grid.edp_size() : plan_.dp_cp_size();
    if (reduced_over == 1) continue;
    std::vector<BufferName> names;
    double bytes = 0;
    auto flush = [&]() {
      if (names.empty()) return;
      // ZeRO-1: reduce_scattered in place, each rank updating its slice (as emit_bucket).
      e_.collective(at, plan_.zero_stage == 0 ? OpKind::all_reduce : OpKind::reduce_scatter, shard_group(expert),
                    Stream::comm, OpName::grad_bucket, bytes, names, names);
      names.clear();
      bytes = 0;
    };
    for (auto g = groups_.rbegin(); g != groups_.rend(); ++g) {
      if (g->expert != expert) continue;
      names.push_back(stale_grads(*g, 0));
      bytes += double(grad_elements(*g)) * dtype_bytes(c_.grad);
      if (bytes >= plan_.grad_bucket_bytes) flush();
    }
    flush();
  }
}

void RoleLowering::emit_async_stash() {
  // After the update read slot k − 1: slot j − 1 → slot j, from the top, then this step's
  // gradient into slot 0 (grads.GROUP is zeroed as the next step starts). Whole buffers, read and
  // written once (under ZeRO-1 only this rank's slice of slots 1.. matters: the copies of the
  // rest are costed too).
  OpSite at{Phase::optimizer, -1, -1, -1};
  for (const auto& g : groups_) {
    const double elements = double(grad_elements(g));
    for (int64_t slot = plan_.async_staleness - 1; slot >= 0; --slot) {
      std::string from = slot == 0 ? "grads." + g.name : stale_grads(g, slot - 1);
      int32_t id = e_.compute(at, OpKind::optimizer_step, OpName::grad_stash, 0, {from}, {stale_grads(g, slot)});
      const_cast<Op&>(rb_.role().ops[size_t(id)]).bytes = 2 * elements * dtype_bytes(c_.grad);
    }
  }
}

void RoleLowering::emit_param_gathers(Phase phase) {
  OpSite at{phase, -1, -1, -1};
  std::vector<BufferName> names;
  double bytes = 0;
  GroupKind group = shard_group();
  auto flush = [&]() {
    if (names.empty()) return;
    e_.collective(at, OpKind::all_gather, group, Stream::comm, OpName::param_gather, bytes,
                  names, names);
    names.clear();
    bytes = 0;
  };
  // Buckets of the gradient buckets' elements. Under fp8_param_gather a layer's FP8 codes are
  // gathered apart from the weights kept in the plan's dtype (Megatron-LM's uint8 parameter
  // buffer beside the 16-bit one), a byte an element.
  const double bucket_elements = plan_.grad_bucket_bytes / dtype_bytes(c_.grad);
  for (bool codes : {false, true}) {
    if (codes && !plan_.fp8.param_gather) continue;
    const double element_bytes = codes ? 1.0 : dtype_bytes(c_.act);
    for (bool expert : {false, true}) {  // expert groups gather over edp
      group = shard_group(expert);
      for (const auto& g : groups_) {
        if (g.expert != expert || (codes && g.fp8_elements == 0)) continue;
        if (plan_.zero_stage == 3 && (codes || g.fp8_elements == 0)) continue;  // (gathered at each use)
        names.push_back(codes ? fp8_weights_name(g) : "weights." + g.name);
        bytes += double(codes ? g.fp8_elements : g.elements - g.fp8_elements) * element_bytes;
        if (bytes >= bucket_elements * element_bytes) flush();
      }
      flush();
    }
  }
}

}  // namespace stepcast
