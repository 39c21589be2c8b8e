// Plans: Megatron's defaults, the values validate_plan resolves (layers_per_stage,
// grad_bucket_bytes), the dtype keys, and every way a plan can be wrong, each answered with an
// InputError naming the plan file, the key and the offending value.
#include <catch2/catch.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "errors.hpp"
#include "json_input.hpp"
#include "model.hpp"
#include "plan.hpp"
#include "test_support.hpp"
#include "topology.hpp"

using namespace stepcast;
using Catch::Matchers::Contains;

namespace {

const std::string kFile = "plan-under-test.json";

ModelConfig shipped_model(const std::string& name) {
  return load_model(test::source_path("models/" + name + ".json"));
}

Topology shipped_topology(const std::string& name, std::optional<int> nodes = std::nullopt) {
  return load_topology(test::source_path("topologies/" + name + ".json"), nodes);
}

// The smallest valid plan (micro_batch_size is the one required key) with `changes` merged in,
// on one device's worth of data parallelism unless `changes` says otherwise (dp_size absent is
// the world / (tp·pp·cp): test_megatron_import.cpp).
Json plan_with(const Json& changes = Json::object()) {
  Json plan = {{"micro_batch_size", 1}, {"dp_size", 1}};
  plan.update(changes);
  return plan;
}

Plan parse(const Json& json) { return parse_plan(json, kFile); }

Plan parse_and_validate(const Json& json, const ModelConfig& model, const Topology& topology) {
  Plan plan = parse(json);
  validate_plan(plan, model, topology);
  return plan;
}

// The InputError message `action` throws; fails the test when it throws nothing.
template <typename Action>
std::string input_error_of(Action&& action) {
  try {
    action();
  } catch (const InputError& e) {
    return e.what();
  }
  FAIL("no InputError thrown");
  return "";
}

std::string parse_error(const Json& json) {
  return input_error_of([&] { parse(json); });
}

std::string validate_error(const Json& json, const ModelConfig& model, const Topology& topology) {
  return input_error_of([&] { parse_and_validate(json, model, topology); });
}

// Every message names the file, the key and the value it rejects, in errors.hpp's format.
void check_names(const std::string& message, const std::string& key, const std::string& value) {
  INFO(message);
  CHECK_THAT(message, Contains(kFile + ": key '" + key + "' = " + value + ": "));
}

}  // namespace

TEST_CASE("a plan with only micro_batch_size gets Megatron's defaults", "[plan]") {
  Plan plan = parse({{"micro_batch_size", 2}});
  CHECK(plan.file == kFile);
  CHECK(plan.name == kFile);
  CHECK(plan.tp_size == 1);
  CHECK(plan.pp_size == 1);
  CHECK(plan.dp_size == 1);  // until validate_plan derives it from the world
  CHECK(plan.dp_size_derived);
  CHECK(plan.zero_stage == 0);
  CHECK(plan.micro_batch_size == 2);
  CHECK(plan.global_batch_size == 2);  // micro_batch_size · dp_size
  CHECK(plan.schedule == ScheduleKind::one_f_one_b);
  CHECK(plan.virtual_pp_size == 1);
  CHECK(plan.recompute == RecomputeKind::none);
  CHECK_FALSE(plan.sequence_parallel);
  CHECK(plan.param_dtype == Dtype::bf16);
  CHECK(plan.grad_dtype == Dtype::fp32);
  CHECK(plan.activation_dtype() == Dtype::bf16);
  CHECK(plan.attention_impl == AttentionImpl::materialized);
  CHECK(plan.dropout == 0.1);
  CHECK_FALSE(plan.overlap_grad_reduce);
  CHECK_FALSE(plan.overlap_param_gather);
  CHECK(plan.order == "tp-dp-pp");
  // Resolved by validate_plan, which needs the model and topology.
  CHECK(plan.grad_bucket_bytes == 0);
  CHECK(plan.layers_per_stage.empty());
}

