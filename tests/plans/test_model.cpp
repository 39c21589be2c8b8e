// Model configs: parameter counts against published figures and hand-counted worked examples,
// model FLOPs against Korthikanti's eq. 7 (GPT) and a parameter-count identity (Llama), and every
// way a config file can be wrong.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "errors.hpp"
#include "model.hpp"
#include "test_support.hpp"

using Catch::Matchers::Contains;
using stepcast::InputError;
using stepcast::Json;
using stepcast::MlpKind;
using stepcast::ModelConfig;
using stepcast::NormKind;
using stepcast::PositionKind;

namespace {

struct Published {
  const char* file;
  double parameters;  // as published
  double tolerance;   // relative
};

// GPT-3's 1.3B and 13B are the paper's rounded names (1.32e9 and 12.85e9 exactly), hence 2%.
const std::vector<Published> kShipped = {
    {"tiny", 279104, 0.0},  // hand count below
    {"gpt2-124m", 124.4e6, 0.01},  {"gpt2-350m", 355e6, 0.01},   {"gpt3-1.3b", 1.3e9, 0.02},
    {"gpt3-13b", 13.0e9, 0.02},    {"gpt3-175b", 175e9, 0.01},   {"llama3-8b", 8.03e9, 0.01},
    {"llama3-70b", 70.6e9, 0.01},  {"llama3-405b", 405e9, 0.01}};

ModelConfig load_shipped(const std::string& name) {
  return stepcast::load_model(stepcast::test::source_path("models/" + name + ".json"));
}

// A valid config to break one key at a time.
Json base_config() {
  return Json{{"hidden_size", 64},   {"num_hidden_layers", 2},       {"num_attention_heads", 4},
              {"num_key_value_heads", 2}, {"intermediate_size", 256}, {"vocab_size", 256},
              {"max_position_embeddings", 256}, {"model_type", "llama"}};
}

ModelConfig parse(const Json& json) { return stepcast::parse_model(json, "test.json"); }

// Korthikanti et al. 2022, eq. 7, divided by the B·s tokens of one iteration.
double korthikanti_flops_per_token(const ModelConfig& m) {
  double h = m.hidden_size, L = m.num_hidden_layers, s = m.seq_length, V = m.vocab_size;
  return 72.0 * L * h * h * (1.0 + s / (6.0 * h) + V / (12.0 * h * L));
}

}  // namespace

TEST_CASE("shipped models load and match their published parameter counts", "[model]") {
  for (const auto& published : kShipped) {
    ModelConfig m = load_shipped(published.file);
    int64_t n = stepcast::parameter_count(m);
    std::printf("model %-12s %16lld parameters (published %.4g)\n", published.file,
                static_cast<long long>(n), published.parameters);
    INFO(published.file << ": " << n);
    CHECK(m.name == published.file);
    CHECK(std::abs(n - published.parameters) <= published.tolerance * published.parameters);
  }
}

TEST_CASE("parameter counts equal hand counts", "[model]") {
  SECTION("tiny: Llama-style, GQA, untied") {
    ModelConfig m = load_shipped("tiny");
    // q 64·64 + k,v 64·32 each + o 64·64 = 12288; SwiGLU 3·64·256 = 49152; 2 RMSNorms 128.
    CHECK(stepcast::layer_parameter_count(m) == 61568);
    // embeddings 256·64 + 4 layers + final norm 64 + output 256·64
    CHECK(stepcast::parameter_count(m) == 16384 + 4 * 61568 + 64 + 16384);
  }
  SECTION("GPT-2 124M: HF's GPT2LMHeadModel has 124,439,808 parameters") {
    ModelConfig m = load_shipped("gpt2-124m");
    // 12h² weights + biases (3h + h + 4h + h) + 2 LayerNorms (4h), h = 768
    CHECK(stepcast::layer_parameter_count(m) == 12 * 768 * 768 + 9 * 768 + 4 * 768);
    CHECK(stepcast::parameter_count(m) == 124439808);
  }
  SECTION("Llama 3 8B: 8,030,261,248 parameters") {
    CHECK(stepcast::parameter_count(load_shipped("llama3-8b")) == 8030261248);
  }
  SECTION("biases on a SwiGLU MLP: gate, up and down") {
    Json json = base_config();
    json["use_bias"] = true;
    ModelConfig with = parse(json), without = parse(base_config());
    // qkv 64 + 2·32, o 64, gate 256, up 256, down 64
    CHECK(stepcast::layer_parameter_count(with) - stepcast::layer_parameter_count(without) ==
          128 + 64 + 256 + 256 + 64);
  }
}

