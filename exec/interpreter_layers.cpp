// The interpreter's layer ops (interpreter.hpp): embeddings, norms, GEMMs, the attention core,
// activations and the loss, each reading its operands by slot. GEMM shapes are the op's
// (m, n, k); attention's are its (batch, m, k) with the key-value width from its qkv buffer.
#include <algorithm>
#include <cmath>
#include <string>

#include "errors.hpp"
#include "interpreter.hpp"

namespace stepcast {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

const char* norm_prefix(const Op& op) {
  switch (op.name) {
    case OpName::input_norm:
      return "ln1";
    case OpName::post_attn_norm:
      return "ln2";
    case OpName::final_norm:
      return "final_norm";
    default:
      break;
  }
  fail_invariant(__FILE__, __LINE__, std::string("unknown norm ") + to_string(op.name));
}

// The weight tensor (and column-parallel bias) a GEMM reads in its parameter group.
struct LinearWeights {
  const char* tensor;
  const char* bias;  // "" when none
};
LinearWeights linear_weights(const Op& op, bool use_bias) {
  switch (op.name) {
    case OpName::qkv:
      return {"qkv.weight", use_bias ? "qkv.bias" : ""};
    case OpName::attn_out:
      return {"attn_out.weight", ""};
    case OpName::mlp_up:
      return {"mlp_up.weight", use_bias ? "mlp_up.bias" : ""};
    case OpName::mlp_gate:
      return {"mlp_gate.weight", use_bias ? "mlp_gate.bias" : ""};
    case OpName::mlp_down:
      return {"mlp_down.weight", ""};
    case OpName::logits:
      return {"embedding.weight", ""};
    case OpName::router:
      return {"router.weight", use_bias ? "router.bias" : ""};
    default:
      break;
  }
  fail_invariant(__FILE__, __LINE__, std::string("unknown gemm ") + to_string(op.name));
}

}  // namespace

template <class T, class G, class W>
void Interpreter<T, G, W>::embedding(const Op& op) {
  int64_t v0 = coord_.tp * vocab_local_;
  bool backward = op.phase == Phase::backward;
  if (op.name == OpName::word && !backward) {  // [w, tokens] → [y]
    backend_.embedding_forward(buf<int32_t>(in(op, "tokens"), op), slice(in(op, "w"), op, "embedding.weight"),
                               buf(out(op, "y"), op), s_, b_, h_, v0, vocab_local_);
  } else if (op.name == OpName::word) {  // [d_y, w, dw, tokens] → [dw]
    backend_.embedding_backward(buf<int32_t>(in(op, "tokens"), op), buf(in(op, "d_y"), op),
                                slice<G>(out(op, "dw"), op, "embedding.weight"), s_, b_, h_, v0, vocab_local_);
  } else if (!backward) {  // position_dropout: [x, (position)] → [y, (mask)]
    T* x = buf(out(op, "y"), op);
    backend_.copy(x, buf(in(op, "x"), op), count(in(op, "x"), op) * int64_t(sizeof(T)));
    for (const PositionRun& run : position_runs(s0(), s_local_)) {  // one run without cp
      T* xr = x + run.offset * b_ * h_;
      if (operands(op).has_in("position")) {
        backend_.position_add_forward(xr, slice(in(op, "position"), op, "position.weight"), run.rows, b_, h_, run.s0,
                                      model_.max_position_embeddings);
      }
      if (operands(op).has_out("mask")) {
        backend_.dropout_add_forward(xr, nullptr, xr, mask(out(op, "mask"), op) + run.offset * b_ * h_, run.rows, b_,
                                     h_, dropout(op, cpu::DropoutSite::embedding), run.s0, samples(op));
      }
    }
  } else {  // backward: [d_y, (mask)] → [(d_position), d_x]
    T* g = buf(in(op, "d_y"), op);
    T* d = buf(out(op, "d_x"), op);
    int64_t n = count(out(op, "d_x"), op);
    if (operands(op).has_in("mask"))
      backend_.dropout_backward(g, mask(in(op, "mask"), op), d, n, plan_.dropout);
    else
      backend_.copy(d, g, n * int64_t(sizeof(T)));
    if (operands(op).has_out("d_position")) {
      for (const PositionRun& run : position_runs(s0(), s_local_)) {
        backend_.position_add_backward(d + run.offset * b_ * h_, slice<G>(out(op, "d_position"), op, "position.weight"),
                                       run.rows, b_, h_, run.s0, model_.max_position_embeddings);
      }
    }
  }
}

