// The MLP half of a mixture-of-experts layer, forward and backward, Megatron-core's MoELayer:
// norm; the router GEMM [T, h]·[h, E] and softmax/top-k on this rank's T tokens (T = s_local·b),
// the aux load-balancing loss from its probabilities; the permutation of the T·k token copies into
// expert order; dispatch over the expert-parallel group (an all_to_all, or with the allgather
// dispatcher every ep rank's tokens gathered); under etp the tokens gathered over the etp group;
// the E/ep local experts as grouped GEMMs (batch = experts, f_e/etp wide); the way back (etp
// reduce_scatter, combine, un-permutation weighted by the routing probabilities); the shared
// experts as a tp-sharded dense MLP added; dropout and the residual. Buffer rows: routed tokens,
// sized as LowerContext::MoeShape says (capacity, or the worst the routing draws give).
#include "errors.hpp"
#include "lower_context.hpp"

namespace stepcast {

namespace {

struct Names {
  std::string prefix;
  std::string operator()(const std::string& n) const { return prefix + n; }
};

// A grouped GEMM of the local experts: `experts` GEMMs of rows × n × k (m = the mean rows of an
// expert; the simulator draws each expert's rows from the program's routing). Under FP8 (slots
// a, b ≥ 0: the experts' slot kinds, Fp8SlotLayout::expert_slot) it reads FP8 operands
// and writes the plan's dtype, as OpEmitter::linear's GEMMs (Transformer Engine's grouped linear
// layers); on a device that reads FP8 row-wise only, a wgrad reads its operands' transposed
// copies (x_t, d_y_t), made here where the lowering has not made them already.
int32_t grouped_gemm(OpEmitter& e, const OpSite& at, OpName name, Grad grad, int64_t rows, int64_t n, int64_t k,
                     std::vector<BufferName> inputs, std::vector<BufferName> outputs, int32_t a = -1,
                     int32_t b = -1) {
  const LowerContext& c = e.ctx();
  const int64_t experts = c.moe.experts_local;
  const bool fp8 = c.fp8 && a >= 0;
  std::vector<std::string> made;  // transposed copies made here, freed after the GEMM
  if (fp8 && c.fp8_transposed && grad == Grad::wgrad) {
    const std::vector<BufferName> operands(inputs.begin(), inputs.begin() + 2);  // x, d_y
    for (const BufferName& x8 : operands) {
      const std::string t = fp8_transposed_operand_name(x8);
      if (!e.builder().is_live(t)) made.push_back(e.fp8_transposed(at, x8, e.builder().live_shape(x8)[0]));
      inputs.push_back(t);
    }
  }
  int32_t id;
  if (grad == Grad::wgrad) id = e.gemm(at, name, grad, n, k, rows, std::move(inputs), std::move(outputs));
  else id = e.gemm(at, name, grad, rows, n, k, std::move(inputs), std::move(outputs));
  for (const std::string& t : made) e.free(t, at.phase);
  if (fp8) e.mark_fp8(id, at, Fp8Slot(a), Fp8Slot(b), /*experts=*/true);
  Op& op = const_cast<Op&>(e.builder().role().ops[size_t(id)]);
  op.batch = experts;
  op.flops *= double(experts);
  op.bytes *= double(experts);
  return id;
}

// Under FP8 the cast of a grouped GEMM's input or output gradient `stem` to its FP8 copy (the
// stem then freed); otherwise the stem itself.
std::string expert_operand(OpEmitter& e, const OpSite& at, const std::string& prefix, const std::string& stem,
                           Fp8Slot slot, BufferClass kept) {
  if (!e.ctx().fp8) return prefix + stem;
  const bool gradient = is_gradient_slot(slot);
  const std::string x8 = e.fp8_cast(at, prefix + stem, prefix + stem + "_f8", slot, kept, false,
                                    /*transposed=*/gradient, prefix + "counts");
  e.free(prefix + stem, at.phase);
  return x8;
}

double bytes_of(const LowerContext& c, int64_t rows) { return double(rows) * double(c.h) * dtype_bytes(c.act); }

// Whether the aux loss's per-expert counts are summed over the ranks that split a sequence.
bool aux_counts_summed(const LowerContext& c) {
  return c.model.router_aux_loss_coef != 0 && c.plan.tp_size * c.plan.cp_size > 1;
}

// The allgather dispatcher's routing of the whole expert block: this rank's `name` [T, k]
// gathered over ep, then etp (the tokens' order) into name_g [T·ep·etp, k]; the rank's own where
// neither group splits it.
std::string gathered_name(const LowerContext& c, const std::string& prefix, const std::string& name) {
  return c.moe.ep * c.moe.etp > 1 ? prefix + name + "_g" : prefix + name;
}

std::string gathered_route(OpEmitter& e, const OpSite& at, const std::string& prefix, const std::string& name,
                           Dtype dtype, bool keep) {
  const LowerContext& c = e.ctx();
  const auto& x = c.moe;
  const std::string full = gathered_name(c, prefix, name);
  std::string from = prefix + name;
  const double row_bytes = double(x.top_k) * dtype_bytes(dtype);
  auto gather = [&](GroupKind group, int64_t rows, const std::string& to) {
    const BufferClass kept = to == full && keep ? BufferClass::activations : BufferClass::workspace;
    e.alloc(to, kept, dtype, {rows, x.top_k}, at.phase);
    e.collective(at, OpKind::all_gather, group, Stream::compute, OpName::moe_route_gather, row_bytes * double(rows),
                 {from}, {to});
    if (from != prefix + name) e.free(from, at.phase);
    from = to;
  };
  if (x.ep > 1) gather(GroupKind::ep, x.tokens * x.ep, x.etp > 1 ? prefix + name + "_ep" : full);
  if (x.etp > 1) gather(GroupKind::etp, x.tokens * x.ep * x.etp, full);
  return from;
}

}  // namespace

std::string emit_moe_mlp_forward(OpEmitter& e, const OpSite& at, const std::string& prefix,
                                 const LayerParams& params, bool keep) {
  const LowerContext& c = e.ctx();
  const auto& x = c.moe;
  const Names n{prefix};
  const Phase ph = at.phase;
  const bool a2a = c.plan.moe.dispatcher == MoeDispatcher::alltoall;
  const bool swiglu = c.model.mlp == MlpKind::swiglu;
  const std::vector<int64_t> local = {c.s_local, c.b, c.h};
  const std::string& w = params.weights;
  const std::string& we = params.expert_weights;
  const int64_t T = x.tokens, E = x.experts, k = x.top_k, h = c.h;
  const int64_t gathered = T * x.ep * x.etp;  // allgather dispatcher: the tokens of the expert block
  // Buffers backward reads: freed here unless kept (full recompute keeps none).
  auto done = [&](const std::string& name) {
    if (!keep) e.free(n(name), ph);
  };
  auto kept_class = [&]() { return keep ? BufferClass::activations : BufferClass::workspace; };
  // The grouped GEMMs read the counts (where each expert's rows are).
  auto with_counts = [&](std::vector<BufferName> inputs) {
    inputs.push_back(n("counts"));
    return inputs;
  };

  e.alloc(n("ln2"), BufferClass::activations, c.act, local, ph);
  e.compute(at, OpKind::norm, OpName::post_attn_norm, 8.0 * T * h, {n("x_mid"), w}, {n("ln2")});

  // Router, top-k and the aux loss on this rank's tokens.
  e.alloc(n("router_logits"), BufferClass::workspace, c.act, {T, E}, ph);
  e.gemm(at, OpName::router, Grad::none, T, E, h, {n("ln2"), w}, {n("router_logits")});
  e.alloc(n("probs_e"), kept_class(), c.act, {T, E}, ph);
  e.alloc(n("route_w"), kept_class(), c.act, {T, k}, ph);
  e.alloc(n("route_idx"), kept_class(), Dtype::int32, {T, k}, ph);
  // counts [etp, ep, E]: the token copies each rank of the expert block routes to each expert
  // (this rank's row written by routing; with the alltoall dispatcher the others' arrive with the
  // dispatch and the etp gather, with the allgather one they are counted from the gathered
  // routing): the real sizes of the rows the worst-case buffers below hold, which every op of the
  // way to the experts and back reads.
  e.alloc(n("counts"), kept_class(), Dtype::int32, {x.etp * x.ep, E}, ph);
  // Where tp (sequence parallel) or cp splits the sequence, the aux loss counts the copies routed
  // to each expert over the whole sequence, as Megatron's get_tokens_per_expert_and_token_count
  // (moe_utils.py) all-reduces them over tp × cp: `routed` [E], summed by moe_aux_counts.
  const bool global_counts = aux_counts_summed(c);
  std::vector<BufferName> route_out = {n("probs_e"), n("route_w"), n("route_idx"), n("counts")};
  std::vector<BufferName> aux_in = {n("probs_e"), n("route_idx")};
  if (global_counts) {
    e.alloc(n("routed"), keep ? BufferClass::activations : BufferClass::workspace, c.wide, {E}, ph);
    route_out.push_back(n("routed"));
    aux_in.push_back(n("routed"));
  }
  e.compute(at, OpKind::activation, OpName::moe_route, 6.0 * T * E, {n("router_logits")}, route_out);
  e.free(n("router_logits"), ph);
  if (global_counts) {
    for (GroupKind g : {GroupKind::tp, GroupKind::cp}) {
      if ((g == GroupKind::tp ? c.plan.tp_size : c.plan.cp_size) == 1) continue;
      e.collective(at, OpKind::all_reduce, g, Stream::compute, OpName::moe_aux_counts, double(E) * dtype_bytes(c.wide),
                   {n("routed")}, {n("routed")});
    }
  }
  e.alloc(n("aux"), BufferClass::workspace, c.wide, {1}, ph);
  e.compute(at, OpKind::loss, OpName::moe_aux_loss, 2.0 * T * E, aux_in, {n("aux")});
  e.free(n("aux"), ph);

  // Shared experts: a dense MLP on every token, tp-sharded (lower_moe_shared.cpp).
  const std::string shared_out = x.shared_local > 0 ? emit_shared_experts_forward(e, at, prefix, params, keep) : "";

  // Routed experts: tokens to their experts' ranks ...
  const int64_t R = x.expert_rows, m = x.rows_per_expert, fl = x.width_local;
  const bool ep = x.ep > 1, etp = x.etp > 1;
  if (a2a) {
    // perm → (ep) all_to_all → (etp) all_gather → xe; a step without its group writes xe itself.
    const std::string perm = !ep && !etp ? n("xe") : n("perm");
    e.alloc(perm, perm == n("xe") ? kept_class() : BufferClass::workspace, c.act, {x.send_rows, h}, ph);
    e.compute(at, OpKind::activation, OpName::moe_permute, 0, {n("ln2"), n("route_idx"), n("counts")}, {perm});
    std::string y = perm;
    if (ep) {
      y = etp ? n("disp") : n("xe");
      e.alloc(y, etp ? BufferClass::workspace : kept_class(), c.act, {x.recv_rows, h}, ph);
      // The counts first (every ep rank's row to every other), then the rows they say.
      e.collective(at, OpKind::all_to_all, GroupKind::ep, Stream::compute, OpName::ep_dispatch,
                   bytes_of(c, x.send_rows), {perm, n("counts")}, {y, n("counts")});
      e.free(perm, ph);
    }
    if (etp) {
      // Every etp rank's block of recv_rows rows (its real rows first, as its counts say), and the
      // counts: xe is etp blocks of the worst case.
      e.alloc(n("xe"), kept_class(), c.act, {R, h}, ph);
      e.collective(at, OpKind::all_gather, GroupKind::etp, Stream::compute, OpName::etp_gather, bytes_of(c, R),
                   {y, n("counts")}, {n("xe"), n("counts")});
      e.free(y, ph);
    }
  } else {
    // Every token of the expert block gathered (over ep, then etp) with its top-k weights and
    // experts (Megatron's MoEAllGatherTokenDispatcher gathers the probabilities and the routing
    // map the same way); the local experts' rows taken, and the counts [etp·ep, E] of every
    // gathered rank's copies per expert written from the gathered routing.
    std::string g = n("ln2");
    gathered_route(e, at, prefix, "route_w", c.act, keep);
    const std::string route_idx = gathered_route(e, at, prefix, "route_idx", Dtype::int32, keep);
    if (ep) {
      e.alloc(n("ag_ep"), BufferClass::workspace, c.act, {T * x.ep, h}, ph);
      e.collective(at, OpKind::all_gather, GroupKind::ep, Stream::compute, OpName::ep_dispatch, bytes_of(c, T * x.ep),
                   {g}, {n("ag_ep")});
      g = n("ag_ep");
    }
    if (etp) {
      e.alloc(n("ag_etp"), BufferClass::workspace, c.act, {gathered, h}, ph);
      e.collective(at, OpKind::all_gather, GroupKind::etp, Stream::compute, OpName::etp_gather, bytes_of(c, gathered),
                   {g}, {n("ag_etp")});
      if (ep) e.free(g, ph);
      g = n("ag_etp");
    }
    e.alloc(n("xe"), kept_class(), c.act, {R, h}, ph);
    e.compute(at, OpKind::activation, OpName::moe_permute, 0, {g, route_idx}, {n("xe"), n("counts")});
    if (g != n("ln2")) e.free(g, ph);
  }
  // ... the local experts (under FP8 on FP8 copies of their inputs and weights, the copies kept
  // for the backward as Transformer Engine keeps them) ...
  const std::string& we8 = c.fp8 ? params.expert_fp8_weights : we;
  // A forward grouped GEMM's operands: under FP8 with biases, the biases read beside the FP8 copy.
  auto expert_in = [&](const std::string& in) {
    std::vector<BufferName> v = with_counts({in, we8});
    if (c.fp8 && c.model.use_bias) v.push_back(we);
    return v;
  };
  const std::string xe = expert_operand(e, at, prefix, "xe", Fp8Slot::mlp_x, kept_class());
  if (swiglu) {
    e.alloc(n("gate_e"), kept_class(), c.act, {R, fl}, ph);
    grouped_gemm(e, at, OpName::expert_gate, Grad::none, m, fl, h, expert_in(xe), {n("gate_e")},
                 Fp8Slot::mlp_x, Fp8Slot::mlp_gate_w);
  }
  e.alloc(n("up_e"), kept_class(), c.act, {R, fl}, ph);
  grouped_gemm(e, at, OpName::expert_up, Grad::none, m, fl, h, expert_in(xe), {n("up_e")}, Fp8Slot::mlp_x,
               Fp8Slot::mlp_up_w);
  if (!keep) e.free(xe, ph);
  e.alloc(n("act_e"), kept_class(), c.act, {R, fl}, ph);
  const double elements = double(m) * double(x.experts_local) * double(fl);
  if (swiglu) {
    e.compute(at, OpKind::activation, OpName::swiglu, 6.0 * elements, {n("gate_e"), n("up_e")}, {n("act_e")});
    done("gate_e");
  } else {
    e.compute(at, OpKind::activation, OpName::gelu, 8.0 * elements, {n("up_e")}, {n("act_e")});
  }
  done("up_e");
  const std::string act_e = expert_operand(e, at, prefix, "act_e", Fp8Slot::mlp_down_x, kept_class());
  // ... and back: (etp) reduce_scatter → (ep) all_to_all → comb, un-permuted into moe_out; with
  // the allgather dispatcher un-permuted into the block's tokens, then (etp, ep) reduce_scatter.
  const std::string moe_out = n("moe_out");
  if (a2a) {
    const std::string ye = !ep && !etp ? n("comb") : n("ye");
    e.alloc(ye, ye == n("comb") ? kept_class() : BufferClass::workspace, c.act, {R, h}, ph);
    grouped_gemm(e, at, OpName::expert_down, Grad::none, m, h, fl, expert_in(act_e), {ye},
                 Fp8Slot::mlp_down_x, Fp8Slot::mlp_down_w);
    if (!keep) e.free(act_e, ph);
    std::string y = ye;
    if (etp) {
      std::string out = ep ? n("ye_rs") : n("comb");
      e.alloc(out, ep ? BufferClass::workspace : kept_class(), c.act, {x.recv_rows, h}, ph);
      e.collective(at, OpKind::reduce_scatter, GroupKind::etp, Stream::compute, OpName::etp_scatter, bytes_of(c, R),
                   {y}, {out});
      e.free(y, ph);
      y = out;
    }
    if (ep) {
      e.alloc(n("comb"), kept_class(), c.act, {x.send_rows, h}, ph);
      e.collective(at, OpKind::all_to_all, GroupKind::ep, Stream::compute, OpName::ep_combine,
                   bytes_of(c, x.recv_rows), {y, n("counts")}, {n("comb")});
      e.free(y, ph);
    }
    e.alloc(moe_out, BufferClass::workspace, c.act, local, ph);
    e.compute(at, OpKind::activation, OpName::moe_unpermute, 2.0 * T * k * h,
              {n("comb"), n("route_w"), n("route_idx"), n("counts")}, {moe_out});
    done("comb");
  } else {
    e.alloc(n("ye"), kept_class(), c.act, {R, h}, ph);
    grouped_gemm(e, at, OpName::expert_down, Grad::none, m, h, fl, expert_in(act_e), {n("ye")},
                 Fp8Slot::mlp_down_x, Fp8Slot::mlp_down_w);
    if (!keep) e.free(act_e, ph);
    std::string y = !ep && !etp ? moe_out : n("ug");
    e.alloc(y, BufferClass::workspace, c.act, y == moe_out ? local : std::vector<int64_t>{gathered, h}, ph);
    e.compute(at, OpKind::activation, OpName::moe_unpermute, 2.0 * double(R) * h,
              {n("ye"), gathered_name(c, prefix, "route_w"), gathered_name(c, prefix, "route_idx"), n("counts")}, {y});
    done("ye");
    if (etp) {
      std::string out = ep ? n("rs_etp") : moe_out;
      e.alloc(out, BufferClass::workspace, c.act, ep ? std::vector<int64_t>{T * x.ep, h} : local, ph);
      e.collective(at, OpKind::reduce_scatter, GroupKind::etp, Stream::compute, OpName::etp_scatter,
                   bytes_of(c, gathered), {y}, {out});
      e.free(y, ph);
      y = out;
    }
    if (ep) {
      e.alloc(moe_out, BufferClass::workspace, c.act, local, ph);
      e.collective(at, OpKind::reduce_scatter, GroupKind::ep, Stream::compute, OpName::ep_combine,
                   bytes_of(c, T * x.ep), {y}, {moe_out});
      e.free(y, ph);
    }
  }
  std::string branch = moe_out;
  if (!shared_out.empty()) {
    e.compute(at, OpKind::activation, OpName::moe_add, double(T) * h, {moe_out, shared_out}, {shared_out});
    e.free(moe_out, ph);
    branch = shared_out;
  }
  if (!keep) {
    for (const char* name : {"probs_e", "route_w", "route_idx", "counts"}) e.free(n(name), ph);
    if (global_counts) e.free(n("routed"), ph);
    if (!a2a && (ep || etp)) {
      for (const char* name : {"route_w", "route_idx"}) e.free(gathered_name(c, prefix, name), ph);
    }
  }

  // Dropout and the residual.
  e.alloc(n("out"), BufferClass::activations, c.act, local, ph);
  std::vector<BufferName> residual_out = {n("out")};
  if (c.dropout) {
    e.alloc(n("mask2"), kept_class(), Dtype::u8, local, ph);
    residual_out.push_back(n("mask2"));
  }
  e.compute(at, OpKind::activation, OpName::dropout_add, 3.0 * T * h, {branch, n("x_mid"), w}, residual_out);
  e.free(branch, ph);
  if (c.dropout) done("mask2");
  done("ln2");
  done("x_mid");
  return n("out");
}

void emit_moe_mlp_backward(OpEmitter& e, const OpSite& at, const std::string& prefix, const std::string& g,
                           const LayerParams& params) {
  const LowerContext& c = e.ctx();
  const auto& x = c.moe;
  const Names n{prefix};
  const Phase bwd = at.phase;
  const bool a2a = c.plan.moe.dispatcher == MoeDispatcher::alltoall;
  const bool swiglu = c.model.mlp == MlpKind::swiglu;
  const bool ep = x.ep > 1, etp = x.etp > 1;
  const std::vector<int64_t> local = {c.s_local, c.b, c.h};
  const std::string& w = params.weights;
  const std::string& wg = params.grads;
  const std::string& we = params.expert_weights;
  const std::string& weg = params.expert_grads;
  const int64_t T = x.tokens, E = x.experts, k = x.top_k, h = c.h;
  const int64_t R = x.expert_rows, m = x.rows_per_expert, fl = x.width_local;
  const int64_t gathered = T * x.ep * x.etp;
  auto with_counts = [&](std::vector<BufferName> inputs) {
    inputs.push_back(n("counts"));
    return inputs;
  };

  // Through dropout (and the row-parallel bias) into the branch's gradient d [T, h].
  std::string d = g;
  if (c.dropout) {
    d = n("d_mlp");
    e.alloc(d, BufferClass::workspace, c.act, local, bwd);
    std::vector<BufferName> outputs = {d};
    if (c.model.use_bias) outputs.push_back(wg);
    e.compute(at, OpKind::activation, OpName::dropout_add, 2.0 * T * h, {g, n("mask2"), wg}, outputs);
    e.free(n("mask2"), bwd);
  } else if (c.model.use_bias && x.shared_local > 0) {
    e.compute(at, OpKind::activation, OpName::mlp_bias_grad, 1.0 * T * h, {g, wg}, {wg});
  }

  // Routed experts, the way back: d of the un-permuted output to the experts' rows d_ye [R, h].
  e.alloc(n("d_route_w"), BufferClass::workspace, c.act, {T, k}, bwd);
  if (a2a) {
    const std::string d_comb = !ep && !etp ? n("d_ye") : n("d_comb");
    e.alloc(d_comb, BufferClass::workspace, c.act, {x.send_rows, h}, bwd);
    e.compute(at, OpKind::activation, OpName::moe_unpermute, 3.0 * T * k * h,
              {d, n("comb"), n("route_w"), n("route_idx"), n("counts")}, {d_comb, n("d_route_w")});
    e.free(n("comb"), bwd);
    std::string y = d_comb;
    if (ep) {
      y = etp ? n("d_ye_rs") : n("d_ye");
      e.alloc(y, BufferClass::workspace, c.act, {x.recv_rows, h}, bwd);
      e.collective(at, OpKind::all_to_all, GroupKind::ep, Stream::compute, OpName::ep_combine,
                   bytes_of(c, x.send_rows), {d_comb, n("counts")}, {y});
      e.free(d_comb, bwd);
    }
    if (etp) {
      e.alloc(n("d_ye"), BufferClass::workspace, c.act, {R, h}, bwd);
      e.collective(at, OpKind::all_gather, GroupKind::etp, Stream::compute, OpName::etp_scatter, bytes_of(c, R), {y},
                   {n("d_ye")});
      e.free(y, bwd);
    }
  } else {
    std::string y = d;
    if (ep) {
      e.alloc(n("d_ag_ep"), BufferClass::workspace, c.act, {T * x.ep, h}, bwd);
      e.collective(at, OpKind::all_gather, GroupKind::ep, Stream::compute, OpName::ep_combine, bytes_of(c, T * x.ep),
                   {y}, {n("d_ag_ep")});
      y = n("d_ag_ep");
    }
    if (etp) {
      e.alloc(n("d_ag_etp"), BufferClass::workspace, c.act, {gathered, h}, bwd);
      e.collective(at, OpKind::all_gather, GroupKind::etp, Stream::compute, OpName::etp_scatter, bytes_of(c, gathered),
                   {y}, {n("d_ag_etp")});
      if (ep) e.free(y, bwd);
      y = n("d_ag_etp");
    }
    // The routing weights' gradient of every gathered copy (zero but for this rank's experts; under
    // etp a partial dot product) summed back to the copies' ranks: reduce_scatter over etp, then ep.
    const std::string route_w = gathered_name(c, prefix, "route_w");
    std::string d_route_w = route_w == n("route_w") ? n("d_route_w") : n("d_route_w_g");
    if (d_route_w != n("d_route_w")) e.alloc(d_route_w, BufferClass::workspace, c.act, {gathered, k}, bwd);
    e.alloc(n("d_ye"), BufferClass::workspace, c.act, {R, h}, bwd);
    e.compute(at, OpKind::activation, OpName::moe_unpermute, 3.0 * double(R) * h,
              {y, n("ye"), route_w, gathered_name(c, prefix, "route_idx"), n("counts")}, {n("d_ye"), d_route_w});
    e.free(n("ye"), bwd);
    if (y != d) e.free(y, bwd);
    if (route_w != n("route_w")) e.free(route_w, bwd);
    auto scatter = [&](GroupKind group, int64_t rows, const std::string& to) {  // rows: before
      const int64_t size = group == GroupKind::ep ? x.ep : x.etp;
      if (to != n("d_route_w")) e.alloc(to, BufferClass::workspace, c.act, {rows / size, k}, bwd);
      e.collective(at, OpKind::reduce_scatter, group, Stream::compute, OpName::moe_route_gather,
                   double(rows) * double(k) * dtype_bytes(c.act), {d_route_w}, {to});
      e.free(d_route_w, bwd);
      d_route_w = to;
    };
    if (etp) scatter(GroupKind::etp, gathered, ep ? n("d_route_w_ep") : n("d_route_w"));
    if (ep) scatter(GroupKind::ep, T * x.ep, n("d_route_w"));
  }
  e.free(n("route_w"), bwd);

  // The local experts' backward (under FP8: each output gradient cast to FP8, with its transposed
  // copy where the device needs one for the wgrad; the dgrads read the experts' FP8 weights).
  const std::string& wd = !c.fp8                                 ? we
                          : !params.expert_fp8_weights_t.empty() ? params.expert_fp8_weights_t
                                                                 : params.expert_fp8_weights;
  const std::string xe = c.fp8 ? n("xe_f8") : n("xe"), act_e = c.fp8 ? n("act_e_f8") : n("act_e");
  auto free_operand = [&](const std::string& operand) {
    e.free(operand, bwd);
    if (e.builder().is_live(fp8_transposed_operand_name(operand))) e.free(fp8_transposed_operand_name(operand), bwd);
  };
  const std::string d_ye = expert_operand(e, at, prefix, "d_ye", Fp8Slot::mlp_down_d, BufferClass::workspace);
  e.alloc(n("d_act_e"), BufferClass::workspace, c.act, {R, fl}, bwd);
  grouped_gemm(e, at, OpName::expert_down, Grad::dgrad, m, fl, h, with_counts({d_ye, wd}), {n("d_act_e")},
               Fp8Slot::mlp_down_d, Fp8Slot::mlp_down_w);
  grouped_gemm(e, at, OpName::expert_down, Grad::wgrad, m, h, fl, with_counts({act_e, d_ye}), {weg},
               Fp8Slot::mlp_down_x, Fp8Slot::mlp_down_d);
  e.free(act_e, bwd);
  free_operand(d_ye);
  const double elements = double(m) * double(x.experts_local) * double(fl);
  e.alloc(n("d_up_e"), BufferClass::workspace, c.act, {R, fl}, bwd);
  if (swiglu) {
    e.alloc(n("d_gate_e"), BufferClass::workspace, c.act, {R, fl}, bwd);
    e.compute(at, OpKind::activation, OpName::swiglu, 10.0 * elements, {n("gate_e"), n("up_e"), n("d_act_e")},
              {n("d_gate_e"), n("d_up_e")});
    e.free(n("gate_e"), bwd);
  } else {
    e.compute(at, OpKind::activation, OpName::gelu, 12.0 * elements, {n("up_e"), n("d_act_e")}, {n("d_up_e")});
  }
  e.free(n("up_e"), bwd);
  e.free(n("d_act_e"), bwd);
  const std::string d_up = expert_operand(e, at, prefix, "d_up_e", Fp8Slot::mlp_up_d, BufferClass::workspace);
  // SwiGLU's two wgrads read one transposed copy of the experts' input (fp8_transposed devices).
  const bool shared_t = c.fp8 && c.fp8_transposed && swiglu;
  if (shared_t) e.fp8_transposed(at, xe, R);
  e.alloc(n("d_xe"), BufferClass::workspace, c.act, {R, h}, bwd);
  grouped_gemm(e, at, OpName::expert_up, Grad::dgrad, m, h, fl, with_counts({d_up, wd}), {n("d_xe")},
               Fp8Slot::mlp_up_d, Fp8Slot::mlp_up_w);
  grouped_gemm(e, at, OpName::expert_up, Grad::wgrad, m, fl, h, with_counts({xe, d_up}), {weg}, Fp8Slot::mlp_x,
               Fp8Slot::mlp_up_d);
  free_operand(d_up);
  if (swiglu) {
    const std::string d_gate =
        expert_operand(e, at, prefix, "d_gate_e", Fp8Slot::mlp_gate_d, BufferClass::workspace);
    grouped_gemm(e, at, OpName::expert_gate, Grad::dgrad, m, h, fl, {d_gate, wd, n("counts"), n("d_xe")},
                 {n("d_xe")}, Fp8Slot::mlp_gate_d, Fp8Slot::mlp_gate_w);
    grouped_gemm(e, at, OpName::expert_gate, Grad::wgrad, m, fl, h, with_counts({xe, d_gate}), {weg},
                 Fp8Slot::mlp_x, Fp8Slot::mlp_gate_d);
    free_operand(d_gate);
  }
  free_operand(xe);

  // Back to this rank's tokens: d_ln2 [T, h].
  e.alloc(n("d_ln2"), BufferClass::workspace, c.act, local, bwd);
  if (a2a) {
    std::string y = n("d_xe");
    if (etp) {
      std::string out = ep ? n("d_disp") : n("d_perm");
      e.alloc(out, BufferClass::workspace, c.act, {x.recv_rows, h}, bwd);
      e.collective(at, OpKind::reduce_scatter, GroupKind::etp, Stream::compute, OpName::etp_gather, bytes_of(c, R), {y},
                   {out});
      e.free(y, bwd);
      y = out;
    }
    if (ep) {
      e.alloc(n("d_perm"), BufferClass::workspace, c.act, {x.send_rows, h}, bwd);
      e.collective(at, OpKind::all_to_all, GroupKind::ep, Stream::compute, OpName::ep_dispatch,
                   bytes_of(c, x.recv_rows), {y, n("counts")}, {n("d_perm")});
      e.free(y, bwd);
      y = n("d_perm");
    }
    e.compute(at, OpKind::activation, OpName::moe_permute, double(T) * k * h, {y, n("route_idx"), n("counts")},
              {n("d_ln2")});
    e.free(y, bwd);
  } else {
    std::string y = !ep && !etp ? n("d_ln2") : n("d_g");
    if (y != n("d_ln2")) e.alloc(y, BufferClass::workspace, c.act, {gathered, h}, bwd);
    const std::string route_idx = gathered_name(c, prefix, "route_idx");
    e.compute(at, OpKind::activation, OpName::moe_permute, double(R) * h, {n("d_xe"), route_idx, n("counts")}, {y});
    e.free(n("d_xe"), bwd);
    if (route_idx != n("route_idx")) e.free(route_idx, bwd);
    if (etp) {
      std::string out = ep ? n("d_rs_etp") : n("d_ln2");
      if (ep) e.alloc(out, BufferClass::workspace, c.act, {T * x.ep, h}, bwd);
      e.collective(at, OpKind::reduce_scatter, GroupKind::etp, Stream::compute, OpName::etp_gather,
                   bytes_of(c, gathered), {y}, {out});
      e.free(y, bwd);
      y = out;
    }
    if (ep) {
      e.collective(at, OpKind::reduce_scatter, GroupKind::ep, Stream::compute, OpName::ep_dispatch,
                   bytes_of(c, T * x.ep), {y}, {n("d_ln2")});
      e.free(y, bwd);
    }
  }

  // Routing's backward (with the aux loss's gradient) and the router's GEMMs, added into d_ln2.
  e.alloc(n("d_logits"), BufferClass::workspace, c.act, {T, E}, bwd);
  std::vector<BufferName> route_in = {n("probs_e"), n("route_idx"), n("d_route_w")};
  if (aux_counts_summed(c)) route_in.push_back(n("routed"));
  e.compute(at, OpKind::activation, OpName::moe_route, 8.0 * T * E, route_in, {n("d_logits")});
  for (const BufferName& name : route_in) e.free(name, bwd);
  e.free(n("counts"), bwd);
  e.gemm(at, OpName::router, Grad::dgrad, T, h, E, {n("d_logits"), w, n("d_ln2")}, {n("d_ln2")});
  e.gemm(at, OpName::router, Grad::wgrad, h, E, T, {n("ln2"), n("d_logits")}, {wg});
  e.free(n("d_logits"), bwd);

  // Shared experts' backward, added into d_ln2.
  if (x.shared_local > 0) emit_shared_experts_backward(e, at, prefix, d, params);
  if (d != g) e.free(d, bwd);
  e.free(n("ln2"), bwd);

  // The norm's backward adds into the residual gradient stream.
  e.compute(at, OpKind::norm, OpName::post_attn_norm, 10.0 * T * h, {n("x_mid"), n("d_ln2"), w, g}, {g, wg});
  e.free(n("x_mid"), bwd);
  e.free(n("d_ln2"), bwd);
}

}  // namespace stepcast