TEST_CASE("model FLOPs per token follow Korthikanti eq. 7 for GPT models", "[model]") {
  for (const char* name : {"gpt2-124m", "gpt2-350m", "gpt3-1.3b", "gpt3-13b", "gpt3-175b"}) {
    ModelConfig m = load_shipped(name);
    INFO(name);
    double expected = korthikanti_flops_per_token(m);
    CHECK(std::abs(stepcast::model_flops_per_token(m) - expected) <= 1e-12 * expected);
  }
}

TEST_CASE("model FLOPs per token for Llama: 6 × GEMM weights + attention scores", "[model]") {
  for (const char* name : {"tiny", "llama3-8b", "llama3-70b", "llama3-405b"}) {
    ModelConfig m = load_shipped(name);
    INFO(name);
    double h = m.hidden_size, L = m.num_hidden_layers, s = m.seq_length, V = m.vocab_size;
    double N = double(stepcast::parameter_count(m));
    // Untied, no biases: every parameter but the input embedding and the 2L+1 RMSNorms is a
    // GEMM weight (the output layer's included); attention scores add 12·L·s·h.
    double expected = 6.0 * (N - V * h - (2 * L + 1) * h) + 12.0 * L * s * h;
    double flops = stepcast::model_flops_per_token(m);
    CHECK(std::abs(flops - expected) <= 1e-12 * expected);
    CHECK(flops > 6.0 * N * 0.9);
    CHECK(flops < 6.0 * N * 1.5);
  }
}

TEST_CASE("GQA changes parameters but not attention-score FLOPs", "[model]") {
  Json mha = base_config();
  mha["num_key_value_heads"] = 4;
  ModelConfig a = parse(mha), b = parse(base_config());
  // K and V shrink from 64 to 32 columns: 2·64·32 weights fewer per layer.
  CHECK(stepcast::layer_parameter_count(a) - stepcast::layer_parameter_count(b) == 2 * 64 * 32);
  CHECK(stepcast::model_flops_per_token(a) - stepcast::model_flops_per_token(b) ==
        Approx(3.0 * 2.0 * 2 * (2 * 64 * 32)));
}

TEST_CASE("model_to_json round-trips every shipped model", "[model]") {
  for (const auto& published : kShipped) {
    ModelConfig m = load_shipped(published.file);
    ModelConfig back = stepcast::parse_model(stepcast::model_to_json(m), "round-trip.json");
    INFO(published.file);
    CHECK(back.name == m.name);
    CHECK(stepcast::model_to_json(back) == stepcast::model_to_json(m));
    CHECK(stepcast::parameter_count(back) == stepcast::parameter_count(m));
  }
}

TEST_CASE("HuggingFace defaults, GPT-2 aliases and stepcast overrides", "[model]") {
  SECTION("GPT-2 names: n_inner null means 4h, model_type gpt2 means GPT-2's architecture") {
    Json json = {{"n_embd", 64},        {"n_layer", 2},        {"n_head", 4},
                 {"n_positions", 128},  {"n_ctx", 128},        {"n_inner", nullptr},
                 {"vocab_size", 256},   {"model_type", "gpt2"}, {"activation_function", "gelu_new"}};
    ModelConfig m = parse(json);
    CHECK(m.hidden_size == 64);
    CHECK(m.intermediate_size == 256);
    CHECK(m.num_key_value_heads == 4);
    CHECK(m.seq_length == 128);  // defaults to the context length
    CHECK(m.norm == stepcast::NormKind::layernorm);
    CHECK(m.mlp == stepcast::MlpKind::gelu);
    CHECK(m.position == stepcast::PositionKind::learned);
    CHECK(m.use_bias);
    CHECK(m.tie_word_embeddings);
    CHECK(m.name == "test");
  }
  SECTION("model_type llama: RMSNorm, SwiGLU, rotary, no biases, untied") {
    ModelConfig m = parse(base_config());
    CHECK(m.norm == stepcast::NormKind::rmsnorm);
    CHECK(m.mlp == stepcast::MlpKind::swiglu);
    CHECK(m.position == stepcast::PositionKind::rotary);
    CHECK_FALSE(m.use_bias);
    CHECK_FALSE(m.tie_word_embeddings);
  }
  SECTION("stepcast's keys and HF's specific fields override model_type") {
    Json json = base_config();
    json["norm_type"] = "layernorm";
    json["hidden_act"] = "gelu";
    json["attention_bias"] = true;
    json["tie_word_embeddings"] = true;
    json["seq_length"] = 32;
    ModelConfig m = parse(json);
    CHECK(m.norm == stepcast::NormKind::layernorm);
    CHECK(m.mlp == stepcast::MlpKind::gelu);
    CHECK(m.use_bias);
    CHECK(m.tie_word_embeddings);
    CHECK(m.seq_length == 32);
  }
  SECTION("rotary positions allow seq_length past max_position_embeddings") {
    Json json = base_config();
    json["seq_length"] = 512;
    CHECK(parse(json).seq_length == 512);
  }
}