template <class T, class G, class W>
void Interpreter<T, G, W>::norm(const Op& op) {
  std::string prefix = norm_prefix(op);
  const std::string& x_name = in(op, "x");
  int64_t rows = count(x_name, op) / h_;
  bool layer = model_.norm == NormKind::layernorm;
  double eps = model_.norm_eps;
  if (op.phase != Phase::backward) {  // [x, w] → [y]
    T* w = slice(in(op, "w"), op, prefix + ".weight");
    T* bias = layer ? slice(in(op, "w"), op, prefix + ".bias") : nullptr;
    if (layer)
      backend_.layernorm_forward(buf(x_name, op), w, bias, buf(out(op, "y"), op), rows, h_, eps);
    else
      backend_.rmsnorm_forward(buf(x_name, op), w, buf(out(op, "y"), op), rows, h_, eps);
    return;
  }
  // [x, d_y, w, d_x] → [d_x (+= dx), dw (+= dw, db)]
  T* x = buf(x_name, op);
  T* dy = buf(in(op, "d_y"), op);
  T* w = slice(in(op, "w"), op, prefix + ".weight");
  T* dx = buf(out(op, "d_x"), op);
  G* dw = slice<G>(out(op, "dw"), op, prefix + ".weight");
  if (layer) {
    backend_.layernorm_backward(x, w, dy, dx, dw, slice<G>(out(op, "dw"), op, prefix + ".bias"), rows, h_, eps);
  } else {
    backend_.rmsnorm_backward(x, w, dy, dx, dw, rows, h_, eps);
  }
}

// y[tokens, out] = x[tokens, in] · W[out, in]ᵀ. The op's (m, n, k) by pass (op_signature.hpp):
// forward m = tokens, n = out, k = in; dgrad m = tokens, n = in, k = out; wgrad m = in, n = out,
// k = tokens.
template <class T, class G, class W>
void Interpreter<T, G, W>::gemm(const Op& op) {
  if (op.name == OpName::expert_gate || op.name == OpName::expert_up || op.name == OpName::expert_down) {
    return moe_gemm(op);
  }
  LinearWeights l = linear_weights(op, model_.use_bias);
  if (op.fp8_slots[0] >= 0) return fp8_gemm(op, l.tensor, l.bias);
  const bool bias = l.bias[0] != '\0';
  if (op.grad == Grad::none) {  // [x, w] → [y]
    int64_t tokens = op.m, in_features = op.k, out_features = op.n;
    T* y = buf(out(op, "y"), op);
    backend_.linear_forward(buf(in(op, "x"), op), slice(in(op, "w"), op, l.tensor),
                            bias ? slice(in(op, "w"), op, l.bias) : nullptr, y, tokens, in_features, out_features);
    if (op.name == OpName::logits) mask_padded_vocab(y, tokens);
  } else if (op.grad == Grad::dgrad) {  // [d_y, w, (d_x)] → [d_x]
    int64_t tokens = op.m, in_features = op.n, out_features = op.k;
    backend_.linear_backward_data(buf(in(op, "d_y"), op), slice(in(op, "w"), op, l.tensor), buf(out(op, "d_x"), op),
                                  tokens, in_features, out_features, operands(op).has_in("d_x"));
  } else {  // wgrad: [x, d_y] → [dw]
    int64_t tokens = op.k, in_features = op.m, out_features = op.n;
    G* dbias = bias ? slice<G>(out(op, "dw"), op, l.bias) : nullptr;
    backend_.linear_backward_weight(buf(in(op, "d_y"), op), buf(in(op, "x"), op), slice<G>(out(op, "dw"), op, l.tensor),
                                    dbias, tokens, in_features, out_features);
  }
}

// Padded vocabulary rows (tp must divide the vocabulary) never win the softmax.
template <class T, class G, class W>
void Interpreter<T, G, W>::mask_padded_vocab(T* logits, int64_t tokens) {
  int64_t v0 = coord_.tp * vocab_local_;
  int64_t valid = std::max<int64_t>(0, std::min(vocab_local_, model_.vocab_size - v0));
  if (valid == vocab_local_) return;
  backend_.fill_columns(logits, tokens, vocab_local_, valid, T(-1e30));
}

