// The interpreter's context-parallel ops (interpreter.hpp): flash attention of this rank's
// queries over the K/V block an op names (its cp_step's, or every rank's gathered), K/V packing,
// the log-sum-exp merge and the dK/dV accumulation. Positions come from the rank grid: cp rank c
// holds chunks c and 2·cp−1−c of every sequence.
#include "errors.hpp"
#include "interpreter.hpp"

namespace stepcast {

template <class T, class G, class W>
const std::vector<int64_t>& Interpreter<T, G, W>::kv_positions(const Op& op) {
  kv_positions_.clear();
  if (op.cp_step < 0) {  // gathered: every cp rank's block in cp rank order
    STEPCAST_CHECK(op.n == s_full_, "op " + std::to_string(op.id) + ": gathered K/V of " + std::to_string(op.n) +
                                        " rows, not the sequence's " + std::to_string(s_full_));
    for (int64_t c = 0; c < cp_; ++c) {
      for (int64_t r = 0; r < s_; ++r) kv_positions_.push_back(position(c, r));
    }
  } else {
    STEPCAST_CHECK(op.n == s_ && op.cp_step < cp_, "op " + std::to_string(op.id) + ": a ring block of " +
                                                       std::to_string(op.n) + " rows at step " +
                                                       std::to_string(op.cp_step));
    const int64_t source = (coord_.cp - op.cp_step + cp_) % cp_;
    for (int64_t r = 0; r < s_; ++r) kv_positions_.push_back(position(source, r));
  }
  return kv_positions_;
}

template <class T, class G, class W>
void Interpreter<T, G, W>::cp_attention(const Op& op) {
  cpu::AttentionShape shape = attention_shape(op);
  STEPCAST_CHECK(shape.s == s_, "op " + std::to_string(op.id) + ": context-parallel queries are the rank's tokens");
  const int64_t head0 = coord_.tp * shape.heads;
  cpu::Dropout drop = dropout(op, cpu::DropoutSite::attention_probs);
  const cpu::Dropout* drop_ptr = plan_.dropout > 0 ? &drop : nullptr;
  const std::vector<int64_t>& kv_pos = kv_positions(op);
  const bool backward = op.phase == Phase::backward;
  if (op.name == OpName::dropout) {  // [probs] → [probs_drop, mask], at global positions
    backend_.cp_attention_dropout_forward(buf(in(op, "probs"), op), buf(out(op, "probs_drop"), op),
                                          mask(out(op, "mask"), op), shape, op.n, q_positions_.data(),
                                          kv_pos.data(), drop, head0, samples(op));
    return;
  }
  const T* kv = buf(in(op, "kv"), op);
  if (op.name == OpName::cp_value && !backward) {  // [probs, kv] → [ctx]
    backend_.cp_value_forward(buf(in(op, "probs"), op), kv, op.n, buf(out(op, "ctx"), op), shape);
    return;
  }
  if (op.name == OpName::cp_value) {  // [d_ctx, probs, kv] → [d_probs, d_kv]
    backend_.cp_value_backward(buf(in(op, "d_ctx"), op), buf(in(op, "probs"), op), kv, op.n,
                               buf(out(op, "d_probs"), op), buf(out(op, "d_kv"), op), shape);
    return;
  }
  const T* qkv = buf(in(op, "qkv"), op);
  if (op.name == OpName::cp_score && !backward) {  // [qkv, kv] → [scores]
    backend_.cp_score_forward(qkv, kv, op.n, q_positions_.data(), kv_pos.data(), buf(out(op, "scores"), op), shape,
                              scale_);
    return;
  }
  if (op.name == OpName::cp_score) {  // [d_scores, qkv, kv, d_kv] → [d_qkv, d_kv]
    backend_.cp_score_backward(buf(in(op, "d_scores"), op), qkv, kv, op.n, buf(out(op, "d_qkv"), op),
                               buf(out(op, "d_kv"), op), shape, scale_);
    return;
  }
  if (!backward) {  // flash: [qkv, kv] → [ctx, lse]
    backend_.cp_flash_forward(qkv, kv, op.n, q_positions_.data(), kv_pos.data(), buf(out(op, "ctx"), op),
                              buf<W>(out(op, "lse"), op), shape, scale_, drop_ptr, head0, samples(op));
    return;
  }
  // [qkv, ctx, lse, d_ctx, kv, (d_qkv)] → [d_qkv, d_kv]: dQ added in when d_qkv is also read.
  backend_.cp_flash_backward(qkv, kv, op.n, q_positions_.data(), kv_pos.data(), buf(in(op, "ctx"), op),
                             buf<W>(in(op, "lse"), op), buf(in(op, "d_ctx"), op), buf(out(op, "d_qkv"), op),
                             operands(op).has_in("d_qkv"), buf(out(op, "d_kv"), op), shape, scale_, drop_ptr, head0,
                             samples(op));
}

template <class T, class G, class W>
void Interpreter<T, G, W>::cp_activation(const Op& op) {
  const int64_t d = model_.head_dim();
  // The layer's attention problem over this rank's tokens, its heads from the ctx or qkv width.
  auto shape_of = [&](int64_t qkv_elements) {
    return cpu::AttentionShape{s_, b_, qkv_elements / (s_ * b_ * d) - 2 * kv_heads_local_, kv_heads_local_, d};
  };
  if (op.name == OpName::cp_a2a_split_heads || op.name == OpName::cp_a2a_join_heads) {
    // [x] → [y]: between [s, b, W] rows and the cp blocks [cp][s, b, W/cp]; W a qkv width (its q,
    // k and v heads each split) or a ctx width.
    const bool split = op.name == OpName::cp_a2a_split_heads;
    const std::string& rows = split ? in(op, "x") : out(op, "y");
    const int64_t width = count(rows, op) / (s_ * b_), kv = kv_heads_local_ * d;
    const int64_t q = width == model_.num_attention_heads / t_ * d + 2 * kv ? width - 2 * kv : width;
    std::vector<int64_t> sections = {q};
    if (q != width) sections = {q, kv, kv};
    backend_.cp_a2a_heads(buf(in(op, "x"), op), buf(out(op, "y"), op), s_ * b_, sections, cp_, split);
  } else if (op.name == OpName::cp_a2a_join_seq || op.name == OpName::cp_a2a_split_seq) {
    // [x] → [y]: the cp blocks' token rows to (from) their sequence positions.
    const bool gather = op.name == OpName::cp_a2a_split_seq;
    const int64_t row = count(in(op, "x"), op) / s_full_;  // b · W/cp elements a token
    backend_.cp_permute_rows(buf(in(op, "x"), op), buf(out(op, "y"), op), a2a_positions_.data(), s_full_, row, gather);
  } else if (op.name == OpName::cp_kv_pack) {  // [qkv] → [kv]
    backend_.cp_kv_pack(buf(in(op, "qkv"), op), buf(out(op, "kv"), op), shape_of(count(in(op, "qkv"), op)));
  } else if (op.name == OpName::cp_dkv) {  // [d_kv, d_qkv] → [d_qkv]: dK, dV into their place
    backend_.cp_kv_unpack(buf(in(op, "d_kv"), op), buf(out(op, "d_qkv"), op), shape_of(count(in(op, "d_qkv"), op)));
  } else if (op.phase != Phase::backward) {  // cp_merge: [ctx_part, lse_part, ctx, lse] → [ctx, lse]
    const int64_t heads = count(in(op, "ctx"), op) / (s_ * b_ * d);
    cpu::AttentionShape shape{s_, b_, heads, kv_heads_local_, d};
    backend_.cp_merge(buf(out(op, "ctx"), op), buf<W>(out(op, "lse"), op), buf(in(op, "ctx_part"), op),
                      buf<W>(in(op, "lse_part"), op), shape);
  } else {  // cp_merge backward: [d_kv_part, d_kv] → [d_kv], added
    backend_.cp_accumulate(buf(out(op, "d_kv"), op), buf(in(op, "d_kv_part"), op), count(out(op, "d_kv"), op));
  }
}

#define STEPCAST_INSTANTIATE_CP(T, G, W)                                                      \
  template const std::vector<int64_t>& Interpreter<T, G, W>::kv_positions(const Op&);         \
  template void Interpreter<T, G, W>::cp_attention(const Op&);                                \
  template void Interpreter<T, G, W>::cp_activation(const Op&);
STEPCAST_FOR_EACH_STORAGE(STEPCAST_INSTANTIATE_CP)
#undef STEPCAST_INSTANTIATE_CP

}  // namespace stepcast
