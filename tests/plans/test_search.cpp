// The planner's search: enumeration counts worked by hand, every pruned plan's reason re-checked,
// the memory path against the full program's memory, ranking by an evaluator passed in, and
// `stepcast plan` end to end with its bad-input cases.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <tuple>

#include "csv_tables.hpp"
#include "errors.hpp"
#include "json_input.hpp"
#include "lower.hpp"
#include "memory.hpp"
#include "program_check.hpp"
#include "program_stats.hpp"
#include "profile.hpp"
#include "pruned_reasons.hpp"
#include "quick_estimate.hpp"
#include "search.hpp"
#include "simulator.hpp"
#include "cheap_path_check.hpp"
#include "test_support.hpp"

using namespace stepcast;
using namespace stepcast::test;

namespace {

ModelConfig tiny() { return load_model(source_path("models/tiny.json")); }
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
  //   48 + 192 + 192 + 96 + 384 = 912,
  // plus hybrid sharding where dp leaves the node: (1,1,4) with shards of 2 (one node's cores),
  // ZeRO 1–3: 4 × 3 × 3 = 36 → 948.
  SearchSpace space;
  space.global_batch_size = 32;
  auto candidates = enumerate_candidates(tiny(), cpu(2), space);
  CHECK(candidates.size() == 948);
  std::set<std::tuple<int64_t, int64_t, int64_t>> triples;
  std::map<std::tuple<int64_t, int64_t>, int64_t> kept_by_tp_pp;
  for (const auto& c : candidates) {
    triples.insert({c.plan.tp_size, c.plan.pp_size, c.plan.dp_size});
    if (c.kept()) ++kept_by_tp_pp[{c.plan.tp_size, c.plan.pp_size}];
  }
  CHECK(triples == std::set<std::tuple<int64_t, int64_t, int64_t>>{
                       {1, 1, 4}, {1, 2, 2}, {1, 4, 1}, {2, 1, 2}, {2, 2, 1}});
  // (1,1,4): mbs·4 divides 32 for every mbs: all 48 + 36 valid.
  CHECK(kept_by_tp_pp[{1, 1}] == 84);
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
  CHECK(pruned + kept == 948);
  // Flash attention keeps no scores, so selective recompute would lower to recompute none's
  // program: not enumerated (recompute none and full only: 2/3 of 948).
  space.attention_impl = AttentionImpl::flash;
  auto flash = enumerate_candidates(tiny(), cpu(2), space);
  CHECK(flash.size() == 632);
  for (const auto& c : flash) CHECK(c.plan.recompute != RecomputeKind::selective);
}

TEST_CASE("pruned reasons: a category's N and <file> printed as the values its messages took", "[search]") {
  const std::string a = "candidate p1: key 'pp_size' = 128: pp_size · virtual_pp_size = 128 exceeds the 96 layers "
                        "of models/m.json; valid: pp_size · virtual_pp_size <= 96";
  const std::string b = "candidate p2: key 'pp_size' = 64: pp_size · virtual_pp_size = 384 exceeds the 96 layers "
                        "of models/m.json; valid: pp_size · virtual_pp_size <= 96";
  CHECK(reason_category(a, "models/m.json", "t.json") == "pp_size: pp_size · virtual_pp_size = N exceeds the N "
                                                          "layers of <file>");
  CHECK(reason_category(a, "models/m.json", "t.json") == reason_category(b, "models/m.json", "t.json"));
  CHECK(reason_with_ranges({a}) == "pp_size: pp_size · virtual_pp_size = 128 exceeds the 96 layers of models/m.json");
  CHECK(reason_with_ranges({b, a}) ==
        "pp_size: pp_size · virtual_pp_size = 128–384 exceeds the 96 layers of models/m.json");
  CHECK(reason_with_ranges({"candidate p3: key 'x' = 1.5: ratio 1.5 below 2.25; valid: 3",
                            "candidate p4: key 'x' = 0.75: ratio 0.75 below 2.25; valid: 3"}) ==
        "x: ratio 0.75–1.5 below 2.25");
  CHECK(reason_category("no key here: 3 things", "models/m.json", "t.json") == "plan: no key here: N things");
  CHECK(reason_with_ranges({}).empty());

  // The planner's own candidates: the same counts, and no N or <file> left in a validation reason.
  SearchSpace space;
  space.global_batch_size = 32;
  auto candidates = enumerate_candidates(tiny(), cpu(2), space);
  auto categories = pruned_counts(candidates);
  auto words = pruned_counts_in_words(candidates);
  int64_t by_category = 0, in_words = 0;
  for (const auto& [reason, n] : categories) by_category += n;
  for (const auto& [reason, n] : words) {
    INFO(reason);
    in_words += n;
    CHECK(reason.find("<file>") == std::string::npos);
    CHECK(reason.find(" N ") == std::string::npos);
  }
  CHECK(by_category > 0);
  CHECK(in_words == by_category);
}