// The op's attention problem: batch = b·heads, m = s, k = head_dim (the lowering's fields).
template <class T, class G, class W>
cpu::AttentionShape Interpreter<T, G, W>::attention_shape(const Op& op) const {
  STEPCAST_CHECK(op.batch % b_ == 0, "attention op " + std::to_string(op.id) + ": batch " + std::to_string(op.batch) +
                                         " is not micro_batch_size × heads");
  // (Ulysses: the core holds 1/cp of a tensor-parallel rank's heads, K/V heads alike.)
  return cpu::AttentionShape{op.m, b_, op.batch / b_, ulysses_ ? kv_heads_local_ / cp_ : kv_heads_local_, op.k};
}

template <class T, class G, class W>
void Interpreter<T, G, W>::attention(const Op& op) {
  if (op.name == OpName::cp_score || op.name == OpName::cp_value ||
      (op.name == OpName::flash && operands(op).has_in("kv")) ||
      (op.name == OpName::dropout && op.phase != Phase::backward && cp_ > 1 && !ulysses_)) {
    return cp_attention(op);
  }
  bool backward = op.phase == Phase::backward;
  cpu::AttentionShape shape = attention_shape(op);
  // The first global head: under Ulysses this cp rank's 1/cp of the tensor-parallel rank's heads.
  int64_t head0 = ulysses_ ? (coord_.tp * cp_ + coord_.cp) * shape.heads : coord_.tp * shape.heads;
  int64_t rows = op.batch * op.m, cols = op.n;  // scores and probabilities: [b, heads, s, s]
  cpu::Dropout drop = dropout(op, cpu::DropoutSite::attention_probs);
  const cpu::Dropout* drop_ptr = plan_.dropout > 0 ? &drop : nullptr;
  if (!backward) {
    if (op.name == OpName::score) {  // [qkv] → [scores]
      backend_.attention_score_forward(buf(in(op, "qkv"), op), buf(out(op, "scores"), op), shape, scale_);
    } else if (op.name == OpName::softmax) {  // [scores] → [probs]
      backend_.softmax_forward(buf(in(op, "scores"), op), buf(out(op, "probs"), op), rows, cols);
    } else if (op.name == OpName::dropout) {  // [probs] → [probs_drop, mask]
      backend_.attention_dropout_forward(buf(in(op, "probs"), op), buf(out(op, "probs_drop"), op),
                                         mask(out(op, "mask"), op), shape, drop, head0, samples(op));
    } else if (op.name == OpName::value) {  // [probs, qkv] → [ctx]
      backend_.attention_value_forward(buf(in(op, "probs"), op), buf(in(op, "qkv"), op), buf(out(op, "ctx"), op),
                                       shape);
    } else {  // flash: [qkv] → [ctx, lse]
      backend_.flash_attention_forward(buf(in(op, "qkv"), op), buf(out(op, "ctx"), op), buf<W>(out(op, "lse"), op),
                                       shape, scale_, drop_ptr, head0, samples(op));
    }
    return;
  }
  if (op.name == OpName::value) {  // [d_ctx, probs, qkv] → [d_probs, d_qkv]
    backend_.attention_value_backward(buf(in(op, "d_ctx"), op), buf(in(op, "probs"), op), buf(in(op, "qkv"), op),
                                      buf(out(op, "d_probs"), op), buf(out(op, "d_qkv"), op), shape);
  } else if (op.name == OpName::dropout) {  // [d_y, mask] → [d_x]
    backend_.dropout_backward(buf(in(op, "d_y"), op), mask(in(op, "mask"), op), buf(out(op, "d_x"), op), rows * cols,
                              plan_.dropout);
  } else if (op.name == OpName::softmax) {  // [d_probs, probs] → [d_scores]
    backend_.softmax_backward(buf(in(op, "d_probs"), op), buf(in(op, "probs"), op), buf(out(op, "d_scores"), op), rows,
                              cols);
  } else if (op.name == OpName::score) {  // [d_scores, qkv, d_qkv] → [d_qkv]
    backend_.attention_score_backward(buf(in(op, "d_scores"), op), buf(in(op, "qkv"), op), buf(out(op, "d_qkv"), op),
                                      shape, scale_);
  } else {  // flash: [qkv, ctx, lse, d_ctx] → [d_qkv]
    backend_.flash_attention_backward(buf(in(op, "qkv"), op), buf(in(op, "ctx"), op), buf<W>(in(op, "lse"), op),
                                      buf(in(op, "d_ctx"), op), buf(out(op, "d_qkv"), op), shape, scale_, drop_ptr,
                                      head0, samples(op));
  }
}

