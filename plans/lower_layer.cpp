// The ops of one transformer layer, forward and backward, for one microbatch, Megatron-style:
// column-parallel QKV and MLP-up, row-parallel attention-out and MLP-down, the tensor-parallel
// all_reduce (or reduce_scatter / all_gather under sequence parallelism), dropout + residual.
// Which buffers survive the forward pass is the activation memory: with materialized attention,
// dropout and 16-bit activations it is Korthikanti et al.'s 34·sbh + 5·a·s²·b per layer (TP and
// SP variants alike). Buffer shapes: [s_local, b, h] between TP regions, [s, b, ·] inside them.
#include <functional>
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
  if (c.fp8) {  // a linear layer keeps its FP8 input (Transformer Engine); ctx stays for flash
    for (const char* stem : {"ln1", "ln2", "act"}) {
      all.erase(stem);
      all.insert(c.fp8_kept(stem));
    }
    all.insert(c.fp8_kept("ctx"));
    if (c.plan.attention_impl != AttentionImpl::flash) all.erase("ctx");
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
  explicit LayerNames(std::string p) : prefix(std::move(p)) {}
  std::string operator()(const std::string& n) const { return prefix + n; }
  std::string prefix;
};

// Forward of the attention core with materialized scores: score → softmax → dropout → value.
// Under context parallelism the keys are the gathered sequence's (`kv_all`, s_full rows).
void emit_attention_scores(OpEmitter& e, const OpSite& at, const LayerNames& n, const std::string& kv_all = "") {
  const LowerContext& c = e.ctx();
  const int64_t s_kv = kv_all.empty() ? c.s : c.s_full;
  std::vector<int64_t> square = {c.b, c.heads_local, c.s, s_kv};
  double score_flops = 2.0 * c.b * c.heads_local * c.s * s_kv * c.d;
  double square_elems = double(c.b) * c.heads_local * c.s * s_kv;
  e.alloc(n("scores"), BufferClass::workspace, c.act, square, at.phase);
  if (kv_all.empty()) e.attention(at, OpName::score, score_flops, {n("qkv")}, {n("scores")});
  else e.cp_attention(at, OpName::cp_score, score_flops, s_kv, {n("qkv"), kv_all}, {n("scores")});
  e.alloc(n("probs"), BufferClass::activations, c.act, square, at.phase);
  e.cp_attention(at, OpName::softmax, 5 * square_elems, s_kv, {n("scores")}, {n("probs")});
  e.free(n("scores"), at.phase);
  if (c.dropout) {
    e.alloc(n("probs_mask"), BufferClass::activations, Dtype::u8, square, at.phase);
    e.alloc(n("probs_drop"), BufferClass::activations, c.act, square, at.phase);
    e.cp_attention(at, OpName::dropout, 2 * square_elems, s_kv, {n("probs")}, {n("probs_drop"), n("probs_mask")});
  }
}

std::string probs_for_value(const LowerContext& c, const LayerNames& n) {
  return c.dropout ? n("probs_drop") : n("probs");
}

bool ulysses(const LowerContext& c) { return c.cp > 1 && c.plan.cp_comm_type == CpCommType::a2a; }