TEST_CASE("global_batch_size defaults to micro_batch_size · dp_size", "[plan]") {
  Plan plan = parse(plan_with({{"micro_batch_size", 3}, {"dp_size", 4}}));
  CHECK(plan.global_batch_size == 12);
  CHECK(plan.num_microbatches() == 1);
  Plan given =
      parse(plan_with({{"micro_batch_size", 3}, {"dp_size", 4}, {"global_batch_size", 48}}));
  CHECK(given.global_batch_size == 48);
  CHECK(given.num_microbatches() == 4);
}

TEST_CASE("validate_plan resolves grad_bucket_bytes as Megatron's max(4e7, 1e6·dp) parameters",
          "[plan]") {
  ModelConfig model = shipped_model("tiny");
  Topology topology = shipped_topology("dgx-a100-80gb");
  SECTION("dp below 40: 4e7 parameters of fp32 gradients") {
    Plan plan = parse_and_validate(plan_with({{"dp_size", 8}}), model, topology);
    CHECK(plan.grad_bucket_bytes == 4e7 * 4);
  }
  SECTION("dp 64: 6.4e7 parameters of fp32 gradients") {
    Plan plan = parse_and_validate(plan_with({{"dp_size", 64}}), model, topology);
    CHECK(plan.grad_bucket_bytes == 6.4e7 * 4);
  }
  SECTION("fp64 gradients double it") {
    Plan plan =
        parse_and_validate(plan_with({{"dp_size", 64}, {"dtype", "fp64"}}), model, topology);
    CHECK(plan.grad_bucket_bytes == 6.4e7 * 8);
  }
  SECTION("a given grad_bucket_bytes is kept") {
    Plan plan = parse_and_validate(plan_with({{"grad_bucket_bytes", 1e6}}), model, topology);
    CHECK(plan.grad_bucket_bytes == 1e6);
  }
}

TEST_CASE("validate_plan resolves layers_per_stage, one entry per virtual stage", "[plan]") {
  SECTION("one stage holds every layer") {
    Plan plan = parse_and_validate(plan_with(), shipped_model("tiny"),
                                   shipped_topology("dgx-a100-80gb", 1));
    CHECK(plan.layers_per_stage == std::vector<int64_t>{4});
  }
  SECTION("GPT-3 175B as in SC'21: pp 8 × 3 model chunks of 4 layers") {
    Plan plan = load_plan(test::source_path("examples/gpt3-175b-a100-1024.json"));
    validate_plan(plan, shipped_model("gpt3-175b"), shipped_topology("dgx-a100-80gb"));
    CHECK(plan.layers_per_stage == std::vector<int64_t>(24, 4));
    CHECK(plan.num_microbatches() == 96);
  }
  SECTION("Llama 3 405B: 126 layers on 16 stages, the first and last hold 7") {
    Plan plan = load_plan(test::source_path("examples/llama3-405b-h100-16384.json"));
    validate_plan(plan, shipped_model("llama3-405b"), shipped_topology("dgx-h100"));
    std::vector<int64_t> expected(16, 8);
    expected.front() = expected.back() = 7;
    CHECK(plan.layers_per_stage == expected);
  }
  SECTION("a given layers_per_stage is kept") {
    Plan plan = parse_and_validate(plan_with({{"pp_size", 2}, {"layers_per_stage", {1, 3}}}),
                                   shipped_model("tiny"), shipped_topology("dgx-a100-80gb", 1));
    CHECK(plan.layers_per_stage == std::vector<int64_t>{1, 3});
  }
}

TEST_CASE("plan_to_json writes the resolved plan, which reads back unchanged", "[plan]") {
  ModelConfig model = shipped_model("gpt3-175b");
  Topology topology = shipped_topology("dgx-a100-80gb");
  Plan plan = load_plan(test::source_path("examples/gpt3-175b-a100-1024.json"));
  validate_plan(plan, model, topology);
  Json written = plan_to_json(plan);
  CHECK(written["grad_bucket_bytes"] == 4e7 * 4);
  CHECK(written["layers_per_stage"].size() == 24);
  Plan reread = parse(written);
  validate_plan(reread, model, topology);
  CHECK(plan_to_json(reread) == written);
}

