// The planner's search: enumeration counts worked by hand, every pruned plan's reason re-checked,
// the memory path against the full program's memory, ranking by an evaluator passed in, and
// `stepcast plan` end to end with its bad-input cases.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <set>
#include <tuple>

#include "errors.hpp"
#include "json_input.hpp"
#include "lower.hpp"
#include "memory.hpp"
#include "search.hpp"
#include "test_support.hpp"

using namespace stepcast;
using namespace stepcast::test;

namespace {

ModelConfig tiny() { return load_model(source_path("plans/models/tiny.json")); }
Topology cpu(int nodes) { return load_topology(source_path("topologies/localhost-cpu.json"), nodes); }

ComputeCostModel cost_model(const Topology& topology) {
  return ComputeCostModel(topology.node.device, Dtype::fp32, roofline_profile(topology), topology.file);
}

}  // namespace

TEST_CASE("enumeration counts for the tiny model on 4 CPU cores", "[search]") {
  // 2 nodes × 2 cores: tp ∈ {1, 2} (divisors of devices_per_node), pp ∈ divisors of 4/tp.
  // Triples (tp, pp, dp): (1,1,4) (1,2,2) (1,4,1) (2,1,2) (2,2,1).
  // Per triple: 4 micro batches × 4 ZeRO stages × schedules (1 at pp 1; 1f1b + vpp 2,3,4 = 4
  // otherwise) × 3 recompute × sequence parallel (2 when tp > 1):
  //   48 + 192 + 192 + 96 + 384 = 912.
  SearchSpace space;
  space.global_batch_size = 32;
  auto candidates = enumerate_candidates(tiny(), cpu(2), space);
  CHECK(candidates.size() == 912);
  std::set<std::tuple<int64_t, int64_t, int64_t>> triples;
  std::map<std::tuple<int64_t, int64_t>, int64_t> kept_by_tp_pp;
  for (const auto& c : candidates) {
    triples.insert({c.plan.tp_size, c.plan.pp_size, c.plan.dp_size});
    if (c.kept()) ++kept_by_tp_pp[{c.plan.tp_size, c.plan.pp_size}];
  }
  CHECK(triples == std::set<std::tuple<int64_t, int64_t, int64_t>>{
                       {1, 1, 4}, {1, 2, 2}, {1, 4, 1}, {2, 1, 2}, {2, 2, 1}});
  // (1,1,4): mbs·4 divides 32 for every mbs: all 48 valid.
  CHECK(kept_by_tp_pp[{1, 1}] == 48);
  // (1,4,1): 4 layers on 4 stages leave no room for virtual stages: 1f1b only, m = 32/mbs:
  // 4 mbs × 4 zero × 3 recompute = 48.
  CHECK(kept_by_tp_pp[{1, 4}] == 48);
  // (1,2,2): m = 16/mbs; vpp 2 (2·2 = 4 ≤ 4 layers) needs m % 2 == 0: mbs 1, 2, 4 (m = 16, 8, 4),
  // not 8 (m = 2 — still even, so also valid); vpp 3, 4 exceed the layers.
  // 1f1b: 4·4·3 = 48; vpp 2: 4·4·3 = 48 → 96.
  CHECK(kept_by_tp_pp[{1, 2}] == 96);
  auto counts = pruned_counts(candidates);
  CHECK(counts.size() >= 1);
  int64_t pruned = 0;
  for (const auto& [reason, n] : counts) pruned += n;
  int64_t kept = 0;
  for (const auto& c : candidates) kept += c.kept();
  CHECK(pruned + kept == 912);
}

TEST_CASE("every pruned plan carries a true reason; memory path agrees with memory", "[search]") {
  ModelConfig model = tiny();
  Topology topology = cpu(2);
  SearchSpace space;
  space.global_batch_size = 32;
  auto candidates = enumerate_candidates(model, topology, space);
  // Validation reasons: validating the plan again throws the same message.
  for (const auto& c : candidates) {
    if (c.kept()) continue;
    Plan again = c.plan;
    again.layers_per_stage.clear();
    again.grad_bucket_bytes = 0;
    INFO(c.plan.name << ": " << c.pruned_detail);
    try {
      validate_plan(again, model, topology);
      FAIL("validated: " << c.plan.name);
    } catch (const InputError& e) {
      CHECK(std::string(e.what()) == c.pruned_detail);
    }
  }
  // First pass at full capacity, to find a memory limit some plans meet and some do not.
  auto all = candidates;
  auto costs = cost_model(topology);
  check_candidates(all, model, topology, space, costs, 2, nullptr);
  std::vector<double> peaks;
  for (const auto& c : all) {
    if (c.kept()) peaks.push_back(c.peak_bytes_max);
  }
  REQUIRE(peaks.size() > 10);
  std::sort(peaks.begin(), peaks.end());
  space.max_memory_fraction = peaks[peaks.size() / 2] / topology.node.device.memory_bytes;
  check_candidates(candidates, model, topology, space, costs, 2, nullptr);
  int64_t fit = 0, too_big = 0, capped = 0;
  for (const auto& c : candidates) {
    if (!c.kept() && c.pruned != "does not fit in memory") continue;
    // The memory path's verdict against `memory` on the whole program.
    MemoryReport full = memory_report(lower_program(model, topology, c.plan), topology);
    INFO(c.plan.name);
    CHECK(full.peak_bytes_max == Approx(c.peak_bytes_max).epsilon(1e-12));
    bool full_fits = full.peak_bytes_max + full.reserved_bytes <=
                     space.max_memory_fraction * full.capacity_bytes;
    CHECK(full_fits == c.kept());
    if (c.kept()) {
      ++fit;
      CHECK(c.estimate.step_time_s > 0);
    } else {
      ++too_big;
    }
    capped += memory_path_plan(c.plan).num_microbatches() < c.plan.num_microbatches();
  }
  CHECK(fit > 0);
  CHECK(too_big > 0);
  CHECK(capped > 0);  // the cap was exercised
}