TEST_CASE("bad model configs are rejected with file, key and what is valid", "[model]") {
  SECTION("malformed JSON names line and column") {
    std::string text = "{\n  \"hidden_size\": 64,\n  oops\n}\n";
    CHECK_THROWS_WITH(stepcast::parse_json_text(text, "bad.json"), Contains("bad.json:3:3:"));
    std::string path = stepcast::test::write_temp_file("bad-model.json", text);
    CHECK_THROWS_WITH(stepcast::load_model(path), Contains(path + ":3:3:"));
  }
  SECTION("a missing file") {
    CHECK_THROWS_AS(stepcast::load_model("/nonexistent/model.json"), InputError);
  }
  SECTION("top level not an object") {
    CHECK_THROWS_AS(parse(Json::array({1, 2})), InputError);
  }
  SECTION("missing required key, with its alias") {
    Json json = base_config();
    json.erase("vocab_size");
    CHECK_THROWS_WITH(parse(json), Contains("test.json") && Contains("'vocab_size'") &&
                                       Contains("missing required key"));
    json = base_config();
    json.erase("hidden_size");
    CHECK_THROWS_WITH(parse(json), Contains("'hidden_size'") && Contains("n_embd"));
  }
  SECTION("unknown key suggests the closest name") {
    Json json = base_config();
    json.erase("hidden_size");
    json["hidden_sise"] = 64;
    CHECK_THROWS_WITH(parse(json), Contains("'hidden_sise'") && Contains("unknown key") &&
                                       Contains("did you mean 'hidden_size'?"));
  }
  SECTION("wrong type") {
    Json json = base_config();
    json["hidden_size"] = "64";
    CHECK_THROWS_WITH(parse(json), Contains("'hidden_size' = \"64\"") && Contains("wrong type"));
    json = base_config();
    json["num_hidden_layers"] = 2.5;
    CHECK_THROWS_WITH(parse(json), Contains("'num_hidden_layers'") && Contains("wrong type"));
    json = base_config();
    json["tie_word_embeddings"] = "no";
    CHECK_THROWS_WITH(parse(json), Contains("'tie_word_embeddings'") && Contains("true or false"));
  }
  SECTION("zero and negative sizes") {
    for (const char* key : {"hidden_size", "num_hidden_layers", "num_attention_heads",
                            "num_key_value_heads", "intermediate_size", "vocab_size",
                            "max_position_embeddings"}) {
      Json json = base_config();
      json[key] = 0;
      CHECK_THROWS_WITH(parse(json), Contains(std::string("'") + key + "' = 0") &&
                                         Contains("out of range") && Contains(">= 1"));
    }
    Json json = base_config();
    json["seq_length"] = -1;
    CHECK_THROWS_WITH(parse(json), Contains("'seq_length' = -1"));
  }
  SECTION("heads must divide hidden_size") {
    Json json = base_config();
    json["num_attention_heads"] = 5;
    json["num_key_value_heads"] = 5;
    CHECK_THROWS_WITH(parse(json), Contains("'num_attention_heads' = 5") &&
                                       Contains("does not divide hidden_size = 64"));
  }
  SECTION("KV heads must divide heads") {
    Json json = base_config();
    json["num_key_value_heads"] = 3;
    CHECK_THROWS_WITH(parse(json), Contains("'num_key_value_heads' = 3") &&
                                       Contains("a divisor of 4"));
  }
  SECTION("learned positions bound seq_length") {
    Json json = base_config();
    json["position_embedding_type"] = "learned";
    json["seq_length"] = 512;
    CHECK_THROWS_WITH(parse(json), Contains("'seq_length' = 512") && Contains("[1, 256]"));
  }
  SECTION("nothing decides the architecture") {
    Json json = base_config();
    json.erase("model_type");
    CHECK_THROWS_WITH(parse(json), Contains("'norm_type'") && Contains("missing"));
    json["norm_type"] = "rmsnorm";
    CHECK_THROWS_WITH(parse(json), Contains("'mlp_type'"));
    json["mlp_type"] = "swiglu";
    CHECK_THROWS_WITH(parse(json), Contains("'position_embedding_type'"));
    json["position_embedding_type"] = "rotary";
    CHECK_THROWS_WITH(parse(json), Contains("'use_bias'"));
    json["use_bias"] = false;
    CHECK_THROWS_WITH(parse(json), Contains("'tie_word_embeddings'"));
    json["tie_word_embeddings"] = false;
    CHECK(stepcast::parameter_count(parse(json)) == stepcast::parameter_count(parse(base_config())));
  }
  SECTION("unknown enum values name the valid ones") {
    Json json = base_config();
    json["norm_type"] = "rms";
    CHECK_THROWS_WITH(parse(json), Contains("\"layernorm\", \"rmsnorm\""));
    json = base_config();
    json["model_type"] = "falcon";
    CHECK_THROWS_WITH(parse(json), Contains("'model_type'") && Contains("\"gpt2\", \"llama\", \"mistral\""));
    json = base_config();
    json["hidden_act"] = "relu";
    CHECK_THROWS_WITH(parse(json), Contains("'hidden_act'") && Contains("\"silu\""));
  }
  SECTION("SwiGLU needs an explicit intermediate_size") {
    Json json = base_config();
    json.erase("intermediate_size");
    CHECK_THROWS_WITH(parse(json), Contains("'intermediate_size'") && Contains("missing"));
  }
  SECTION("aliases and implied fields that disagree") {
    Json json = base_config();
    json["n_embd"] = 128;
    CHECK_THROWS_WITH(parse(json), Contains("'n_embd' = 128") &&
                                       Contains("disagrees with 'hidden_size' = 64"));
    json = base_config();
    json["rms_norm_eps"] = 1e-5;
    json["layer_norm_eps"] = 1e-5;
    CHECK_THROWS_WITH(parse(json), Contains("'rms_norm_eps'") && Contains("conflicts"));
    json = base_config();
    json["attention_bias"] = true;
    json["mlp_bias"] = false;
    CHECK_THROWS_WITH(parse(json), Contains("'mlp_bias'"));
  }
  SECTION("sizes too large to count") {
    Json json = base_config();
    json["vocab_size"] = int64_t{1} << 40;
    CHECK_THROWS_WITH(parse(json), Contains("'vocab_size'") && Contains("out of range"));
    json = base_config();
    json["hidden_size"] = int64_t{1} << 30;
    json["num_hidden_layers"] = int64_t{1} << 30;
    CHECK_THROWS_WITH(parse(json), Contains("parameters"));
  }
}