TEST_CASE("dtype sets the parameter dtype — gradients follow fp32 and fp64", "[plan]") {
  struct Case {
    Json keys;
    Dtype param;
    Dtype grad;
  };
  const std::vector<Case> cases = {
      {{{"dtype", "bf16"}}, Dtype::bf16, Dtype::fp32},
      {{{"dtype", "fp16"}}, Dtype::fp16, Dtype::fp32},
      {{{"dtype", "fp32"}}, Dtype::fp32, Dtype::fp32},
      {{{"dtype", "fp64"}}, Dtype::fp64, Dtype::fp64},
      {{{"param_dtype", "fp64"}}, Dtype::fp64, Dtype::fp64},
      {{{"dtype", "fp32"}, {"param_dtype", "fp32"}}, Dtype::fp32, Dtype::fp32},
      {{{"dtype", "fp64"}, {"grad_dtype", "fp32"}}, Dtype::fp64, Dtype::fp32},
      {{{"dtype", "bf16"}, {"grad_dtype", "bf16"}}, Dtype::bf16, Dtype::bf16},
  };
  for (const auto& c : cases) {
    INFO(c.keys.dump());
    Plan plan = parse(plan_with(c.keys));
    CHECK(plan.param_dtype == c.param);
    CHECK(plan.activation_dtype() == c.param);
    CHECK(plan.grad_dtype == c.grad);
  }
  SECTION("param_dtype contradicting dtype is an error") {
    std::string message = parse_error(plan_with({{"dtype", "bf16"}, {"param_dtype", "fp32"}}));
    check_names(message, "param_dtype", "\"fp32\"");
    CHECK_THAT(message, Contains("'dtype' = \"bf16\""));
  }
  SECTION("an unknown dtype names the valid ones") {
    std::string message = parse_error(plan_with({{"dtype", "tf32"}}));
    check_names(message, "dtype", "\"tf32\"");
    CHECK_THAT(message, Contains("\"fp32\", \"bf16\""));
  }
}