template <class T, class G, class W>
void Interpreter<T, G, W>::activation(const Op& op) {
  bool backward = op.phase == Phase::backward;
  if (op.name == OpName::fp8_cast || op.name == OpName::fp8_cast_transpose || op.name == OpName::fp8_weights ||
      op.name == OpName::fp8_absmax || op.name == OpName::fp8_transpose || op.name == OpName::fp8_weights_transpose) {
    return fp8_activation(op);
  }
  if (op.name == OpName::fp8_param_absmax || op.name == OpName::fp8_param_cast) return fp8_param(op);
  if (op.name == OpName::rotary) {  // [qkv] → [qkv], in place
    const std::string& qkv = out(op, "qkv");
    // The attention problem of this layer: s, b and the local heads from the qkv buffer's width.
    int64_t d = model_.head_dim();
    cpu::AttentionShape shape{s_, b_, count(qkv, op) / (s_ * b_ * d) - 2 * kv_heads_local_, kv_heads_local_, d};
    for (const PositionRun& run : position_runs(0, s_)) {  // rotated at global positions
      cpu::AttentionShape part = shape;
      part.s = run.rows;
      T* x = buf(qkv, op) + run.offset * b_ * shape.qkv_width();
      if (backward)
        backend_.rotary_backward(x, part, model_.rope_theta, run.s0);
      else
        backend_.rotary_forward(x, part, model_.rope_theta, run.s0);
    }
  } else if (op.name == OpName::gelu) {
    if (backward) {  // [x, d_y] → [d_x]
      backend_.gelu_backward(buf(in(op, "x"), op), buf(in(op, "d_y"), op), buf(out(op, "d_x"), op),
                             count(out(op, "d_x"), op));
    } else {  // [x] → [y]
      backend_.gelu_forward(buf(in(op, "x"), op), buf(out(op, "y"), op), count(out(op, "y"), op));
    }
  } else if (op.name == OpName::swiglu) {
    if (backward) {  // [gate, up, d_y] → [d_gate, d_up]
      backend_.swiglu_backward(buf(in(op, "gate"), op), buf(in(op, "up"), op), buf(in(op, "d_y"), op),
                               buf(out(op, "d_gate"), op), buf(out(op, "d_up"), op), count(in(op, "d_y"), op));
    } else {  // [gate, up] → [y]
      backend_.swiglu_forward(buf(in(op, "gate"), op), buf(in(op, "up"), op), buf(out(op, "y"), op),
                              count(out(op, "y"), op));
    }
  } else if (op.name == OpName::dropout_add && !backward) {
    // [branch, residual, w] → [y, (mask)]: the row-parallel bias first.
    const std::string& y = out(op, "y");
    bool attention_branch = ends_with(y, "x_mid");
    T* branch = buf(in(op, "branch"), op);
    const char* bias_name = attention_branch ? "attn_out.bias" : "mlp_down.bias";
    if (model_.use_bias && has_tensor(in(op, "w"), bias_name)) {  // (no mlp_down: MoE, no shared experts)
      backend_.add_rows(branch, slice(in(op, "w"), op, bias_name), count(y, op) / h_, h_);
    }
    cpu::Dropout drop =
        dropout(op, attention_branch ? cpu::DropoutSite::attention_residual : cpu::DropoutSite::mlp_residual);
    bool masked = operands(op).has_out("mask");  // none: no dropout
    if (!masked) drop.p = 0;
    for (const PositionRun& run : position_runs(s0(), s_local_)) {
      const int64_t at = run.offset * b_ * h_;
      backend_.dropout_add_forward(branch + at, buf(in(op, "residual"), op) + at, buf(y, op) + at,
                                   masked ? mask(out(op, "mask"), op) + at : nullptr, run.rows, b_, h_, drop, run.s0,
                                   samples(op));
    }
  } else if (op.name == OpName::dropout_add) {  // [d_y, mask, dw] → [d_x, (dw)]
    T* d = buf(out(op, "d_x"), op);
    backend_.dropout_backward(buf(in(op, "d_y"), op), mask(in(op, "mask"), op), d, count(out(op, "d_x"), op),
                              plan_.dropout);
    if (model_.use_bias) add_bias_grad(op, d, in(op, "dw"));
  } else if (op.name == OpName::mlp_bias_grad || op.name == OpName::attn_bias_grad) {  // [d_y, dw] → [dw]
    add_bias_grad(op, buf(in(op, "d_y"), op), in(op, "dw"));
  } else if (op.name == OpName::moe_route || op.name == OpName::moe_permute || op.name == OpName::moe_unpermute ||
             op.name == OpName::moe_add) {
    moe_activation(op);
  } else if (op.name == OpName::cp_kv_pack || op.name == OpName::cp_merge || op.name == OpName::cp_dkv ||
             op.name == OpName::cp_a2a_split_heads || op.name == OpName::cp_a2a_join_seq ||
             op.name == OpName::cp_a2a_split_seq || op.name == OpName::cp_a2a_join_heads) {
    cp_activation(op);
  } else {
    STEPCAST_CHECK(false, std::string("unknown activation op ") + to_string(op.name));
  }
}

