// The CPU executor on FP8 parameters (fp8_param_gather, Megatron-LM's --fp8-param-gather), through
// `scripts/mpirun build/stepcast run`: each layer's linear weights live as FP8 codes only, cast
// from the master shards after the optimizer step and gathered as codes. fp64 curves against the
// single rank's FP8 curve of the same recipe, measured memory against the program's, a resumed
// checkpoint, and the weights it saves against the same plan without it.
#include "run_fixtures.hpp"

using namespace stepcast;
using namespace stepcast::test;

namespace {

Json fp8_plan(Json p, const char* recipe, bool param_gather = true) {
  p["fp8"] = "hybrid";
  p["fp8_recipe"] = recipe;
  if (param_gather) p["fp8_param_gather"] = true;
  return p;
}

double weights_bytes(const RunResult& r) {
  return r.measurement.at("memory").at("ranks")[0].at("memory_weights_bytes").get<double>();
}

}  // namespace

TEST_CASE("run: FP8 parameter plans give the single rank's FP8 curve (fp64), with their memory", "[run][fp8]") {
  // Casting a master shard with the weight's scale gives the codes casting the whole weight does:
  // the same scale (delayed: the one just updated, as the next step's first forward would use;
  // tensorwise: from the amax maximised over the shards), the same values. So every plan's curve
  // is the single rank's without FP8 parameters (tensorwise: with the plan's microbatch size,
  // whose tokens set the activations' scales; with tp the same plan's without them, as a tp rank's
  // row-parallel input takes its own scale: near the single rank's, test_run_cp_fp8.cpp). The
  // shards cut tensors anywhere (tiny's layer over 2 ranks, its codes gathered as bytes); tp with
  // SP, interleaved pp with full recompute, overlapped gathers under ZeRO-2, hybrid sharding, cp 2
  // (the shards over dp × cp) and ZeRO-3.
  const int steps = 4;
  Json hybrid = plan(1, 1, 4, 1, "1f1b", "none", false, true, 1, false);
  hybrid["num_distributed_optimizer_instances"] = 2;
  Json cp = plan(1, 1, 1, 1, "1f1b", "selective", false, true, 2, false);
  cp["context_parallel_size"] = 2;
  Json history = plan(1, 1, 2, 1, "1f1b", "none", false, true, 1, false);
  history["fp8_amax_history_len"] = 4;
  history["fp8_amax_compute_algo"] = "max";
  struct Case {
    const char* model;
    const char* recipe;
    Json plan;
  };
  const std::vector<Case> cases = {
      {"tiny", "delayed", plan(1, 1, 2, 1, "1f1b", "none", false, true, 1, false)},
      {"tiny", "delayed", plan(1, 1, 2, 2, "1f1b", "selective", false, true, 1, true)},
      {"tiny", "delayed", plan(2, 1, 2, 1, "1f1b", "selective", true, true, 2, true)},
      {"tiny", "delayed", plan(1, 2, 2, 1, "interleaved_1f1b", "full", false, true, 1, false)},
      {"tiny", "delayed", hybrid},
      {"tiny", "delayed", cp},
      {"tiny-gpt", "delayed", plan(2, 1, 2, 2, "1f1b", "none", false, false, 1, false)},
      {"tiny", "tensorwise", plan(1, 1, 2, 1, "1f1b", "none", false, true, 1, false)},
      {"tiny", "tensorwise", plan(2, 1, 2, 2, "1f1b", "selective", true, true, 2, true)},  // (against itself)
      {"tiny", "tensorwise", hybrid},
      {"tiny", "history", history},
      // ZeRO-3: the codes sharded, gathered at each use (prefetched with overlap), the rest whole.
      {"tiny", "delayed", plan(1, 1, 2, 3, "1f1b", "full", false, true, 1, true)},
      {"tiny", "delayed", plan(2, 1, 2, 3, "1f1b", "selective", true, true, 2, false)},
      {"tiny-gpt", "tensorwise", plan(1, 2, 2, 3, "1f1b", "none", false, true, 1, true)},
  };
  auto key_of = [](const Case& c) {
    return std::string(c.model) + " " + c.recipe + " mbs " + c.plan.at("micro_batch_size").dump();
  };
  std::map<std::string, std::vector<double>> reference;
  for (const Case& c : cases) {
    const std::string key = key_of(c);
    if (reference.count(key)) continue;
    const bool max_history = std::string(c.recipe) == "history";
    Json one = fp8_plan(plan(1, 1, 1, 0, "1f1b", "none", false, true, c.plan.at("micro_batch_size"), false),
                        max_history ? "delayed" : c.recipe, false);
    if (max_history) {
      one["fp8_amax_history_len"] = 4;
      one["fp8_amax_compute_algo"] = "max";
    }
    RunResult single = run_plan(c.model, one, steps);
    INFO(single.output);
    REQUIRE(single.exit_code == 0);
    reference[key] = curve(single);
  }
  double largest = 0;
  for (const Case& c : cases) {
    const bool max_history = std::string(c.recipe) == "history";
    const Json p = fp8_plan(c.plan, max_history ? "delayed" : c.recipe);
    RunResult r = run_plan(c.model, p, steps);
    INFO(c.model << " " << p.dump() << "\n" << r.output);
    REQUIRE(r.exit_code == 0);
    std::vector<double> against = reference.at(key_of(c));
    if (std::string(c.recipe) == "tensorwise" && c.plan.at("tp_size") != 1) {
      RunResult same = run_plan(c.model, fp8_plan(c.plan, c.recipe, false), steps);
      REQUIRE(same.exit_code == 0);
      against = curve(same);
    }
    const double d = max_relative_difference(curve(r), against);
    std::printf("fp8 parameters %-8s %s: max relative loss difference %.3g\n", c.model, p.dump().c_str(), d);
    largest = std::max(largest, d);
    CHECK(d < 1e-12);
    check_measured_memory("fp8 parameters " + p.dump(), r, true, 64 * 1024);
  }
  std::printf("fp8 parameters: largest deviation over %zu plans: %.3g\n", cases.size(), largest);
}