TEST_CASE("every pruned plan carries a true reason", "[search]") {
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
  // Memory reasons: `memory` on the whole program says it does not fit.
  space.max_memory_fraction = 0.001;
  auto costs = cost_model(topology);
  check_candidates(candidates, model, topology, space, costs, 2, nullptr);
  int64_t memory = 0;
  for (const auto& c : candidates) {
    if (c.pruned != "does not fit in memory") continue;
    ++memory;
    MemoryReport full = memory_report(lower_program(model, topology, c.plan), topology);
    INFO(c.plan.name << ": " << c.pruned_detail);
    CHECK(full.peak_bytes_max + full.reserved_bytes > space.max_memory_fraction * full.capacity_bytes);
    CHECK(c.peak_bytes_max <= full.peak_bytes_max);
  }
  CHECK(memory > 0);
}

TEST_CASE("the cheap path agrees with memory and quick_estimate: tiny (Llama-style) on 4 cores",
          "[search]") {
  SearchSpace space;
  space.global_batch_size = 32;
  space.include_gpipe = true;
  CHECK(check_cheap_path(tiny(), cpu(2), space, 1) > 0);
}

TEST_CASE("the cheap path agrees with memory and quick_estimate: GPT-2 on 8 A100, flash, no dropout",
          "[search]") {
  ModelConfig model = load_model(source_path("models/gpt2-124m.json"));
  Topology topology = load_topology(source_path("topologies/dgx-a100-80gb.json"), 1);
  SearchSpace space;
  space.global_batch_size = 16;
  space.attention_impl = AttentionImpl::flash;
  space.dropout = 0;
  check_cheap_path(model, topology, space, 3);
  space.attention_impl = AttentionImpl::materialized;
  space.dropout = 0.1;
  check_cheap_path(model, topology, space, 3);
}

TEST_CASE("the cheap path agrees with memory and quick_estimate: tiny on 8 H100, context parallel, FP8",
          "[search]") {
  // cp 1 and 2 with the three exchanges, then FP8 under both recipes: the layer probe depends on
  // both (the tokens a rank holds, the buffers of each exchange, the kept FP8 casts) and the
  // persistent bytes hold the FP8 weight copies and scales.
  ModelConfig model = tiny();
  Topology topology = load_topology(source_path("topologies/dgx-h100.json"), 1);
  SearchSpace space;
  space.global_batch_size = 16;
  space.attention_impl = AttentionImpl::flash;
  space.context_parallel_sizes = {1, 2};
  space.micro_batch_sizes = {1, 2};
  check_cheap_path(model, topology, space, 3);
  space.context_parallel_sizes = {1};
  space.fp8.format = Fp8Format::hybrid;
  check_cheap_path(model, topology, space, 3);
  space.fp8.scaling = Fp8Scaling::current;
  check_cheap_path(model, topology, space, 3);
}

TEST_CASE("the cheap path agrees with quick_estimate under a measured profile (A100: link fractions, tables)",
          "[search]") {
  ModelConfig model = load_model(source_path("models/gpt2-124m.json"));
  Topology topology = load_topology(source_path("topologies/dgx-a100-80gb.json"), 2);
  SearchSpace space;
  space.global_batch_size = 32;
  space.micro_batch_sizes = {1, 4};
  check_cheap_path(model, topology, space, 5, "profiles/a100-sxm4-80gb.json");
}