TEST_CASE("hub configs of Llama-shaped families: Mistral, Qwen2, Qwen3, Phi-3 — Gemma and MoE refused by name",
          "[model]") {
  // Mistral 7B v0.1's shape: a 4,096-token sliding window over 32,768 positions.
  Json mistral = base_config();
  mistral["model_type"] = "mistral";
  mistral["max_position_embeddings"] = 1024;
  mistral["sliding_window"] = 256;
  mistral["rope_theta"] = 10000.0;
  mistral["attention_dropout"] = 0.0;
  // Trained at its positions (1,024 tokens), the window is shorter: not modelled, refused.
  CHECK_THROWS_WITH(parse(mistral), Contains("'sliding_window' = 256") && Contains("shorter than the sequence") &&
                                        Contains("--seq-length 256"));
  // At --seq-length 256 the window covers the sequence: accepted, and listed as not modelled.
  ModelConfig m = stepcast::parse_model(mistral, "mistral.json", 256);
  CHECK(m.seq_length == 256);
  CHECK(m.seq_length_from == "--seq-length");
  CHECK(m.mlp == MlpKind::swiglu);
  CHECK(m.norm == NormKind::rmsnorm);
  CHECK(std::find(m.ignored_keys.begin(), m.ignored_keys.end(), "sliding_window") != m.ignored_keys.end());
  // Read, so not listed: rope_theta, and attention_dropout (the planner's default dropout).
  CHECK(std::find(m.ignored_keys.begin(), m.ignored_keys.end(), "attention_dropout") == m.ignored_keys.end());
  CHECK(std::find(m.ignored_keys.begin(), m.ignored_keys.end(), "rope_theta") == m.ignored_keys.end());
  CHECK(m.stated_dropout == 0.0);
  mistral["sliding_window"] = nullptr;  // Mistral v0.3: no window
  CHECK(parse(mistral).seq_length == 1024);
  CHECK(parse(mistral).seq_length_from == "max_position_embeddings");

  // Qwen2: the window is switched off (use_sliding_window false); max_window_layers is moot.
  Json qwen2 = base_config();
  qwen2["model_type"] = "qwen2";
  qwen2["use_sliding_window"] = false;
  qwen2["sliding_window"] = 64;
  qwen2["max_window_layers"] = 2;
  CHECK(parse(qwen2).seq_length == 256);
  qwen2["use_sliding_window"] = true;
  CHECK_THROWS_WITH(parse(qwen2), Contains("'sliding_window' = 64"));
  // Qwen3: layer kinds, all full attention.
  Json qwen3 = base_config();
  qwen3["model_type"] = "qwen3";
  qwen3["layer_types"] = {"full_attention", "full_attention"};
  CHECK(parse(qwen3).num_hidden_layers == 2);
  qwen3["layer_types"] = {"full_attention", "sliding_attention"};
  CHECK_THROWS_WITH(parse(qwen3), Contains("'layer_types'") && Contains("sliding_attention"));
  Json phi3 = base_config();
  phi3["model_type"] = "phi3";
  phi3["original_max_position_embeddings"] = 256;
  CHECK(parse(phi3).position == PositionKind::rotary);

  Json gemma = base_config();
  gemma["model_type"] = "gemma2";
  CHECK_THROWS_WITH(parse(gemma), Contains("'model_type' = \"gemma2\"") && Contains("GeGLU"));
  Json mixtral = base_config();  // experts without top-k (test_model_moe.cpp has the rest)
  mixtral["num_local_experts"] = 8;
  CHECK_THROWS_WITH(parse(mixtral), Contains("'num_experts_per_tok'") && Contains("mixture of experts"));
}