TEST_CASE("bad plan files are rejected when parsed, naming file, key and value", "[plan]") {
  SECTION("malformed JSON names line and column") {
    std::string text = "{\n  \"tp_size\": 2,\n  \"pp_size\" 2\n}\n";
    std::string message = input_error_of([&] { parse_json_text(text, kFile); });
    CHECK_THAT(message, Contains(kFile + ":3:13: malformed JSON"));
  }
  SECTION("micro_batch_size is required") {
    std::string message = parse_error(Json::object());
    CHECK_THAT(message, Contains(kFile + ": key 'micro_batch_size': missing required key"));
    CHECK_THAT(message, Contains("an integer >= 1"));
  }
  SECTION("an unknown key suggests the closest valid name") {
    std::string message = parse_error(plan_with({{"tp_sise", 2}}));
    CHECK_THAT(message, Contains(kFile + ": key 'tp_sise'"));
    CHECK_THAT(message, Contains("unknown key"));
    CHECK_THAT(message, Contains("did you mean 'tp_size'?"));
    CHECK_THAT(parse_error(plan_with({{"overlap_grad_reduction", true}})),
               Contains("did you mean 'overlap_grad_reduce'?"));
  }
  SECTION("wrong types") {
    struct Case {
      const char* key;
      Json value;
      const char* rendered;
    };
    const std::vector<Case> cases = {{"tp_size", "2", "\"2\""},
                                     {"dp_size", 2.5, "2.5"},
                                     {"micro_batch_size", true, "true"},
                                     {"sequence_parallel", 1, "1"},
                                     {"schedule", 1, "1"},
                                     {"dropout", "0.1", "\"0.1\""},
                                     {"layers_per_stage", 4, "4"},
                                     {"order", Json::array({"tp", "pp"}), "[\"tp\",\"pp\"]"},
                                     {"name", 7, "7"}};
    for (const auto& c : cases) {
      std::string message = parse_error(plan_with({{c.key, c.value}}));
      check_names(message, c.key, c.rendered);
      CHECK_THAT(message, Contains("wrong type"));
    }
  }
  SECTION("zero and negative sizes") {
    for (const char* key : {"tp_size", "pp_size", "dp_size", "micro_batch_size",
                            "global_batch_size", "virtual_pp_size"}) {
      for (int value : {0, -1}) {
        std::string message = parse_error(plan_with({{key, value}}));
        check_names(message, key, std::to_string(value));
        CHECK_THAT(message, Contains("out of range; valid: an integer >= 1"));
      }
    }
    check_names(parse_error(plan_with({{"zero_stage", -1}})), "zero_stage", "-1");
    check_names(parse_error(plan_with({{"grad_bucket_bytes", 0}})), "grad_bucket_bytes", "0");
    std::string message = parse_error(plan_with({{"pp_size", 3}, {"layers_per_stage", {2, 0, 2}}}));
    check_names(message, "layers_per_stage", "[2,0,2]");
    CHECK_THAT(message, Contains("element 0 is invalid"));
  }
  SECTION("zero_stage 4") {
    std::string message = parse_error(plan_with({{"zero_stage", 4}}));
    check_names(message, "zero_stage", "4");
    CHECK_THAT(message, Contains("0, 1, 2 or 3"));
  }
  SECTION("unknown schedule and recompute names suggest the closest") {
    std::string message = parse_error(plan_with({{"schedule", "1F1B"}}));
    check_names(message, "schedule", "\"1F1B\"");
    CHECK_THAT(message, Contains("closest: \"1f1b\""));
    message = parse_error(plan_with({{"recompute", "selectiv"}}));
    check_names(message, "recompute", "\"selectiv\"");
    CHECK_THAT(message, Contains("closest: \"selective\""));
  }
  SECTION("order must be a permutation of tp, dp and pp") {
    for (const char* order :
         {"tp-pp", "tp-dp-dp", "tp_dp_pp", "tp--dp-pp", "tp-dp-pp-", "TP-DP-PP"}) {
      std::string message = parse_error(plan_with({{"order", order}}));
      check_names(message, "order", "\"" + std::string(order) + "\"");
      CHECK_THAT(message, Contains("not a permutation of tp, dp, pp"));
    }
    CHECK(parse(plan_with({{"order", "pp-dp-tp"}})).order == "pp-dp-tp");
  }
  SECTION("dropout out of [0, 0.99]") {
    for (double dropout : {1.0, -0.1, 0.995}) {
      std::string message = parse_error(plan_with({{"dropout", dropout}}));
      check_names(message, "dropout", Json(dropout).dump());
      CHECK_THAT(message, Contains("a number in [0, 0.99]"));
    }
    CHECK(parse(plan_with({{"dropout", 0}})).dropout == 0.0);
  }
  SECTION("micro_batch_size · dp_size past 2^63 is rejected, not wrapped") {
    std::string message =
        parse_error(plan_with({{"micro_batch_size", 4}, {"dp_size", int64_t{1} << 62}}));
    check_names(message, "micro_batch_size", "4");
    CHECK_THAT(message, Contains("overflows"));
  }
}