TEST_CASE("search ranks by the evaluator it is given", "[search]") {
  ModelConfig model = tiny();
  Topology topology = cpu(2);
  SearchSpace space;
  space.global_batch_size = 16;
  auto candidates = enumerate_candidates(model, topology, space);
  check_candidates(candidates, model, topology, space, cost_model(topology), 2, nullptr);
  std::atomic<int> calls{0};
  // A fake evaluator that prefers large micro batches and then ZeRO stage 0.
  Evaluator fake = [&calls](const Plan& plan) {
    ++calls;
    return 10.0 / double(plan.micro_batch_size) + plan.zero_stage;
  };
  auto ranked = search(candidates, fake, 12, 2, nullptr);
  CHECK(calls == 12);
  REQUIRE(ranked.size() > 12);
  for (size_t i = 0; i < 12; ++i) REQUIRE(ranked[i].step_time_s);
  for (size_t i = 1; i < 12; ++i) CHECK(*ranked[i - 1].step_time_s <= *ranked[i].step_time_s);
  for (size_t i = 12; i < ranked.size(); ++i) {
    CHECK(!ranked[i].step_time_s);
    if (i > 12) CHECK(ranked[i - 1].estimate.step_time_s <= ranked[i].estimate.step_time_s);
  }
  // Every returned plan lowers and fits.
  for (const auto& c : ranked) {
    MemoryReport memory = memory_report(lower_program(model, topology, c.plan), topology);
    CHECK(memory.fits);
  }
}

TEST_CASE("Megatron-LM arguments of a plan", "[search]") {
  ModelConfig model = load_model(source_path("plans/models/gpt3-175b.json"));
  Plan plan;
  plan.tp_size = 8;
  plan.pp_size = 8;
  plan.schedule = ScheduleKind::interleaved_1f1b;
  plan.virtual_pp_size = 3;
  plan.micro_batch_size = 1;
  plan.global_batch_size = 1536;
  plan.sequence_parallel = true;
  plan.recompute = RecomputeKind::full;
  plan.zero_stage = 1;
  auto args = megatron_arguments(plan, model);
  auto has = [&](const std::string& a) {
    return std::find(args.arguments.begin(), args.arguments.end(), a) != args.arguments.end();
  };
  CHECK(has("--num-layers-per-virtual-pipeline-stage 4"));  // 96 / (8·3)
  CHECK(has("--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"));
  CHECK(has("--use-distributed-optimizer"));
  CHECK(has("--sequence-parallel"));
  CHECK(args.notes.empty());
  plan.zero_stage = 3;
  CHECK(megatron_arguments(plan, model).notes.size() == 1);
}

TEST_CASE("stepcast plan end to end on the tiny model", "[search][cli]") {
  std::string out = (std::filesystem::temp_directory_path() / "stepcast-test-plan").string();
  std::filesystem::remove_all(out);
  auto r = run_stepcast("plan" + model_arg("tiny") + topology_arg("localhost-cpu") +
                        " --global-batch-size 8 --top 3 --evaluate 2 --out " + out);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  Json plans = load_json_file(out + "/plans.json");
  REQUIRE(plans.at("plans").size() >= 3);
  CHECK(plans["plans"][0]["step_time_source"] == "simulate");
  CHECK(plans["plans"][1]["step_time_source"] == "simulate");
  CHECK(plans["plans"][0]["step_time_s"].get<double>() <= plans["plans"][1]["step_time_s"].get<double>());
  REQUIRE(plans.at("top").size() == 3);
  for (const auto& t : plans["top"]) {
    std::string file = out + "/" + t.at("plan_file").get<std::string>();
    auto sim = run_stepcast("simulate" + model_arg("tiny") + topology_arg("localhost-cpu") +
                            " --plan " + file + " --no-scaling");
    INFO(sim.output);
    CHECK(sim.exit_code == 0);
  }
  std::filesystem::remove_all(out);
}

TEST_CASE("stepcast plan refuses what no plan can do", "[search][cli]") {
  // 16 cores, 4 layers: tp·pp ≤ 2·4, so dp ≥ 2 and an odd batch divides by nothing.
  auto batch = run_stepcast("plan" + model_arg("tiny") + topology_arg("localhost-cpu") +
                            " --nodes 8 --global-batch-size 7");
  INFO(batch.output);
  CHECK(batch.exit_code == 2);
  CHECK(batch.output.find("no plan is valid for --global-batch-size 7") != std::string::npos);
  auto big = run_stepcast("plan" + model_arg("gpt3-175b") + topology_arg("localhost-cpu") +
                          " --global-batch-size 8");
  INFO(big.output);
  CHECK(big.exit_code == 2);
  CHECK(big.output.find("more than the cluster's 2 devices") != std::string::npos);
  auto tight = run_stepcast("plan" + model_arg("gpt2-124m") + topology_arg("localhost-cpu") +
                            " --global-batch-size 8 --max-memory-fraction 0.1");
  INFO(tight.output);
  CHECK(tight.exit_code == 2);
  CHECK(tight.output.find("no plan fits") != std::string::npos);
  CHECK(tight.output.find("Checked changes") != std::string::npos);
}