TEST_CASE("Spearman rank correlation and Amdahl's serial fraction", "[search]") {
  // Ranks (1, 2, 3, 4, 5) against (2, 1, 4, 3, 5): Σd² = 4, ρ = 1 − 6·4/(5·24) = 0.8.
  CHECK(spearman_rank_correlation({1, 2, 3, 4, 5}, {20, 10, 40, 30, 50}) == Approx(0.8));
  CHECK(spearman_rank_correlation({1, 2, 3}, {3, 2, 1}) == Approx(-1));
  // Ties get average ranks: x ranks (1.5, 1.5, 3), y (1, 2, 3): ρ = 0.866.
  CHECK(spearman_rank_correlation({1, 1, 2}, {1, 2, 3}) == Approx(std::sqrt(3.0) / 2));
  CHECK(std::isnan(spearman_rank_correlation({1}, {1})));
  // Points made with f = 0.1: 1/S = f + (1 − f)·x at x = 1, 1/2, 1/4, 1/8.
  std::vector<std::pair<double, double>> xy;
  for (double x : {1.0, 0.5, 0.25, 0.125}) xy.push_back({x, 0.1 + 0.9 * x});
  CHECK(amdahl_serial_fraction(xy) == Approx(0.1));
  // Perfect scaling: f = 0.
  CHECK(amdahl_serial_fraction({{1, 1}, {0.5, 0.5}}) == Approx(0).margin(1e-12));
  CHECK(std::isnan(amdahl_serial_fraction({{1, 1}})));
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
  // Every returned plan lowers, keeps the program's invariants and fits.
  for (const auto& c : ranked) {
    StepProgram program = lower_program(model, topology, c.plan);
    CHECK(check_program(program).empty());
    CHECK(memory_report(program, topology).fits);
  }
}

TEST_CASE("Megatron-LM arguments of a plan", "[search]") {
  ModelConfig model = load_model(source_path("models/gpt3-175b.json"));
  Plan plan;
  plan.tp_size = 8;
  plan.pp_size = 8;
  plan.schedule = ScheduleKind::interleaved_1f1b;
  plan.virtual_pp_size = 3;
  plan.overlap_p2p_comm = true;  // parse_plan's default for the schedule
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
  CHECK(has("--recompute-granularity full"));
  CHECK(has("--recompute-method uniform"));
  CHECK(has("--recompute-num-layers 1"));
  CHECK(has("--use-distributed-optimizer"));
  CHECK(has("--sequence-parallel"));
  CHECK(args.runnable);
  plan.zero_stage = 3;
  auto fsdp = megatron_arguments(plan, model).arguments;
  CHECK(std::count(fsdp.begin(), fsdp.end(), "--data-parallel-sharding-strategy optim_grads_params") == 1);
  // 1F1B with overlapped pipeline transfers: Megatron-LM has no flag for it.
  plan.zero_stage = 1;
  plan.schedule = ScheduleKind::one_f_one_b;
  plan.virtual_pp_size = 1;
  auto overlapped = megatron_arguments(plan, model);
  CHECK_FALSE(overlapped.runnable);
  CHECK_THAT(Json(overlapped.notes).dump(), Catch::Contains("overlap_p2p_comm"));
}

TEST_CASE("hybrid sharding: searched where dp leaves the node, named, exported to Megatron-LM", "[search]") {
  // 4 devices on 2 nodes of 2: dp 4 (tp 1) also tried with its shards inside a node.
  SearchSpace space;
  space.global_batch_size = 32;
  auto candidates = enumerate_candidates(tiny(), cpu(2), space);
  int64_t hybrid = 0;
  for (const Candidate& c : candidates) {
    if (c.plan.num_distributed_optimizer_instances == 1) continue;
    ++hybrid;
    INFO(c.plan.name);
    CHECK(c.plan.zero_stage >= 1);
    CHECK(c.plan.tp_size * c.plan.dp_shard_size() == 2);  // one node's devices
    CHECK_THAT(c.plan.name, Catch::EndsWith("-shard" + std::to_string(c.plan.dp_shard_size())));
  }
  CHECK(hybrid > 0);
  space.hybrid_sharding = false;
  for (const Candidate& c : enumerate_candidates(tiny(), cpu(2), space)) {
    CHECK(c.plan.num_distributed_optimizer_instances == 1);
  }
  Plan plan;
  plan.dp_size = 8;
  plan.zero_stage = 1;
  plan.num_distributed_optimizer_instances = 4;
  auto args = megatron_arguments(plan, tiny()).arguments;
  CHECK(std::find(args.begin(), args.end(), "--num-distributed-optimizer-instances 4") != args.end());
  CHECK(std::find(args.begin(), args.end(), "--use-distributed-optimizer") != args.end());
}

