// A decoder-only transformer's shape, read from a HuggingFace-style config.json, and the two
// counts everything else is checked against: parameters and model FLOPs per token.
// Model FLOPs count GEMMs only (linear layers, attention score and value products over the full
// s×s matrix, the logit layer), forward + backward = 3 × forward, no recompute: the convention of
// Megatron's eq. 3 / Korthikanti's eq. 7, so MFU figures are comparable with published ones.
#pragma once

#include <cstdint>
#include <string>

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
  NormKind norm = NormKind::layernorm;
  MlpKind mlp = MlpKind::gelu;
  PositionKind position = PositionKind::learned;
  bool tie_word_embeddings = true;
  bool use_bias = true;                 // biases on linear layers (GPT) or not (Llama)
  double norm_eps = 1e-5;               // LayerNorm / RMSNorm epsilon
  double rope_theta = 10000.0;          // rotary base

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  int64_t kv_size() const { return num_key_value_heads * head_dim(); }  // width of K (and of V)
};

// Parameter count of the whole model (embeddings, all layers, final norm, output layer if untied).
int64_t parameter_count(const ModelConfig& model);
// Parameters of one transformer layer (attention, MLP, norms, biases).
int64_t layer_parameter_count(const ModelConfig& model);
// Model FLOPs (fwd + bwd, no recompute) per token at the model's seq_length.
double model_flops_per_token(const ModelConfig& model);

// Loads a model config. Accepts HuggingFace names as they are (GPT-2's n_embd etc. too) and
// stepcast's own keys (seq_length, norm_type, mlp_type, position_embedding_type, use_bias).
ModelConfig load_model(const std::string& path);
ModelConfig parse_model(const Json& json, const std::string& file);
Json model_to_json(const ModelConfig& model);

}  // namespace stepcast
