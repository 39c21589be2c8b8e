// Parameter layouts and shard-independent initialisation; see param_layout.hpp.
#include "param_layout.hpp"

#include <cmath>
#include <limits>

#include "errors.hpp"
#include "lower.hpp"

namespace stepcast {

const TensorSlice& GroupLayout::at(const std::string& name) const {
  for (const auto& t : tensors) {
    if (t.name == name) return t;
  }
  STEPCAST_CHECK(false, "no tensor '" + name + "' in the group layout");
  return tensors.front();
}

bool GroupLayout::has(const std::string& name) const {
  for (const auto& t : tensors) {
    if (t.name == name) return true;
  }
  return false;
}

namespace {

void add(GroupLayout& g, const std::string& name, int64_t rows, int64_t cols, bool replicated,
         bool decay) {
  g.tensors.push_back({name, g.elements, rows, cols, replicated, decay});
  g.elements += rows * cols;
}

void add_norm(GroupLayout& g, const ModelConfig& m, const std::string& prefix) {
  add(g, prefix + ".weight", m.hidden_size, 1, true, false);
  if (m.norm == NormKind::layernorm) add(g, prefix + ".bias", m.hidden_size, 1, true, false);
}

uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t hash_string(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Standard normal from two hashed uniforms (Box–Muller).
double hashed_normal(uint64_t key) {
  double u1 = (double(mix(key) >> 11) + 0.5) * 0x1.0p-53;
  double u2 = (double(mix(key ^ 0x5851F42D4C957F2Dull) >> 11) + 0.5) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * M_PI * u2);
}

// A transformer layer's group on one tp rank: attention, an MLP f wide on this rank (none when
// f = 0), then the replicated tail: norms and row biases.
void add_layer(GroupLayout& g, const ModelConfig& m, int64_t t, int64_t f) {
  const int64_t h = m.hidden_size, d = m.head_dim();
  const int64_t heads = m.num_attention_heads / t, kv = m.num_key_value_heads / t;
  const int64_t qkv = (heads + 2 * kv) * d;
  add(g, "qkv.weight", qkv, h, false, true);
  if (m.use_bias) add(g, "qkv.bias", qkv, 1, false, false);
  add(g, "attn_out.weight", h, heads * d, false, true);
  if (f > 0) {
    if (m.mlp == MlpKind::swiglu) {
      add(g, "mlp_gate.weight", f, h, false, true);
      if (m.use_bias) add(g, "mlp_gate.bias", f, 1, false, false);
    }
    add(g, "mlp_up.weight", f, h, false, true);
    if (m.use_bias) add(g, "mlp_up.bias", f, 1, false, false);
    add(g, "mlp_down.weight", h, f, false, true);
  }
  add_norm(g, m, "ln1");
  add_norm(g, m, "ln2");
  if (m.use_bias) {
    add(g, "attn_out.bias", h, 1, true, false);
    if (f > 0) add(g, "mlp_down.bias", h, 1, true, false);
  }
}

// A MoE layer's group on one tp rank: the layer with the shared experts as its MLP (tp-sharded,
// n_shared_experts · moe_intermediate_size wide), then the router [E, h], replicated
// (lower_context's layer_sp_replicated(layer)).
GroupLayout moe_layer_layout(const ModelConfig& m, int64_t t) {
  GroupLayout g;
  add_layer(g, m, t, m.n_shared_experts * m.moe_intermediate_size / t);
  add(g, "router.weight", m.num_experts, m.hidden_size, true, true);
  if (m.use_bias) add(g, "router.bias", m.num_experts, 1, true, false);
  return g;
}

}  // namespace

std::string expert_tensor_name(int64_t expert, const char* tensor) {
  return "expert." + std::to_string(expert) + "." + tensor;
}

GroupLayout expert_group_layout(const ModelConfig& m, int64_t ep_size, int64_t ep_rank, int64_t etp_size) {
  GroupLayout g;
  const int64_t h = m.hidden_size, f = m.moe_intermediate_size / etp_size, local = m.num_experts / ep_size;
  for (int64_t e = ep_rank * local; e < (ep_rank + 1) * local; ++e) {
    if (m.mlp == MlpKind::swiglu) {
      add(g, expert_tensor_name(e, "gate.weight"), f, h, false, true);
      if (m.use_bias) add(g, expert_tensor_name(e, "gate.bias"), f, 1, false, false);
    }
    add(g, expert_tensor_name(e, "up.weight"), f, h, false, true);
    if (m.use_bias) add(g, expert_tensor_name(e, "up.bias"), f, 1, false, false);
    add(g, expert_tensor_name(e, "down.weight"), h, f, false, true);
    // The down projection's bias is whole on every etp rank (its output is summed over them).
    if (m.use_bias) add(g, expert_tensor_name(e, "down.bias"), h, 1, etp_size > 1, false);
  }
  return g;
}

GroupLayout param_group_layout(const ModelConfig& m, int64_t t, const std::string& group) {
  GroupLayout g;
  const int64_t h = m.hidden_size;
  const int64_t vocab = padded_vocab_size(m, t) / t;
  if (group == "embedding" || group == "output") {
    add(g, "embedding.weight", vocab, h, false, true);
  } else if (group == "position") {
    add(g, "position.weight", m.max_position_embeddings, h, true, true);
  } else if (group == "final_norm") {
    add_norm(g, m, "final_norm");
  } else if (group.size() > 1 && group[0] == 'X') {
    STEPCAST_CHECK(false, "expert group " + group + ": its layout is expert_group_layout's");
  } else {
    STEPCAST_CHECK(group.size() > 1 && group[0] == 'L', "unknown parameter group " + group);
    const int64_t layer = std::stoll(group.substr(1));
    if (m.is_moe_layer(layer)) return moe_layer_layout(m, t);
    add_layer(g, m, t, m.intermediate_size / t);
  }
  return g;
}

TensorInitializer::TensorInitializer(const ModelConfig& m, int64_t t, int64_t r, const std::string& group,
                                     const TensorSlice& tensor, uint64_t seed) {
  const std::string& name = tensor.name;
  if (name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0) {
    constant_ = 0.0;
    return;
  }
  if (name.rfind("ln", 0) == 0 || name.rfind("final_norm", 0) == 0) {
    constant_ = 1.0;
    return;
  }
  const int64_t d = m.head_dim();
  const int64_t heads = m.num_attention_heads / t, kv = m.num_key_value_heads / t;
  // Where local (row, col) sits in the global tensor, and that tensor's name.
  std::vector<std::string> global_names = {name};
  if (name == "qkv.weight") {
    global_names = {"q.weight", "k.weight", "v.weight"};
    q_rows_ = heads * d;
    k_rows_ = kv * d;
    qkv_ = true;
    tp_rank_ = r;
  } else if (name == "attn_out.weight") {
    col_offset_ = r * heads * d;
  } else if (name == "mlp_up.weight" || name == "mlp_gate.weight") {
    row_offset_ = r * tensor.rows;
  } else if (name == "mlp_down.weight") {
    col_offset_ = r * tensor.cols;
  } else if (name == "embedding.weight") {
    row_offset_ = r * tensor.rows;
    row_limit_ = m.vocab_size;  // padding rows are 0
  } else if (name.rfind("expert.", 0) == 0) {  // r: the etp rank (column- and row-parallel slices)
    auto ends_with = [&](const char* suffix) {
      const size_t k = std::char_traits<char>::length(suffix);
      return name.size() >= k && name.compare(name.size() - k, k, suffix) == 0;
    };
    if (ends_with(".gate.weight") || ends_with(".up.weight")) row_offset_ = r * tensor.rows;
    if (ends_with(".down.weight")) col_offset_ = r * tensor.cols;
  }
  // The tied output layer is the embedding: both draw from the "embedding" group's key.
  std::string key_group = group == "output" && m.tie_word_embeddings ? "embedding" : group;
  for (size_t i = 0; i < global_names.size(); ++i) {
    keys_[i] = mix(seed ^ hash_string(key_group + "/" + global_names[i]));
  }
  std_ = 0.02;
  if (name == "attn_out.weight" || name == "mlp_down.weight" ||
      (name.rfind("expert.", 0) == 0 && name.size() > 11 && name.compare(name.size() - 11, 11, "down.weight") == 0)) {
    std_ = 0.02 / std::sqrt(2.0 * double(m.num_hidden_layers));
  }
}

double TensorInitializer::at(int64_t row, int64_t col) const {
  if (std_ == 0.0) return constant_;
  uint64_t key = keys_[0];
  int64_t grow = row_offset_ + row, gcol = col_offset_ + col;
  if (qkv_) {
    if (row < q_rows_) {
      grow = tp_rank_ * q_rows_ + row;
    } else if (row < q_rows_ + k_rows_) {
      key = keys_[1];
      grow = tp_rank_ * k_rows_ + (row - q_rows_);
    } else {
      key = keys_[2];
      grow = tp_rank_ * k_rows_ + (row - q_rows_ - k_rows_);
    }
  }
  if (grow >= row_limit_) return 0.0;
  key = mix(key ^ uint64_t(grow));
  key = mix(key ^ (uint64_t(gcol) << 1));
  return std_ * hashed_normal(key);
}

double initial_parameter(const ModelConfig& m, int64_t t, int64_t r, const std::string& group,
                         const TensorSlice& tensor, int64_t row, int64_t col, uint64_t seed) {
  return TensorInitializer(m, t, r, group, tensor, seed).at(row, col);
}

}  // namespace stepcast
