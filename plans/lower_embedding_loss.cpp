// The embedding (vocab-parallel lookup, position and dropout) and the loss (final norm, logits,
// cross-entropy) of a role, forward and backward.
#include "lower_role.hpp"

namespace stepcast {

std::string RoleLowering::emit_embedding_forward(const OpSite& at) {
  std::string prefix = "mb" + std::to_string(at.microbatch) + ".emb.";
  std::vector<int64_t> full = {c_.s, c_.b, c_.h};
  std::vector<int64_t> local = {c_.s_local, c_.b, c_.h};
  std::string word = prefix + "word";
  rb_.alloc(word, BufferClass::workspace, c_.act, full, at.phase);
  // Vocab-parallel lookup of the microbatch's token ids (from the sample mapping): each tp
  // rank fills the rows of its vocabulary shard, zeros elsewhere; the reduction completes it.
  std::string ew = weights_for(group("embedding"), at);
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
  std::vector<BufferName> outputs = {out};
  if (c_.dropout) {
    rb_.alloc(prefix + "mask", BufferClass::activations, Dtype::u8, local, at.phase);
    outputs.push_back(prefix + "mask");
  }
  std::vector<BufferName> inputs = {reduced};
  std::string pw;
  if (c_.model.position == PositionKind::learned) {
    pw = weights_for(group("position"), at);
    inputs.push_back(pw);
  }
  e_.compute(at, OpKind::embedding, OpName::position_dropout, 3.0 * c_.s_local * c_.b * c_.h, inputs,
             outputs);
  rb_.free(reduced, at.phase);
  if (!pw.empty()) release_weights(pw, at.phase);
  return out;
}

void RoleLowering::emit_embedding_backward(const OpSite& at, const std::string& g) {
  std::string prefix = "mb" + std::to_string(at.microbatch) + ".emb.";
  std::vector<int64_t> full = {c_.s, c_.b, c_.h};
  std::vector<int64_t> local = {c_.s_local, c_.b, c_.h};
  std::string d = g;
  std::vector<BufferName> inputs = {g};
  std::vector<BufferName> outputs;
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
  std::string ew = weights_for(group("embedding"), at);
  std::string ids = data_buffer_name(at.microbatch, DataBuffer::tokens);
  e_.compute(at, OpKind::embedding, OpName::word, 0, {d_full, ew, eg, ids}, {eg});
  rb_.free(d_full, at.phase);
  rb_.free(ids, at.phase);
  release_weights(ew, at.phase);
}

RoleLowering::UnfusedLossBytes RoleLowering::unfused_loss_bytes(double logits) const {
  // Megatron's vocab-parallel cross entropy as PyTorch ops on `logits` elements: the cast of
  // the logits to the softmax's width (where they differ) reads one and writes the other; max
  // and sum read, the subtraction, exp and division read and write; backward the in-place scale
  // reads and writes, and the cast back to the logits' width.
  const double a = dtype_bytes(c_.act), w = dtype_bytes(c_.wide);
  const double cast = c_.act == c_.wide ? 0.0 : a + w;
  return {logits * (cast + 8 * w), logits * 2 * w, logits * (2 * w + cast)};
}

void RoleLowering::emit_loss_forward(const OpSite& at, const std::string& x) {
  std::string p = "mb" + std::to_string(at.microbatch) + ".loss.";
  std::vector<int64_t> local = {c_.s_local, c_.b, c_.h};
  std::vector<int64_t> full = {c_.s, c_.b, c_.h};
  std::vector<int64_t> logits_shape = {c_.s, c_.b, c_.vocab_local};
  std::string targets = data_buffer_name(at.microbatch, DataBuffer::targets);
  rb_.alloc(targets, BufferClass::activations, Dtype::int32, {c_.s, c_.b}, at.phase);
  rb_.alloc(p + "lnf", BufferClass::activations, c_.act, local, at.phase);
  std::string nw = weights_for(group("final_norm"), at);
  e_.compute(at, OpKind::norm, OpName::final_norm, 8.0 * c_.s_local * c_.b * c_.h, {x, nw},
             {p + "lnf"});
  release_weights(nw, at.phase);
  std::string lnf = gather_sequence(at, p + "lnf", p + "lnf_full", OpName::sp_final_norm);
  rb_.alloc(p + "logits", BufferClass::workspace, c_.act, logits_shape, at.phase);
  std::string ow = weights_for(output_group(), at);
  e_.gemm(at, OpName::logits, Grad::none, c_.s * c_.b, c_.vocab_local, c_.h, {lnf, ow}, {p + "logits"});
  release_weights(ow, at.phase);
  if (lnf != p + "lnf") rb_.free(lnf, at.phase);
  double tokens = double(c_.s) * c_.b;
  // [logits, targets, (stats_all)] → [softmax, per-token loss, (stats: one tp rank)]
  std::vector<BufferName> loss_inputs = {p + "logits", targets};
  std::vector<BufferName> loss_outputs = {p + "softmax", p + "token_loss"};
  rb_.alloc(p + "stats", BufferClass::workspace, c_.wide, {3, c_.s, c_.b}, at.phase);
  const UnfusedLossBytes unfused = unfused_loss_bytes(tokens * double(c_.vocab_local));
  if (c_.t > 1) {
    int32_t stats = e_.compute(at, OpKind::loss, OpName::cross_entropy_stats, 3.0 * tokens * c_.vocab_local,
                               {p + "logits", targets}, {p + "stats"});
    if (!plan_.cross_entropy_loss_fusion) rb_.set_bytes(stats, unfused.forward - unfused.division);
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
  int32_t loss = e_.compute(at, OpKind::loss, OpName::cross_entropy, 5.0 * tokens * c_.vocab_local,
                            loss_inputs, loss_outputs);
  if (!plan_.cross_entropy_loss_fusion) rb_.set_bytes(loss, c_.t > 1 ? unfused.division : unfused.forward);
  rb_.free(p + "logits", at.phase);
  rb_.free(p + "token_loss", at.phase);
  rb_.free(c_.t > 1 ? p + "stats_all" : p + "stats", at.phase);
  loss_input_[at.microbatch] = x;
}

void RoleLowering::emit_loss_backward(const OpSite& at, const std::string& g) {
  std::string p = "mb" + std::to_string(at.microbatch) + ".loss.";
  std::vector<int64_t> local = {c_.s_local, c_.b, c_.h};
  std::vector<int64_t> full = {c_.s, c_.b, c_.h};
  double tokens = double(c_.s) * c_.b;
  rb_.alloc(p + "d_logits", BufferClass::workspace, c_.act, {c_.s, c_.b, c_.vocab_local},
            at.phase);
  std::string targets = data_buffer_name(at.microbatch, DataBuffer::targets);
  int32_t loss = e_.compute(at, OpKind::loss, OpName::cross_entropy, 2.0 * tokens * c_.vocab_local,
                            {p + "softmax", targets}, {p + "d_logits"});
  if (!plan_.cross_entropy_loss_fusion) {
    rb_.set_bytes(loss, unfused_loss_bytes(tokens * double(c_.vocab_local)).backward);
  }
  rb_.free(p + "softmax", at.phase);
  rb_.free(targets, at.phase);
  rb_.alloc(p + "d_lnf_full", BufferClass::workspace, c_.act, full, at.phase);
  std::string ow = weights_for(output_group(), at);
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
  std::string nw = weights_for(group("final_norm"), at);
  e_.compute(at, OpKind::norm, OpName::final_norm, 10.0 * c_.s_local * c_.b * c_.h,
             {x, d_lnf, nw, ng}, {g, ng});
  release_weights(nw, at.phase);
  rb_.free(d_lnf, at.phase);
  rb_.free(x, at.phase);
  loss_input_.erase(at.microbatch);
}

std::string RoleLowering::gather_sequence(const OpSite& at, const std::string& local_name, const std::string& full_name,
                                          OpName what) {
  if (!plan_.sequence_parallel) return local_name;
  rb_.alloc(full_name, BufferClass::workspace, c_.act, {c_.s, c_.b, c_.h}, at.phase);
  e_.collective(at, OpKind::all_gather, GroupKind::tp, Stream::compute, what,
                act_bytes({c_.s, c_.b, c_.h}), {local_name}, {full_name});
  return full_name;
}

}  // namespace stepcast