TEST_CASE("plans that contradict the model or topology are rejected by validate_plan", "[plan]") {
  ModelConfig tiny = shipped_model("tiny");  // 4 layers, 4 heads, 2 KV heads
  Topology node = shipped_topology("dgx-a100-80gb", 1);  // 8 devices

  SECTION("tp_size must divide the attention heads") {
    std::string message = validate_error(plan_with({{"tp_size", 3}}), tiny, node);
    check_names(message, "tp_size", "3");
    CHECK_THAT(message, Contains("num_attention_heads = 4"));
    CHECK_THAT(message, Contains("tiny.json"));
    CHECK_THAT(message, Contains("a divisor of 4"));
  }
  SECTION("tp_size must divide the KV heads: llama3-8b, 32 heads and 8 KV heads, tp 16") {
    ModelConfig llama = shipped_model("llama3-8b");
    REQUIRE(llama.num_attention_heads % 16 == 0);
    std::string message = validate_error(plan_with({{"tp_size", 16}}), llama,
                                         shipped_topology("dgx-h100"));
    check_names(message, "tp_size", "16");
    CHECK_THAT(message, Contains("num_key_value_heads = 8"));
    CHECK_THAT(message, Contains("llama3-8b.json"));
    CHECK_THAT(message, Contains("a divisor of 8"));
    CHECK_NOTHROW(
        parse_and_validate(plan_with({{"tp_size", 8}}), llama, shipped_topology("dgx-h100")));
  }
  SECTION("more (microbatch, layer) passes than a program holds") {
    std::string message =
        validate_error(plan_with({{"global_batch_size", 100000}}), tiny, node);
    check_names(message, "global_batch_size", "100000");
    CHECK_THAT(message, Contains("at most 50000 microbatches per dp rank"));
    CHECK_NOTHROW(parse_and_validate(plan_with({{"global_batch_size", 50000}}), tiny, node));
  }
  SECTION("pp_size larger than the layers") {
    std::string message = validate_error(plan_with({{"pp_size", 8}}), tiny, node);
    check_names(message, "pp_size", "8");
    CHECK_THAT(message, Contains("exceeds the 4 layers"));
    CHECK_THAT(message, Contains("pp_size · virtual_pp_size <= 4"));
  }
  SECTION("pp_size · virtual_pp_size larger than the layers") {
    Json plan = plan_with({{"pp_size", 2}, {"virtual_pp_size", 4},
                           {"schedule", "interleaved_1f1b"}, {"global_batch_size", 2}});
    std::string message = validate_error(plan, tiny, node);
    check_names(message, "virtual_pp_size", "4");
    CHECK_THAT(message, Contains("= 8 exceeds the 4 layers"));
  }
  SECTION("pp_size · virtual_pp_size past 2^63 does not wrap to a small number") {
    const int64_t huge = int64_t{1} << 32;
    Json plan = plan_with({{"pp_size", huge}, {"virtual_pp_size", huge},
                           {"schedule", "interleaved_1f1b"}, {"global_batch_size", huge}});
    std::string message = validate_error(plan, tiny, node);
    check_names(message, "virtual_pp_size", std::to_string(huge));
    CHECK_THAT(message, Contains("exceeds the 4 layers"));
  }
  SECTION("more devices than the topology has suggests --nodes") {
    std::string message = validate_error(plan_with({{"dp_size", 16}}), tiny, node);
    check_names(message, "dp_size", "16");
    CHECK_THAT(message, Contains("= 16 devices"));
    CHECK_THAT(message, Contains("has 8 (1 nodes × 8)"));
    CHECK_THAT(message, Contains("--nodes 2"));
    // 2 · 5 = 10 devices need 2 nodes of 8, rounded up.
    CHECK_THAT(validate_error(plan_with({{"tp_size", 2}, {"dp_size", 5}}), tiny, node),
               Contains("--nodes 2"));
    // GPT-3 175B's 1,024 devices on 64 of the 128 DGX nodes.
    Plan gpt3 = load_plan(test::source_path("examples/gpt3-175b-a100-1024.json"));
    message = input_error_of([&] {
      validate_plan(gpt3, shipped_model("gpt3-175b"), shipped_topology("dgx-a100-80gb", 64));
    });
    CHECK_THAT(message, Contains("gpt3-175b-a100-1024.json: key 'dp_size' = 16"));
    CHECK_THAT(message, Contains("= 1024 devices"));
    CHECK_THAT(message, Contains("--nodes 128"));
  }
  SECTION("a product of sizes past 2^63 still reports too many devices") {
    std::string message =
        validate_error(plan_with({{"tp_size", 2}, {"dp_size", int64_t{1} << 62}}), tiny, node);
    check_names(message, "dp_size", std::to_string(int64_t{1} << 62));
    CHECK_THAT(message, Contains("has 8"));
  }
  SECTION("fewer devices than the topology has are allowed") {
    CHECK_NOTHROW(parse_and_validate(plan_with({{"dp_size", 2}}), tiny, node));
    Plan plan = load_plan(test::source_path("examples/gpt3-1.3b-h200-1.json"));
    CHECK_NOTHROW(
        validate_plan(plan, shipped_model("gpt3-1.3b"), shipped_topology("dgx-a100-80gb")));
  }
  SECTION("global_batch_size not divisible by micro_batch_size · dp_size") {
    Json plan = plan_with({{"micro_batch_size", 2}, {"dp_size", 2}, {"global_batch_size", 6}});
    std::string message = validate_error(plan, tiny, node);
    check_names(message, "global_batch_size", "6");
    CHECK_THAT(message, Contains("micro_batch_size · dp_size = 4"));
    CHECK_THAT(message, Contains("a multiple of 4"));
  }
  SECTION("virtual_pp_size > 1 needs the interleaved schedule") {
    for (const char* schedule : {"1f1b", "gpipe"}) {
      Json plan = plan_with({{"pp_size", 2}, {"virtual_pp_size", 2}, {"schedule", schedule},
                             {"global_batch_size", 2}});
      std::string message = validate_error(plan, tiny, node);
      check_names(message, "virtual_pp_size", "2");
      CHECK_THAT(message, Contains("interleaved_1f1b"));
      CHECK_THAT(message, Contains(schedule));
    }
  }
  SECTION("the interleaved schedule needs a pipeline") {
    std::string message = validate_error(plan_with({{"schedule", "interleaved_1f1b"}}), tiny, node);
    check_names(message, "pp_size", "1");
    CHECK_THAT(message, Contains("pp_size >= 2"));
  }
  SECTION("the interleaved schedule needs microbatches a multiple of pp_size") {
    Json plan = plan_with({{"pp_size", 2}, {"virtual_pp_size", 2},
                           {"schedule", "interleaved_1f1b"}, {"global_batch_size", 3}});
    std::string message = validate_error(plan, tiny, node);
    check_names(message, "global_batch_size", "3");
    CHECK_THAT(message, Contains("gives 3 microbatches"));
    CHECK_THAT(message, Contains("a multiple of micro_batch_size · dp_size · pp_size = 2"));
    plan["global_batch_size"] = 4;
    CHECK_NOTHROW(parse_and_validate(plan, tiny, node));
  }
  SECTION("layers_per_stage must have one entry per virtual stage and sum to the layers") {
    struct Case {
      Json layers;
      const char* rendered;
      const char* why;
    };
    const std::vector<Case> cases = {{{1, 2}, "[1,2]", "has 2 entries summing to 3"},
                                     {{4}, "[4]", "has 1 entries summing to 4"},
                                     {{1, 1, 2}, "[1,1,2]", "has 3 entries summing to 4"}};
    for (const auto& c : cases) {
      std::string message =
          validate_error(plan_with({{"pp_size", 2}, {"layers_per_stage", c.layers}}), tiny, node);
      check_names(message, "layers_per_stage", c.rendered);
      CHECK_THAT(message, Contains(c.why));
      CHECK_THAT(message, Contains("2 entries (pp_size · virtual_pp_size) summing to "
                                   "num_hidden_layers = 4"));
    }
  }
  SECTION("layers_per_stage entries that overflow their sum are not accepted") {
    // 2 · (2^63 - 1) + 6 wraps to 4, the layer count, if the sum is not checked.
    Json plan = plan_with({{"pp_size", 3}, {"layers_per_stage", {INT64_MAX, INT64_MAX, 6}}});
    check_names(validate_error(plan, tiny, node), "layers_per_stage",
                plan["layers_per_stage"].dump());
  }
  SECTION("sequence_parallel needs tp_size > 1") {
    std::string message = validate_error(plan_with({{"sequence_parallel", true}}), tiny, node);
    check_names(message, "sequence_parallel", "true");
    CHECK_THAT(message, Contains("tp_size = 1"));
    CHECK_NOTHROW(parse_and_validate(plan_with({{"sequence_parallel", true}, {"tp_size", 2}}),
                                     tiny, node));
  }
  SECTION("overlap_param_gather needs zero_stage >= 1") {
    std::string message = validate_error(plan_with({{"overlap_param_gather", true}}), tiny, node);
    check_names(message, "overlap_param_gather", "true");
    CHECK_THAT(message, Contains("zero_stage >= 1"));
    CHECK_NOTHROW(parse_and_validate(plan_with({{"overlap_param_gather", true}, {"zero_stage", 1}}),
                                     tiny, node));
  }
  SECTION("a dtype the device has no peak for names the topology key") {
    std::string message = validate_error(plan_with(), tiny, shipped_topology("localhost-cpu"));
    CHECK_THAT(message, Contains("localhost-cpu.json: key 'node.device.peak_flops_per_s.bf16'"));
    CHECK_NOTHROW(parse_and_validate(plan_with({{"dtype", "fp32"}}), tiny,
                                     shipped_topology("localhost-cpu")));
  }
}