TEST_CASE("a --seq-length stays within the positions, beyond them only for rotary positions with rope_scaling",
          "[model]") {
  Json llama = base_config();  // rotary, 256 positions
  CHECK(stepcast::parse_model(llama, "l.json", 128).seq_length == 128);
  CHECK_THROWS_WITH(stepcast::parse_model(llama, "l.json", 512),
                    Contains("--seq-length") && Contains("'seq_length' = 512") && Contains("no rope_scaling"));
  llama["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  CHECK(stepcast::parse_model(llama, "l.json", 512).seq_length == 512);
  CHECK_THROWS_WITH(stepcast::parse_model(llama, "l.json", 0), Contains("'seq_length' = 0") && Contains("out of range"));
  Json gpt2 = base_config();
  gpt2["model_type"] = "gpt2";
  gpt2.erase("num_key_value_heads");
  gpt2.erase("intermediate_size");
  CHECK_THROWS_WITH(stepcast::parse_model(gpt2, "g.json", 512), Contains("learned position table"));
}

TEST_CASE("a config's dropout keys: the rate they agree on, none where they disagree, bad rates refused", "[model]") {
  Json config = base_config();
  CHECK_FALSE(parse(config).stated_dropout);  // no dropout key
  config["attn_pdrop"] = 0.1;
  config["resid_pdrop"] = 0.1;
  config["embd_pdrop"] = 0.1;
  ModelConfig gpt2 = parse(config);
  REQUIRE(gpt2.stated_dropout);
  CHECK(*gpt2.stated_dropout == 0.1);
  CHECK(gpt2.dropout_keys == std::vector<std::string>{"attn_pdrop", "resid_pdrop", "embd_pdrop"});
  config["resid_pdrop"] = 0.2;  // the plan has one rate: which one is not the config's to say
  CHECK_FALSE(parse(config).stated_dropout);
  config["resid_pdrop"] = nullptr;  // null: not stated
  CHECK(*parse(config).stated_dropout == 0.1);
  config["attn_pdrop"] = 1.0;
  CHECK_THROWS_WITH(parse(config), Contains("attn_pdrop") && Contains("a number in [0, 1)"));
  config["attn_pdrop"] = -0.1;
  CHECK_THROWS_WITH(parse(config), Contains("attn_pdrop") && Contains("[0, 1]"));
  config["attn_pdrop"] = "0.1";
  CHECK_THROWS_WITH(parse(config), Contains("attn_pdrop"));
}
