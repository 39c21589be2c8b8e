// Shard-independent initialisation (param_layout.hpp): TensorInitializer gives every element of a
// tp shard the value of the same global element at tp 1, zeros the padded vocabulary rows, and
// draws GPT-2's normal(0, 0.02) (0.02/√(2L) for output projections), 0 for biases, 1 for norms.
#include <catch2/catch.hpp>

#include <cmath>

#include "param_layout.hpp"
#include "test_support.hpp"

using namespace stepcast;
using namespace stepcast::test;

namespace {

// The global (row, col) of local (row, col) of `tensor` on tp rank r of t, as Megatron shards it.
std::pair<int64_t, int64_t> global_of(const ModelConfig& m, int64_t t, int64_t r, const TensorSlice& tensor,
                                      int64_t row, int64_t col) {
  const int64_t d = m.head_dim(), q = m.num_attention_heads / t * d, kv = m.num_key_value_heads / t * d;
  const int64_t q_all = m.num_attention_heads * d, kv_all = m.num_key_value_heads * d;
  if (tensor.name == "qkv.weight" || tensor.name == "qkv.bias") {
    if (row < q) return {r * q + row, col};
    if (row < q + kv) return {q_all + r * kv + (row - q), col};
    return {q_all + kv_all + r * kv + (row - q - kv), col};
  }
  if (tensor.name == "attn_out.weight" || tensor.name == "mlp_down.weight") return {row, r * tensor.cols + col};
  if (tensor.name == "mlp_up.weight" || tensor.name == "mlp_gate.weight" || tensor.name == "embedding.weight") {
    return {r * tensor.rows + row, col};
  }
  return {row, col};  // replicated
}

}  // namespace

TEST_CASE("initial parameters of a tp 2 shard are the tp 1 model's", "[param_init]") {
  ModelConfig m = load_model(source_path("models/small-llama.json"));  // GQA: 6 heads, 2 kv heads
  m.vocab_size = 6001;                                                  // one padded row at tp 2
  for (const std::string group : {"L0", "L3", "embedding", "output", "final_norm"}) {
    const GroupLayout whole = param_group_layout(m, 1, group);
    for (int64_t r = 0; r < 2; ++r) {
      const GroupLayout shard = param_group_layout(m, 2, group);
      for (const TensorSlice& tensor : shard.tensors) {
        INFO(group << " " << tensor.name << " on tp rank " << r);
        const TensorInitializer local(m, 2, r, group, tensor, 1234);
        const TensorInitializer global(m, 1, 0, group, whole.at(tensor.name), 1234);
        int64_t compared = 0;
        for (int64_t row = 0; row < tensor.rows; row += 7) {
          for (int64_t col = 0; col < tensor.cols; col += 5) {
            auto [grow, gcol] = global_of(m, 2, r, tensor, row, col);
            double value = local.at(row, col);
            CHECK(value == initial_parameter(m, 2, r, group, tensor, row, col, 1234));
            if (tensor.name == "embedding.weight" && grow >= m.vocab_size) {
              CHECK(value == 0.0);  // padding
            } else {
              CHECK(value == global.at(grow, gcol));
            }
            ++compared;
          }
        }
        CHECK(compared > 0);
      }
    }
  }
}

TEST_CASE("initial parameters: normal 0.02, output projections 0.02/sqrt(2L), biases 0, norms 1", "[param_init]") {
  ModelConfig m = load_model(source_path("models/small-gpt.json"));
  const GroupLayout layer = param_group_layout(m, 1, "L1");
  for (const TensorSlice& tensor : layer.tensors) {
    INFO(tensor.name);
    const TensorInitializer init(m, 1, 0, "L1", tensor, 99);
    double sum = 0, squares = 0;
    int64_t n = 0;
    for (int64_t row = 0; row < tensor.rows; ++row) {
      for (int64_t col = 0; col < tensor.cols; ++col, ++n) {
        double v = init.at(row, col);
        sum += v;
        squares += v * v;
      }
    }
    const double mean = sum / double(n), sd = std::sqrt(squares / double(n) - mean * mean);
    if (tensor.name.find(".bias") != std::string::npos) {
      CHECK(sum == 0.0);
      CHECK(squares == 0.0);
    } else if (tensor.name.rfind("ln", 0) == 0) {
      CHECK(mean == 1.0);
    } else {
      const bool output = tensor.name == "attn_out.weight" || tensor.name == "mlp_down.weight";
      const double want = output ? 0.02 / std::sqrt(2.0 * double(m.num_hidden_layers)) : 0.02;
      CHECK(std::abs(mean) < 0.05 * want);
      CHECK(std::abs(sd / want - 1) < 0.02);
    }
  }
}
