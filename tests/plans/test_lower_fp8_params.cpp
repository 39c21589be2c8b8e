// Lowering of FP8 parameters (fp8_param_gather, Megatron-LM's --fp8-param-gather; plans/fp8.hpp):
// a layer's linear weights kept in FP8 only, cast from the master shards after the optimizer step
// and gathered as codes; its weights buffer the other tensors; the memory that saves, the cheap
// path's agreement, the arguments, the program JSON and the refusals.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>

#include "cheap_path_check.hpp"
#include "errors.hpp"
#include "lower.hpp"
#include "lower_context.hpp"
#include "lower_fixtures.hpp"
#include "megatron_export.hpp"
#include "megatron_import.hpp"
#include "memory.hpp"
#include "program_check.hpp"
#include "program_json.hpp"
#include "torchtitan_export.hpp"

using namespace stepcast;
using namespace stepcast::test;

namespace {

Json params_plan(const char* recipe, int zero = 1, bool param_gather = true) {
  return {{"dp_size", 2},       {"zero_stage", zero},  {"micro_batch_size", 1}, {"global_batch_size", 4},
          {"dtype", "fp32"},    {"dropout", 0.0},      {"fp8", "hybrid"},       {"fp8_recipe", recipe},
          {"fp8_param_gather", param_gather}};
}

// Each persistent buffer's bytes on role 0, by name.
std::map<std::string, double> persistent(const StepProgram& program) {
  std::map<std::string, double> out;
  for (const Op& op : program.roles[0].ops) {
    if (op.kind == OpKind::alloc && op.persistent) out[op.buffer] = op.bytes;
  }
  return out;
}

}  // namespace

TEST_CASE("FP8 parameters: 16-bit tensors in the weights buffer, FP8 codes cast after the update and gathered",
          "[lower][fp8]") {
  ModelConfig model = load_model(source_path("models/small-gpt.json"));
  const Topology topology = test_topology();
  for (const char* recipe : {"delayed", "tensorwise"}) {
    INFO(recipe);
    const bool current = std::string(recipe) == "tensorwise";
    const Plan plan = make_plan(params_plan(recipe), model, topology);
    const Plan without = make_plan(params_plan(recipe, 1, false), model, topology);
    const StepProgram program = lower_program(model, topology, plan);
    const StepProgram reference = lower_program(model, topology, without);
    REQUIRE(check_program(program).empty());
    const LowerContext c(model, topology, plan);
    const double linear = double(c.layer_linear_weights()), elements = double(c.layer_params_local());
    const int64_t layers = model.num_hidden_layers;
    // The weights buffer holds the rest (fp32: 4 bytes); the optimizer a master copy (fp32 plans too).
    std::map<std::string, double> with = persistent(program), before = persistent(reference);
    for (int64_t l = 0; l < layers; ++l) {
      const std::string g = "L" + std::to_string(l);
      CHECK(with.at("weights." + g) == 4 * (elements - linear));
      CHECK(before.at("weights." + g) == 4 * elements);
      CHECK(with.at("fp8w." + g) == before.at("fp8w." + g));
      CHECK(with.at("optimizer." + g) == 1.5 * before.at("optimizer." + g));  // [m | v | master]
    }
    CHECK(with.at("weights.embedding") == before.at("weights.embedding"));
    CHECK(with.at("optimizer.embedding") == before.at("optimizer.embedding"));  // (fp32: no master)
    int64_t forward_casts = 0, param_casts = 0, absmaxes = 0, shard_amax = 0;
    double code_bytes = 0, kept_bytes = 0;
    for (const Op& op : program.roles[0].ops) {
      if (op.name == OpName::fp8_weights) ++forward_casts;
      if (op.name == OpName::fp8_param_cast) {
        ++param_casts;
        CHECK(op.phase == Phase::optimizer);
        CHECK(op.inputs.at(0).rfind("optimizer.L", 0) == 0);
        CHECK(op.bytes == Approx(linear / 2 * 5));  // its half of the FP8 weights: read 4 bytes, write 1
      }
      if (op.name == OpName::fp8_param_absmax) ++absmaxes;
      if (op.name == OpName::fp8_amax && op.group == GroupKind::dp) ++shard_amax;
      if (op.name != OpName::param_gather) continue;
      CHECK(op.phase == Phase::optimizer);  // (no overlap_param_gather)
      for (const BufferName& name : op.inputs) {
        if (name.rfind("fp8w.", 0) == 0) code_bytes += linear;
      }
      if (op.inputs.at(0).rfind("weights.", 0) == 0) kept_bytes += op.bytes;
    }
    CHECK(forward_casts == 0);
    CHECK(param_casts == layers);
    CHECK(absmaxes == (current ? layers : 0));
    CHECK(shard_amax == (current ? 1 : 0));
    CHECK(code_bytes == Approx(double(layers) * linear));
    double gathered_codes = 0, gathered_before = 0;
    for (const Op& op : program.roles[0].ops) {
      if (op.name == OpName::param_gather) gathered_codes += op.bytes;
    }
    for (const Op& op : reference.roles[0].ops) {
      if (op.name == OpName::param_gather) gathered_before += op.bytes;
    }
    // Every layer's linear weights a byte each instead of four.
    CHECK(gathered_before - gathered_codes == Approx(3 * double(layers) * linear));
    CHECK(kept_bytes == Approx(gathered_before - 4 * double(layers) * linear));
    // The weights class at the peak: 4 bytes less for each linear weight.
    const double saved = memory_report(reference, topology).ranks[0].weights_bytes -
                         memory_report(program, topology).ranks[0].weights_bytes;
    CHECK(saved == Approx(4 * double(layers) * linear));
  }
}

