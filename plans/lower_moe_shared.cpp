// A MoE layer's shared experts (lower_moe.cpp calls these): a dense MLP of n_shared_experts ·
// moe_intermediate_size, tp-sharded, on every token of the layer's post-attention norm output
// (sequence-gathered under SP), as Megatron-core's SharedExpertMLP. Under FP8 its linear layers
// run as the dense layers' do (lower_layer.cpp): the input and the activation's output cast to
// FP8 and kept in FP8 for the backward (the input gathered in FP8 under SP), the layer's FP8 weight
// copy read, each output gradient cast before its GEMMs; they take the layer's MLP scale slots,
// which the routed experts share.
#include "lower_context.hpp"

namespace stepcast {

namespace {

struct SharedShape {
  explicit SharedShape(const LowerContext& c)
      : rows(c.s * c.b), width(c.moe.shared_local), local{c.s_local, c.b, c.h}, full{c.s, c.b, c.h},
        wide{c.s, c.b, c.moe.shared_local} {}
  int64_t rows, width;  // the gathered tokens; the rank's share of the shared experts' width
  std::vector<int64_t> local, full, wide;
};

// The GEMMs' input `x` gathered over tp under SP (in its own dtype: FP8 under FP8), else x.
std::string gathered(OpEmitter& e, const OpSite& at, const std::string& x, OpName name) {
  const LowerContext& c = e.ctx();
  if (!c.plan.sequence_parallel) return x;
  const Dtype dtype = e.builder().live_dtype(x);
  e.alloc(x + "_full", BufferClass::workspace, dtype, SharedShape(c).full, at.phase);
  e.collective(at, OpKind::all_gather, GroupKind::tp, Stream::compute, name,
               double(c.s) * double(c.b) * double(c.h) * dtype_bytes(dtype), {x}, {x + "_full"});
  return x + "_full";
}

}  // namespace

std::string emit_shared_experts_forward(OpEmitter& e, const OpSite& at, const std::string& prefix,
                                        const LayerParams& params, bool keep) {
  const LowerContext& c = e.ctx();
  const SharedShape x(c);
  auto n = [&](const std::string& name) { return prefix + name; };
  const Phase ph = at.phase;
  const bool sp = c.plan.sequence_parallel, fp8 = c.fp8, swiglu = c.model.mlp == MlpKind::swiglu;
  const std::string& w = params.weights;
  const std::string& wl = fp8 ? params.fp8_weights : w;  // what the linear layers read
  const BufferClass kept = keep ? BufferClass::activations : BufferClass::workspace;
  auto done = [&](const std::string& name) {
    if (!keep) e.free(name, ph);
  };
  // A column-parallel GEMM's operands: under FP8 its bias is read beside the FP8 copy.
  auto column_in = [&](const std::string& in) {
    std::vector<BufferName> v = {in, wl};
    if (fp8 && c.model.use_bias) v.push_back(w);
    return v;
  };
  // ln2 stays in the plan's dtype for the router and the dispatch; under FP8 its FP8 copy is
  // what these layers read (and keep).
  const std::string ln2 = fp8 ? e.fp8_cast(at, n("ln2"), n("ln2_f8"), Fp8Slot::mlp_x, kept, sp) : n("ln2");
  const std::string in = gathered(e, at, ln2, OpName::sp_ln2);
  if (swiglu) {
    e.alloc(n("gate"), kept, c.act, x.wide, ph);
    e.linear(at, OpName::mlp_gate, Grad::none, x.rows, x.width, c.h, column_in(in), {n("gate")}, Fp8Slot::mlp_x,
             Fp8Slot::mlp_gate_w);
  }
  e.alloc(n("up"), kept, c.act, x.wide, ph);
  e.linear(at, OpName::mlp_up, Grad::none, x.rows, x.width, c.h, column_in(in), {n("up")}, Fp8Slot::mlp_x,
           Fp8Slot::mlp_up_w);
  if (sp) e.free(in, ph);
  if (fp8) done(ln2);
  e.alloc(n("act"), kept, c.act, x.wide, ph);
  const double elements = double(x.rows) * double(x.width);
  if (swiglu) {
    e.compute(at, OpKind::activation, OpName::swiglu, 6.0 * elements, {n("gate"), n("up")}, {n("act")});
    done(n("gate"));
  } else {
    e.compute(at, OpKind::activation, OpName::gelu, 8.0 * elements, {n("up")}, {n("act")});
  }
  done(n("up"));
  std::string act = n("act");
  if (fp8) {
    act = e.fp8_cast(at, act, n("act_f8"), Fp8Slot::mlp_down_x, kept);
    e.free(n("act"), ph);
  }
  e.alloc(n("mlp_partial"), BufferClass::workspace, c.act, x.full, ph);
  e.linear(at, OpName::mlp_down, Grad::none, x.rows, c.h, x.width, {act, wl}, {n("mlp_partial")},
           Fp8Slot::mlp_down_x, Fp8Slot::mlp_down_w);
  done(act);
  if (!sp) return n("mlp_partial");
  e.alloc(n("mlp_rs"), BufferClass::workspace, c.act, x.local, ph);
  e.collective(at, OpKind::reduce_scatter, GroupKind::tp, Stream::compute, OpName::tp_mlp_down,
               double(x.rows) * double(c.h) * dtype_bytes(c.act), {n("mlp_partial")}, {n("mlp_rs")});
  e.free(n("mlp_partial"), ph);
  return n("mlp_rs");
}

void emit_shared_experts_backward(OpEmitter& e, const OpSite& at, const std::string& prefix, const std::string& d,
                                  const LayerParams& params) {
  const LowerContext& c = e.ctx();
  const SharedShape x(c);
  auto n = [&](const std::string& name) { return prefix + name; };
  const Phase bwd = at.phase;
  const bool sp = c.plan.sequence_parallel, fp8 = c.fp8, swiglu = c.model.mlp == MlpKind::swiglu;
  const std::string& w = params.weights;
  const std::string& wg = params.grads;
  // The dgrads read the FP8 weights, transposed where the device reads FP8 row-wise only.
  const std::string& wd = !fp8                              ? w
                          : !params.fp8_weights_t.empty() ? params.fp8_weights_t
                                                          : params.fp8_weights;
  // An output gradient as the GEMMs read it: cast to FP8 under FP8 (written transposed too for
  // the wgrad where the device needs it); its FP8 copies freed after them.
  auto grad_in = [&](const std::string& g, Fp8Slot kind) {
    return fp8 ? e.fp8_cast(at, g, g + "_f8", kind, BufferClass::workspace, false, true) : g;
  };
  auto grad_in_done = [&](const std::string& g8, const std::string& g) {
    if (g8 == g) return;
    e.free(g8, bwd);
    if (e.builder().is_live(fp8_transposed_operand_name(g8))) e.free(fp8_transposed_operand_name(g8), bwd);
  };
  const double elements = double(x.rows) * double(x.width);
  std::string d_full = d;
  if (sp) {
    d_full = n("d_mlp_full");
    e.alloc(d_full, BufferClass::workspace, c.act, x.full, bwd);
    e.collective(at, OpKind::all_gather, GroupKind::tp, Stream::compute, OpName::sp_d_mlp,
                 double(x.rows) * double(c.h) * dtype_bytes(c.act), {d}, {d_full});
  }
  const std::string d8 = grad_in(d_full, Fp8Slot::mlp_down_d);
  const std::string act = fp8 ? n("act_f8") : n("act");
  e.alloc(n("d_act"), BufferClass::workspace, c.act, x.wide, bwd);
  e.linear(at, OpName::mlp_down, Grad::dgrad, x.rows, x.width, c.h, {d8, wd}, {n("d_act")}, Fp8Slot::mlp_down_d,
           Fp8Slot::mlp_down_w);
  e.linear(at, OpName::mlp_down, Grad::wgrad, x.width, c.h, x.rows, {act, d8}, {wg}, Fp8Slot::mlp_down_x,
           Fp8Slot::mlp_down_d);
  e.free(act, bwd);
  grad_in_done(d8, d_full);
  if (sp) e.free(d_full, bwd);  // (d itself is the caller's)
  e.alloc(n("d_up"), BufferClass::workspace, c.act, x.wide, bwd);
  if (swiglu) {
    e.alloc(n("d_gate"), BufferClass::workspace, c.act, x.wide, bwd);
    e.compute(at, OpKind::activation, OpName::swiglu, 10.0 * elements, {n("gate"), n("up"), n("d_act")},
              {n("d_gate"), n("d_up")});
    e.free(n("gate"), bwd);
  } else {
    e.compute(at, OpKind::activation, OpName::gelu, 12.0 * elements, {n("up"), n("d_act")}, {n("d_up")});
  }
  e.free(n("d_act"), bwd);
  e.free(n("up"), bwd);
  // The kept input (its FP8 copy under FP8), gathered again under SP.
  const std::string ln2 = gathered(e, at, fp8 ? n("ln2_f8") : n("ln2"), OpName::sp_ln2);
  const std::string d_sh = sp ? n("d_ln2_full") : n("d_sh");
  emit_mlp_input_backward(e, at, prefix, x.width, ln2, d_sh, sp ? x.full : x.local, wd, wg);
  if (sp) e.free(ln2, bwd);
  if (fp8) e.free(n("ln2_f8"), bwd);
  if (sp) {
    e.alloc(n("d_sh"), BufferClass::workspace, c.act, x.local, bwd);
    e.collective(at, OpKind::reduce_scatter, GroupKind::tp, Stream::compute, OpName::tp_mlp_up,
                 double(x.rows) * double(c.h) * dtype_bytes(c.act), {d_sh}, {n("d_sh")});
    e.free(d_sh, bwd);
  }
  e.compute(at, OpKind::activation, OpName::moe_add, double(c.moe.tokens) * c.h, {n("d_sh"), n("d_ln2")},
            {n("d_ln2")});
  e.free(n("d_sh"), bwd);
}

}  // namespace stepcast
