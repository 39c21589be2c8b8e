// Megatron-LM's mixture-of-experts flags → model and plan keys: the inverse of megatron_export.cpp's
// add_moe. Not the routing distribution the simulator draws from (no flag says it: uniform, seed 1).
// Citations are file:line in Megatron-LM at commit d98e8a64ddf3, megatron/training/arguments.py
// unless a file is named; transformer_config.py is megatron/core/transformer/transformer_config.py.
#include <algorithm>
#include <cctype>

#include "megatron_flags.hpp"

namespace stepcast {

namespace {

// The MoE flags that mean nothing without --num-experts.
const std::vector<std::string> kMoeFlags = {
    "moe-ffn-hidden-size", "moe-router-topk", "moe-shared-expert-intermediate-size", "moe-layer-freq",
    "moe-router-pre-softmax", "moe-router-load-balancing-type", "moe-aux-loss-coeff",
    "moe-token-dispatcher-type", "moe-grouped-gemm", "moe-expert-capacity-factor",
    "moe-pad-expert-input-to-capacity", "moe-token-drop-policy"};

// A --moe-layer-freq list expression, evaluated as Python would: lists of integers, '+' joins,
// '*n' (or 'n*') repeats, parentheses group. Megatron eval()s it once it holds only digits, ',',
// '[', ']', '(', ')', '+' and '*' (arguments.py:245-253).
class LayerPattern {
 public:
  LayerPattern(const MegatronFlags& f, const std::string& text) : f_(f), s_(text) {}

  std::vector<int64_t> evaluate() {
    if (s_.find_first_not_of("0123456789,[]()+*") != std::string::npos) {
      bad("holds characters other than digits , [ ] ( ) + * (arguments.py:250-251)");
    }
    std::vector<int64_t> out = sum();
    if (i_ != s_.size()) bad("has '" + s_.substr(i_, 1) + "' where the expression should end");
    return out;
  }

 private:
  [[noreturn]] void bad(const std::string& why) const {
    f_.fail("moe-layer-freq", s_, why, "an integer N, or a list expression such as \"([0]*3+[1]*58)\"");
  }
  bool next(char c) {
    if (i_ < s_.size() && s_[i_] == c) return ++i_, true;
    return false;
  }
  int64_t count() {
    size_t begin = i_;
    while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_])) && i_ - begin < 9) ++i_;
    if (i_ == begin) bad("has no number where one should be (at character " + std::to_string(i_ + 1) + ")");
    return std::stoll(s_.substr(begin, i_ - begin));
  }
  std::vector<int64_t> sum() {
    std::vector<int64_t> out = product();
    while (next('+')) {
      std::vector<int64_t> more = product();
      out.insert(out.end(), more.begin(), more.end());
    }
    return out;
  }
  std::vector<int64_t> product() {
    int64_t times = 1;
    if (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) {  // n*[...]
      times = count();
      if (!next('*')) bad("has a number that is not a list repeated");
    }
    std::vector<int64_t> one = list();
    while (next('*')) {
      times *= count();
      if (times > (1 << 20) || double(one.size()) * double(times) > double(1 << 20)) bad("unrolls to more than 2^20 layers");
    }
    std::vector<int64_t> out;
    for (int64_t k = 0; k < times; ++k) out.insert(out.end(), one.begin(), one.end());
    return out;
  }
  std::vector<int64_t> list() {
    std::vector<int64_t> out;
    if (next('(')) {
      out = sum();
      if (!next(')')) bad("has '(' without ')'");
    } else if (next('[')) {
      while (!next(']')) {
        out.push_back(count());
        if (!next(',') && !(i_ < s_.size() && s_[i_] == ']')) bad("has a list without its ']'");
      }
    } else {
      bad("has no list where one should be (at character " + std::to_string(i_ + 1) + ")");
    }
    return out;
  }

  const MegatronFlags& f_;
  std::string s_;
  size_t i_ = 0;
};