TEST_CASE("FP8 parameters: a device reading FP8 row-wise only transposes the codes at their first use",
          "[lower][fp8]") {
  ModelConfig model = load_model(source_path("models/small-gpt.json"));
  Topology topology = test_topology();
  topology.node.device.fp8_transposed_copies = true;
  const StepProgram program = lower_program(model, topology, make_plan(params_plan("delayed", 2), model, topology));
  REQUIRE(check_program(program).empty());
  int64_t transposes = 0;
  for (const Op& op : program.roles[0].ops) {
    if (op.name != OpName::fp8_weights_transpose) continue;
    ++transposes;
    CHECK(op.phase == Phase::forward);
    CHECK(op.inputs.at(0).rfind("fp8w.L", 0) == 0);
  }
  CHECK(transposes == model.num_hidden_layers);  // once a step, as without fp8_param_gather
}

TEST_CASE("FP8 parameters under ZeRO-3: the codes sharded and gathered at each use, the other tensors whole",
          "[lower][fp8]") {
  ModelConfig model = load_model(source_path("models/small-gpt.json"));
  Topology topology = test_topology();
  topology.node.device.fp8_transposed_copies = true;
  const Plan plan = make_plan(params_plan("delayed", 3), model, topology);
  const StepProgram program = lower_program(model, topology, plan);
  REQUIRE(check_program(program).empty());
  const LowerContext c(model, topology, plan);
  const double linear = double(c.layer_linear_weights()), elements = double(c.layer_params_local());
  const int64_t layers = model.num_hidden_layers, microbatches = plan.num_microbatches();
  std::map<std::string, double> with = persistent(program);
  CHECK(with.at("weights.L0") == 4 * (elements - linear));  // whole
  CHECK(with.at("fp8w.L0") == std::ceil(elements / 2));   // this rank's half of the codes
  CHECK_FALSE(with.count("fp8wt.L0"));                   // (transposed at each backward use)
  CHECK(with.at("weights.embedding") == 4 * std::ceil(double(c.vocab_local * c.h) / 2));  // sharded
  int64_t code_gathers = 0, wfull = 0, casts = 0, transposes = 0, kept_gathers = 0;
  for (const Op& op : program.roles[0].ops) {
    if (op.name == OpName::zero3_param_gather && op.inputs.at(0).rfind("fp8w.L", 0) == 0) {
      ++code_gathers;
      CHECK(op.bytes == linear);
    }
    if (op.kind == OpKind::alloc && op.buffer.rfind("wfull.L", 0) == 0) ++wfull;
    if (op.name == OpName::fp8_weights) ++casts;
    if (op.name == OpName::fp8_weights_transpose) {
      ++transposes;
      CHECK(op.phase == Phase::backward);
    }
    if (op.name == OpName::param_gather) {
      ++kept_gathers;
      CHECK(op.phase == Phase::optimizer);
      for (const BufferName& name : op.inputs) CHECK(name.rfind("weights.L", 0) == 0);
    }
  }
  CHECK(code_gathers == 2 * layers * microbatches);  // forward and backward
  CHECK(wfull == 0);
  CHECK(casts == 0);
  CHECK(transposes == layers * microbatches);
  CHECK(kept_gathers >= 1);
}