// Row-parallel bias gradient from the local tokens of a residual branch: the mlp branch's
// dropout reads mask2, the attention branch's mask1; without dropout the op's name says.
template <class T, class G, class W>
void Interpreter<T, G, W>::add_bias_grad(const Op& op, const T* d, const std::string& grads) {
  bool mlp = op.name == OpName::mlp_bias_grad || (op.name == OpName::dropout_add && ends_with(in(op, "mask"), "mask2"));
  const char* name = mlp ? "mlp_down.bias" : "attn_out.bias";
  if (!has_tensor(grads, name)) return;  // a MoE layer without shared experts
  backend_.sum_rows(d, slice<G>(grads, op, name), s_local_ * b_, h_);
}

template <class T, class G, class W>
void Interpreter<T, G, W>::loss(const Op& op) {
  if (op.name == OpName::moe_aux_loss) return moe_aux(op);
  int64_t v0 = coord_.tp * vocab_local_;
  const int32_t* targets = buf<int32_t>(in(op, "targets"), op);
  int64_t tokens = count(in(op, "targets"), op);
  if (op.name == OpName::cross_entropy_stats) {  // [logits, targets] → [stats]
    backend_.cross_entropy_stats(buf(in(op, "logits"), op), targets, buf<W>(out(op, "stats"), op), tokens, v0,
                                 vocab_local_);
    return;
  }
  if (op.phase == Phase::backward) {  // [softmax, targets] → [d_logits]
    // The step's tokens; a parameter server's worker updates alone: its own tokens.
    const int64_t samples = plan_.parameter_server() ? plan_.global_batch_size / plan_.dp_size : plan_.global_batch_size;
    double scale = 1.0 / double(samples * s_full_);
    backend_.cross_entropy_backward(buf<W>(in(op, "softmax"), op), targets, buf(out(op, "d_logits"), op), tokens, v0,
                                    vocab_local_, scale);
    return;
  }
  // [logits, targets, (stats_all)] → [softmax, token_loss, (stats: one tp rank)]
  const T* logits = buf(in(op, "logits"), op);
  const W* stats_all = nullptr;
  if (operands(op).has_in("stats_all")) {
    stats_all = buf<W>(in(op, "stats_all"), op);
  } else {
    W* stats = buf<W>(out(op, "stats"), op);
    backend_.cross_entropy_stats(logits, targets, stats, tokens, v0, vocab_local_);
    stats_all = stats;
  }
  W* token_loss = buf<W>(out(op, "token_loss"), op);
  backend_.cross_entropy_forward(logits, stats_all, t_, buf<W>(out(op, "softmax"), op), token_loss, tokens,
                                 vocab_local_);
  // Each tp rank computes the same per-token loss: count it once.
  if (coord_.tp == 0) loss_sum_ += backend_.sum(token_loss, tokens);
}

#define STEPCAST_INSTANTIATE_LAYERS(T, G, W)                                                  \
  template void Interpreter<T, G, W>::embedding(const Op&);                                   \
  template void Interpreter<T, G, W>::norm(const Op&);                                        \
  template void Interpreter<T, G, W>::gemm(const Op&);                                        \
  template void Interpreter<T, G, W>::mask_padded_vocab(T*, int64_t);                         \
  template cpu::AttentionShape Interpreter<T, G, W>::attention_shape(const Op&) const;        \
  template void Interpreter<T, G, W>::attention(const Op&);                                   \
  template void Interpreter<T, G, W>::activation(const Op&);                                  \
  template void Interpreter<T, G, W>::add_bias_grad(const Op&, const T*, const std::string&); \
  template void Interpreter<T, G, W>::loss(const Op&);
STEPCAST_FOR_EACH_STORAGE(STEPCAST_INSTANTIATE_LAYERS)
#undef STEPCAST_INSTANTIATE_LAYERS

}  // namespace stepcast