// The dense layers before the first MoE layer (first_k_dense_replace) of --moe-layer-freq: an
// integer N puts experts on every N-th layer from the first, a list says each layer (1 MoE, 0
// dense) and is num_layers long (core/models/gpt/gpt_layer_specs.py:647-670). stepcast models
// dense layers first, then MoE layers only.
int64_t dense_layers(const MegatronFlags& f, int64_t num_layers) {
  const std::string text = *f.text("moe-layer-freq");
  std::vector<int64_t> pattern;
  if (text.find('[') == std::string::npos) {  // an integer (arguments.py:342-350)
    const int64_t every = *f.integer("moe-layer-freq");
    for (int64_t l = 0; l < num_layers; ++l) pattern.push_back(l % every == 0 ? 1 : 0);
  } else {
    pattern = LayerPattern(f, text).evaluate();
    if (int64_t(pattern.size()) != num_layers) {
      f.fail("moe-layer-freq", text,
             "has " + std::to_string(pattern.size()) + " layers, the model --num-layers " + std::to_string(num_layers) +
                 " (gpt_layer_specs.py:651-656)",
             "a list of " + std::to_string(num_layers) + " entries");
    }
  }
  const auto first_moe = std::find(pattern.begin(), pattern.end(), 1);
  for (auto it = pattern.begin(); it != pattern.end(); ++it) {
    if (*it != 0 && *it != 1) f.fail("moe-layer-freq", text, "holds a value other than 0 and 1 (gpt_layer_specs.py:664-670)", "0 (dense) or 1 (MoE) per layer");
    if (it > first_moe && *it == 0) {
      f.fail("moe-layer-freq", text, "has dense layers after the first MoE layer, which are not modelled",
             "dense layers first, then MoE layers only: \"([0]*d+[1]*(num_layers-d))\", or 1");
    }
  }
  return first_moe - pattern.begin();
}

}  // namespace