// The head every planner output shares with simulate's prediction.
static void check_envelope(const Json& out, const std::string& command) {
  CHECK(out.at("schema_version") == 1);
  CHECK(out.at("command") == command);
  CHECK(!out.at("stepcast_version").get<std::string>().empty());
  CHECK(!out.at("git_commit").get<std::string>().empty());
  CHECK(out.at("simulate_mode") == "approx");
  CHECK(out.at("inputs").at("model").at("hidden_size") == 64);
  CHECK(out.at("inputs").at("topology").contains("node"));
}

TEST_CASE("stepcast plan end to end on the tiny model", "[search][cli]") {
  std::string out = (std::filesystem::temp_directory_path() / "stepcast-test-plan").string();
  std::filesystem::remove_all(out);
  auto r = run_stepcast("plan" + model_arg("tiny") + topology_arg("localhost-cpu") +
                        " --global-batch-size 8 --top 3 --evaluate 2 --out " + out);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  // Each pruned reason with one plan's own message (numbers, files) as its example.
  CHECK_THAT(r.output, Catch::Contains("e.g. candidate tp1-pp2-dp1-z0-mbs8-vpp2-flash: key 'global_batch_size' = 8"));
  Json plans = load_json_file(out + "/plans.json");
  check_envelope(plans, "plan");
  REQUIRE(plans.at("plans").size() >= 3);
  CHECK(plans["plans"][0]["step_time_source"] == "simulate");
  CHECK(plans["plans"][1]["step_time_source"] == "simulate");
  CHECK(plans["plans"][0]["step_time_s"].get<double>() <= plans["plans"][1]["step_time_s"].get<double>());
  REQUIRE(plans.at("top").size() == 3);
  // Pruned candidates are listed with their reason; the counts add up.
  REQUIRE(plans.at("pruned").size() > 0);
  int64_t counted = 0;
  for (const auto& [reason, n] : plans.at("pruned_counts").items()) counted += n.get<int64_t>();
  CHECK(counted == int64_t(plans["pruned"].size()));
  for (const auto& p : plans["pruned"]) {
    CHECK(!p.at("reason").get<std::string>().empty());
    CHECK(!p.at("detail").get<std::string>().empty());
  }
  CHECK(std::filesystem::exists(out + "/report.md"));
  CHECK(std::filesystem::exists(out + "/report.html"));
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
  // The nearest batch sizes some plan accepts, computed: 6 (below) and 8 (above), both even.
  CHECK(batch.output.find("--global-batch-size 6") != std::string::npos);
  CHECK(batch.output.find("--global-batch-size 8") != std::string::npos);
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
  // What would fit, computed: the search again on more nodes.
  CHECK(tight.output.find("valid: --nodes 2 (2× the nodes):") != std::string::npos);
  for (const char* command : {"plan", "compare-strategies"}) {
    auto mode = run_stepcast(std::string(command) + model_arg("tiny") +
                             topology_arg("localhost-cpu") + " --global-batch-size 8 --sim-mode full");
    INFO(mode.output);
    CHECK(mode.exit_code == 2);
    CHECK(mode.output.find("--sim-mode 'full': valid: approx, fast") != std::string::npos);
  }
}

