// Mixture-of-experts model configs: the shipped MoE models against their published total and
// active parameter counts, a hand count of the tiny MoE models, and the refusals of bad expert keys.
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "errors.hpp"
#include "model.hpp"
#include "test_support.hpp"

using Catch::Matchers::Contains;
using stepcast::InputError;
using stepcast::Json;
using stepcast::ModelConfig;

namespace {

struct PublishedMoe {
  const char* file;
  double total;   // parameters, as the model card or paper gives them
  double active;  // parameters a token passes through
  double tolerance_total, tolerance_active;  // relative
};

// Sources: model cards and reports named in each file's notes. DeepSeek-V3-shaped models MLA as
// multi-head attention (+0.2% total); its "37B" active is a rounded figure, hence 5%. OpenAI's
// 5.13B active leaves the input embedding out (201088 · 2880 = 0.58B; Mixtral's and Qwen's
// figures count it): compared with it added.
const std::vector<PublishedMoe> kShippedMoe = {
    {"mixtral-8x7b", 46.7e9, 12.9e9, 0.005, 0.01},
    {"qwen3-30b-a3b", 30.5e9, 3.3e9, 0.005, 0.02},
    {"qwen3-235b-a22b", 235e9, 22e9, 0.005, 0.02},
    {"gpt-oss-120b", 116.83e9, 5.13e9 + 201088.0 * 2880, 0.005, 0.01},
    {"deepseek-v3-shaped", 671e9, 37e9, 0.005, 0.05}};

ModelConfig load_shipped(const std::string& name) {
  return stepcast::load_model(stepcast::test::source_path("models/" + name + ".json"));
}

Json moe_config() {
  return Json{{"hidden_size", 64},     {"num_hidden_layers", 2},  {"num_attention_heads", 4},
              {"intermediate_size", 32}, {"vocab_size", 256},     {"max_position_embeddings", 256},
              {"model_type", "mixtral"}, {"num_local_experts", 4}, {"num_experts_per_tok", 2}};
}

ModelConfig parse(const Json& json) { return stepcast::parse_model(json, "moe.json"); }

}  // namespace

TEST_CASE("shipped MoE models match their published total and active parameters", "[model][moe]") {
  for (const auto& p : kShippedMoe) {
    INFO(p.file);
    ModelConfig m = load_shipped(p.file);
    REQUIRE(m.is_moe());
    double total = double(stepcast::parameter_count(m));
    double active = double(stepcast::active_parameter_count(m));
    CHECK(std::abs(total - p.total) <= p.tolerance_total * p.total);
    CHECK(std::abs(active - p.active) <= p.tolerance_active * p.active);
  }
}

TEST_CASE("tiny MoE models: hand counts of experts, router, shared experts and dense layers", "[model][moe]") {
  ModelConfig m = load_shipped("tiny-moe");
  CHECK(m.num_experts == 4);
  CHECK(m.num_experts_per_tok == 2);
  CHECK(m.moe_intermediate_size == 64);  // intermediate_size, as Mixtral gives it
  // attention 64·64 + 2·64·32 + 64·64 = 12288; router 64·4; 4 experts of 3·64·64; 2 RMSNorms.
  const int64_t layer = 12288 + 256 + 4 * 12288 + 128;
  CHECK(stepcast::layer_parameter_count(m, 1) == layer);
  CHECK(stepcast::expert_parameter_count(m) == 12288);
  CHECK(stepcast::parameter_count(m) == 2 * 256 * 64 + 4 * layer + 64);
  CHECK(stepcast::active_parameter_count(m) == 2 * 256 * 64 + 4 * (layer - 2 * 12288) + 64);

  ModelConfig s = load_shipped("tiny-moe-shared");
  CHECK(s.is_moe_layer(0) == false);
  CHECK(s.is_moe_layer(1));
  CHECK(s.num_moe_layers() == 3);
  const int64_t dense = 12288 + 3 * 64 * 128 + 128;
  const int64_t moe = 12288 + 64 * 8 + (8 + 1) * 3 * 64 * 32 + 128;
  CHECK(stepcast::layer_parameter_count(s, 0) == dense);
  CHECK(stepcast::layer_parameter_count(s, 2) == moe);
  CHECK(stepcast::parameter_count(s) == 2 * 256 * 64 + dense + 3 * moe + 64);
}