TEST_CASE("every shipped plan is valid on its model and topology", "[plan]") {
  struct Shipped {
    const char* plan;
    const char* model;
    const char* topology;
  };
  const std::vector<Shipped> shipped = {
      {"tiny-cpu", "tiny", "localhost-cpu"},
      {"tiny-cpu-3d", "tiny", "localhost-cpu"},
      {"gpt3-175b-a100-1024", "gpt3-175b", "dgx-a100-80gb"},
      {"llama3-405b-h100-16384", "llama3-405b", "dgx-h100"},
      {"gpt3-13b-a100-64", "gpt3-13b", "dgx-a100-80gb"},
      {"gpt3-1.3b-h200-1", "gpt3-1.3b", "h200-1gpu"}};
  for (const auto& s : shipped) {
    INFO(s.plan);
    Plan plan = load_plan(test::source_path(std::string("examples/") + s.plan + ".json"));
    std::optional<int> nodes;
    if (std::string(s.plan) == "tiny-cpu-3d") nodes = 4;  // 8 ranks on 2-core nodes
    CHECK_NOTHROW(validate_plan(plan, shipped_model(s.model), shipped_topology(s.topology, nodes)));
  }
}

TEST_CASE("plans accept Megatron-LM's argument names as aliases", "[plan]") {
  Json megatron = {{"tensor_model_parallel_size", 2}, {"pipeline_model_parallel_size", 2},
                   {"data_parallel_size", 2}, {"use_distributed_optimizer", true}, {"bf16", true},
                   {"recompute_granularity", "selective"}, {"hidden_dropout", 0.0},
                   {"micro_batch_size", 1}, {"global_batch_size", 8}};
  Json ours = {{"tp_size", 2}, {"pp_size", 2}, {"dp_size", 2}, {"zero_stage", 1}, {"dtype", "bf16"},
               {"recompute", "selective"}, {"dropout", 0.0}, {"micro_batch_size", 1}, {"global_batch_size", 8}};
  Json a = plan_to_json(parse(megatron)), b = plan_to_json(parse(ours));
  a.erase("name");
  b.erase("name");
  CHECK(a == b);
  // A stepcast ZeRO stage wins over the distributed optimizer's stage 1; false switches nothing.
  megatron["zero_stage"] = 3;
  megatron["fp16"] = false;
  CHECK(parse(megatron).zero_stage == 3);
  // The same setting twice must agree.
  megatron["tp_size"] = 4;
  CHECK_THROWS_WITH(parse(megatron), Contains(kFile) && Contains("'tensor_model_parallel_size' = 2") &&
                                         Contains("contradicts 'tp_size' = 4"));
  Json both = {{"bf16", true}, {"dtype", "fp32"}, {"micro_batch_size", 1}};
  CHECK_THROWS_WITH(parse(both), Contains("'bf16'") && Contains("contradicts 'dtype'"));
  Json not_bool = {{"bf16", "yes"}, {"micro_batch_size", 1}};
  CHECK_THROWS_WITH(parse(not_bool), Contains("'bf16' = \"yes\"") && Contains("true or false"));
}
