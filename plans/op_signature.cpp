// The signature table of op_signature.hpp and the binding of an op's operands to slots. To add an
// op: a value in OpName (program.hpp), its name in op_names.cpp, and its row in the table.
#include "op_signature.hpp"

#include <cstring>
#include <ostream>
#include <span>

#include "errors.hpp"

namespace stepcast {

const char* to_string(SlotRole role) {
  switch (role) {
    case SlotRole::activation: return "activation";
    case SlotRole::weights: return "weights";
    case SlotRole::grads: return "grads";
    case SlotRole::optimizer_state: return "optimizer_state";
    case SlotRole::statistics: return "statistics";
    case SlotRole::mask: return "mask";
    case SlotRole::data: return "data";
    case SlotRole::comm_scratch: return "comm_scratch";
  }
  return "?";
}

const char* to_string(DtypeRule rule) {
  switch (rule) {
    case DtypeRule::any: return "any";
    case DtypeRule::floating: return "floating";
    case DtypeRule::wide: return "fp32 or fp64";
    case DtypeRule::int32: return "int32";
    case DtypeRule::int64: return "int64";
    case DtypeRule::mask: return "u8";
    case DtypeRule::fp8: return "fp8_e4m3 or fp8_e5m2";
    case DtypeRule::same_as_first: return "the first input's";
    case DtypeRule::unpacked: return "the first input's, or a wider one after FP8";
  }
  return "?";
}

const char* to_string(ShapeRule rule) {
  switch (rule) {
    case ShapeRule::any: return "any";
    case ShapeRule::m_k: return "m·k";
    case ShapeRule::m_n: return "m·n";
    case ShapeRule::k_m: return "k·m";
    case ShapeRule::k_n: return "k·n";
    case ShapeRule::batch_m_n: return "batch·m·n";
    case ShapeRule::batch_m_k: return "batch·m·k";
    case ShapeRule::batch_m: return "batch·m";
    case ShapeRule::one: return "1";
  }
  return "?";
}

namespace {

using R = SlotRole;
using C = SlotCount;
using D = DtypeRule;
using S = ShapeRule;
using N = OpName;

// Slot shorthands.
Slot act(const char* name, D dtype = D::floating, S shape = S::any) {
  return {name, R::activation, C::one, dtype, shape};
}
Slot optional_act(const char* name, S shape = S::any) {
  return {name, R::activation, C::optional, D::floating, shape};
}
Slot weights(const char* name = "w") { return {name, R::weights, C::one, D::floating, S::any}; }
Slot grads(const char* name = "dw") { return {name, R::grads, C::one, D::floating, S::any}; }
Slot mask(const char* name = "mask", S shape = S::any) { return {name, R::mask, C::one, D::mask, shape}; }
Slot stats(const char* name, S shape = S::any) { return {name, R::statistics, C::one, D::wide, shape}; }
Slot optional_stats(const char* name) { return {name, R::statistics, C::optional, D::wide, S::any}; }
Slot tokens(const char* name) { return {name, R::data, C::one, D::int32, S::any}; }
// MoE's counts [etp, ep, E] (optional: programs lowered before the executor ran MoE lack them).
Slot counts() { return {"counts", R::activation, C::optional, D::int32, S::any}; }
// MoE's routed copies per expert [E] for the aux loss, summed over the ranks that split the
// sequence (tp under sequence parallelism, cp); absent where one rank holds the whole sequence.
Slot routed() { return {"routed", R::statistics, C::optional, D::wide, S::any}; }
Slot scratch() { return {"scratch", R::comm_scratch, C::optional, D::same_as_first, S::any}; }

// A collective reading `in` and writing `out` (one buffer each), with the host staging.
OpSignature collective(OpKind kind, std::vector<OpName> names, const char* in, const char* out) {
  return {kind, std::move(names), Grad::none, Pass::any,
          {{in, R::activation, C::one, D::same_as_first, S::any}},
          {{out, R::activation, C::one, D::same_as_first, S::any}, scratch()}};
}
// A collective over whole parameter groups (one buffer each, reduced or gathered in place).
OpSignature group_collective(OpKind kind, std::vector<OpName> names, R role, const char* slot) {
  return {kind, std::move(names), Grad::none, Pass::any,
          {{slot, role, C::repeated, D::same_as_first, S::any}},
          {{slot, role, C::repeated, D::same_as_first, S::any}, scratch()}};
}

std::vector<OpSignature> make_table() {
  const std::vector<OpName> gemms = {N::qkv, N::attn_out, N::mlp_up, N::mlp_gate, N::mlp_down, N::logits, N::router};
  const std::vector<OpName> grouped = {N::expert_gate, N::expert_up, N::expert_down};
  const std::vector<OpName> moe_comm = {N::ep_dispatch, N::ep_combine, N::etp_gather, N::etp_scatter};
  const std::vector<OpName> norms = {N::input_norm, N::post_attn_norm, N::final_norm};
  return {
      // ---- embedding ----
      {OpKind::embedding, {N::word}, Grad::none, Pass::forward,
       {weights(), tokens("tokens")}, {act("y")}},
      {OpKind::embedding, {N::word}, Grad::none, Pass::backward,
       {act("d_y"), weights(), grads("dw"), tokens("tokens")}, {grads("dw")}},
      {OpKind::embedding, {N::position_dropout}, Grad::none, Pass::forward,
       {act("x"), {"position", R::weights, C::optional, D::floating, S::any}},
       {act("y", D::same_as_first), {"mask", R::mask, C::optional, D::mask, S::any}}},
      {OpKind::embedding, {N::position_dropout}, Grad::none, Pass::backward,
       {act("d_y"), {"mask", R::mask, C::optional, D::mask, S::any}},
       {{"d_position", R::grads, C::optional, D::floating, S::any}, act("d_x", D::same_as_first)}},
      // ---- norms: the backward adds dx into the residual gradient stream d_x ----
      {OpKind::norm, norms, Grad::none, Pass::forward, {act("x"), weights()}, {act("y", D::same_as_first)}},
      {OpKind::norm, norms, Grad::none, Pass::backward,
       {act("x"), act("d_y"), weights(), act("d_x")}, {act("d_x"), grads()}},
      // ---- gemm: forward y[m, n] = x[m, k] · w; dgrad d_x[m, n] = d_y[m, k] · w (added into
      // d_x when it is also read); wgrad dw += x[k, m]ᵀ · d_y[k, n] ----
      // Under FP8 (an op with fp8_slots) x, w and d_y are FP8 copies, y and d_x wider.
      // An FP8 forward with a column-parallel bias reads it from the weights (bias_w).
      {OpKind::gemm, gemms, Grad::none, Pass::forward,
       {act("x", D::floating, S::m_k), weights(), {"bias_w", R::weights, C::optional, D::floating, S::any}},
       {act("y", D::unpacked, S::m_n)}},
      {OpKind::gemm, gemms, Grad::dgrad, Pass::backward,
       {act("d_y", D::floating, S::m_k), weights(), optional_act("d_x", S::m_n)},
       {act("d_x", D::unpacked, S::m_n)}},
      // On a device that reads FP8 operands row-wise only, x's and d_y's transposed copies too
      // (fp8_transpose), which the GEMM reads in their place.
      {OpKind::gemm, gemms, Grad::wgrad, Pass::backward,
       {act("x", D::floating, S::k_m), act("d_y", D::floating, S::k_n),
        {"x_t", R::activation, C::optional, D::fp8, S::k_m}, {"d_y_t", R::activation, C::optional, D::fp8, S::k_n}},
       {grads()}},
      // Grouped GEMMs of the local experts: batch = experts, m = the mean rows an expert computes;
      // the buffers hold every local expert's rows (as the routing puts them), hence any shape.
      // counts [etp·ep, E] (int32): the rows each expert holds. Under FP8 as the dense GEMMs (x,
      // w and d_y FP8 copies, y and d_x wider; a wgrad's transposed copies x_t, d_y_t).
      {OpKind::gemm, grouped, Grad::none, Pass::forward,
       {act("x", D::floating), weights(), counts(), {"bias_w", R::weights, C::optional, D::floating, S::any}},
       {act("y", D::unpacked)}},
      {OpKind::gemm, grouped, Grad::dgrad, Pass::backward,
       {act("d_y", D::floating), weights(), counts(), optional_act("d_x")}, {act("d_x", D::unpacked)}},
      {OpKind::gemm, grouped, Grad::wgrad, Pass::backward,
       {act("x", D::floating), act("d_y", D::floating), counts(),
        {"x_t", R::activation, C::optional, D::fp8, S::any}, {"d_y_t", R::activation, C::optional, D::fp8, S::any}},
       {grads()}},
      // ---- attention core: batch = b·heads, m = n = s, k = head_dim ----
      {OpKind::attention, {N::score}, Grad::none, Pass::forward,
       {act("qkv")}, {act("scores", D::same_as_first, S::batch_m_n)}},
      {OpKind::attention, {N::softmax}, Grad::none, Pass::forward,
       {act("scores", D::floating, S::batch_m_n)}, {act("probs", D::same_as_first, S::batch_m_n)}},
      {OpKind::attention, {N::dropout}, Grad::none, Pass::forward,
       {act("probs", D::floating, S::batch_m_n)},
       {act("probs_drop", D::same_as_first, S::batch_m_n), mask("mask", S::batch_m_n)}},
      {OpKind::attention, {N::value}, Grad::none, Pass::forward,
       {act("probs", D::floating, S::batch_m_n), act("qkv")}, {act("ctx", D::same_as_first, S::batch_m_k)}},
      // Under context parallelism flash also reads the K/V block of its cp_step (rows n).
      {OpKind::attention, {N::flash}, Grad::none, Pass::forward,
       {act("qkv"), optional_act("kv")}, {act("ctx", D::same_as_first, S::batch_m_k), stats("lse", S::batch_m)}},
      {OpKind::attention, {N::value}, Grad::none, Pass::backward,
       {act("d_ctx", D::floating, S::batch_m_k), act("probs", D::floating, S::batch_m_n), act("qkv")},
       {act("d_probs", D::same_as_first, S::batch_m_n), act("d_qkv", D::same_as_first)}},
      {OpKind::attention, {N::dropout}, Grad::none, Pass::backward,
       {act("d_y", D::floating, S::batch_m_n), mask("mask", S::batch_m_n)},
       {act("d_x", D::same_as_first, S::batch_m_n)}},
      {OpKind::attention, {N::softmax}, Grad::none, Pass::backward,
       {act("d_probs", D::floating, S::batch_m_n), act("probs", D::floating, S::batch_m_n)},
       {act("d_scores", D::same_as_first, S::batch_m_n)}},
      {OpKind::attention, {N::score}, Grad::none, Pass::backward,
       {act("d_scores", D::floating, S::batch_m_n), act("qkv"), act("d_qkv")},
       {act("d_qkv", D::same_as_first)}},
      // ... and writes the block's dK/dV (d_kv), adding dQ into d_qkv when it also reads it.
      {OpKind::attention, {N::flash}, Grad::none, Pass::backward,
       {act("qkv"), act("ctx", D::floating, S::batch_m_k), stats("lse", S::batch_m),
        act("d_ctx", D::floating, S::batch_m_k), optional_act("kv"), optional_act("d_qkv")},
       {act("d_qkv", D::same_as_first), optional_act("d_kv")}},
      // ---- activations ----
      {OpKind::activation, {N::rotary}, Grad::none, Pass::any, {act("qkv")}, {act("qkv", D::same_as_first)}},
      {OpKind::activation, {N::gelu}, Grad::none, Pass::forward, {act("x")}, {act("y", D::same_as_first)}},
      {OpKind::activation, {N::gelu}, Grad::none, Pass::backward,
       {act("x"), act("d_y")}, {act("d_x", D::same_as_first)}},
      {OpKind::activation, {N::swiglu}, Grad::none, Pass::forward,
       {act("gate"), act("up")}, {act("y", D::same_as_first)}},
      {OpKind::activation, {N::swiglu}, Grad::none, Pass::backward,
       {act("gate"), act("up"), act("d_y")},
       {act("d_gate", D::same_as_first), act("d_up", D::same_as_first)}},
      // The residual branch: its row-parallel bias (in w), dropout, and the residual add.
      {OpKind::activation, {N::dropout_add}, Grad::none, Pass::forward,
       {act("branch"), act("residual"), weights()},
       {act("y", D::same_as_first), {"mask", R::mask, C::optional, D::mask, S::any}}},
      {OpKind::activation, {N::dropout_add}, Grad::none, Pass::backward,
       {act("d_y"), mask(), grads("dw")},
       {act("d_x", D::same_as_first), {"dw", R::grads, C::optional, D::floating, S::any}}},
      {OpKind::activation, {N::mlp_bias_grad, N::attn_bias_grad}, Grad::none, Pass::backward,
       {act("d_y"), grads("dw")}, {grads("dw")}},
      // ---- mixture of experts: routing (probabilities [T, E], top-k weights and expert indices
      // [T, k]); permutation of the tokens into expert order, and back weighted (its backward
      // also gives the weights' gradient); the backward of routing adds the aux loss's gradient ----
      {OpKind::activation, {N::moe_route}, Grad::none, Pass::forward, {act("logits")},
       {act("probs", D::same_as_first), act("route_w", D::same_as_first), act("route_idx", D::int32), counts(),
        routed()}},
      {OpKind::activation, {N::moe_route}, Grad::none, Pass::backward,
       {act("probs"), act("route_idx", D::int32), act("d_route_w"), routed()}, {act("d_logits", D::same_as_first)}},
      {OpKind::loss, {N::moe_aux_loss}, Grad::none, Pass::forward,
       {act("probs"), act("route_idx", D::int32), routed()}, {stats("aux", S::one)}},
      {OpKind::all_reduce, {N::moe_aux_counts}, Grad::none, Pass::forward,
       {{"routed", R::statistics, C::one, D::wide, S::any}},
       {{"routed", R::statistics, C::one, D::wide, S::any}, scratch()}},
      // (With the allgather dispatcher the forward writes the counts, from the gathered routing.)
      {OpKind::activation, {N::moe_permute}, Grad::none, Pass::forward,
       {act("x"), act("route_idx", D::int32), counts()},
       {act("y", D::same_as_first), counts()}},
      {OpKind::activation, {N::moe_permute}, Grad::none, Pass::backward,
       {act("d_y"), act("route_idx", D::int32), counts()},
       {act("d_x", D::same_as_first)}},
      {OpKind::activation, {N::moe_unpermute}, Grad::none, Pass::forward,
       {act("x"), act("route_w"), act("route_idx", D::int32), counts()}, {act("y", D::same_as_first)}},
      {OpKind::activation, {N::moe_unpermute}, Grad::none, Pass::backward,
       {act("d_y"), act("x"), act("route_w"), act("route_idx", D::int32), counts()},
       {act("d_x", D::same_as_first), act("d_route_w", D::same_as_first)}},
      {OpKind::activation, {N::moe_add}, Grad::none, Pass::any, {act("x"), act("acc")}, {act("acc", D::same_as_first)}},
      // ---- context parallelism: K and V out of qkv; partial attention merged by log-sum-exp
      // (forward) or a block's dK/dV added into its accumulator (backward); dK/dV into d_qkv ----
      {OpKind::activation, {N::cp_kv_pack}, Grad::none, Pass::any, {act("qkv")}, {act("kv", D::same_as_first)}},
      {OpKind::activation, {N::cp_merge}, Grad::none, Pass::forward,
       {act("ctx_part"), stats("lse_part"), act("ctx"), stats("lse")}, {act("ctx"), stats("lse")}},
      {OpKind::activation, {N::cp_merge}, Grad::none, Pass::backward, {act("d_kv_part"), act("d_kv")}, {act("d_kv")}},
      {OpKind::activation, {N::cp_dkv}, Grad::none, Pass::backward, {act("d_kv"), act("d_qkv")}, {act("d_qkv")}},
      // a2a (Ulysses): [s, b, W] ⇄ [cp][s, b, W/cp] (heads split, or joined back) and
      // [cp][s, b, W/cp] ⇄ [s_full, b, W/cp] (the members' token blocks in sequence order); W is a
      // qkv width (its q, k and v heads each split) or a ctx width.
      {OpKind::activation, {N::cp_a2a_split_heads, N::cp_a2a_join_seq, N::cp_a2a_split_seq, N::cp_a2a_join_heads},
       Grad::none, Pass::any, {act("x")}, {act("y", D::same_as_first)}},
      // Materialized attention over the gathered K/V [s_full, b, 2·kv·d] (n = s_full key rows):
      // scores of the local queries; values; their backward writes dQ into d_qkv and dK/dV into
      // d_kv (value first, zeroing it; score adds dK).
      {OpKind::attention, {N::cp_score}, Grad::none, Pass::forward,
       {act("qkv"), act("kv")}, {act("scores", D::same_as_first, S::batch_m_n)}},
      {OpKind::attention, {N::cp_value}, Grad::none, Pass::forward,
       {act("probs", D::floating, S::batch_m_n), act("kv")}, {act("ctx", D::same_as_first, S::batch_m_k)}},
      {OpKind::attention, {N::cp_value}, Grad::none, Pass::backward,
       {act("d_ctx", D::floating, S::batch_m_k), act("probs", D::floating, S::batch_m_n), act("kv")},
       {act("d_probs", D::same_as_first, S::batch_m_n), act("d_kv", D::same_as_first)}},
      {OpKind::attention, {N::cp_score}, Grad::none, Pass::backward,
       {act("d_scores", D::floating, S::batch_m_n), act("qkv"), act("kv"), act("d_kv")},
       {act("d_qkv", D::same_as_first), act("d_kv", D::same_as_first)}},
      // ---- FP8 (delayed scaling): scale[slot] and amax[slot] of the program's FP8 slots ----
      // (Current scaling: the casts write the scales they take from the amax.)
      // (A MoE expert buffer's cast, and under current scaling its amax, reads its counts: the rows
      // it holds, each local expert's on its own slot then.)
      // (MXFP8: no scale and no amax, the block scales inside the MX buffers; fp8.hpp.)
      {OpKind::activation, {N::fp8_cast}, Grad::none, Pass::any,
       {act("x"), optional_stats("scale"), optional_stats("amax"), counts()},
       {{"y", R::activation, C::one, D::fp8, S::any}, optional_stats("amax"), optional_stats("scale")}},
      // (Once a step, at the layer's first forward; under ZeRO-3 at each use, backward too.)
      {OpKind::activation, {N::fp8_weights}, Grad::none, Pass::any,
       {weights(), optional_stats("scale"), optional_stats("amax")},
       {{"w8", R::weights, C::one, D::fp8, S::any}, optional_stats("amax"), optional_stats("scale")}},
      {OpKind::activation, {N::fp8_absmax}, Grad::none, Pass::any, {act("x"), stats("amax"), counts()},
       {stats("amax")}},
      // fp8_param_gather: the FP8 weights' amax of this rank's master shard (current scaling), then
      // the shard cast into the FP8 weights (at the shard's place; the codes gathered after).
      {OpKind::activation, {N::fp8_param_absmax}, Grad::none, Pass::optimizer,
       {{"master", R::optimizer_state, C::one, D::wide, S::any}, stats("amax")}, {stats("amax")}},
      {OpKind::activation, {N::fp8_param_cast}, Grad::none, Pass::optimizer,
       {{"master", R::optimizer_state, C::one, D::wide, S::any}, stats("scale"), stats("amax")},
       {{"w8", R::weights, C::one, D::fp8, S::any}, stats("amax"), optional_stats("scale")}},
      // The FP8 weight codes transposed (MXFP8: the weights' column-wise copy, cast from them).
      {OpKind::activation, {N::fp8_weights_transpose}, Grad::none, Pass::any,
       {{"w", R::weights, C::one, D::floating, S::any}}, {{"w8t", R::weights, C::one, D::fp8, S::any}}},
      // A cast that also writes its codes transposed: y [m rows, n columns] and y_t [n, m] (MXFP8:
      // y_t x's column-wise copy, [m, n] too).
      {OpKind::activation, {N::fp8_cast_transpose}, Grad::none, Pass::any,
       {act("x"), optional_stats("scale"), optional_stats("amax"), counts()},
       {{"y", R::activation, C::one, D::fp8, S::m_n}, {"y_t", R::activation, C::one, D::fp8, S::m_n},
        optional_stats("amax"), optional_stats("scale")}},
      // A wgrad operand's transient transposed copy: x8 [m rows, n columns] → x8t [n, m].
      {OpKind::activation, {N::fp8_transpose}, Grad::none, Pass::backward,
       {{"x8", R::activation, C::one, D::fp8, S::m_n}}, {{"x8t", R::activation, C::one, D::fp8, S::m_n}}},
      {OpKind::all_reduce, {N::fp8_amax}, Grad::none, Pass::any, {stats("amax")}, {stats("amax"), scratch()}},
      {OpKind::optimizer_step, {N::fp8_scale_update}, Grad::none, Pass::optimizer,
       {stats("amax"), stats("history"), stats("scale")}, {stats("history"), stats("scale"), stats("amax")}},
      // ---- loss: per-token (max, sum of exp, target logit) statistics over the vocabulary ----
      {OpKind::loss, {N::cross_entropy_stats}, Grad::none, Pass::forward,
       {act("logits"), tokens("targets")}, {stats("stats")}},
      {OpKind::loss, {N::cross_entropy}, Grad::none, Pass::forward,
       {act("logits"), tokens("targets"), {"stats_all", R::statistics, C::optional, D::wide, S::any}},
       {stats("softmax"), stats("token_loss"), {"stats", R::statistics, C::optional, D::wide, S::any}}},
      {OpKind::loss, {N::cross_entropy}, Grad::none, Pass::backward,
       {stats("softmax"), tokens("targets")}, {act("d_logits")}},
      // ---- optimizer ----
      {OpKind::optimizer_step, {N::grad_accumulate}, Grad::none, Pass::backward,
       {grads("full"), grads("shard")}, {grads("shard")}},
      {OpKind::optimizer_step, {N::grad_stash}, Grad::none, Pass::optimizer, {grads("from")}, {grads("to")}},
      {OpKind::optimizer_step, {N::grad_norm}, Grad::none, Pass::optimizer,
       {{"grads", R::grads, C::repeated, D::floating, S::any}}, {stats("norm_sq", S::one)}},
      {OpKind::optimizer_step, {N::adamw}, Grad::none, Pass::optimizer,
       {{"grads", R::grads, C::repeated, D::floating, S::any},
        {"states", R::optimizer_state, C::repeated, D::wide, S::any}, stats("norm_sq", S::one)},
       {{"states", R::optimizer_state, C::repeated, D::wide, S::any},
        {"weights", R::weights, C::repeated, D::floating, S::any}}},
      // ---- collectives ----
      collective(OpKind::all_reduce, {N::tp_embedding, N::tp_attn_out, N::tp_mlp_down, N::tp_mlp_up,
                                      N::tp_qkv, N::tp_logits}, "x", "x"),
      collective(OpKind::reduce_scatter, {N::tp_embedding, N::tp_attn_out, N::tp_mlp_down,
                                          N::tp_mlp_up, N::tp_qkv, N::tp_logits}, "x", "y"),
      collective(OpKind::all_gather, {N::sp_embedding, N::sp_ln1, N::sp_ln2, N::sp_d_attn,
                                      N::sp_d_mlp, N::sp_final_norm, N::tp_cross_entropy, N::cp_kv, N::pp_gather},
                 "x", "y"),
      collective(OpKind::reduce_scatter, {N::cp_dkv}, "x", "y"),
      collective(OpKind::all_to_all, {N::cp_a2a}, "x", "y"),
      // MoE dispatch and combine (and their backward): an all_to_all over ep with the alltoall
      // dispatcher, all_gather / reduce_scatter over ep with allgather, and over etp.
      // (The alltoall dispatcher's: the counts travel first, then the rows they say.)
      {OpKind::all_to_all, moe_comm, Grad::none, Pass::any,
       {{"x", R::activation, C::one, D::same_as_first, S::any}, counts()},
       {{"y", R::activation, C::one, D::same_as_first, S::any}, counts(), scratch()}},
      // (The etp gather of the alltoall dispatcher's: every etp rank's counts, then its rows.)
      {OpKind::all_gather, moe_comm, Grad::none, Pass::any,
       {{"x", R::activation, C::one, D::same_as_first, S::any}, counts()},
       {{"y", R::activation, C::one, D::same_as_first, S::any}, counts(), scratch()}},
      collective(OpKind::reduce_scatter, moe_comm, "x", "y"),
      // The allgather dispatcher's routing (top-k weights, int32 experts) over ep and etp, and the
      // weights' gradient back.
      collective(OpKind::all_gather, {N::moe_route_gather}, "x", "y"),
      collective(OpKind::reduce_scatter, {N::moe_route_gather}, "x", "y"),
      {OpKind::all_gather, {N::zero3_param_gather}, Grad::none, Pass::any,
       {{"shard", R::weights, C::one, D::floating, S::any}},
       {{"full", R::weights, C::one, D::same_as_first, S::any}, scratch()}},
      {OpKind::all_reduce, {N::grad_norm}, Grad::none, Pass::optimizer,
       {{"norm_sq", R::statistics, C::one, D::wide, S::one}},
       {{"norm_sq", R::statistics, C::one, D::wide, S::one}, scratch()}},
      // ZeRO-0 all_reduces whole gradients; ZeRO-1 reduce_scatters them; ZeRO-2/3 read
      // (full gradient, shard) pairs and write the shards.
      // replica_grads (hybrid sharding) all-reduces the shards a bucket's reduce_scatter left:
      // whole shard buffers under ZeRO-2/3, each rank's slice of the full ones under ZeRO-1.
      group_collective(OpKind::all_reduce, {N::grad_bucket, N::tied_embedding_grads,
                                            N::sp_replicated_grads, N::replica_grads}, R::grads, "grads"),
      group_collective(OpKind::reduce_scatter, {N::grad_bucket}, R::grads, "grads"),
      group_collective(OpKind::all_gather, {N::param_gather}, R::weights, "weights"),
      // ---- pipeline ----
      {OpKind::send, {N::send}, Grad::none, Pass::any,
       {act("x")}, {{"staging", R::comm_scratch, C::optional, D::same_as_first, S::any}}},
      {OpKind::recv, {N::recv}, Grad::none, Pass::any, {}, {act("x")}},
      // ---- parameter servers: a group's slice of the weights to a worker (param_pull) and of
      // the gradient to a server (grad_push), with the worker's gradient norm (norm_push) ----
      {OpKind::recv, {N::param_pull}, Grad::none, Pass::any, {}, {weights("weights")}},
      {OpKind::send, {N::param_pull}, Grad::none, Pass::any, {weights("weights")},
       {{"staging", R::comm_scratch, C::optional, D::same_as_first, S::any}}},
      {OpKind::recv, {N::grad_push}, Grad::none, Pass::any, {}, {grads("grads")}},
      {OpKind::send, {N::grad_push}, Grad::none, Pass::any, {grads("grads")}, {}},
      {OpKind::recv, {N::norm_push}, Grad::none, Pass::any, {}, {stats("norm_sq", S::one)}},
      {OpKind::send, {N::norm_push}, Grad::none, Pass::any, {stats("norm_sq", S::one)}, {}},
  };
}

bool pass_covers(Pass pass, Phase phase) {
  switch (pass) {
    case Pass::forward: return phase == Phase::forward || phase == Phase::recompute;
    case Pass::backward: return phase == Phase::backward;
    case Pass::optimizer: return phase == Phase::optimizer;
    case Pass::any: return true;
  }
  return false;
}

// Binds `buffers` to `slots` (see SlotCount); returns the error, empty when they fit.
std::string bind_side(const std::vector<Slot>& slots, std::span<const BufferName> buffers,
                      std::vector<const Slot*>& bound, const char* side) {
  bound.clear();
  size_t n = buffers.size();
  const Slot* scratch_slot = nullptr;
  size_t last = slots.size();
  if (!slots.empty() && slots.back().role == R::comm_scratch) {
    scratch_slot = &slots.back();
    --last;
    if (n > 0 && is_comm_scratch(buffers.back())) --n;
    else scratch_slot = nullptr;
  }
  size_t ones = 0, optionals = 0, repeated = 0;
  for (size_t i = 0; i < last; ++i) {
    ones += slots[i].count == C::one;
    optionals += slots[i].count == C::optional;
    repeated += slots[i].count == C::repeated;
  }
  auto mismatch = [&](const std::string& want) {
    return std::string(side) + ": " + std::to_string(buffers.size()) + " buffers; the signature takes " + want;
  };
  size_t times = 0, present = 0;
  if (repeated > 0) {
    if (n <= ones || (n - ones) % repeated != 0) {
      return mismatch(std::to_string(ones) + " + a positive multiple of " + std::to_string(repeated));
    }
    times = (n - ones) / repeated;
  } else {
    if (n < ones || n > ones + optionals) {
      return mismatch(optionals ? std::to_string(ones) + " to " + std::to_string(ones + optionals)
                                : std::to_string(ones));
    }
    present = n - ones;
  }
  for (size_t i = 0; i < last; ++i) {
    const Slot& slot = slots[i];
    if (slot.count == C::one) {
      bound.push_back(&slot);
    } else if (slot.count == C::optional) {
      if (present > 0) {
        bound.push_back(&slot);
        --present;
      }
    } else {
      for (size_t t = 0; t < times; ++t) bound.push_back(&slot);
    }
  }
  if (scratch_slot) bound.push_back(scratch_slot);
  STEPCAST_CHECK(bound.size() == buffers.size(), "slot binding lost a buffer");
  return "";
}

}  // namespace

const std::vector<OpSignature>& op_signatures() {
  static const std::vector<OpSignature> table = make_table();  // immutable once built
  return table;
}

const OpSignature* find_signature(const Op& op) {
  for (const OpSignature& s : op_signatures()) {
    if (s.kind != op.kind || s.grad != op.grad || !pass_covers(s.pass, op.phase)) continue;
    for (OpName name : s.names) {
      if (name == op.name) return &s;
    }
  }
  return nullptr;
}

SlotBinding bind_slots(const OpSignature& signature, const Op& op) {
  SlotBinding b;
  b.error = bind_side(signature.inputs, op.inputs, b.inputs, "inputs");
  if (b.error.empty()) b.error = bind_side(signature.outputs, op.outputs, b.outputs, "outputs");
  return b;
}

Operands::Operands(const Op& op) : op_(&op) {
  if (op.kind == OpKind::alloc || op.kind == OpKind::free) return;
  const OpSignature* signature = find_signature(op);
  STEPCAST_CHECK(signature != nullptr, "op " + std::to_string(op.id) + " (" + to_string(op.kind) + " " +
                                           to_string(op.name) + ") has no signature");
  SlotBinding binding = bind_slots(*signature, op);
  STEPCAST_CHECK(binding.error.empty(), "op " + std::to_string(op.id) + ": " + binding.error);
  for (const Slot* slot : binding.inputs) inputs_.push_back(slot->name);
  for (const Slot* slot : binding.outputs) outputs_.push_back(slot->name);
}

namespace {
std::vector<size_t> slot_positions(const std::vector<const char*>& names, const char* slot) {
  std::vector<size_t> at;
  for (size_t i = 0; i < names.size(); ++i) {
    if (std::strcmp(names[i], slot) == 0) at.push_back(i);
  }
  return at;
}
const std::string& one_buffer(const Op* op, const std::vector<const char*>& names,
                              std::span<const BufferName> buffers, const char* slot, const char* side) {
  std::vector<size_t> at = slot_positions(names, slot);
  STEPCAST_CHECK(!at.empty(), "op " + std::to_string(op->id) + " has no " + side + " in slot '" + slot + "'");
  return buffers[at.front()];
}
std::vector<BufferName> all_buffers(const std::vector<const char*>& names,
                                     std::span<const BufferName> buffers, const char* slot) {
  std::vector<BufferName> out;
  for (size_t i : slot_positions(names, slot)) out.push_back(buffers[i]);
  return out;
}
}  // namespace

const std::string& Operands::in(const char* slot) const {
  STEPCAST_CHECK(op_ != nullptr, std::string("no op for input slot '") + slot + "'");
  return one_buffer(op_, inputs_, op_->inputs, slot, "input");
}
const std::string& Operands::out(const char* slot) const {
  STEPCAST_CHECK(op_ != nullptr, std::string("no op for output slot '") + slot + "'");
  return one_buffer(op_, outputs_, op_->outputs, slot, "output");
}
bool Operands::has_in(const char* slot) const { return !slot_positions(inputs_, slot).empty(); }
bool Operands::has_out(const char* slot) const { return !slot_positions(outputs_, slot).empty(); }
std::vector<BufferName> Operands::ins(const char* slot) const { return all_buffers(inputs_, op_->inputs, slot); }
std::vector<BufferName> Operands::outs(const char* slot) const { return all_buffers(outputs_, op_->outputs, slot); }

std::optional<int64_t> expected_elements(ShapeRule rule, const Op& op) {
  switch (rule) {
    case ShapeRule::any: return std::nullopt;
    case ShapeRule::m_k: return op.m * op.k;
    case ShapeRule::m_n: return op.m * op.n;
    case ShapeRule::k_m: return op.k * op.m;
    case ShapeRule::k_n: return op.k * op.n;
    case ShapeRule::batch_m_n: return op.batch * op.m * op.n;
    case ShapeRule::batch_m_k: return op.batch * op.m * op.k;
    case ShapeRule::batch_m: return op.batch * op.m;
    case ShapeRule::one: return 1;
  }
  return std::nullopt;
}

bool dtype_fits(DtypeRule rule, Dtype dtype, Dtype first) {
  switch (rule) {
    case DtypeRule::any: return true;
    case DtypeRule::floating: return dtype != Dtype::int32 && dtype != Dtype::int64 && dtype != Dtype::u8;
    case DtypeRule::wide: return dtype == Dtype::fp32 || dtype == Dtype::fp64;
    case DtypeRule::int32: return dtype == Dtype::int32;
    case DtypeRule::int64: return dtype == Dtype::int64;
    case DtypeRule::mask: return dtype == Dtype::u8;
    case DtypeRule::fp8: return is_fp8_storage(dtype);
    case DtypeRule::same_as_first: return dtype == first;
    case DtypeRule::unpacked:
      if (!is_fp8_storage(first)) return dtype == first;
      return dtype_fits(DtypeRule::floating, dtype, first) && !is_fp8_storage(dtype);
  }
  return false;
}

}  // namespace stepcast