TEST_CASE("stepcast plan --objective memory puts the smallest peak first", "[search][cli]") {
  std::string out = (std::filesystem::temp_directory_path() / "stepcast-test-plan-memory").string();
  std::filesystem::remove_all(out);
  auto r = run_stepcast("plan" + model_arg("tiny") + topology_arg("localhost-cpu") +
                        " --nodes 2 --global-batch-size 16 --objective memory --top 4 --evaluate 0"
                        " --out " + out);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  Json plans = load_json_file(out + "/plans.json");
  REQUIRE(plans.at("top").size() == 4);
  double previous = 0;
  for (const auto& t : plans["top"]) {
    double peak = t.at("peak_bytes_max").get<double>();
    CHECK(peak >= previous);
    previous = peak;
  }
  // The report's table as CSV beside it: a header row, then the top plans in their order.
  std::vector<std::vector<std::string>> csv =
      parse_csv(read_text_file(out + "/best-plans.csv"), out + "/best-plans.csv");
  REQUIRE(csv.size() == 5);
  CHECK(csv[0][0] == "#");
  CHECK(csv[0][1] == "plan");
  for (size_t i = 1; i < csv.size(); ++i) CHECK(csv[i][1] == plans["top"][i - 1]["name"].get<std::string>());
  CHECK(std::filesystem::exists(out + "/pruned.csv"));
  // No plan that fits has a smaller peak than the first: its lower bound is not below it.
  double first = plans["top"][0]["peak_bytes_max"].get<double>();
  for (const auto& p : plans["plans"]) {
    double low = p.contains("peak_bytes_max") ? p["peak_bytes_max"].get<double>()
                                              : p.at("peak_bytes_lower_bound").get<double>();
    CHECK(low >= first);
  }
  std::filesystem::remove_all(out);
}

TEST_CASE("stepcast plan with --from-megatron ranks the launch line's own plan", "[search][cli]") {
  auto r = run_stepcast("plan" + topology_arg("localhost-cpu") + " --nodes 2 --evaluate 0 --top 2 --from-megatron "
                        "'--num-layers 4 --hidden-size 64 --num-attention-heads 4 --max-position-embeddings 64 "
                        "--seq-length 64 --vocab-size 256 --tensor-model-parallel-size 2 --micro-batch-size 1 "
                        "--global-batch-size 8 --attention-backend unfused'");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  // The batch comes from the launch line; its plan (tp 2, dp 2 on 4 cores) is ranked among the rest.
  CHECK_THAT(r.output, Catch::Contains("global batch 8"));
  CHECK_THAT(r.output, Catch::Contains("the launch line's plan (launch-line) ranks "));
}

TEST_CASE("stepcast plan --from-megatron FILE re-simulates its best plans", "[search][cli]") {
  // A launch script is a file, but not the model: the children get the model it describes
  // (every re-simulation failed on the script's text before, leaving the estimates).
  std::string script = test::write_temp_file(
      "launch-tiny.sh",
      "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --max-position-embeddings 64 --seq-length 64 "
      "--vocab-size 256 --tensor-model-parallel-size 2 --micro-batch-size 1 --global-batch-size 8 "
      "--attention-backend unfused\n");
  auto r = run_stepcast("plan" + topology_arg("localhost-cpu") + " --nodes 2 --evaluate 2 --top 2 --from-megatron " +
                        script);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, !Catch::Contains("failed"));
  CHECK_THAT(r.output, Catch::Contains("2 re-simulated"));
}

TEST_CASE("stepcast compare-strategies: a strategy with no valid plan has no timing (null)", "[search][cli]") {
  // One node of 2 cores: the strategies that need 2 nodes (HSDP) or more ranks have no plan.
  std::string out = (std::filesystem::temp_directory_path() / "stepcast-test-strategies-none").string();
  std::filesystem::remove_all(out);
  auto r = run_stepcast("compare-strategies" + model_arg("tiny") + topology_arg("localhost-cpu") +
                        " --nodes 1 --global-batch-size 8 --attention flash --out " + out);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  Json s = load_json_file(out + "/strategies.json");
  int not_simulated = 0;
  for (const auto& row : s["strategies"]) {
    INFO(row.dump());
    if (row.at("simulated").get<bool>()) {
      CHECK(row.at("step_time_s").get<double>() > 0);
      continue;
    }
    ++not_simulated;
    for (const char* key : {"step_time_s", "exposed_comm_s", "bubble_s", "mfu", "variability_s"}) {
      CHECK(row.at(key).is_null());  // 0 before: a step of no time
    }
  }
  CHECK(not_simulated > 0);
  std::filesystem::remove_all(out);
}