// The attention core, qkv → ctx (and lse, or the probabilities): the flash op, the context-parallel
// ring or gather, or the materialized scores; `done` frees what the layer does not keep.
void emit_attention_core_forward(OpEmitter& e, const OpSite& at, const LayerNames& n,
                                 const std::function<void(const std::string&)>& done) {
  const LowerContext& c = e.ctx();
  e.alloc(n("ctx"), BufferClass::activations, c.act, {c.s, c.b, c.heads_local * c.d}, at.phase);
  double core_flops = 4.0 * c.b * c.heads_local * c.s * (c.cp > 1 ? c.s_full : c.s) * c.d;
  if (c.plan.attention_impl == AttentionImpl::flash) {
    e.alloc(n("lse"), BufferClass::activations, c.wide, {c.b, c.heads_local, c.s}, at.phase);
    if (c.cp > 1) emit_cp_attention_forward(e, at, n.prefix);
    else e.attention(at, OpName::flash, core_flops, {n("qkv")}, {n("ctx"), n("lse")});
    done("lse");
  } else if (c.cp > 1) {  // the gathered kind: every rank's K/V, then the scores over them
    emit_cp_gather_kv(e, at, n("qkv"), n("kv"), n("kv_all"));
    emit_attention_scores(e, at, n, n("kv_all"));
    e.cp_attention(at, OpName::cp_value, core_flops / 2, c.s_full, {probs_for_value(c, n), n("kv_all")}, {n("ctx")});
    e.free(n("kv_all"), at.phase);
    done("probs");
    if (c.dropout) {
      done("probs_mask");
      done("probs_drop");
    }
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
}

// Its backward: d_ctx (and what the forward kept) → d_qkv, which the caller allocated; frees the
// kept core buffers, ctx among them unless `free_ctx` is false (the layer still holds it).
void emit_attention_core_backward(OpEmitter& e, const OpSite& at, const LayerNames& n, bool free_ctx) {
  const LowerContext& c = e.ctx();
  const Phase bwd = at.phase;
  const bool flash = c.plan.attention_impl == AttentionImpl::flash;
  double core_flops = 4.0 * c.b * c.heads_local * c.s * (c.cp > 1 ? c.s_full : c.s) * c.d;
  if (flash && c.cp > 1) {
    emit_cp_attention_backward(e, at, n.prefix);
    e.free(n("lse"), bwd);
    e.free(n("ctx"), bwd);
    return;
  }
  if (flash) {
    // FlashAttention-2's backward recomputes the scores: 5 matmuls against the forward's 2.
    e.attention(at, OpName::flash, 2.5 * core_flops, {n("qkv"), n("ctx"), n("lse"), n("d_ctx")},
                {n("d_qkv")});
    e.free(n("lse"), bwd);
    e.free(n("ctx"), bwd);
    return;
  }
  // Under context parallelism the K/V of the whole sequence are gathered again and their
  // gradients (d_kv_all) reduce-scattered back after the score's backward.
  const bool cp = c.cp > 1;
  const int64_t s_kv = cp ? c.s_full : c.s;
  if (free_ctx) e.free(n("ctx"), bwd);
  if (cp) emit_cp_gather_kv(e, at, n("qkv"), n("bkv"), n("bkv_all"));
  if (c.plan.recompute == RecomputeKind::selective) {
    OpSite re = at;
    re.phase = Phase::recompute;
    emit_attention_scores(e, re, n, cp ? n("bkv_all") : "");
  }
  std::vector<int64_t> square = {c.b, c.heads_local, c.s, s_kv};
  double square_elems = double(c.b) * c.heads_local * c.s * s_kv;
  std::string probs_used = probs_for_value(c, n);
  e.alloc(n("d_probs_used"), BufferClass::workspace, c.act, square, bwd);
  if (cp) {
    e.alloc(n("dkv_all"), BufferClass::workspace, c.act, {c.s_full, c.b, 2 * c.kv_local * c.d}, bwd);
    e.cp_attention(at, OpName::cp_value, core_flops, s_kv, {n("d_ctx"), probs_used, n("bkv_all")},
                   {n("d_probs_used"), n("dkv_all")});
  } else {
    e.attention(at, OpName::value, core_flops, {n("d_ctx"), probs_used, n("qkv")},
                {n("d_probs_used"), n("d_qkv")});
  }
  std::string d_probs = n("d_probs_used");
  if (c.dropout) {
    e.free(n("probs_drop"), bwd);
    e.alloc(n("d_probs"), BufferClass::workspace, c.act, square, bwd);
    e.cp_attention(at, OpName::dropout, 2 * square_elems, s_kv, {n("d_probs_used"), n("probs_mask")},
                   {n("d_probs")});
    e.free(n("d_probs_used"), bwd);
    e.free(n("probs_mask"), bwd);
    d_probs = n("d_probs");
  }
  e.alloc(n("d_scores"), BufferClass::workspace, c.act, square, bwd);
  e.cp_attention(at, OpName::softmax, 4 * square_elems, s_kv, {d_probs, n("probs")}, {n("d_scores")});
  e.free(d_probs, bwd);
  e.free(n("probs"), bwd);
  if (cp) {
    e.cp_attention(at, OpName::cp_score, core_flops, s_kv, {n("d_scores"), n("qkv"), n("bkv_all"), n("dkv_all")},
                   {n("d_qkv"), n("dkv_all")});
    e.free(n("bkv_all"), bwd);
    emit_cp_reduce_dkv(e, at, n("dkv_all"), n("dkv"), n("d_qkv"));
  } else {
    e.attention(at, OpName::score, core_flops, {n("d_scores"), n("qkv"), n("d_qkv")}, {n("d_qkv")});
  }
  e.free(n("d_scores"), bwd);
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
  const bool fp8 = c.fp8;
  const std::string& wl = fp8 ? params.fp8_weights : w;  // what the linear layers read
  // A linear layer's input `stem`: under FP8 cast to "<stem>_f8" (the stem itself then freed
  // unless kept); gathered over the sequence under SP (in FP8 under FP8, as Transformer Engine
  // gathers). Returns what the GEMM reads.
  auto linear_input = [&](const std::string& stem, Fp8Slot kind, OpName gather) {
    std::string x = n(stem);
    if (fp8) {
      const bool keep8 = kept.count(c.fp8_kept(stem)) > 0;
      x = e.fp8_cast(at, x, n(stem + "_f8"), kind, keep8 ? BufferClass::activations : BufferClass::workspace, sp,
                     c.block_scaled && keep8);
      done(stem);
    }
    if (!sp) return x;
    e.alloc(x + "_full", BufferClass::workspace, e.builder().live_dtype(x), full, at.phase);
    e.collective(at, OpKind::all_gather, GroupKind::tp, Stream::compute, gather,
                 storage_bytes(e.builder().live_dtype(x), tokens * c.h), {x}, {x + "_full"});
    return x + "_full";
  };
  // A column-parallel GEMM's operands: under FP8 its bias is read from the weights beside the
  // FP8 copy.
  auto column_in = [&](const std::string& x) {
    std::vector<BufferName> v = {x, wl};
    if (fp8 && c.model.use_bias) v.push_back(w);
    return v;
  };
  // After the GEMMs that read it.
  auto linear_input_done = [&](const std::string& stem, const std::string& read) {
    if (sp) e.free(read, at.phase);
    done(fp8 ? stem + "_f8" : stem);
  };

  // Input norm, then gather the sequence under SP.
  e.alloc(n("ln1"), BufferClass::activations, c.act, local, at.phase);
  e.compute(at, OpKind::norm, OpName::input_norm, 8.0 * c.s_local * c.b * c.h, {x_in, w}, {n("ln1")});
  std::string qkv_in = linear_input("ln1", Fp8Slot::qkv_x, OpName::sp_ln1);
  e.alloc(n("qkv"), BufferClass::activations, c.act, {c.s, c.b, c.qkv_width}, at.phase);
  e.linear(at, OpName::qkv, Grad::none, c.s * c.b, c.qkv_width, c.h, column_in(qkv_in), {n("qkv")}, Fp8Slot::qkv_x,
           Fp8Slot::qkv_w);
  linear_input_done("ln1", qkv_in);
  if (c.model.position == PositionKind::rotary) {
    e.compute(at, OpKind::activation, OpName::rotary, 6.0 * c.s * c.b * (c.heads_local + c.kv_local) * c.d,
              {n("qkv")}, {n("qkv")});
  }

  // Attention core; under a2a on the Ulysses view (the whole sequence, 1/cp of the heads), whose
  // buffers ("u." names) it keeps in the layer's stead, with ctx travelling back for attn_out.
  if (ulysses(c)) {
    const LayerNames un(n.prefix + "u.");
    emit_a2a_to_sequence(e, at, n("qkv"), un("qkv"), c.qkv_width,
                         kept.count("qkv") ? BufferClass::activations : BufferClass::workspace);
    e.free(n("qkv"), at.phase);
    emit_attention_core_forward(e.ulysses(), at, un, [&](const std::string& short_name) {
      if (!kept.count(short_name)) e.free(un(short_name), at.phase);
    });
    e.alloc(n("ctx"), BufferClass::activations, c.act, {c.s, c.b, c.heads_local * c.d}, at.phase);
    emit_a2a_to_heads(e, at, un("ctx"), n("ctx"), c.heads_local * c.d);
    if (!flash || !kept.count("ctx")) e.free(un("ctx"), at.phase);  // flash's backward reads it
  } else {
    emit_attention_core_forward(e, at, n, done);
  }

  // Attention output projection, its tensor-parallel reduction, dropout and residual.
  std::string ctx = n("ctx");
  if (fp8) {
    ctx = e.fp8_cast(at, ctx, n("ctx_f8"), Fp8Slot::attn_out_x, BufferClass::activations, false,
                     c.block_scaled && kept.count(c.fp8_kept("ctx")));
  }
  e.alloc(n("attn_partial"), BufferClass::workspace, c.act, full, at.phase);
  e.linear(at, OpName::attn_out, Grad::none, c.s * c.b, c.h, c.heads_local * c.d, {ctx, wl}, {n("attn_partial")},
           Fp8Slot::attn_out_x, Fp8Slot::attn_out_w);
  if (ulysses(c) && fp8 && kept.count("ctx")) e.free(n("ctx"), at.phase);  // (its FP8 copy is kept)
  else done("ctx");
  if (fp8) done("ctx_f8");
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
  std::vector<BufferName> residual_out = {n("x_mid")};
  if (c.dropout) {
    e.alloc(n("mask1"), BufferClass::activations, Dtype::u8, local, at.phase);
    residual_out.push_back(n("mask1"));
  }
  // The row-parallel bias of attn_out (replicated) is added after the reduction, here.
  e.compute(at, OpKind::activation, OpName::dropout_add, 3.0 * c.s_local * c.b * c.h,
            {attn_out, x_in, w}, residual_out);
  e.free(attn_out, at.phase);
  if (c.dropout) done("mask1");

  // MLP (lower_moe.cpp's in a MoE layer).
  if (c.model.is_moe_layer(at.layer)) return emit_moe_mlp_forward(e, at, n.prefix, params, kept.count("x_mid") > 0);
  e.alloc(n("ln2"), BufferClass::activations, c.act, local, at.phase);
  e.compute(at, OpKind::norm, OpName::post_attn_norm, 8.0 * c.s_local * c.b * c.h, {n("x_mid"), w},
            {n("ln2")});
  std::string mlp_in = linear_input("ln2", Fp8Slot::mlp_x, OpName::sp_ln2);
  const std::vector<int64_t> wide = {c.s, c.b, c.f_local};
  if (c.model.mlp == MlpKind::swiglu) {
    e.alloc(n("gate"), BufferClass::activations, c.act, wide, at.phase);
    e.linear(at, OpName::mlp_gate, Grad::none, c.s * c.b, c.f_local, c.h, column_in(mlp_in), {n("gate")}, Fp8Slot::mlp_x,
             Fp8Slot::mlp_gate_w);
  }
  e.alloc(n("up"), BufferClass::activations, c.act, wide, at.phase);
  e.linear(at, OpName::mlp_up, Grad::none, c.s * c.b, c.f_local, c.h, column_in(mlp_in), {n("up")}, Fp8Slot::mlp_x,
           Fp8Slot::mlp_up_w);
  linear_input_done("ln2", mlp_in);
  e.alloc(n("act"), BufferClass::activations, c.act, wide, at.phase);
  if (c.model.mlp == MlpKind::swiglu) {
    e.compute(at, OpKind::activation, OpName::swiglu, 6.0 * c.s * c.b * c.f_local, {n("gate"), n("up")},
              {n("act")});
    done("gate");
  } else {
    e.compute(at, OpKind::activation, OpName::gelu, 8.0 * c.s * c.b * c.f_local, {n("up")}, {n("act")});
  }
  done("up");
  std::string act = n("act");
  if (fp8) {
    const bool keep8 = kept.count(c.fp8_kept("act")) > 0;
    act = e.fp8_cast(at, act, n("act_f8"), Fp8Slot::mlp_down_x,
                     keep8 ? BufferClass::activations : BufferClass::workspace, false, c.block_scaled && keep8);
    done("act");
  }
  e.alloc(n("mlp_partial"), BufferClass::workspace, c.act, full, at.phase);
  e.linear(at, OpName::mlp_down, Grad::none, c.s * c.b, c.h, c.f_local, {act, wl}, {n("mlp_partial")},
           Fp8Slot::mlp_down_x, Fp8Slot::mlp_down_w);
  done(fp8 ? "act_f8" : "act");
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
    e.alloc(n("mask2"), BufferClass::activations, Dtype::u8, local, at.phase);
    residual_out.push_back(n("mask2"));
  }
  e.compute(at, OpKind::activation, OpName::dropout_add, 3.0 * c.s_local * c.b * c.h,
            {mlp_out, n("x_mid"), w}, residual_out);
  e.free(mlp_out, at.phase);
  if (c.dropout) done("mask2");
  done("x_mid");  // read by the norm and by the residual add
  return n("out");
}

