// The names of OpName and Grad (program.hpp): their JSON strings, parsing them back, and the
// list of valid names for messages. A new OpName value gets its name here.
#include <optional>
#include <ostream>
#include <string>

#include "program.hpp"

namespace stepcast {

const char* to_string(OpName name) {
  switch (name) {
    case OpName::none: return "";
    case OpName::word: return "word";
    case OpName::position_dropout: return "position_dropout";
    case OpName::input_norm: return "input_norm";
    case OpName::post_attn_norm: return "post_attn_norm";
    case OpName::final_norm: return "final_norm";
    case OpName::qkv: return "qkv";
    case OpName::attn_out: return "attn_out";
    case OpName::mlp_up: return "mlp_up";
    case OpName::mlp_gate: return "mlp_gate";
    case OpName::mlp_down: return "mlp_down";
    case OpName::logits: return "logits";
    case OpName::score: return "score";
    case OpName::softmax: return "softmax";
    case OpName::dropout: return "dropout";
    case OpName::value: return "value";
    case OpName::flash: return "flash";
    case OpName::rotary: return "rotary";
    case OpName::gelu: return "gelu";
    case OpName::swiglu: return "swiglu";
    case OpName::dropout_add: return "dropout_add";
    case OpName::mlp_bias_grad: return "mlp_bias_grad";
    case OpName::attn_bias_grad: return "attn_bias_grad";
    case OpName::cross_entropy_stats: return "cross_entropy_stats";
    case OpName::cross_entropy: return "cross_entropy";
    case OpName::grad_accumulate: return "grad_accumulate";
    case OpName::grad_norm: return "grad_norm";
    case OpName::adamw: return "adamw";
    case OpName::grad_stash: return "grad_stash";
    case OpName::param_pull: return "param_pull";
    case OpName::grad_push: return "grad_push";
    case OpName::norm_push: return "norm_push";
    case OpName::tp_embedding: return "tp_embedding";
    case OpName::tp_attn_out: return "tp_attn_out";
    case OpName::tp_mlp_down: return "tp_mlp_down";
    case OpName::tp_mlp_up: return "tp_mlp_up";
    case OpName::tp_qkv: return "tp_qkv";
    case OpName::tp_logits: return "tp_logits";
    case OpName::tp_cross_entropy: return "tp_cross_entropy";
    case OpName::sp_embedding: return "sp_embedding";
    case OpName::sp_ln1: return "sp_ln1";
    case OpName::sp_ln2: return "sp_ln2";
    case OpName::sp_d_attn: return "sp_d_attn";
    case OpName::sp_d_mlp: return "sp_d_mlp";
    case OpName::sp_final_norm: return "sp_final_norm";
    case OpName::grad_bucket: return "grad_bucket";
    case OpName::tied_embedding_grads: return "tied_embedding_grads";
    case OpName::sp_replicated_grads: return "sp_replicated_grads";
    case OpName::param_gather: return "param_gather";
    case OpName::zero3_param_gather: return "zero3_param_gather";
    case OpName::replica_grads: return "replica_grads";
    case OpName::cp_kv_pack: return "cp_kv_pack";
    case OpName::cp_kv: return "cp_kv";
    case OpName::cp_dkv: return "cp_dkv";
    case OpName::cp_merge: return "cp_merge";
    case OpName::cp_score: return "cp_score";
    case OpName::cp_value: return "cp_value";
    case OpName::cp_a2a_split_heads: return "cp_a2a_split_heads";
    case OpName::cp_a2a_join_seq: return "cp_a2a_join_seq";
    case OpName::cp_a2a_split_seq: return "cp_a2a_split_seq";
    case OpName::cp_a2a_join_heads: return "cp_a2a_join_heads";
    case OpName::cp_a2a: return "cp_a2a";
    case OpName::fp8_cast: return "fp8_cast";
    case OpName::fp8_weights: return "fp8_weights";
    case OpName::fp8_amax: return "fp8_amax";
    case OpName::fp8_scale_update: return "fp8_scale_update";
    case OpName::fp8_absmax: return "fp8_absmax";
    case OpName::fp8_transpose: return "fp8_transpose";
    case OpName::fp8_cast_transpose: return "fp8_cast_transpose";
    case OpName::fp8_weights_transpose: return "fp8_weights_transpose";
    case OpName::fp8_param_absmax: return "fp8_param_absmax";
    case OpName::fp8_param_cast: return "fp8_param_cast";
    case OpName::router: return "router";
    case OpName::expert_gate: return "expert_gate";
    case OpName::expert_up: return "expert_up";
    case OpName::expert_down: return "expert_down";
    case OpName::moe_route: return "moe_route";
    case OpName::moe_permute: return "moe_permute";
    case OpName::moe_unpermute: return "moe_unpermute";
    case OpName::moe_add: return "moe_add";
    case OpName::moe_aux_loss: return "moe_aux_loss";
    case OpName::moe_aux_counts: return "moe_aux_counts";
    case OpName::ep_dispatch: return "ep_dispatch";
    case OpName::ep_combine: return "ep_combine";
    case OpName::etp_gather: return "etp_gather";
    case OpName::etp_scatter: return "etp_scatter";
    case OpName::moe_route_gather: return "moe_route_gather";
    case OpName::pp_gather: return "pp_gather";
    case OpName::send: return "send";
    case OpName::recv: return "recv";
  }
  return "?";
}

const char* to_string(Grad grad) {
  switch (grad) {
    case Grad::none: return "";
    case Grad::dgrad: return "dgrad";
    case Grad::wgrad: return "wgrad";
  }
  return "?";
}

std::optional<OpName> parse_op_name(const std::string& text) {
  for (int i = 1; i <= int(OpName::recv); ++i) {
    if (text == to_string(OpName(i))) return OpName(i);
  }
  return std::nullopt;
}

std::optional<Grad> parse_grad(const std::string& text) {
  if (text == "dgrad") return Grad::dgrad;
  if (text == "wgrad") return Grad::wgrad;
  return std::nullopt;
}

std::string valid_op_names() {
  std::string valid;
  for (int i = 1; i <= int(OpName::recv); ++i) {
    if (i > 1) valid += ", ";
    valid += to_string(OpName(i));
  }
  return valid;
}

std::ostream& operator<<(std::ostream& out, OpName name) { return out << to_string(name); }
std::ostream& operator<<(std::ostream& out, Grad grad) { return out << to_string(grad); }

}  // namespace stepcast