TEST_CASE("stepcast compare-strategies on the tiny model", "[search][cli]") {
  std::string out = (std::filesystem::temp_directory_path() / "stepcast-test-strategies").string();
  std::filesystem::remove_all(out);
  auto r = run_stepcast("compare-strategies" + model_arg("tiny") + topology_arg("localhost-cpu") +
                        " --nodes 2 --global-batch-size 16 --attention flash --out " + out);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  Json s = load_json_file(out + "/strategies.json");
  check_envelope(s, "compare-strategies");
  REQUIRE(s.at("strategies").size() == 10);
  std::vector<std::string> names;
  for (const auto& row : s["strategies"]) names.push_back(row.at("strategy").get<std::string>());
  CHECK(names.front() == "pure DP");
  CHECK(names.back() == "best 3D");
  for (const auto& row : s["strategies"]) {
    INFO(row.dump());
    REQUIRE(row.at("simulated").get<bool>());  // every strategy has a valid plan on 4 cores
    CHECK(row.at("step_time_s").get<double>() > 0);
    CHECK(row.at("peak_bytes").get<double>() > row.at("memory_weights_bytes").get<double>());
  }
  const Json& rows = s["strategies"];
  // Pure DP's plan asynchronous: the same weights, one more gradient copy (the stale slot).
  CHECK(rows[1]["strategy"] == "pure DP, async (staleness 1)");
  CHECK(rows[1]["plan"] == rows[0]["plan"].get<std::string>() + "-async1");
  CHECK(rows[1]["memory_weights_bytes"] == rows[0]["memory_weights_bytes"]);
  CHECK(rows[1]["memory_grads_bytes"].get<double>() == Approx(2 * rows[0]["memory_grads_bytes"].get<double>()));
  // ZeRO-3 shards weights over the 4 ranks: fewer weight bytes than pure DP; HSDP over the 2 of
  // a node: between the two.
  CHECK(rows[4]["memory_weights_bytes"].get<double>() < rows[0]["memory_weights_bytes"].get<double>());
  CHECK(rows[5]["strategy"] == "HSDP (ZeRO-3 shards in a node)");
  CHECK(rows[5]["memory_weights_bytes"].get<double>() > rows[4]["memory_weights_bytes"].get<double>());
  CHECK(rows[5]["memory_weights_bytes"].get<double>() < rows[0]["memory_weights_bytes"].get<double>());
  // Context parallelism: its row's plan splits the sequence; activations per rank shrink.
  CHECK(rows[8]["strategy"] == "CP (ring) + 3D");
  CHECK(rows[8].dump().find("-cp") != std::string::npos);
  // The best row: the fastest synchronous plan that fits in simulation (its note says so).
  const Json& best = rows.back();
  for (size_t i = 0; i + 1 < rows.size(); ++i) {  // (the asynchronous row, 1, trains otherwise)
    if (i != 1 && rows[i]["fits"].get<bool>()) CHECK(best["step_time_s"] <= rows[i]["step_time_s"]);
  }
  CHECK((best["note"] == "" || best["note"].get<std::string>().find("estimate's") != std::string::npos));
  CHECK(std::filesystem::exists(out + "/report.html"));
  std::filesystem::remove_all(out);
}

