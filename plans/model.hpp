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
// `seq_length` (--seq-length) trains at that many tokens per sequence instead of the config's
// seq_length or positions: refused beyond a learned position table, or beyond
// max_position_embeddings of rotary positions unless the config scales them (rope_scaling).
ModelConfig load_model(const std::string& path, std::optional<int64_t> seq_length = std::nullopt);
ModelConfig parse_model(const Json& json, const std::string& file,
                        std::optional<int64_t> seq_length = std::nullopt);
Json model_to_json(const ModelConfig& model);

}  // namespace stepcast
