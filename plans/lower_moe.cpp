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
// expert; the simulator draws each expert's rows from the program's routing).
int32_t grouped_gemm(OpEmitter& e, const OpSite& at, OpName name, Grad grad, int64_t rows, int64_t n, int64_t k,
                     std::vector<BufferName> inputs, std::vector<BufferName> outputs) {
  const LowerContext& c = e.ctx();
  const int64_t experts = c.moe.experts_local;
  int32_t id;
  if (grad == Grad::wgrad) id = e.gemm(at, name, grad, n, k, rows, std::move(inputs), std::move(outputs));
  else id = e.gemm(at, name, grad, rows, n, k, std::move(inputs), std::move(outputs));
  Op& op = const_cast<Op&>(e.builder().role().ops[size_t(id)]);
  op.batch = experts;
  op.flops *= double(experts);
  op.bytes *= double(experts);
  return id;
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
  const bool sp = c.plan.sequence_parallel;
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

  // Shared experts: a dense MLP on every token, tp-sharded (sequence-gathered under SP).
  std::string shared_out;
  if (x.shared_local > 0) {
    const std::vector<int64_t> full = {c.s, c.b, c.h}, wide = {c.s, c.b, x.shared_local};
    std::string in = n("ln2");
    if (sp) {
      e.alloc(n("ln2_full"), BufferClass::workspace, c.act, full, ph);
      e.collective(at, OpKind::all_gather, GroupKind::tp, Stream::compute, OpName::sp_ln2, bytes_of(c, c.s * c.b),
                   {in}, {n("ln2_full")});
      in = n("ln2_full");
    }
    if (swiglu) {
      e.alloc(n("gate"), kept_class(), c.act, wide, ph);
      e.gemm(at, OpName::mlp_gate, Grad::none, c.s * c.b, x.shared_local, h, {in, w}, {n("gate")});
    }
    e.alloc(n("up"), kept_class(), c.act, wide, ph);
    e.gemm(at, OpName::mlp_up, Grad::none, c.s * c.b, x.shared_local, h, {in, w}, {n("up")});
    if (sp) e.free(in, ph);
    e.alloc(n("act"), kept_class(), c.act, wide, ph);
    if (swiglu) {
      e.compute(at, OpKind::activation, OpName::swiglu, 6.0 * c.s * c.b * x.shared_local, {n("gate"), n("up")},
                {n("act")});
      done("gate");
    } else {
      e.compute(at, OpKind::activation, OpName::gelu, 8.0 * c.s * c.b * x.shared_local, {n("up")}, {n("act")});
    }
    done("up");
    e.alloc(n("mlp_partial"), BufferClass::workspace, c.act, full, ph);
    e.gemm(at, OpName::mlp_down, Grad::none, c.s * c.b, h, x.shared_local, {n("act"), w}, {n("mlp_partial")});
    done("act");
    shared_out = n("mlp_partial");
    if (sp) {
      e.alloc(n("mlp_rs"), BufferClass::workspace, c.act, local, ph);
      e.collective(at, OpKind::reduce_scatter, GroupKind::tp, Stream::compute, OpName::tp_mlp_down,
                   bytes_of(c, c.s * c.b), {n("mlp_partial")}, {n("mlp_rs")});
      e.free(n("mlp_partial"), ph);
      shared_out = n("mlp_rs");
    }
  }

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
  // ... the local experts ...
  if (swiglu) {
    e.alloc(n("gate_e"), kept_class(), c.act, {R, fl}, ph);
    grouped_gemm(e, at, OpName::expert_gate, Grad::none, m, fl, h, with_counts({n("xe"), we}), {n("gate_e")});
  }
  e.alloc(n("up_e"), kept_class(), c.act, {R, fl}, ph);
  grouped_gemm(e, at, OpName::expert_up, Grad::none, m, fl, h, with_counts({n("xe"), we}), {n("up_e")});
  done("xe");
  e.alloc(n("act_e"), kept_class(), c.act, {R, fl}, ph);
  const double elements = double(m) * double(x.experts_local) * double(fl);
  if (swiglu) {
    e.compute(at, OpKind::activation, OpName::swiglu, 6.0 * elements, {n("gate_e"), n("up_e")}, {n("act_e")});
    done("gate_e");
  } else {
    e.compute(at, OpKind::activation, OpName::gelu, 8.0 * elements, {n("up_e")}, {n("act_e")});
  }
  done("up_e");
  // ... and back: (etp) reduce_scatter → (ep) all_to_all → comb, un-permuted into moe_out; with
  // the allgather dispatcher un-permuted into the block's tokens, then (etp, ep) reduce_scatter.
  const std::string moe_out = n("moe_out");
  if (a2a) {
    const std::string ye = !ep && !etp ? n("comb") : n("ye");
    e.alloc(ye, ye == n("comb") ? kept_class() : BufferClass::workspace, c.act, {R, h}, ph);
    grouped_gemm(e, at, OpName::expert_down, Grad::none, m, h, fl, with_counts({n("act_e"), we}), {ye});
    done("act_e");
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
    grouped_gemm(e, at, OpName::expert_down, Grad::none, m, h, fl, with_counts({n("act_e"), we}), {n("ye")});
    done("act_e");
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
  const bool sp = c.plan.sequence_parallel;
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

  // The local experts' backward.
  e.alloc(n("d_act_e"), BufferClass::workspace, c.act, {R, fl}, bwd);
  grouped_gemm(e, at, OpName::expert_down, Grad::dgrad, m, fl, h, with_counts({n("d_ye"), we}), {n("d_act_e")});
  grouped_gemm(e, at, OpName::expert_down, Grad::wgrad, m, h, fl, with_counts({n("act_e"), n("d_ye")}), {weg});
  e.free(n("act_e"), bwd);
  e.free(n("d_ye"), bwd);
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
  e.alloc(n("d_xe"), BufferClass::workspace, c.act, {R, h}, bwd);
  grouped_gemm(e, at, OpName::expert_up, Grad::dgrad, m, h, fl, with_counts({n("d_up_e"), we}), {n("d_xe")});
  grouped_gemm(e, at, OpName::expert_up, Grad::wgrad, m, fl, h, with_counts({n("xe"), n("d_up_e")}), {weg});
  e.free(n("d_up_e"), bwd);
  if (swiglu) {
    grouped_gemm(e, at, OpName::expert_gate, Grad::dgrad, m, h, fl, {n("d_gate_e"), we, n("counts"), n("d_xe")},
                 {n("d_xe")});
    grouped_gemm(e, at, OpName::expert_gate, Grad::wgrad, m, fl, h, with_counts({n("xe"), n("d_gate_e")}), {weg});
    e.free(n("d_gate_e"), bwd);
  }
  e.free(n("xe"), bwd);

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
  if (x.shared_local > 0) {
    const std::vector<int64_t> full = {c.s, c.b, c.h}, wide = {c.s, c.b, x.shared_local};
    const double tokens = double(c.s) * c.b;
    std::string d_full = d;
    if (sp) {
      d_full = n("d_mlp_full");
      e.alloc(d_full, BufferClass::workspace, c.act, full, bwd);
      e.collective(at, OpKind::all_gather, GroupKind::tp, Stream::compute, OpName::sp_d_mlp, bytes_of(c, c.s * c.b),
                   {d}, {d_full});
    }
    e.alloc(n("d_act"), BufferClass::workspace, c.act, wide, bwd);
    e.gemm(at, OpName::mlp_down, Grad::dgrad, c.s * c.b, x.shared_local, h, {d_full, w}, {n("d_act")});
    e.gemm(at, OpName::mlp_down, Grad::wgrad, x.shared_local, h, c.s * c.b, {n("act"), d_full}, {wg});
    e.free(n("act"), bwd);
    if (sp) e.free(d_full, bwd);
    e.alloc(n("d_up"), BufferClass::workspace, c.act, wide, bwd);
    if (swiglu) {
      e.alloc(n("d_gate"), BufferClass::workspace, c.act, wide, bwd);
      e.compute(at, OpKind::activation, OpName::swiglu, 10.0 * tokens * x.shared_local, {n("gate"), n("up"), n("d_act")},
                {n("d_gate"), n("d_up")});
      e.free(n("gate"), bwd);
    } else {
      e.compute(at, OpKind::activation, OpName::gelu, 12.0 * tokens * x.shared_local, {n("up"), n("d_act")}, {n("d_up")});
    }
    e.free(n("d_act"), bwd);
    e.free(n("up"), bwd);
    std::string ln2 = n("ln2");
    if (sp) {
      ln2 = n("ln2_full");
      e.alloc(ln2, BufferClass::workspace, c.act, full, bwd);
      e.collective(at, OpKind::all_gather, GroupKind::tp, Stream::compute, OpName::sp_ln2, bytes_of(c, c.s * c.b),
                   {n("ln2")}, {ln2});
    }
    std::string d_sh = sp ? n("d_ln2_full") : n("d_sh");
    e.alloc(d_sh, BufferClass::workspace, c.act, sp ? full : local, bwd);
    e.gemm(at, OpName::mlp_up, Grad::dgrad, c.s * c.b, h, x.shared_local, {n("d_up"), w}, {d_sh});
    e.gemm(at, OpName::mlp_up, Grad::wgrad, h, x.shared_local, c.s * c.b, {ln2, n("d_up")}, {wg});
    if (swiglu) {
      e.gemm(at, OpName::mlp_gate, Grad::dgrad, c.s * c.b, h, x.shared_local, {n("d_gate"), w, d_sh}, {d_sh});
      e.gemm(at, OpName::mlp_gate, Grad::wgrad, h, x.shared_local, c.s * c.b, {ln2, n("d_gate")}, {wg});
      e.free(n("d_gate"), bwd);
    }
    e.free(n("d_up"), bwd);
    if (sp) {
      e.free(ln2, bwd);
      e.alloc(n("d_sh"), BufferClass::workspace, c.act, local, bwd);
      e.collective(at, OpKind::reduce_scatter, GroupKind::tp, Stream::compute, OpName::tp_mlp_up, bytes_of(c, c.s * c.b),
                   {d_sh}, {n("d_sh")});
      e.free(d_sh, bwd);
    }
    e.compute(at, OpKind::activation, OpName::moe_add, double(T) * h, {n("d_sh"), n("d_ln2")}, {n("d_ln2")});
    e.free(n("d_sh"), bwd);
  }
  if (d != g) e.free(d, bwd);
  e.free(n("ln2"), bwd);

  // The norm's backward adds into the residual gradient stream.
  e.compute(at, OpKind::norm, OpName::post_attn_norm, 10.0 * T * h, {n("x_mid"), n("d_ln2"), w, g}, {g, wg});
  e.free(n("x_mid"), bwd);
  e.free(n("d_ln2"), bwd);
}

}  // namespace stepcast