void import_moe(const MegatronFlags& f, int64_t tp, Json& m, Json& p) {
  if (!f.has("num-experts")) {
    for (const std::string& name : kMoeFlags) {
      if (f.has(name)) f.fail(name, f.all().at(name), "needs experts (--num-experts)", "--num-experts E with it, or neither");
    }
    // Expert parallelism needs experts (arguments.py:1655-1656); a size of 1 changes nothing.
    for (const char* name : {"expert-model-parallel-size", "expert-tensor-parallel-size"}) {
      if (f.integer(name).value_or(1) != 1) f.fail(name, *f.text(name), "needs experts (--num-experts)", "1");
    }
    return;
  }
  const int64_t experts = *f.integer("num-experts");           // arguments.py:3518
  const int64_t top_k = f.integer("moe-router-topk").value_or(2);  // transformer_config.py:760
  if (top_k > experts) {
    f.fail("moe-router-topk", *f.text("moe-router-topk"), "exceeds the " + std::to_string(experts) + " experts",
           "an integer in [1, " + std::to_string(experts) + "]");
  }
  // With --moe-router-pre-softmax Megatron weighs by the probabilities over all experts (the
  // model's norm_topk_prob false), without it by a softmax over the top k (norm_topk_prob true,
  // written into the model: it changes the values but not the step's time or memory), except
  // at k = 1, which it refuses (transformer_config.py:2661-2669).
  if (top_k == 1 && !f.on("moe-router-pre-softmax")) {
    f.fail("moe-router-topk", "1", "needs --moe-router-pre-softmax (transformer_config.py:2661-2669)",
           "--moe-router-pre-softmax with it");
  }
  if (!f.on("moe-grouped-gemm")) {
    f.fail("num-experts", *f.text("num-experts"),
           "without --moe-grouped-gemm Megatron-LM runs the local experts one GEMM after another (SequentialMLP, "
           "core/extensions/transformer_engine_spec_provider.py:74-110); stepcast models grouped GEMMs",
           "--moe-grouped-gemm with it");
  }
  m["num_local_experts"] = experts;
  m["num_experts_per_tok"] = top_k;
  m["norm_topk_prob"] = !f.on("moe-router-pre-softmax");
  // Default ffn_hidden_size (transformer_config.py:1685-1687).
  const int64_t width = f.integer("moe-ffn-hidden-size").value_or(m.at("intermediate_size").get<int64_t>());
  m["moe_intermediate_size"] = width;  // transformer_config.py:740
  if (f.has("moe-shared-expert-intermediate-size")) {  // transformer_config.py:701-704
    const int64_t shared = *f.integer("moe-shared-expert-intermediate-size");
    if (shared % width != 0) {
      f.fail("moe-shared-expert-intermediate-size", *f.text("moe-shared-expert-intermediate-size"),
             "is not a whole number of experts of --moe-ffn-hidden-size " + std::to_string(width) +
                 " (stepcast's shared experts are n_shared_experts experts of the routed width)",
             "a multiple of " + std::to_string(width));
    }
    m["n_shared_experts"] = shared / width;
  }
  if (f.has("moe-layer-freq")) {  // arguments.py:3520, default 1: every layer
    m["first_k_dense_replace"] = dense_layers(f, m.at("num_hidden_layers").get<int64_t>());
  }
  // aux_loss (Switch's, the default) or none (arguments.py:3532-3535); the coefficient default 0.0.
  const std::string balancing = f.choice("moe-router-load-balancing-type", {"aux_loss", "none"}, "aux_loss");
  const double coefficient = f.number("moe-aux-loss-coeff", 0, 1e6).value_or(0.0);  // arguments.py:3536
  m["router_aux_loss_coef"] = balancing == "none" ? 0.0 : coefficient;

  if (f.has("expert-model-parallel-size")) p["expert_model_parallel_size"] = *f.integer("expert-model-parallel-size");
  const int64_t etp = f.integer("expert-tensor-parallel-size").value_or(tp);  // default tp (arguments.py:587-588)
  if (f.has("expert-tensor-parallel-size")) p["expert_tensor_parallel_size"] = etp;
  if (m.at("use_bias").get<bool>() && etp > 1) {
    f.fail("expert-tensor-parallel-size", std::to_string(etp),
           "with biases (no --disable-bias-linear): Megatron-LM has expert biases with etp 1 only "
           "(transformer_config.py:2612-2615)",
           "1, or --disable-bias-linear");
  }
  // Megatron's default is allgather (transformer_config.py:891); flex (DeepEP and the like) is not modelled.
  p["moe_token_dispatcher_type"] = f.choice("moe-token-dispatcher-type", {"alltoall", "allgather"}, "allgather");
  // A negative factor is none: dropless (transformer_config.py:1836-1838).
  const double factor = f.number("moe-expert-capacity-factor", -1e6, 1e6).value_or(-1);
  if (factor == 0) {
    f.fail("moe-expert-capacity-factor", "0", "keeps no tokens", "a number > 0, or none for dropless routing");
  }
  if (f.on("moe-pad-expert-input-to-capacity") && factor < 0) {
    f.fail("moe-pad-expert-input-to-capacity", "", "needs --moe-expert-capacity-factor (transformer_config.py:1862-1866)",
           "--moe-expert-capacity-factor F with it, or neither");
  }
  // Which copies a capacity drops (transformer_config.py:932-936); dropless, nothing is.
  const std::string drop_policy = f.choice("moe-token-drop-policy", {"probs", "position"}, "probs");
  if (factor > 0) {
    p["moe_expert_capacity_factor"] = factor;  // transformer_config.py:917
    // Padded, each expert computes its capacity; else the copies kept (moe_utils.py:1074-1081).
    if (f.on("moe-pad-expert-input-to-capacity")) p["moe_pad_expert_input_to_capacity"] = true;
    p["moe_token_drop_policy"] = drop_policy;
  }
}

}  // namespace stepcast