TEST_CASE("FP8 parameters: the cheap path agrees with memory and quick_estimate (small-gpt on 8 H100)",
          "[search][fp8]") {
  ModelConfig model = load_model(source_path("models/small-gpt.json"));
  Topology topology = load_topology(source_path("topologies/dgx-h100.json"), 1);
  SearchSpace space;
  space.global_batch_size = 16;
  space.attention_impl = AttentionImpl::flash;
  space.micro_batch_sizes = {1, 2};
  space.fp8.format = Fp8Format::hybrid;
  space.fp8.param_gather = true;
  CHECK(check_cheap_path(model, topology, space, 3) > 0);
  int64_t with = 0;
  for (const Candidate& c : enumerate_candidates(model, topology, space)) {
    CHECK(c.plan.fp8.param_gather == (c.plan.zero_stage >= 1));
    if (c.plan.fp8.param_gather) CHECK(c.plan.name.find("-pg") != std::string::npos);
    with += c.plan.fp8.param_gather && c.kept();
  }
  CHECK(with > 0);
}

TEST_CASE("FP8 parameters: the plan key travels through the program JSON and Megatron-LM's arguments",
          "[lower][fp8]") {
  ModelConfig model = load_model(source_path("models/small-gpt.json"));
  const Topology topology = test_topology();
  const Plan plan = make_plan(params_plan("tensorwise"), model, topology);
  CHECK(plan_to_json(plan).at("fp8_param_gather") == true);
  const Plan off = make_plan(params_plan("tensorwise", 1, false), model, topology);
  CHECK_FALSE(plan_to_json(off).contains("fp8_param_gather"));
  std::ostringstream text;
  write_program_json(lower_program(model, topology, plan), &text);
  CHECK(text.str().find("\"param_gather\":true") != std::string::npos);
  CHECK(parse_program_json_text(text.str(), "program.json").fp8.param_gather);
  std::string wrong = text.str();
  wrong.replace(wrong.find("\"param_gather\":true"), 19, "\"param_gather\":1");
  CHECK_THROWS_WITH(parse_program_json_text(rehash(wrong), "program.json"),
                    Catch::Contains("key 'fp8.param_gather' = 1") && Catch::Contains("valid: true with recipe"));
  std::string all;
  for (const std::string& a : megatron_arguments(plan, model).arguments) all += a + "\n";
  CHECK(all.find("--fp8-param-gather\n") != std::string::npos);
  const MegatronImport back = import_megatron_arguments(all, "args", "back");
  CHECK(back.plan.at("fp8_param_gather") == true);
  std::string notes;
  for (const std::string& n : torchtitan_config(plan, model).notes) notes += n + "\n";
  CHECK(notes.find("cannot run this plan as simulated: fp8_param_gather with ZeRO-1") != std::string::npos);
  const TorchTitanConfig fsdp = torchtitan_config(make_plan(params_plan("tensorwise", 3), model, topology), model);
  CHECK(fsdp.toml.find("enable_fsdp_float8_all_gather = true") != std::string::npos);
  CHECK(fsdp.toml.find("precompute_float8_dynamic_scale_for_fsdp = true") != std::string::npos);
}