void emit_mlp_input_backward(OpEmitter& e, const OpSite& at, const std::string& prefix, int64_t width,
                             const std::string& x, const std::string& d_x, const std::vector<int64_t>& d_x_shape,
                             const std::string& wd, const std::string& wg) {
  const LowerContext& c = e.ctx();
  const Phase bwd = at.phase;
  const bool fp8 = c.fp8, swiglu = c.model.mlp == MlpKind::swiglu;
  const int64_t rows = c.s * c.b;
  // An output gradient as the GEMMs read it: its FP8 cast under FP8 (written transposed too where
  // the device needs it for the wgrad); freed after them.
  auto grad_in = [&](const std::string& d, Fp8Slot kind) {
    return fp8 ? e.fp8_cast(at, d, d + "_f8", kind, BufferClass::workspace, false, true) : d;
  };
  auto grad_in_done = [&](const std::string& d8, const std::string& d) {
    if (d8 != d) {
      e.free(d8, bwd);
      if (e.builder().is_live(fp8_transposed_operand_name(d8))) e.free(fp8_transposed_operand_name(d8), bwd);
    }
    e.free(d, bwd);
  };
  // SwiGLU's two wgrads read one transposed copy of their input (fp8_transposed devices).
  const bool shared_t = fp8 && c.fp8_transposed && !c.block_scaled && swiglu;
  const std::string x_t = shared_t ? e.fp8_transposed(at, x, rows) : "";
  const std::string d_up = prefix + "d_up", d_gate = prefix + "d_gate";
  const std::string d_up8 = grad_in(d_up, Fp8Slot::mlp_up_d);
  e.alloc(d_x, BufferClass::workspace, c.act, d_x_shape, bwd);
  e.linear(at, OpName::mlp_up, Grad::dgrad, rows, c.h, width, {d_up8, wd}, {d_x}, Fp8Slot::mlp_up_d,
           Fp8Slot::mlp_up_w);
  e.linear(at, OpName::mlp_up, Grad::wgrad, c.h, width, rows, {x, d_up8}, {wg}, Fp8Slot::mlp_x, Fp8Slot::mlp_up_d);
  if (swiglu) {
    const std::string d_gate8 = grad_in(d_gate, Fp8Slot::mlp_gate_d);
    e.linear(at, OpName::mlp_gate, Grad::dgrad, rows, c.h, width, {d_gate8, wd, d_x}, {d_x}, Fp8Slot::mlp_gate_d,
             Fp8Slot::mlp_gate_w);
    e.linear(at, OpName::mlp_gate, Grad::wgrad, c.h, width, rows, {x, d_gate8}, {wg}, Fp8Slot::mlp_x,
             Fp8Slot::mlp_gate_d);
    grad_in_done(d_gate8, d_gate);
  }
  if (shared_t) e.free(x_t, bwd);
  grad_in_done(d_up8, d_up);
}

