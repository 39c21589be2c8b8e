// The ops of one transformer layer, forward and backward, for one microbatch, Megatron-style:
// column-parallel QKV and MLP-up, row-parallel attention-out and MLP-down, the tensor-parallel
// all_reduce (or reduce_scatter / all_gather under sequence parallelism), dropout + residual.
// Which buffers survive the forward pass is the activation memory: with materialized attention,
// dropout and 16-bit activations it is Korthikanti et al.'s 34·sbh + 5·a·s²·b per layer (TP and
// SP variants alike). Buffer shapes: [s_local, b, h] between TP regions, [s, b, ·] inside them.
#include <set>

#include "errors.hpp"
#include "lower_context.hpp"

namespace stepcast {

std::string layer_prefix(int32_t microbatch, int32_t layer) {
  return "mb" + std::to_string(microbatch) + ".L" + std::to_string(layer) + ".";
}

namespace {

// Buffers kept from forward to backward under each recompute mode (the layer input always).
std::set<std::string> kept_buffers(const LowerContext& c, KeepMode keep) {
  std::set<std::string> all = {"ln1", "qkv", "ctx", "mask1", "x_mid", "ln2", "up", "act", "mask2"};
  if (c.model.mlp == MlpKind::swiglu) all.insert("gate");
  if (c.plan.attention_impl == AttentionImpl::flash) {
    all.insert("lse");
  } else {
    all.insert("probs");
    all.insert("probs_mask");
    all.insert("probs_drop");
  }
  if (keep == KeepMode::all_for_backward) return all;
  if (c.plan.recompute == RecomputeKind::full) return {};
  if (c.plan.recompute == RecomputeKind::selective) {
    all.erase("probs");
    all.erase("probs_mask");
    all.erase("probs_drop");
  }
  return all;
}

struct LayerNames {
  explicit LayerNames(const OpSite& at) : prefix(layer_prefix(at.microbatch, at.layer)) {}
  std::string operator()(const std::string& n) const { return prefix + n; }
  std::string prefix;
};

// Forward of the attention core with materialized scores: score → softmax → dropout → value.
void emit_attention_scores(OpEmitter& e, const OpSite& at, const LayerNames& n) {
  const LowerContext& c = e.ctx();
  std::vector<int64_t> square = {c.b, c.heads_local, c.s, c.s};
  double score_flops = 2.0 * c.b * c.heads_local * c.s * c.s * c.d;
  double square_elems = double(c.b) * c.heads_local * c.s * c.s;
  e.alloc(n("scores"), BufferClass::workspace, c.act, square, at.phase);
  e.attention(at, OpName::score, score_flops, {n("qkv")}, {n("scores")});
  e.alloc(n("probs"), BufferClass::activations, c.act, square, at.phase);
  e.attention(at, OpName::softmax, 5 * square_elems, {n("scores")}, {n("probs")});
  e.free(n("scores"), at.phase);
  if (c.dropout) {
    e.alloc(n("probs_mask"), BufferClass::activations, Dtype::fp8, square, at.phase);
    e.alloc(n("probs_drop"), BufferClass::activations, c.act, square, at.phase);
    e.attention(at, OpName::dropout, 2 * square_elems, {n("probs")}, {n("probs_drop"), n("probs_mask")});
  }
}

std::string probs_for_value(const LowerContext& c, const LayerNames& n) {
  return c.dropout ? n("probs_drop") : n("probs");
}

}  // namespace

std::string emit_layer_forward(OpEmitter& e, const OpSite& at, const std::string& x_in,
                               const LayerParams& params, KeepMode keep) {
  const LowerContext& c = e.ctx();
  const bool sp = c.plan.sequence_parallel;
  const bool flash = c.plan.attention_impl == AttentionImpl::flash;
  LayerNames n(at);
  std::set<std::string> kept = kept_buffers(c, keep);
  auto done = [&](const std::string& short_name) {
    if (!kept.count(short_name)) e.free(n(short_name), at.phase);
  };
  const std::vector<int64_t> local = {c.s_local, c.b, c.h};
  const std::vector<int64_t> full = {c.s, c.b, c.h};
  const double tokens = double(c.s) * c.b;
  const std::string& w = params.weights;

  // Input norm, then gather the sequence under SP.
  e.alloc(n("ln1"), BufferClass::activations, c.act, local, at.phase);
  e.compute(at, OpKind::norm, OpName::input_norm, 8.0 * c.s_local * c.b * c.h, {x_in, w}, {n("ln1")});
  std::string qkv_in = n("ln1");
  if (sp) {
    e.alloc(n("ln1_full"), BufferClass::workspace, c.act, full, at.phase);
    e.collective(at, OpKind::all_gather, GroupKind::tp, Stream::compute, OpName::sp_ln1,
                 tokens * c.h * dtype_bytes(c.act), {n("ln1")}, {n("ln1_full")});
    qkv_in = n("ln1_full");
  }
  e.alloc(n("qkv"), BufferClass::activations, c.act, {c.s, c.b, c.qkv_width}, at.phase);
  e.gemm(at, OpName::qkv, Grad::none, c.s * c.b, c.qkv_width, c.h, {qkv_in, w}, {n("qkv")});
  if (sp) e.free(n("ln1_full"), at.phase);
  done("ln1");
  if (c.model.position == PositionKind::rotary) {
    e.compute(at, OpKind::activation, OpName::rotary, 6.0 * c.s * c.b * (c.heads_local + c.kv_local) * c.d,
              {n("qkv")}, {n("qkv")});
  }

  // Attention core.
  e.alloc(n("ctx"), BufferClass::activations, c.act, {c.s, c.b, c.heads_local * c.d}, at.phase);
  double core_flops = 4.0 * c.b * c.heads_local * c.s * c.s * c.d;
  if (flash) {
    e.alloc(n("lse"), BufferClass::activations, c.wide, {c.b, c.heads_local, c.s}, at.phase);
    if (c.cp > 1) emit_cp_attention_forward(e, at, n.prefix);
    else e.attention(at, OpName::flash, core_flops, {n("qkv")}, {n("ctx"), n("lse")});
    done("lse");
  } else {
    emit_attention_scores(e, at, n);
    e.attention(at, OpName::value, core_flops / 2, {probs_for_value(c, n), n("qkv")}, {n("ctx")});
    done("probs");
    if (c.dropout) {
      done("probs_mask");
      done("probs_drop");
    }
  }
  done("qkv");

  // Attention output projection, its tensor-parallel reduction, dropout and residual.
  e.alloc(n("attn_partial"), BufferClass::workspace, c.act, full, at.phase);
  e.gemm(at, OpName::attn_out, Grad::none, c.s * c.b, c.h, c.heads_local * c.d, {n("ctx"), w},
         {n("attn_partial")});
  done("ctx");
  std::string attn_out = n("attn_partial");
  if (sp) {
    e.alloc(n("attn_rs"), BufferClass::workspace, c.act, local, at.phase);
    e.collective(at, OpKind::reduce_scatter, GroupKind::tp, Stream::compute, OpName::tp_attn_out,
                 tokens * c.h * dtype_bytes(c.act), {n("attn_partial")}, {n("attn_rs")});
    e.free(n("attn_partial"), at.phase);
    attn_out = n("attn_rs");
  } else {
    e.collective(at, OpKind::all_reduce, GroupKind::tp, Stream::compute, OpName::tp_attn_out,
                 tokens * c.h * dtype_bytes(c.act), {n("attn_partial")}, {n("attn_partial")});
  }
  e.alloc(n("x_mid"), BufferClass::activations, c.act, local, at.phase);
  std::vector<std::string> residual_out = {n("x_mid")};
  if (c.dropout) {
    e.alloc(n("mask1"), BufferClass::activations, Dtype::fp8, local, at.phase);
    residual_out.push_back(n("mask1"));
  }
  // The row-parallel bias of attn_out (replicated) is added after the reduction, here.
  e.compute(at, OpKind::activation, OpName::dropout_add, 3.0 * c.s_local * c.b * c.h,
            {attn_out, x_in, w}, residual_out);
  e.free(attn_out, at.phase);
  if (c.dropout) done("mask1");

  // MLP.
  e.alloc(n("ln2"), BufferClass::activations, c.act, local, at.phase);
  e.compute(at, OpKind::norm, OpName::post_attn_norm, 8.0 * c.s_local * c.b * c.h, {n("x_mid"), w},
            {n("ln2")});
  std::string mlp_in = n("ln2");
  if (sp) {
    e.alloc(n("ln2_full"), BufferClass::workspace, c.act, full, at.phase);
    e.collective(at, OpKind::all_gather, GroupKind::tp, Stream::compute, OpName::sp_ln2,
                 tokens * c.h * dtype_bytes(c.act), {n("ln2")}, {n("ln2_full")});
    mlp_in = n("ln2_full");
  }
  const std::vector<int64_t> wide = {c.s, c.b, c.f_local};
  if (c.model.mlp == MlpKind::swiglu) {
    e.alloc(n("gate"), BufferClass::activations, c.act, wide, at.phase);
    e.gemm(at, OpName::mlp_gate, Grad::none, c.s * c.b, c.f_local, c.h, {mlp_in, w}, {n("gate")});
  }
  e.alloc(n("up"), BufferClass::activations, c.act, wide, at.phase);
  e.gemm(at, OpName::mlp_up, Grad::none, c.s * c.b, c.f_local, c.h, {mlp_in, w}, {n("up")});
  if (sp) e.free(n("ln2_full"), at.phase);
  done("ln2");
  e.alloc(n("act"), BufferClass::activations, c.act, wide, at.phase);
  if (c.model.mlp == MlpKind::swiglu) {
    e.compute(at, OpKind::activation, OpName::swiglu, 6.0 * c.s * c.b * c.f_local, {n("gate"), n("up")},
              {n("act")});
    done("gate");
  } else {
    e.compute(at, OpKind::activation, OpName::gelu, 8.0 * c.s * c.b * c.f_local, {n("up")}, {n("act")});
  }
  done("up");
  e.alloc(n("mlp_partial"), BufferClass::workspace, c.act, full, at.phase);
  e.gemm(at, OpName::mlp_down, Grad::none, c.s * c.b, c.h, c.f_local, {n("act"), w}, {n("mlp_partial")});
  done("act");
  std::string mlp_out = n("mlp_partial");
  if (sp) {
    e.alloc(n("mlp_rs"), BufferClass::workspace, c.act, local, at.phase);
    e.collective(at, OpKind::reduce_scatter, GroupKind::tp, Stream::compute, OpName::tp_mlp_down,
                 tokens * c.h * dtype_bytes(c.act), {n("mlp_partial")}, {n("mlp_rs")});
    e.free(n("mlp_partial"), at.phase);
    mlp_out = n("mlp_rs");
  } else {
    e.collective(at, OpKind::all_reduce, GroupKind::tp, Stream::compute, OpName::tp_mlp_down,
                 tokens * c.h * dtype_bytes(c.act), {n("mlp_partial")}, {n("mlp_partial")});
  }
  e.alloc(n("out"), BufferClass::activations, c.act, local, at.phase);
  residual_out = {n("out")};
  if (c.dropout) {
    e.alloc(n("mask2"), BufferClass::activations, Dtype::fp8, local, at.phase);
    residual_out.push_back(n("mask2"));
  }
  e.compute(at, OpKind::activation, OpName::dropout_add, 3.0 * c.s_local * c.b * c.h,
            {mlp_out, n("x_mid"), w}, residual_out);
  e.free(mlp_out, at.phase);
  if (c.dropout) done("mask2");
  done("x_mid");  // read by the norm and by the residual add
  return n("out");
}

void emit_layer_backward(OpEmitter& e, const OpSite& at, const std::string& x_in,
                         const std::string& g, const LayerParams& params) {
  const LowerContext& c = e.ctx();
  const bool sp = c.plan.sequence_parallel;
  const bool flash = c.plan.attention_impl == AttentionImpl::flash;
  const Phase bwd = at.phase;
  LayerNames n(at);
  const std::vector<int64_t> local = {c.s_local, c.b, c.h};
  const std::vector<int64_t> full = {c.s, c.b, c.h};
  const std::vector<int64_t> wide = {c.s, c.b, c.f_local};
  const double tokens = double(c.s) * c.b;
  const double hidden_bytes = tokens * c.h * dtype_bytes(c.act);
  const std::string& w = params.weights;
  const std::string& wg = params.grads;

  // Full recompute: run the forward again from the kept input, keeping what backward reads.
  if (c.plan.recompute == RecomputeKind::full) {
    OpSite re = at;
    re.phase = Phase::recompute;
    std::string out = emit_layer_forward(e, re, x_in, params, KeepMode::all_for_backward);
    e.free(out, Phase::recompute);
  }

  // Gradient of a residual branch output: through dropout, then gathered over the sequence
  // (the backward of the forward reduce_scatter) under SP.
  // Gradient of a residual branch output: through dropout (and into the row-parallel bias,
  // from the local tokens: its tp all_reduce under SP is sp_replicated_grads), then gathered over
  // the sequence (the backward of the forward reduce_scatter) under SP.
  auto branch_grad = [&](const std::string& mask, const std::string& stem, OpName bias_grad,
                         OpName gather) {
    std::string d = g;
    if (c.dropout) {
      d = n(stem);
      e.alloc(d, BufferClass::workspace, c.act, local, bwd);
      std::vector<std::string> outputs = {d};
      if (c.model.use_bias) outputs.push_back(wg);
      e.compute(at, OpKind::activation, OpName::dropout_add, 2.0 * c.s_local * c.b * c.h,
                {g, n(mask), wg}, outputs);
      e.free(n(mask), bwd);
    } else if (c.model.use_bias) {
      e.compute(at, OpKind::activation, bias_grad, 1.0 * c.s_local * c.b * c.h, {g, wg}, {wg});
    }
    if (!sp) return d;
    std::string gathered = n(stem + "_full");
    e.alloc(gathered, BufferClass::workspace, c.act, full, bwd);
    e.collective(at, OpKind::all_gather, GroupKind::tp, Stream::compute, gather,
                 hidden_bytes, {d}, {gathered});
    if (d != g) e.free(d, bwd);
    return gathered;
  };
  // Gradient into a norm's output, reduced over tp (all_reduce; reduce_scatter under SP).
  auto reduce_norm_grad = [&](const std::string& d_full, const std::string& stem,
                              OpName what) {
    if (!sp) {
      e.collective(at, OpKind::all_reduce, GroupKind::tp, Stream::compute, what, hidden_bytes,
                   {d_full}, {d_full});
      return d_full;
    }
    std::string d = n(stem);
    e.alloc(d, BufferClass::workspace, c.act, local, bwd);
    e.collective(at, OpKind::reduce_scatter, GroupKind::tp, Stream::compute, what, hidden_bytes,
                 {d_full}, {d});
    e.free(d_full, bwd);
    return d;
  };
  auto regather = [&](const std::string& stem, OpName gather) {
    if (!sp) return n(stem);
    e.alloc(n(stem + "_full"), BufferClass::workspace, c.act, full, bwd);
    e.collective(at, OpKind::all_gather, GroupKind::tp, Stream::compute, gather, hidden_bytes,
                 {n(stem)}, {n(stem + "_full")});
    return n(stem + "_full");
  };

  // MLP block.
  std::string d_mlp = branch_grad("mask2", "d_mlp", OpName::mlp_bias_grad, OpName::sp_d_mlp);
  e.alloc(n("d_act"), BufferClass::workspace, c.act, wide, bwd);
  e.gemm(at, OpName::mlp_down, Grad::dgrad, c.s * c.b, c.f_local, c.h, {d_mlp, w}, {n("d_act")});
  e.gemm(at, OpName::mlp_down, Grad::wgrad, c.f_local, c.h, c.s * c.b, {n("act"), d_mlp}, {wg});
  e.free(n("act"), bwd);
  if (d_mlp != g) e.free(d_mlp, bwd);
  e.alloc(n("d_up"), BufferClass::workspace, c.act, wide, bwd);
  if (c.model.mlp == MlpKind::swiglu) {
    e.alloc(n("d_gate"), BufferClass::workspace, c.act, wide, bwd);
    e.compute(at, OpKind::activation, OpName::swiglu, 10.0 * c.s * c.b * c.f_local,
              {n("gate"), n("up"), n("d_act")}, {n("d_gate"), n("d_up")});
    e.free(n("gate"), bwd);
  } else {
    e.compute(at, OpKind::activation, OpName::gelu, 12.0 * c.s * c.b * c.f_local, {n("up"), n("d_act")},
              {n("d_up")});
  }
  e.free(n("d_act"), bwd);
  e.free(n("up"), bwd);
  std::string ln2 = regather("ln2", OpName::sp_ln2);
  e.alloc(n("d_ln2_full"), BufferClass::workspace, c.act, full, bwd);
  e.gemm(at, OpName::mlp_up, Grad::dgrad, c.s * c.b, c.h, c.f_local, {n("d_up"), w}, {n("d_ln2_full")});
  e.gemm(at, OpName::mlp_up, Grad::wgrad, c.h, c.f_local, c.s * c.b, {ln2, n("d_up")}, {wg});
  if (c.model.mlp == MlpKind::swiglu) {
    e.gemm(at, OpName::mlp_gate, Grad::dgrad, c.s * c.b, c.h, c.f_local, {n("d_gate"), w, n("d_ln2_full")},
           {n("d_ln2_full")});
    e.gemm(at, OpName::mlp_gate, Grad::wgrad, c.h, c.f_local, c.s * c.b, {ln2, n("d_gate")}, {wg});
    e.free(n("d_gate"), bwd);
  }
  e.free(n("d_up"), bwd);
  if (sp) e.free(ln2, bwd);
  e.free(n("ln2"), bwd);
  std::string d_ln2 = reduce_norm_grad(n("d_ln2_full"), "d_ln2", OpName::tp_mlp_up);
  e.compute(at, OpKind::norm, OpName::post_attn_norm, 10.0 * c.s_local * c.b * c.h,
            {n("x_mid"), d_ln2, w, g}, {g, wg});
  e.free(n("x_mid"), bwd);
  e.free(d_ln2, bwd);

  // Attention block.
  std::string d_attn = branch_grad("mask1", "d_attn", OpName::attn_bias_grad, OpName::sp_d_attn);
  e.alloc(n("d_ctx"), BufferClass::workspace, c.act, {c.s, c.b, c.heads_local * c.d}, bwd);
  e.gemm(at, OpName::attn_out, Grad::dgrad, c.s * c.b, c.heads_local * c.d, c.h, {d_attn, w}, {n("d_ctx")});
  e.gemm(at, OpName::attn_out, Grad::wgrad, c.heads_local * c.d, c.h, c.s * c.b, {n("ctx"), d_attn}, {wg});
  if (d_attn != g) e.free(d_attn, bwd);
  e.alloc(n("d_qkv"), BufferClass::workspace, c.act, {c.s, c.b, c.qkv_width}, bwd);
  double core_flops = 4.0 * c.b * c.heads_local * c.s * c.s * c.d;
  if (flash && c.cp > 1) {
    emit_cp_attention_backward(e, at, n.prefix);
    e.free(n("lse"), bwd);
    e.free(n("ctx"), bwd);
  } else if (flash) {
    // FlashAttention-2's backward recomputes the scores: 5 matmuls against the forward's 2.
    e.attention(at, OpName::flash, 2.5 * core_flops, {n("qkv"), n("ctx"), n("lse"), n("d_ctx")},
                {n("d_qkv")});
    e.free(n("lse"), bwd);
    e.free(n("ctx"), bwd);
  } else {
    e.free(n("ctx"), bwd);
    if (c.plan.recompute == RecomputeKind::selective) {
      OpSite re = at;
      re.phase = Phase::recompute;
      emit_attention_scores(e, re, n);
    }
    std::vector<int64_t> square = {c.b, c.heads_local, c.s, c.s};
    double square_elems = double(c.b) * c.heads_local * c.s * c.s;
    std::string probs_used = probs_for_value(c, n);
    e.alloc(n("d_probs_used"), BufferClass::workspace, c.act, square, bwd);
    e.attention(at, OpName::value, core_flops, {n("d_ctx"), probs_used, n("qkv")},
                {n("d_probs_used"), n("d_qkv")});
    std::string d_probs = n("d_probs_used");
    if (c.dropout) {
      e.free(n("probs_drop"), bwd);
      e.alloc(n("d_probs"), BufferClass::workspace, c.act, square, bwd);
      e.attention(at, OpName::dropout, 2 * square_elems, {n("d_probs_used"), n("probs_mask")},
                  {n("d_probs")});
      e.free(n("d_probs_used"), bwd);
      e.free(n("probs_mask"), bwd);
      d_probs = n("d_probs");
    }
    e.alloc(n("d_scores"), BufferClass::workspace, c.act, square, bwd);
    e.attention(at, OpName::softmax, 4 * square_elems, {d_probs, n("probs")}, {n("d_scores")});
    e.free(d_probs, bwd);
    e.free(n("probs"), bwd);
    e.attention(at, OpName::score, core_flops, {n("d_scores"), n("qkv"), n("d_qkv")}, {n("d_qkv")});
    e.free(n("d_scores"), bwd);
  }
  e.free(n("d_ctx"), bwd);
  if (c.model.position == PositionKind::rotary) {
    e.compute(at, OpKind::activation, OpName::rotary,
              6.0 * c.s * c.b * (c.heads_local + c.kv_local) * c.d, {n("d_qkv")}, {n("d_qkv")});
  }
  std::string ln1 = regather("ln1", OpName::sp_ln1);
  e.alloc(n("d_ln1_full"), BufferClass::workspace, c.act, full, bwd);
  e.gemm(at, OpName::qkv, Grad::dgrad, c.s * c.b, c.h, c.qkv_width, {n("d_qkv"), w}, {n("d_ln1_full")});
  e.gemm(at, OpName::qkv, Grad::wgrad, c.h, c.qkv_width, c.s * c.b, {ln1, n("d_qkv")}, {wg});
  e.free(n("d_qkv"), bwd);
  e.free(n("qkv"), bwd);
  if (sp) e.free(ln1, bwd);
  e.free(n("ln1"), bwd);
  std::string d_ln1 = reduce_norm_grad(n("d_ln1_full"), "d_ln1", OpName::tp_qkv);
  e.compute(at, OpKind::norm, OpName::input_norm, 10.0 * c.s_local * c.b * c.h, {x_in, d_ln1, w, g},
            {g, wg});
  e.free(x_in, bwd);
  e.free(d_ln1, bwd);
}

}  // namespace stepcast