TEST_CASE("stepcast scale, strong and weak, on the tiny model", "[search][cli]") {
  std::string out = (std::filesystem::temp_directory_path() / "stepcast-test-scale").string();
  std::filesystem::remove_all(out);
  auto strong = run_stepcast("scale" + model_arg("tiny") + topology_arg("localhost-cpu") +
                             " --plan " + source_path("examples/tiny-cpu.json") +
                             " --nodes 1,2,4 --out " + out);
  INFO(strong.output);
  REQUIRE(strong.exit_code == 0);
  Json s = load_json_file(out + "/scale.json");
  check_envelope(s, "scale");
  REQUIRE(s.at("points").size() == 3);
  CHECK(s["points"][0]["speedup"].get<double>() == Approx(1));
  CHECK(s["points"][0]["efficiency"].get<double>() == Approx(1));
  // 4 nodes: dp 8 with micro batch 2 does not divide the batch of 8: a point with its reason.
  REQUIRE(s["points"][2].contains("error"));
  CHECK(s["points"][2]["error"].get<std::string>().find("global_batch_size") != std::string::npos);
  // Named as the points that run (it kept the base plan's name).
  Json base_plan = load_json_file(source_path("examples/tiny-cpu.json"));
  CHECK(s["points"][2]["plan"] == base_plan["name"].get<std::string>() + "-4n");
  for (const auto& p : s["points"]) {
    if (p.contains("error")) continue;
    // Strong scaling: the global batch stays.
    CHECK(p.at("global_batch_size") == s["points"][0]["global_batch_size"]);
    CHECK(p.at("efficiency").get<double>() ==
          Approx(p.at("speedup").get<double>() * 2.0 / p.at("devices").get<double>()));
  }
  CHECK(s.contains("amdahl_serial_fraction"));
  CHECK(strong.output.find("Amdahl serial fraction") != std::string::npos);
  auto weak = run_stepcast("scale" + model_arg("tiny") + topology_arg("localhost-cpu") +
                           " --plan " + source_path("examples/tiny-cpu.json") +
                           " --nodes 1,2 --weak --out " + out);
  INFO(weak.output);
  REQUIRE(weak.exit_code == 0);
  Json w = load_json_file(out + "/scale.json");
  CHECK(w["points"][1]["global_batch_size"].get<int64_t>() ==
        2 * w["points"][0]["global_batch_size"].get<int64_t>());
  // Hybrid sharding keeps its shard group of 2 (a node) and scales the replicas: dp 2, 4, 6 on
  // 1, 2, 3 nodes run with 1, 2, 3 instances.
  Json hybrid_plan = load_json_file(source_path("examples/tiny-cpu.json"));
  hybrid_plan["dp_size"] = 4;
  hybrid_plan["micro_batch_size"] = 1;
  hybrid_plan["num_distributed_optimizer_instances"] = 2;
  std::string hybrid_file = write_temp_file("scale-hybrid.json", hybrid_plan.dump());
  auto hybrid = run_stepcast("scale" + model_arg("tiny") + topology_arg("localhost-cpu") + " --plan " +
                             hybrid_file + " --nodes 1,2,3 --weak --out " + out);
  INFO(hybrid.output);
  REQUIRE(hybrid.exit_code == 0);
  Json h = load_json_file(out + "/scale.json");
  REQUIRE(h.at("points").size() == 3);
  for (const auto& p : h["points"]) CHECK_FALSE(p.contains("error"));
  // Context parallelism: a replica is tp · cp · pp ranks, so cp 2 on 1 and 2 nodes runs dp 1 and 2
  // (weak: a global batch of 2 and 4).
  Json cp_plan = {{"name", "scale-cp2"}, {"context_parallel_size", 2}, {"micro_batch_size", 1},
                  {"global_batch_size", 2}, {"attention_impl", "flash"}, {"dtype", "fp32"}};
  auto cp = run_stepcast("scale" + model_arg("tiny") + topology_arg("localhost-cpu") + " --plan " +
                         write_temp_file("scale-cp2.json", cp_plan.dump()) + " --nodes 1,2 --weak --out " + out);
  INFO(cp.output);
  REQUIRE(cp.exit_code == 0);
  Json c = load_json_file(out + "/scale.json");
  REQUIRE(c.at("points").size() == 2);
  for (const auto& p : c["points"]) CHECK_FALSE(p.contains("error"));
  CHECK(c["points"][0]["global_batch_size"] == 2);
  CHECK(c["points"][1]["global_batch_size"] == 4);
  auto bad = run_stepcast("scale" + model_arg("tiny") + topology_arg("localhost-cpu") +
                          " --plan " + source_path("examples/tiny-cpu.json") + " --nodes 1,x");
  CHECK(bad.exit_code == 2);
  CHECK(bad.output.find("not a node count") != std::string::npos);
  std::filesystem::remove_all(out);
}