void emit_layer_backward(OpEmitter& e, const OpSite& at, const std::string& x_in,
                         const std::string& g, const LayerParams& params) {
  const LowerContext& c = e.ctx();
  const bool sp = c.plan.sequence_parallel;
  const Phase bwd = at.phase;
  LayerNames n(at);
  const std::vector<int64_t> local = {c.s_local, c.b, c.h};
  const std::vector<int64_t> full = {c.s, c.b, c.h};
  const std::vector<int64_t> wide = {c.s, c.b, c.f_local};
  const double tokens = double(c.s) * c.b;
  const double hidden_bytes = tokens * c.h * dtype_bytes(c.act);
  const std::string& w = params.weights;
  const std::string& wg = params.grads;
  const bool fp8 = c.fp8;
  const std::string& wl = fp8 ? params.fp8_weights : w;  // what the linear layers read
  // What the dgrad GEMMs read: the transposed FP8 copy where the device needs one.
  const std::string& wd = fp8 && !params.fp8_weights_t.empty() ? params.fp8_weights_t : wl;

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
      std::vector<BufferName> outputs = {d};
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
  // A linear layer's kept input (its FP8 copy under FP8), gathered again under SP.
  auto regather = [&](std::string stem, OpName gather) {
    if (fp8) stem = c.fp8_kept(stem);
    if (!sp) return n(stem);
    Dtype dtype = e.builder().live_dtype(n(stem));
    e.alloc(n(stem + "_full"), BufferClass::workspace, dtype, full, bwd);
    e.collective(at, OpKind::all_gather, GroupKind::tp, Stream::compute, gather, storage_bytes(dtype, tokens * c.h),
                 {n(stem)}, {n(stem + "_full")});
    return n(stem + "_full");
  };
  // A linear layer's output gradient as its GEMMs read it: cast to FP8 under FP8 (and, on a
  // device that reads FP8 operands row-wise only, written transposed too for the wgrad).
  auto grad_in = [&](const std::string& d, const std::string& stem, Fp8Slot kind) {
    return fp8 ? e.fp8_cast(at, d, n(stem + "_f8"), kind, BufferClass::workspace, false, true) : d;
  };
  auto grad_in_done = [&](const std::string& d8, const std::string& d) {
    if (d8 == d) return;
    e.free(d8, bwd);
    if (e.builder().is_live(fp8_transposed_operand_name(d8))) e.free(fp8_transposed_operand_name(d8), bwd);
  };

  // MLP block (lower_moe.cpp's in a MoE layer).
  if (c.model.is_moe_layer(at.layer)) {
    emit_moe_mlp_backward(e, at, n.prefix, g, params);
  } else {
    std::string d_mlp = branch_grad("mask2", "d_mlp", OpName::mlp_bias_grad, OpName::sp_d_mlp);
    std::string d_mlp8 = grad_in(d_mlp, "d_mlp", Fp8Slot::mlp_down_d);
    std::string act = n(fp8 ? c.fp8_kept("act") : "act");
    e.alloc(n("d_act"), BufferClass::workspace, c.act, wide, bwd);
    e.linear(at, OpName::mlp_down, Grad::dgrad, c.s * c.b, c.f_local, c.h, {d_mlp8, wd}, {n("d_act")},
             Fp8Slot::mlp_down_d, Fp8Slot::mlp_down_w);
    e.linear(at, OpName::mlp_down, Grad::wgrad, c.f_local, c.h, c.s * c.b, {act, d_mlp8}, {wg}, Fp8Slot::mlp_down_x,
             Fp8Slot::mlp_down_d);
    e.free(act, bwd);
    grad_in_done(d_mlp8, d_mlp);
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
    emit_mlp_input_backward(e, at, n.prefix, c.f_local, ln2, n("d_ln2_full"), full, wd, wg);
    if (sp) e.free(ln2, bwd);
    e.free(n(fp8 ? c.fp8_kept("ln2") : "ln2"), bwd);
    std::string d_ln2 = reduce_norm_grad(n("d_ln2_full"), "d_ln2", OpName::tp_mlp_up);
    e.compute(at, OpKind::norm, OpName::post_attn_norm, 10.0 * c.s_local * c.b * c.h,
              {n("x_mid"), d_ln2, w, g}, {g, wg});
    e.free(n("x_mid"), bwd);
    e.free(d_ln2, bwd);
  }

  // Attention block.
  std::string d_attn = branch_grad("mask1", "d_attn", OpName::attn_bias_grad, OpName::sp_d_attn);
  std::string d_attn8 = grad_in(d_attn, "d_attn", Fp8Slot::attn_out_d);
  e.alloc(n("d_ctx"), BufferClass::workspace, c.act, {c.s, c.b, c.heads_local * c.d}, bwd);
  e.linear(at, OpName::attn_out, Grad::dgrad, c.s * c.b, c.heads_local * c.d, c.h, {d_attn8, wd}, {n("d_ctx")},
           Fp8Slot::attn_out_d, Fp8Slot::attn_out_w);
  e.linear(at, OpName::attn_out, Grad::wgrad, c.heads_local * c.d, c.h, c.s * c.b,
           {n(fp8 ? c.fp8_kept("ctx") : "ctx"), d_attn8}, {wg}, Fp8Slot::attn_out_x, Fp8Slot::attn_out_d);
  if (fp8) e.free(n(c.fp8_kept("ctx")), bwd);
  grad_in_done(d_attn8, d_attn);
  if (d_attn != g) e.free(d_attn, bwd);
  e.alloc(n("d_qkv"), BufferClass::workspace, c.act, {c.s, c.b, c.qkv_width}, bwd);
  if (ulysses(c)) {
    const LayerNames un(n.prefix + "u.");
    if (!fp8) e.free(n("ctx"), bwd);  // attn_out's input (under FP8 its FP8 copy, freed above)
    emit_a2a_to_sequence(e, at, n("d_ctx"), un("d_ctx"), c.heads_local * c.d, BufferClass::workspace);
    e.free(n("d_ctx"), bwd);
    e.alloc(un("d_qkv"), BufferClass::workspace, c.act, {c.s_full, c.b, c.qkv_width / c.cp}, bwd);
    emit_attention_core_backward(e.ulysses(), at, un, /*free_ctx=*/false);
    e.free(un("d_ctx"), bwd);
    emit_a2a_to_heads(e, at, un("d_qkv"), n("d_qkv"), c.qkv_width);
    e.free(un("d_qkv"), bwd);
    e.free(un("qkv"), bwd);
  } else {
    emit_attention_core_backward(e, at, n, /*free_ctx=*/!fp8);  // (under FP8 only its FP8 copy was kept)
    e.free(n("d_ctx"), bwd);
  }
  if (c.model.position == PositionKind::rotary) {
    e.compute(at, OpKind::activation, OpName::rotary,
              6.0 * c.s * c.b * (c.heads_local + c.kv_local) * c.d, {n("d_qkv")}, {n("d_qkv")});
  }
  std::string ln1 = regather("ln1", OpName::sp_ln1);
  std::string d_qkv8 = grad_in(n("d_qkv"), "d_qkv", Fp8Slot::qkv_d);
  e.alloc(n("d_ln1_full"), BufferClass::workspace, c.act, full, bwd);
  e.linear(at, OpName::qkv, Grad::dgrad, c.s * c.b, c.h, c.qkv_width, {d_qkv8, wd}, {n("d_ln1_full")},
           Fp8Slot::qkv_d, Fp8Slot::qkv_w);
  e.linear(at, OpName::qkv, Grad::wgrad, c.h, c.qkv_width, c.s * c.b, {ln1, d_qkv8}, {wg}, Fp8Slot::qkv_x,
           Fp8Slot::qkv_d);
  grad_in_done(d_qkv8, n("d_qkv"));
  e.free(n("d_qkv"), bwd);
  if (!ulysses(c)) e.free(n("qkv"), bwd);
  if (sp) e.free(ln1, bwd);
  e.free(n(fp8 ? c.fp8_kept("ln1") : "ln1"), bwd);
  std::string d_ln1 = reduce_norm_grad(n("d_ln1_full"), "d_ln1", OpName::tp_qkv);
  e.compute(at, OpKind::norm, OpName::input_norm, 10.0 * c.s_local * c.b * c.h, {x_in, d_ln1, w, g},
            {g, wg});
  e.free(x_in, bwd);
  e.free(d_ln1, bwd);
}

}  // namespace stepcast