TEST_CASE("run: FP8 parameters save their weights' 16-bit copy, and resume from a checkpoint", "[run][fp8]") {
  // Against the same plan without them: the same curve, and a smaller weights class (the linear
  // weights' copy in the plan's dtype gone; the optimizer keeps their master shard). On a device
  // that reads FP8 row-wise only the codes are transposed at their first use too.
  Json topology = load_json_file(source_path("topologies/localhost-cpu.json"));
  topology["node"]["device"]["fp8_columnwise"] = "transposed";
  const std::string transposed = write_temp_file("localhost-cpu-fp8-params-transposed.json", topology.dump());
  const Json base = plan(1, 1, 2, 1, "1f1b", "none", false, true, 1, false);
  for (const std::string& device : {source_path("topologies/localhost-cpu.json"), transposed}) {
   for (int zero : {1, 3}) {
    Json p = base;
    p["zero_stage"] = zero;
    RunResult with = run_plan("tiny-gpt", fp8_plan(p, "delayed"), 3, "", device);
    RunResult without = run_plan("tiny-gpt", fp8_plan(p, "delayed", false), 3, "", device);
    INFO(device << " ZeRO-" << zero << "\n" << with.output << without.output);
    REQUIRE(with.exit_code == 0);
    REQUIRE(without.exit_code == 0);
    CHECK(max_relative_difference(curve(with), curve(without)) < 1e-12);
    CHECK(weights_bytes(with) < weights_bytes(without));
    check_measured_memory("fp8 parameters " + device, with, zero != 3, 64 * 1024);
   }
  }
  Json named = fp8_plan(base, "tensorwise");
  named["name"] = "fp8-params-resume";  // the program (and its hash) names the plan
  const WholeAndResumed runs = whole_and_resumed("tiny", named, 5, 3, fresh_dir("run-fp8-params-resume"));
  CHECK(runs.resumed == std::vector<double>(runs.whole.begin() + 3, runs.whole.end()));
}
