// Which measured memory-bound table costs an op (cost_model.hpp's memory_families and
// memory_family): the families the profiles measure, and each op's family by kind, name and phase.
#include <string>
#include <vector>

#include "cost_model.hpp"

namespace stepcast {

namespace {

const char* phase_suffix(Phase phase) {
  return phase == Phase::backward ? "_backward" : "_forward";
}

}  // namespace

const std::vector<std::string>& memory_families() {
  static const std::vector<std::string> families = {
      "adamw",          "attention_dropout_forward", "copy",           "cross_entropy_backward",
      "cross_entropy_forward", "cross_entropy_softmax", "cross_entropy_stats", "cross_entropy_unfused_backward",
      "cross_entropy_unfused_forward", "dropout_add_forward",
      "dropout_backward",
      "embedding_backward", "embedding_forward",     "gelu_backward",
      "gelu_forward",   "grad_norm",                 "layernorm_backward", "layernorm_forward",
      "moe_permute_backward", "moe_permute_forward", "moe_route_backward", "moe_route_forward",
      "moe_unpermute_backward", "moe_unpermute_forward", "norm_backward",  "norm_forward",
      "residual_add",   "rotary_backward",
      "rotary_forward", "softmax_backward",          "softmax_forward", "swiglu_backward",
      "swiglu_forward"};
  return families;
}

std::string memory_family(const Op& op, const std::string& norm_type, bool cross_entropy_fusion) {
  switch (op.kind) {
    case OpKind::norm:
      return std::string(norm_type == "layernorm" ? "layernorm" : "norm") + phase_suffix(op.phase);
    case OpKind::activation:
      if (op.name == OpName::swiglu || op.name == OpName::gelu || op.name == OpName::rotary) {
        return to_string(op.name) + std::string(phase_suffix(op.phase));
      }
      // Its backward is the masked scale of every dropout; without dropout (no mask output) the
      // forward is the residual add alone.
      // Context parallelism: packing K/V is a copy; merging partial outputs, or adding a block's
      // dK/dV into its accumulator or into d_qkv, an elementwise add.
      // Ulysses' re-layouts around its all_to_alls permute heads or tokens: copies too.
      if (op.name == OpName::cp_kv_pack || op.name == OpName::cp_a2a_split_heads || op.name == OpName::cp_a2a_join_seq ||
          op.name == OpName::cp_a2a_split_seq || op.name == OpName::cp_a2a_join_heads) {
        return "copy";
      }
      // An FP8 cast reads its input and writes a byte an element: a copy's traffic.
      // Current scaling's amax reads its tensor once: a copy's rate on those bytes.
      if (op.name == OpName::fp8_cast || op.name == OpName::fp8_weights || op.name == OpName::fp8_absmax ||
          op.name == OpName::fp8_transpose || op.name == OpName::fp8_cast_transpose ||
          op.name == OpName::fp8_weights_transpose || op.name == OpName::fp8_param_absmax ||
          op.name == OpName::fp8_param_cast) {
        return "copy";
      }
      if (op.name == OpName::cp_merge || op.name == OpName::cp_dkv) return "residual_add";
      // Mixture of experts: the router's softmax and top-k per token (forward; the backward
      // through both and the aux loss's gradient), moving each token's k copies to the experts'
      // order (its backward summing them back) and the weighted sum back (its backward scaling
      // the gradient to each copy and the routing weights' gradient) measured as families of
      // their own (a profile without the last two: copies); adding the shared experts' output,
      // an elementwise add.
      if (op.name == OpName::moe_route || op.name == OpName::moe_permute || op.name == OpName::moe_unpermute) {
        return to_string(op.name) + std::string(phase_suffix(op.phase));
      }
      if (op.name == OpName::moe_add) return "residual_add";
      if (op.name == OpName::dropout_add) {
        if (op.phase == Phase::backward) return "dropout_backward";
        return op.outputs.size() > 1 ? "dropout_add_forward" : "residual_add";
      }
      return "";
    case OpKind::loss:
      // Unfused, every pass of the loss is one of Megatron's PyTorch ops over the logits: the
      // statistics' and the division's passes of tensor parallelism as the whole forward's.
      if (!cross_entropy_fusion && (op.name == OpName::cross_entropy_stats || op.name == OpName::cross_entropy)) {
        return std::string("cross_entropy_unfused") + phase_suffix(op.phase);
      }
      if (op.name == OpName::cross_entropy_stats) return "cross_entropy_stats";
      // Under tp > 1 the forward reads the gathered statistics: its softmax pass alone.
      if (op.name == OpName::cross_entropy && op.phase != Phase::backward && op.inputs.size() > 2) {
        return "cross_entropy_softmax";
      }
      return op.name == OpName::cross_entropy ? std::string("cross_entropy") + phase_suffix(op.phase) : "";
    case OpKind::embedding:
      // After the lookup: dropout of the embedding (forward [x, (position)] → [out, (mask)],
      // backward [g, (mask)] → [(position grads), d]), a copy where there is no dropout.
      if (op.name == OpName::position_dropout) {
        bool backward = op.phase == Phase::backward;
        bool masked = backward ? op.inputs.size() > 1 : op.outputs.size() > 1;
        if (!masked) return "copy";
        return backward ? "dropout_backward" : "dropout_add_forward";
      }
      // The vocabulary-parallel lookup and its gradient rows' accumulation.
      if (op.name == OpName::word) return std::string("embedding") + phase_suffix(op.phase);
      return "";
    case OpKind::attention:
      if (op.name == OpName::softmax) return std::string("softmax") + phase_suffix(op.phase);
      if (op.name == OpName::dropout) {
        return op.phase == Phase::backward ? "dropout_backward" : "attention_dropout_forward";
      }
      return "";
    case OpKind::optimizer_step:
      if (op.name == OpName::grad_norm || op.name == OpName::adamw) return to_string(op.name);
      if (op.name == OpName::grad_accumulate) return "residual_add";  // two tensors in, their sum out
      if (op.name == OpName::grad_stash) return "copy";
      return "";
    default:
      return "";
  }
}

}  // namespace stepcast
