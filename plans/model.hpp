// A decoder-only transformer's shape, read from a HuggingFace-style config.json, and the two
// counts everything else is checked against: parameters and model FLOPs per token.
// Model FLOPs count GEMMs only (linear layers, attention score and value products over the full
// s×s matrix, the logit layer), forward + backward = 3 × forward, no recompute: the convention of
// Megatron's eq. 3 / Korthikanti's eq. 7, so MFU figures are comparable with published ones.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "json_input.hpp"

namespace stepcast {

enum class NormKind { layernorm, rmsnorm };
enum class MlpKind { gelu, swiglu };  // gelu: up → GeLU → down; swiglu: gate, up → SiLU·up → down
enum class PositionKind { learned, rotary };
const char* to_string(NormKind kind);
const char* to_string(MlpKind kind);
const char* to_string(PositionKind kind);

struct ModelConfig {
  std::string name;
  std::string file;
  int64_t hidden_size = 0;              // h
  int64_t num_hidden_layers = 0;        // L
  int64_t num_attention_heads = 0;      // a
  int64_t num_key_value_heads = 0;      // kv (== a without GQA)
  int64_t intermediate_size = 0;        // f
  int64_t vocab_size = 0;               // V
  int64_t max_position_embeddings = 0;
  int64_t seq_length = 0;               // s used for training
  // Where seq_length came from: "seq_length" (the config), the positions key it defaulted to
  // ("max_position_embeddings", "n_positions", ...), or "--seq-length" (set_seq_length).
  std::string seq_length_from;
  bool rope_scaling = false;            // the config scales rotary positions past max_positions
  // Keys of the config that change neither shapes nor GEMM FLOPs at this sequence length,
  // accepted and not modelled (tokenizer ids, dropout rates, a sliding window longer than the
  // sequence, ...): listed to the user, never silently.
  std::vector<std::string> ignored_keys;
  // The dropout rate the config states (HuggingFace's attention_dropout, attn_pdrop, resid_pdrop,
  // hidden_dropout, ...: each a number in [0, 1)), when every such key it has agrees; `plan` and
  // `compare-strategies` take it for --dropout's default. dropout_keys: the keys read.
  std::optional<double> stated_dropout;
  std::vector<std::string> dropout_keys;
  NormKind norm = NormKind::layernorm;
  MlpKind mlp = MlpKind::gelu;
  PositionKind position = PositionKind::learned;
  bool tie_word_embeddings = true;
  bool use_bias = true;                 // biases on linear layers (GPT) or not (Llama)
  double norm_eps = 1e-5;               // LayerNorm / RMSNorm epsilon
  double rope_theta = 10000.0;          // rotary base
  // Width of one attention head: hidden / heads unless the config's head_dim says otherwise
  // (Qwen3, GPT-OSS: then q and the attention output are heads·head_dim wide, not hidden).
  int64_t head_dim_override = 0;
  // Mixture of experts (0 experts: a dense decoder). Layers from first_k_dense_replace on replace
  // the MLP by a router over num_experts experts, each an MLP of width moe_intermediate_size (the
  // config's, else intermediate_size, as Mixtral and GPT-OSS give it), of which every token goes
  // to num_experts_per_tok, plus n_shared_experts experts of the same width every token goes to
  // (DeepSeek). The router is a linear layer h → experts (with a bias when use_bias).
  int64_t num_experts = 0;              // E: num_local_experts / n_routed_experts / num_experts
  int64_t num_experts_per_tok = 0;      // k (top-k)
  int64_t moe_intermediate_size = 0;    // f_e
  int64_t n_shared_experts = 0;
  int64_t first_k_dense_replace = 0;
  double router_aux_loss_coef = 0.0;    // load-balancing loss weight (Switch / Mixtral's form)
  // Each token's k routing weights divided by their sum (HF norm_topk_prob; Mixtral and GPT-OSS
  // always do, Megatron-LM without --moe-router-pre-softmax) rather than the softmax over every
  // expert. Changes the weights, not which experts: the executor's routing only.
  bool norm_topk_prob = false;

  int64_t head_dim() const {
    return head_dim_override > 0 ? head_dim_override : hidden_size / num_attention_heads;
  }
  int64_t q_size() const { return num_attention_heads * head_dim(); }  // width of Q and of the context
  bool is_moe() const { return num_experts > 0; }
  bool is_moe_layer(int64_t layer) const { return is_moe() && layer >= first_k_dense_replace; }
  int64_t num_moe_layers() const { return is_moe() ? num_hidden_layers - first_k_dense_replace : 0; }
  int64_t kv_size() const { return num_key_value_heads * head_dim(); }  // width of K (and of V)
};

// Parameter count of the whole model (embeddings, all layers, final norm, output layer if untied).
int64_t parameter_count(const ModelConfig& model);
// Parameters of one transformer layer (attention, MLP, norms, biases); of an MoE model its
// first layer's (dense when first_k_dense_replace > 0).
int64_t layer_parameter_count(const ModelConfig& model);
// Parameters of layer `layer` (a MoE layer: attention, norms, router, every expert, shared experts).
int64_t layer_parameter_count(const ModelConfig& model, int64_t layer);
// Parameters one routed expert has (its MLP, with biases when use_bias).
int64_t expert_parameter_count(const ModelConfig& model);
// Parameters a token passes through: all but the routed experts it is not sent to (equal to
// parameter_count for a dense model). The "A22B" of Qwen3-235B-A22B.
int64_t active_parameter_count(const ModelConfig& model);
// Model FLOPs (fwd + bwd, no recompute) per token at the model's seq_length; under MoE the
// router and the k experts a token goes to (the active parameters), no capacity padding.
double model_flops_per_token(const ModelConfig& model);

// Loads a model config. Accepts HuggingFace names as they are (GPT-2's n_embd etc. too) and
// stepcast's own keys (seq_length, norm_type, mlp_type, position_embedding_type, use_bias).
// `seq_length` (--seq-length) trains at that many tokens per sequence instead of the config's
// seq_length or positions: refused beyond a learned position table, or beyond
// max_position_embeddings of rotary positions unless the config scales them (rope_scaling).
ModelConfig load_model(const std::string& path, std::optional<int64_t> seq_length = std::nullopt);
ModelConfig parse_model(const Json& json, const std::string& file,
                        std::optional<int64_t> seq_length = std::nullopt);
Json model_to_json(const ModelConfig& model);

}  // namespace stepcast
