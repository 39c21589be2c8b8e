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
  const T* qkv = buf(in(op, "qkv"), op);
  const T* kv = buf(in(op, "kv"), op);
  if (op.phase != Phase::backward) {  // [qkv, kv] → [ctx, lse]
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
  if (op.name == OpName::cp_kv_pack) {  // [qkv] → [kv]
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