TEST_CASE("FP8 parameters: refused without the distributed optimizer, with other recipes, experts or async dp",
          "[lower][fp8]") {
  const Topology topology = test_topology();
  CHECK_THAT(plan_refusal(params_plan("delayed", 0), "small-gpt", topology),
             Catch::Contains("key 'fp8_param_gather' = true") && Catch::Contains("distributed optimizer or FSDP") &&
                 Catch::Contains("valid: false (or absent), or zero_stage 1, 2 or 3"));
  CHECK(plan_refusal(params_plan("delayed", 3), "small-gpt", topology) == "accepted");
  Topology hopper = load_topology(source_path("topologies/dgx-h100.json"), 1);
  Json blockwise = params_plan("blockwise");
  blockwise["dtype"] = "bf16";
  CHECK_THAT(plan_refusal(blockwise, "small-gpt", hopper),
             Catch::Contains("per-tensor scales") && Catch::Contains("fp8_recipe is \"blockwise\""));
  CHECK_THAT(plan_refusal(params_plan("delayed"), "tiny-moe", topology), Catch::Contains("mixtures of experts"));
  Json async = params_plan("delayed");
  async["data_parallel_mode"] = "async";
  CHECK_THAT(plan_refusal(async, "small-gpt", topology), Catch::Contains("key 'fp8_param_gather'") &&
                                                            Catch::Contains("data_parallel_mode is \"async\""));
  Json off = params_plan("delayed");
  off.erase("fp8");
  off.erase("fp8_recipe");
  CHECK_THAT(plan_refusal(off, "small-gpt", topology),
             Catch::Contains("key 'fp8_param_gather'") && Catch::Contains("no fp8 key"));
}

TEST_CASE("stepcast plan --fp8-param-gather: a plan simulate finds too big ranks after those that fit",
          "[search][cli][fp8]") {
  // Llama 3 70B on 64 H100: FP8 parameters let ZeRO-1/2 plans near the device's memory through
  // the screen, which leaves the arena's placement to simulate; one of the simulated plans then
  // does not fit. It ranks after every other plan (here out of the top 10), with the warning.
  std::string out = (std::filesystem::temp_directory_path() / "stepcast-test-plan-fp8-params").string();
  std::filesystem::remove_all(out);
  auto r = run_stepcast("plan" + model_arg("llama3-70b") + topology_arg("dgx-h100") +
                        " --nodes 8 --global-batch-size 128 --fp8 hybrid --fp8-param-gather --top 10 --evaluate 10"
                        " --out " + out);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const std::string warning = ": simulate says it does not fit in memory";
  const size_t at = r.output.find(warning);
  REQUIRE(at != std::string::npos);
  const size_t from = r.output.rfind("warning: ", at) + 9;
  const std::string too_big = r.output.substr(from, at - from);
  const Json plans = load_json_file(out + "/plans.json");
  bool too_big_seen = false;
  int64_t with_params = 0;
  for (const Json& row : plans.at("top")) {
    const bool fits = row.at("headroom_bytes").get<double>() >= 0;
    if (row.at("name") == too_big) too_big_seen = true;
    CHECK((fits || row.at("name") == too_big));
    CHECK((!too_big_seen || row.at("name") == too_big));  // nothing after it but what does not fit
    with_params += row.at("plan").value("fp8_param_gather", false);
  }
  CHECK(with_params >= 1);
  CHECK(plans.at("top").at(0).at("headroom_bytes").get<double>() >= 0);
  std::filesystem::remove_all(out);
}