TEST_CASE("MoE model FLOPs count the router and the k experts a token goes to", "[model][moe]") {
  ModelConfig m = parse(moe_config());
  Json dense = moe_config();
  dense.erase("num_local_experts");
  dense.erase("num_experts_per_tok");
  dense["intermediate_size"] = 64;  // two experts of 32 a token = one MLP of 64
  ModelConfig d = parse(dense);
  // The same per-token GEMMs, plus the router's 2·h·E forward, ×3, per layer.
  CHECK(stepcast::model_flops_per_token(m) - stepcast::model_flops_per_token(d) ==
        Approx(3.0 * 2 * (2.0 * 64 * 4)));
}

TEST_CASE("head_dim other than hidden / heads widens q and the attention output", "[model]") {
  Json json = moe_config();
  json["head_dim"] = 32;  // 4 heads · 32 = 128 on hidden 64
  ModelConfig m = parse(json);
  CHECK(m.head_dim() == 32);
  CHECK(m.q_size() == 128);
  ModelConfig narrow = parse(moe_config());
  CHECK(stepcast::layer_parameter_count(m, 0) - stepcast::layer_parameter_count(narrow, 0) ==
        2 * 64 * 64 + 2 * 64 * 64);  // q and o twice as wide; k, v (4 heads · d) too
  CHECK(stepcast::model_to_json(m).at("head_dim") == 32);
}

TEST_CASE("bad expert keys are refused naming the key, the value and what is valid", "[model][moe]") {
  Json json = moe_config();
  json["num_experts_per_tok"] = 5;
  CHECK_THROWS_WITH(parse(json), Contains("num_experts_per_tok") && Contains("exceeds") && Contains("[1, 4]"));
  json = moe_config();
  json.erase("num_experts_per_tok");
  CHECK_THROWS_WITH(parse(json), Contains("num_experts_per_tok") && Contains("missing"));
  json = moe_config();
  json["n_routed_experts"] = 8;
  CHECK_THROWS_WITH(parse(json), Contains("n_routed_experts") && Contains("disagrees"));
  json = moe_config();
  json["decoder_sparse_step"] = 2;
  CHECK_THROWS_WITH(parse(json), Contains("decoder_sparse_step"));
  json = moe_config();
  json["first_k_dense_replace"] = 3;
  CHECK_THROWS_WITH(parse(json), Contains("first_k_dense_replace") && Contains("[0, 2]"));
  json = moe_config();
  json.erase("num_local_experts");
  CHECK_THROWS_WITH(parse(json), Contains("num_experts_per_tok") && Contains("without experts"));
}

TEST_CASE("norm_topk_prob: the config's, else Mixtral's and GPT-OSS's renormalised top-k weights", "[model][moe]") {
  // HF's MixtralSparseMoeBlock divides the top-k weights by their sum; GPT-OSS takes a softmax
  // over the top-k logits; Qwen3-MoE and DeepSeek-V3 configs say norm_topk_prob.
  CHECK(load_shipped("mixtral-8x7b").norm_topk_prob);
  CHECK(load_shipped("gpt-oss-120b").norm_topk_prob);
  CHECK(load_shipped("qwen3-30b-a3b").norm_topk_prob);
  CHECK_FALSE(load_shipped("tiny-moe").norm_topk_prob);  // no model_type, no key: the softmax's weights
  Json json = moe_config();
  CHECK(parse(json).norm_topk_prob);
  json["norm_topk_prob"] = false;
  CHECK_FALSE(parse(json).norm_topk_prob);
  json["model_type"] = "qwen3_moe";
  json.erase("norm_topk_prob");
  CHECK_FALSE(parse(json).norm_topk_prob);  // Qwen3MoeConfig's default
  // Written into the program's model (the executor reads it there) and read back.
  json["norm_topk_prob"] = true;
  CHECK(stepcast::parse_model(stepcast::model_to_json(parse(json)), "again.json").norm_topk_prob);
  json["norm_topk_prob"] = "yes";
  CHECK_THROWS_WITH(parse(json), Contains("norm_topk_prob"));
  // Without experts the key changes nothing, but its value is still checked.
  Json dense = moe_config();
  for (const char* key : {"num_local_experts", "num_experts_per_tok", "model_type"}) dense.erase(key);
  dense["model_type"] = "llama";
  dense["norm_topk_prob"] = 3;
  CHECK_THROWS_WITH(parse(dense), Contains("norm_topk_prob"));
}
