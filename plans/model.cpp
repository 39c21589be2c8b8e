// Reading a model config and the exact parameter and model-FLOP counts; see model.hpp.
// Each architectural choice is decided by, in this order: stepcast's own key, the HuggingFace
// field that implies it (rms_norm_eps, hidden_act, attention_bias), model_type's family default;
// if none decides it, the error names stepcast's key. Only load_model does I/O.
#include "model.hpp"

#include <filesystem>
#include <iomanip>
#include <optional>
#include <sstream>
#include <vector>

#include "errors.hpp"

namespace stepcast {

namespace {

// Keys parse_model reads: stepcast's own, HuggingFace's, GPT-2's aliases.
const std::vector<std::string> kReadKeys = {
    "name", "notes", "seq_length", "norm_type", "mlp_type", "position_embedding_type", "use_bias",
    "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "intermediate_size", "vocab_size", "max_position_embeddings",
    "head_dim", "tie_word_embeddings", "hidden_act", "activation_function", "rms_norm_eps",
    "layer_norm_epsilon", "layer_norm_eps", "attention_bias", "mlp_bias",
    "n_embd", "n_layer", "n_head", "n_positions", "n_ctx", "n_inner", "n_special", "norm_eps",
    // read to decide whether they matter (sliding windows, MoE, Qwen3's layer kinds)
    "sliding_window", "use_sliding_window", "max_window_layers", "layer_types",
    // mixture of experts (HuggingFace's Mixtral, Qwen3-MoE, DeepSeek-V3 and GPT-OSS names)
    "num_local_experts", "n_routed_experts", "num_experts", "num_experts_per_tok", "experts_per_token",
    "moe_intermediate_size", "n_shared_experts", "first_k_dense_replace", "router_aux_loss_coef", "norm_topk_prob",
    "aux_loss_alpha", "decoder_sparse_step", "mlp_only_layers", "moe_layer_freq"};

// HuggingFace keys accepted but not modelled: they change neither shapes nor GEMM FLOPs.
const std::vector<std::string> kIgnoredKeys = {
    // identification, tokenizer ids, storage dtype, inference-time switches
    "_name_or_path", "architectures", "transformers_version", "bos_token_id", "eos_token_id",
    "pad_token_id", "torch_dtype", "dtype", "use_cache", "pretraining_tp",
    // initialisation is a training hyper-parameter, not shape (dropout rates: kDropoutKeys)
    "initializer_range",
    // rotary frequencies change values, not shapes
    "rope_theta", "rope_scaling", "partial_rotary_factor", "original_max_position_embeddings",
    // GPT-2: the multiple-choice head of GPT2DoubleHeadsModel, generation defaults, softmax scaling
    "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
    "summary_first_dropout", "task_specific_params", "predict_special_tokens",
    "scale_attn_weights", "reorder_and_upcast_attn", "scale_attn_by_inverse_layer_idx",
    // MoE routing details that change which experts a token goes to, not how many nor their
    // shapes: top-k renormalisation, scaling, group-limited routing, jitter, GPT-OSS's clamp
    "routed_scaling_factor", "scoring_func", "topk_method", "n_group", "topk_group",
    "output_router_logits", "router_jitter_noise", "swiglu_limit", "seq_aux"};

// HuggingFace's dropout rates (GPT-2's, Llama's, Mistral's, Qwen2/3's, Phi-3's): accepted and read
// for ModelConfig::stated_dropout.
const std::vector<std::string> kDropoutKeys = {"attention_dropout", "attn_pdrop", "resid_pdrop", "embd_pdrop",
                                               "hidden_dropout", "resid_dropout", "embd_dropout",
                                               "attention_probs_dropout_prob"};

// No real model has a dimension near 2^31; the bound keeps every count below int64 overflow
// together with the parameter bound.
constexpr int64_t kMaxSize = (int64_t{1} << 31) - 1;
constexpr double kMaxParameters = 9.0e15;  // ~2^53: counts stay exact in a double

// What model_type implies when nothing more specific is given.
struct FamilyDefaults {
  NormKind norm;
  MlpKind mlp;
  PositionKind position;
  bool use_bias;
  bool tie_word_embeddings;  // HF GPT2Config ties, LlamaConfig does not
};

struct SizeKey {
  std::string key;  // the name it was given under, for messages
  int64_t value;
};

// A size under its HF name or an alias; aliases given together must agree. With `null_is_absent`
// JSON null means unset, as HF writes n_inner and num_key_value_heads.
std::optional<SizeKey> read_size(ObjectReader& reader, const Json& json,
                                 const std::vector<std::string>& names, bool null_is_absent) {
  std::optional<SizeKey> found;
  for (const auto& name : names) {
    if (null_is_absent && json.contains(name) && json.at(name).is_null()) continue;
    auto value = reader.get_optional_int(name, 1);
    if (!value) continue;
    if (*value > kMaxSize) reader.fail(name, "out of range", "an integer in [1, 2^31)");
    if (found && found->value != *value) {
      reader.fail(name, "disagrees with '" + found->key + "' = " + std::to_string(found->value),
                  "the same value, or only one of them");
    }
    if (!found) found = SizeKey{name, *value};
  }
  return found;
}

SizeKey require_size(ObjectReader& reader, const Json& json,
                     const std::vector<std::string>& names) {
  auto found = read_size(reader, json, names, false);
  if (!found) {
    std::string valid = "an integer >= 1";
    for (size_t i = 1; i < names.size(); ++i) valid += (i == 1 ? " (alias: " : ", ") + names[i];
    if (names.size() > 1) valid += ")";
    reader.fail(names[0], "missing required key", valid);
  }
  return *found;
}

// hidden_act / activation_function: the activation decides the MLP kind for the GPT-2 and
// Llama families (SiLU is always gated there). GeGLU models (Gemma) are not modelled.
std::optional<MlpKind> read_activation(ObjectReader& reader, const std::string& key) {
  if (!reader.has(key)) return std::nullopt;
  std::string act =
      reader.get_enum(key, {"gelu", "gelu_new", "gelu_pytorch_tanh", "silu", "swiglu"});
  return (act == "silu" || act == "swiglu") ? MlpKind::swiglu : MlpKind::gelu;
}

NormKind decide_norm(ObjectReader& reader, const std::optional<FamilyDefaults>& family) {
  // Epsilons are validated even when norm_type decides: stepcast does not store them.
  bool rms = false, layer = false;
  std::string layer_key;
  for (const char* key : {"rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps"}) {
    if (!reader.has(key)) continue;
    reader.get_number(key, 0.0, true);
    if (std::string(key) == "rms_norm_eps") {
      rms = true;
    } else {
      layer = true;
      layer_key = key;
    }
  }
  if (reader.has("norm_type")) {
    return reader.get_enum("norm_type", {"layernorm", "rmsnorm"}) == "rmsnorm"
               ? NormKind::rmsnorm
               : NormKind::layernorm;
  }
  if (rms && layer) {
    reader.fail("rms_norm_eps", "conflicts with '" + layer_key + "'",
                "one norm epsilon, or norm_type");
  }
  if (rms) return NormKind::rmsnorm;
  if (layer) return NormKind::layernorm;
  if (family) return family->norm;
  reader.fail("norm_type", "missing: no norm_type, norm epsilon or model_type decides it",
              "\"layernorm\" or \"rmsnorm\"");
}

MlpKind decide_mlp(ObjectReader& reader, const std::optional<FamilyDefaults>& family) {
  auto hidden_act = read_activation(reader, "hidden_act");
  auto activation_function = read_activation(reader, "activation_function");  // GPT-2's name
  if (reader.has("mlp_type")) {
    return reader.get_enum("mlp_type", {"gelu", "swiglu"}) == "swiglu" ? MlpKind::swiglu
                                                                       : MlpKind::gelu;
  }
  if (hidden_act && activation_function && *hidden_act != *activation_function) {
    reader.fail("activation_function", "conflicts with 'hidden_act'", "only one of them");
  }
  if (hidden_act) return *hidden_act;
  if (activation_function) return *activation_function;
  if (family) return family->mlp;
  reader.fail("mlp_type", "missing: no mlp_type, hidden_act or model_type decides it",
              "\"gelu\" or \"swiglu\"");
}

PositionKind decide_position(ObjectReader& reader, const std::optional<FamilyDefaults>& family) {
  if (reader.has("position_embedding_type")) {
    return reader.get_enum("position_embedding_type", {"learned", "rotary"}) == "rotary"
               ? PositionKind::rotary
               : PositionKind::learned;
  }
  if (family) return family->position;
  reader.fail("position_embedding_type", "missing: no position_embedding_type or model_type "
              "decides it", "\"learned\" or \"rotary\"");
}

// One flag covers every linear layer; HF Llama's attention_bias and mlp_bias must then agree.
bool decide_use_bias(ObjectReader& reader, const std::optional<FamilyDefaults>& family) {
  std::optional<bool> attention, mlp;
  if (reader.has("attention_bias")) attention = reader.get_bool_or("attention_bias", false);
  if (reader.has("mlp_bias")) mlp = reader.get_bool_or("mlp_bias", false);
  if (reader.has("use_bias")) return reader.get_bool_or("use_bias", false);
  if (attention && mlp && *attention != *mlp) {
    reader.fail("mlp_bias", "differs from 'attention_bias'; stepcast has one flag, use_bias",
                "the same value as attention_bias, or use_bias");
  }
  if (attention) return *attention;
  if (mlp) return *mlp;
  if (family) return family->use_bias;
  reader.fail("use_bias", "missing: no use_bias, attention_bias or model_type decides it",
              "true or false");
}

bool decide_tie(ObjectReader& reader, const std::optional<FamilyDefaults>& family) {
  if (reader.has("tie_word_embeddings")) return reader.get_bool_or("tie_word_embeddings", true);
  if (family) return family->tie_word_embeddings;
  reader.fail("tie_word_embeddings", "missing: no tie_word_embeddings or model_type decides it",
              "true or false");
}

template <typename T>
T mlp_weights(const ModelConfig& m, int64_t width) {
  return (m.mlp == MlpKind::swiglu ? 3 : 2) * T(m.hidden_size) * T(width);
}

// Biases of one MLP of `width`: up (and gate), down.
template <typename T>
T mlp_biases(const ModelConfig& m, int64_t width) {
  if (!m.use_bias) return 0;
  return (m.mlp == MlpKind::swiglu ? 2 : 1) * T(width) + T(m.hidden_size);
}

// Weights of the linear layers of transformer layer `layer` (no biases, no norms) that a token
// passes through — every expert (`active` false) or the k it is routed to and the shared ones.
template <typename T>
T layer_linear_weights(const ModelConfig& m, int64_t layer, bool active) {
  T h = T(m.hidden_size), kv = T(m.kv_size()), q = T(m.q_size());
  T attention = h * q + 2 * h * kv + q * h;  // q, k, v, o
  if (!m.is_moe_layer(layer)) return attention + mlp_weights<T>(m, m.intermediate_size);
  T routed = T(active ? m.num_experts_per_tok : m.num_experts);
  T experts = (routed + T(m.n_shared_experts)) * mlp_weights<T>(m, m.moe_intermediate_size);
  return attention + h * T(m.num_experts) + experts;  // router
}

template <typename T>
T norm_parameters(const ModelConfig& m) {
  // LayerNorm keeps its bias whatever use_bias says (as HF GPT-2 does).
  return T(m.norm == NormKind::layernorm ? 2 : 1) * T(m.hidden_size);
}

template <typename T>
T layer_parameters(const ModelConfig& m, int64_t layer, bool active) {
  T h = T(m.hidden_size), kv = T(m.kv_size()), q = T(m.q_size());
  T bias = 0;
  if (m.use_bias) {
    bias = (q + 2 * kv) + h;  // qkv, o
    if (!m.is_moe_layer(layer)) {
      bias += mlp_biases<T>(m, m.intermediate_size);
    } else {
      T routed = T(active ? m.num_experts_per_tok : m.num_experts);
      bias += T(m.num_experts) + (routed + T(m.n_shared_experts)) * mlp_biases<T>(m, m.moe_intermediate_size);
    }
  }
  return layer_linear_weights<T>(m, layer, active) + bias + 2 * norm_parameters<T>(m);
}

template <typename T>
T model_parameters(const ModelConfig& m, bool active = false) {
  T h = T(m.hidden_size), V = T(m.vocab_size);
  T embeddings = V * h;
  if (m.position == PositionKind::learned) embeddings += T(m.max_position_embeddings) * h;
  T output = m.tie_word_embeddings ? T(0) : V * h;
  T layers = 0;
  for (int64_t l = 0; l < m.num_hidden_layers; ++l) layers += layer_parameters<T>(m, l, active);
  return embeddings + layers + norm_parameters<T>(m) + output;
}

}  // namespace

const char* to_string(NormKind kind) {
  return kind == NormKind::rmsnorm ? "rmsnorm" : "layernorm";
}
const char* to_string(MlpKind kind) { return kind == MlpKind::swiglu ? "swiglu" : "gelu"; }
const char* to_string(PositionKind kind) {
  return kind == PositionKind::rotary ? "rotary" : "learned";
}

int64_t layer_parameter_count(const ModelConfig& model) {
  return layer_parameters<int64_t>(model, 0, false);
}

int64_t layer_parameter_count(const ModelConfig& model, int64_t layer) {
  return layer_parameters<int64_t>(model, layer, false);
}

int64_t expert_parameter_count(const ModelConfig& model) {
  return mlp_weights<int64_t>(model, model.moe_intermediate_size) +
         mlp_biases<int64_t>(model, model.moe_intermediate_size);
}

int64_t parameter_count(const ModelConfig& model) { return model_parameters<int64_t>(model); }

int64_t active_parameter_count(const ModelConfig& model) { return model_parameters<int64_t>(model, true); }

double model_flops_per_token(const ModelConfig& model) {
  double h = double(model.hidden_size), s = double(model.seq_length);
  double V = double(model.vocab_size);
  // QK^T and A·V: 2·s·(a·d) each per token over the full s×s matrix (no causal halving, as
  // Megatron). Every query head attends, so GQA does not reduce it.
  double attention_scores = 4.0 * s * double(model.q_size());
  double forward = 2.0 * h * V;  // logits
  for (int64_t l = 0; l < model.num_hidden_layers; ++l) {
    forward += 2.0 * layer_linear_weights<double>(model, l, true) + attention_scores;
  }
  return 3.0 * forward;          // backward = 2 × forward
}

namespace {

// Trains at `seq_length` (--seq-length, named by `source` in errors).
void set_seq_length(ModelConfig& model, int64_t seq_length, const std::string& source) {
  auto refuse = [&](const std::string& why, const std::string& valid) {
    throw_input_error(source, "seq_length", std::to_string(seq_length), why + " (" + model.file + ")", valid);
  };
  if (seq_length < 1 || seq_length > kMaxSize) refuse("out of range", "an integer in [1, 2^31)");
  bool beyond = seq_length > model.max_position_embeddings;
  if (beyond && model.position == PositionKind::learned) {
    refuse("exceeds the learned position table (max_position_embeddings = " +
               std::to_string(model.max_position_embeddings) + ")",
           "at most " + std::to_string(model.max_position_embeddings));
  }
  if (beyond && !model.rope_scaling) {
    refuse("exceeds max_position_embeddings = " + std::to_string(model.max_position_embeddings) +
               " and the config has no rope_scaling",
           "at most " + std::to_string(model.max_position_embeddings) + ", or a config with rope_scaling");
  }
  model.seq_length = seq_length;
  model.seq_length_from = source;
}

// The dropout rates a config states, each a number in [0, 1): the model's stated dropout where they
// agree (plan's and compare-strategies' default --dropout; a plan file's dropout is what runs).
void read_stated_dropout(ObjectReader& reader, const Json& json, ModelConfig& m) {
  std::optional<double> first;
  bool agree = true;
  for (const std::string& key : kDropoutKeys) {
    if (!json.contains(key) || json.at(key).is_null()) continue;
    double p = reader.get_number_between(key, 0.0, 1.0);
    if (p >= 1.0) reader.fail(key, "is 1 (every activation dropped)", "a number in [0, 1)");
    m.dropout_keys.push_back(key);
    if (first && *first != p) agree = false;
    if (!first) first = p;
  }
  if (agree) m.stated_dropout = first;
}

// A sliding window changes attention's cost only when it is shorter than the sequence: accepted
// (and listed as ignored) where it is not in use or at least seq_length long, refused otherwise.
void check_sliding_window(ObjectReader& reader, const Json& json, ModelConfig& m) {
  bool in_use = !json.contains("use_sliding_window") || reader.get_bool_or("use_sliding_window", false);
  for (const char* key : {"use_sliding_window", "max_window_layers"}) {
    if (json.contains(key)) m.ignored_keys.push_back(key);
  }
  if (json.contains("max_window_layers") && !json.at("max_window_layers").is_null()) {
    reader.get_int("max_window_layers", 0);
  }
  if (!json.contains("sliding_window")) return;
  m.ignored_keys.push_back("sliding_window");
  if (json.at("sliding_window").is_null() || !in_use) return;
  int64_t window = reader.get_int("sliding_window", 1);
  if (window < m.seq_length) {
    reader.fail("sliding_window",
                "is shorter than the sequence (" + std::to_string(m.seq_length) +
                    " tokens, from " + m.seq_length_from + "): sliding-window attention is not modelled",
                "null, or at least the sequence length (or --seq-length " + std::to_string(window) + ")");
  }
}

// The expert keys (model.hpp): the count under any of its three names (which must agree), top-k
// (GPT-OSS's experts_per_token too), the expert width, shared experts, the dense first layers,
// the aux-loss weight. Every MoE layer routes the same way: HF's decoder_sparse_step and
// moe_layer_freq must be 1 and mlp_only_layers empty.
void read_experts(ObjectReader& reader, const Json& json, ModelConfig& m, const std::optional<SizeKey>& intermediate) {
  auto experts = read_size(reader, json, {"num_local_experts", "n_routed_experts", "num_experts"}, true);
  auto top_k = read_size(reader, json, {"num_experts_per_tok", "experts_per_token"}, true);
  for (const char* key : {"moe_intermediate_size", "n_shared_experts", "first_k_dense_replace"}) {
    if (!experts && json.contains(key) && !json.at(key).is_null()) {
      reader.fail(key, "set without experts", "num_local_experts (or n_routed_experts, num_experts) as well");
    }
  }
  if (!experts) {
    if (top_k) reader.fail(top_k->key, "set without experts", "num_local_experts (or n_routed_experts) as well");
    // Routing keys of a config without experts change nothing, but a wrong value is still refused.
    auto given = [&](const char* key) { return json.contains(key) && !json.at(key).is_null(); };
    for (const char* key : {"decoder_sparse_step", "moe_layer_freq"}) {
      if (given(key)) reader.get_int(key, 1);
    }
    for (const char* key : {"router_aux_loss_coef", "aux_loss_alpha"}) {
      if (given(key)) reader.get_number(key, 0.0, false);
    }
    if (given("norm_topk_prob")) reader.get_bool_or("norm_topk_prob", false);
    if (given("mlp_only_layers")) reader.get_int_list("mlp_only_layers", 0);
    return;
  }
  m.num_experts = experts->value;
  if (!top_k) reader.fail("num_experts_per_tok", "missing: a mixture of experts routes each token to k experts",
                          "an integer in [1, " + std::to_string(m.num_experts) + "]");
  if (top_k->value > m.num_experts) {
    reader.fail(top_k->key, "= " + std::to_string(top_k->value) + " exceeds " + experts->key + " = " +
                std::to_string(m.num_experts), "an integer in [1, " + std::to_string(m.num_experts) + "]");
  }
  m.num_experts_per_tok = top_k->value;
  auto width = read_size(reader, json, {"moe_intermediate_size"}, true);
  if (!width && !intermediate) {
    reader.fail("moe_intermediate_size", "missing: no expert width", "an integer >= 1 (or intermediate_size)");
  }
  m.moe_intermediate_size = width ? width->value : intermediate->value;
  m.n_shared_experts = json.contains("n_shared_experts") && json.at("n_shared_experts").is_null()
                           ? 0 : reader.get_int_or("n_shared_experts", 0, 0);
  m.first_k_dense_replace = reader.get_int_or("first_k_dense_replace", 0, 0);
  if (m.first_k_dense_replace > m.num_hidden_layers) {
    reader.fail("first_k_dense_replace", "exceeds num_hidden_layers = " + std::to_string(m.num_hidden_layers),
                "an integer in [0, " + std::to_string(m.num_hidden_layers) + "]");
  }
  if (m.first_k_dense_replace > 0 && !intermediate) {
    reader.fail("intermediate_size", "missing: the dense first layers need a width", "an integer >= 1");
  }
  for (const char* key : {"decoder_sparse_step", "moe_layer_freq"}) {
    if (json.contains(key) && reader.get_int(key, 1) != 1) {
      reader.fail(key, "experts on every other layer are not modelled", "1 (or first_k_dense_replace)");
    }
  }
  if (json.contains("mlp_only_layers") && !(json.at("mlp_only_layers").is_array() && json.at("mlp_only_layers").empty())) {
    reader.fail("mlp_only_layers", "dense layers among the MoE layers are not modelled", "[] (or first_k_dense_replace)");
  }
  // DeepSeek names it aux_loss_alpha.
  for (const char* key : {"router_aux_loss_coef", "aux_loss_alpha"}) {
    if (reader.has(key)) m.router_aux_loss_coef = reader.get_number(key, 0.0, false);
  }
  // HF's MixtralSparseMoeBlock divides the top-k weights by their sum, and GPT-OSS takes the
  // softmax over the top-k logits (the same weights); other configs say so with norm_topk_prob.
  const bool renormalizes = json.contains("model_type") && (json.at("model_type") == "mixtral" ||
                                                             json.at("model_type") == "gpt_oss");
  m.norm_topk_prob = reader.get_bool_or("norm_topk_prob", renormalizes);
}

}  // namespace

ModelConfig parse_model(const Json& json, const std::string& file, std::optional<int64_t> seq_override) {
  ObjectReader reader(json, file);
  // Typos first: a misspelt required key is reported as unknown with the closest name, rather
  // than as missing.
  reader.accept_any_of(kReadKeys);
  reader.accept_any_of(kIgnoredKeys);
  reader.accept_any_of(kDropoutKeys);
  reader.finish();

  ModelConfig m;
  m.file = file;
  m.name = reader.get_string_or("name", std::filesystem::path(file).stem().string());
  reader.get_string_or("notes", "");  // free text: where the shape comes from

  std::optional<FamilyDefaults> family;
  if (reader.has("model_type")) {
    // Gemma's GeGLU MLP and head widths other than hidden / heads are not modelled: refused by
    // name rather than costed as something else.
    for (const char* gemma : {"gemma", "gemma2", "gemma3", "gemma3_text"}) {
      if (reader.has("model_type") && json.at("model_type") == gemma) {
        reader.fail("model_type", "\"" + std::string(gemma) + "\": Gemma's GeGLU MLP is not modelled",
                    "gpt2, llama, mistral, qwen2, qwen3, phi3");
      }
    }
    // Mistral, Qwen2/3 and Phi-3 are Llama-shaped decoders (RMSNorm, SwiGLU, rotary, no
    // biases on the linear layers; Qwen2's q/k/v biases, 3·h parameters a layer, are left out).
    // Mixtral, Qwen3-MoE, DeepSeek-V3 and GPT-OSS are the same with expert MLPs (their MoE keys).
    if (reader.get_enum("model_type", {"gpt2", "llama", "mistral", "qwen2", "qwen3", "phi3", "mixtral", "qwen3_moe",
                                       "deepseek_v3", "gpt_oss"}) == "gpt2") {
      family = FamilyDefaults{NormKind::layernorm, MlpKind::gelu, PositionKind::learned, true,
                              true};
    } else {
      family = FamilyDefaults{NormKind::rmsnorm, MlpKind::swiglu, PositionKind::rotary, false,
                              false};
    }
  }
  m.norm = decide_norm(reader, family);
  // The epsilon of whichever norm key is present; HF's defaults otherwise (LlamaConfig 1e-6,
  // GPT2Config 1e-5).
  m.norm_eps = m.norm == NormKind::rmsnorm ? 1e-6 : 1e-5;
  for (const char* key : {"rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps", "norm_eps"}) {
    if (reader.has(key)) m.norm_eps = reader.get_number(key, 0.0, true);
  }
  m.rope_theta = reader.get_number_or("rope_theta", 0.0, true, 10000.0);
  m.mlp = decide_mlp(reader, family);
  m.position = decide_position(reader, family);
  m.use_bias = decide_use_bias(reader, family);
  m.tie_word_embeddings = decide_tie(reader, family);

  SizeKey hidden = require_size(reader, json, {"hidden_size", "n_embd"});
  SizeKey layers = require_size(reader, json, {"num_hidden_layers", "n_layer"});
  SizeKey heads = require_size(reader, json, {"num_attention_heads", "n_head"});
  SizeKey vocab = require_size(reader, json, {"vocab_size"});
  // n_ctx is GPT-2's legacy name for the same context length.
  SizeKey positions =
      require_size(reader, json, {"max_position_embeddings", "n_positions", "n_ctx"});
  // Absent or null: every head has its own K and V (HF's documented meaning).
  auto kv_heads = read_size(reader, json, {"num_key_value_heads"}, true);
  auto intermediate = read_size(reader, json, {"intermediate_size", "n_inner"}, true);
  // Absent: train at the full context the model was built for.
  auto seq_length = read_size(reader, json, {"seq_length"}, false);
  auto head_dim = read_size(reader, json, {"head_dim"}, false);
  if (reader.get_int_or("n_special", 0, 0) != 0) {
    reader.fail("n_special", "extra special-token embeddings are not modelled",
                "0 (add them to vocab_size)");
  }

  m.hidden_size = hidden.value;
  m.num_hidden_layers = layers.value;
  m.num_attention_heads = heads.value;
  m.num_key_value_heads = kv_heads ? kv_heads->value : heads.value;
  m.vocab_size = vocab.value;
  m.max_position_embeddings = positions.value;
  m.seq_length = seq_length ? seq_length->value : positions.value;
  m.seq_length_from = seq_length ? "seq_length" : positions.key;
  m.rope_scaling = json.contains("rope_scaling") && !json.at("rope_scaling").is_null();
  if (seq_override) set_seq_length(m, *seq_override, "--seq-length");
  read_experts(reader, json, m, intermediate);
  if (json.contains("layer_types")) {
    if (!json.at("layer_types").is_array() && !json.at("layer_types").is_null()) {
      reader.fail("layer_types", "is " + printable_excerpt(json.at("layer_types").dump()) + ", not a list",
                  "a list with one entry a layer, every one \"full_attention\"");
    }
    for (const Json& kind : json.at("layer_types")) {
      if (kind != "full_attention") {
        reader.fail("layer_types", "has " + kind.dump() + " layers: only full attention is modelled",
                    "every entry \"full_attention\"");
      }
    }
    m.ignored_keys.push_back("layer_types");
  }
  if (intermediate) {
    m.intermediate_size = intermediate->value;
  } else if (m.is_moe()) {
    m.intermediate_size = m.moe_intermediate_size;  // every layer routes (read_experts checked)
  } else if (m.mlp == MlpKind::gelu) {
    m.intermediate_size = 4 * m.hidden_size;  // GPT-2's n_inner = null
  } else {
    reader.fail("intermediate_size", "missing required key (a SwiGLU MLP has no standard width)",
                "an integer >= 1");
  }

  if (m.hidden_size % m.num_attention_heads != 0) {
    reader.fail(heads.key, "does not divide " + hidden.key + " = " + std::to_string(m.hidden_size),
                "a divisor of " + std::to_string(m.hidden_size));
  }
  if (m.num_attention_heads % m.num_key_value_heads != 0) {
    reader.fail("num_key_value_heads",
                "does not divide " + heads.key + " = " + std::to_string(m.num_attention_heads),
                "a divisor of " + std::to_string(m.num_attention_heads));
  }
  if (head_dim && head_dim->value != m.head_dim()) m.head_dim_override = head_dim->value;
  if (m.position == PositionKind::learned && m.seq_length > m.max_position_embeddings) {
    reader.fail("seq_length",
                "exceeds " + positions.key + " = " + std::to_string(m.max_position_embeddings) +
                    " (a learned position table has one row per position)",
                "an integer in [1, " + std::to_string(m.max_position_embeddings) + "]");
  }
  for (const std::string& key : kIgnoredKeys) {
    if (json.contains(key) && key != "rope_theta") m.ignored_keys.push_back(key);
  }
  check_sliding_window(reader, json, m);
  read_stated_dropout(reader, json, m);
  double parameters = model_parameters<double>(m);
  if (parameters > kMaxParameters) {
    std::ostringstream why;
    why << "the model would have " << std::setprecision(3) << parameters << " parameters";
    throw_input_error(file, hidden.key, std::to_string(m.hidden_size), why.str(),
                      "a model under 9e15 parameters");
  }
  return m;
}

ModelConfig load_model(const std::string& path, std::optional<int64_t> seq_length) {
  return parse_model(load_json_file(path), path, seq_length);
}



Json model_to_json(const ModelConfig& model) {
  Json json{{"name", model.name},
              {"hidden_size", model.hidden_size},
              {"num_hidden_layers", model.num_hidden_layers},
              {"num_attention_heads", model.num_attention_heads},
              {"num_key_value_heads", model.num_key_value_heads},
              {"intermediate_size", model.intermediate_size},
              {"vocab_size", model.vocab_size},
              {"max_position_embeddings", model.max_position_embeddings},
              {"seq_length", model.seq_length},
              {"norm_type", to_string(model.norm)},
              {"norm_eps", model.norm_eps},
              {"rope_theta", model.rope_theta},
              {"mlp_type", to_string(model.mlp)},
              {"position_embedding_type", to_string(model.position)},
              {"tie_word_embeddings", model.tie_word_embeddings},
              {"use_bias", model.use_bias}};
  if (model.head_dim_override > 0) json["head_dim"] = model.head_dim_override;
  if (model.is_moe()) {
    json["num_local_experts"] = model.num_experts;
    json["num_experts_per_tok"] = model.num_experts_per_tok;
    json["moe_intermediate_size"] = model.moe_intermediate_size;
    json["n_shared_experts"] = model.n_shared_experts;
    json["first_k_dense_replace"] = model.first_k_dense_replace;
    json["router_aux_loss_coef"] = model.router_aux_loss_coef;
    json["norm_topk_prob"] = model.norm_topk_prob;
  }
  return json;
}

}  // namespace stepcast
