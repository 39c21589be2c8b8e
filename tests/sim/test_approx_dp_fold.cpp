// --mode approx folds the data-parallel copies (simulator.hpp): only dp index 0 of each stage is
// simulated, and each step of a collective over the copies is its own flows plus the flows its
// peers send it. Checked against fast mode on plans where fast mode folds everything else approx
// folds (tp 8 fills a node, or tp 1), through the binary (one SimGrid engine per process):
// without variability the copies are identical and the fold is exact up to the flows' rounding;
// with the profile's variability one copy stands in for the slowest, within 1%. What the fold
// leaves out, the other copies' traffic on shared uplinks, shows on an oversubscribed fabric.
#include <catch2/catch.hpp>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "json_input.hpp"
#include "test_support.hpp"

using namespace stepcast;
using Catch::Matchers::Contains;
using test::CommandResult;
using test::fresh_dir;
using test::read_json;
using test::run_stepcast;
using test::source_path;

namespace {

struct FoldCase {
  std::string name;
  std::string model;
  Json topology;  // written to a file
  int nodes = 0;
  Json plan;
  // Without variability: how far approx may land below fast mode (0: the same step to 1e-4).
  double shared_uplinks = 0;
};

std::string file_name(std::string name) {
  for (char& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '-';
  }
  return name;
}

Json simulate(const std::string& args, const std::string& name) {
  std::string dir = fresh_dir("approx-dp-" + name);
  CommandResult result = run_stepcast("simulate" + args + " --out " + dir);
  INFO("simulate" << args << "\n" << result.output);
  REQUIRE(result.exit_code == 0);
  return read_json(dir + "/prediction.json");
}

std::string case_args(const FoldCase& c) {
  const std::string name = file_name(c.name);
  return test::model_arg(c.model) + " --topology " +
         test::write_temp_file("topology-" + name + ".json", c.topology.dump(2)) + " --plan " +
         test::write_temp_file("plan-" + name + ".json", c.plan.dump(2)) + " --nodes " +
         std::to_string(c.nodes) + " --profile " + source_path("profiles/a100-sxm4-80gb.json") +
         " --no-scaling --no-records";
}

struct Pair {
  Json fast, approx;
  double relative() const {
    const double f = fast["step_time_s"].get<double>(), a = approx["step_time_s"].get<double>();
    return (a - f) / f;
  }
};

Pair fast_and_approx(const FoldCase& c, const std::string& extra, const std::string& tag) {
  const std::string args = case_args(c) + extra;
  const std::string name = file_name(c.name + " " + tag);
  Pair p{simulate(args + " --mode fast", name + "-fast"), simulate(args + " --mode approx", name + "-approx")};
  std::printf("  %-44s %-16s %.6g  %.6g  %+.4f%%\n", c.name.c_str(), tag.c_str(), p.fast["step_time_s"].get<double>(),
              p.approx["step_time_s"].get<double>(), 100 * p.relative());
  return p;
}

Json dgx() { return read_json(source_path("topologies/dgx-a100-80gb.json")); }

}  // namespace

TEST_CASE("simulate: --mode approx folds the data-parallel copies, exact without variability",
          "[simulate]") {
  std::vector<FoldCase> cases = {
      // One copy per node, the nodes under leaves of 2.5 nodes (radix 40): the other copies'
      // pipeline and gradient traffic on the leaves' uplinks is left out, 0.25% here.
      {"gpt3-1.3b tp8 pp2 dp4 zero1 sp", "gpt3-1.3b", dgx(), 8,
       {{"name", "1.3b-tp8-pp2-dp4"}, {"tp_size", 8}, {"pp_size", 2}, {"dp_size", 4}, {"zero_stage", 1},
        {"micro_batch_size", 1}, {"global_batch_size", 32}, {"sequence_parallel", true},
        {"overlap_grad_reduce", true}, {"overlap_param_gather", true}},
       0.005},
      // Hybrid sharding: ZeRO-3 over 4 copies (dp_shard), replicated twice (dp_replica), the
      // shards inside a node and the replicas across nodes, beside the pipeline's transfers.
      {"gpt2 pp2 dp8 zero3 hybrid", "gpt2-124m", dgx(), 2,
       {{"name", "pp2-dp8-zero3-hybrid"}, {"pp_size", 2}, {"dp_size", 8}, {"zero_stage", 3},
        {"num_distributed_optimizer_instances", 2}, {"micro_batch_size", 2}, {"global_batch_size", 64},
        {"overlap_grad_reduce", true}, {"overlap_param_gather", true}}},
      // Context parallelism: the gradients reduce over dp × cp, whose simulated members (the cp
      // ranks of copy 0) exchange as usual and mirror the copies' flows.
      {"gpt2 cp2 pp2 dp4 zero1 flash", "gpt2-124m", dgx(), 2,
       {{"name", "cp2-pp2-dp4"}, {"context_parallel_size", 2}, {"pp_size", 2}, {"dp_size", 4},
        {"attention_impl", "flash"}, {"zero_stage", 1}, {"micro_batch_size", 1}, {"global_batch_size", 16},
        {"overlap_grad_reduce", true}}},
      // dp 16 over two nodes: a hierarchical ring, NVLink inside and the NICs across.
      {"gpt2 dp16 zero2", "gpt2-124m", dgx(), 2,
       {{"name", "dp16-zero2"}, {"dp_size", 16}, {"zero_stage", 2}, {"micro_batch_size", 4},
        {"global_batch_size", 128}, {"overlap_grad_reduce", true}}},
  };
  std::printf("fast vs approx step time (s), (approx - fast) / fast:\n");
  for (const FoldCase& c : cases) {
    INFO(c.name);
    const int64_t dp = c.plan["dp_size"].get<int64_t>();
    Pair off = fast_and_approx(c, " --variability off", "variability off");
    CHECK_THAT(off.approx["mode_detail"].get<std::string>(), Contains("fold_dp"));
    CHECK_THAT(off.fast["mode_detail"].get<std::string>(), !Contains("fold_dp"));
    CHECK(off.approx["simulated_ranks"].get<int64_t>() * dp == off.fast["simulated_ranks"].get<int64_t>());  // (cp ranks kept)
    CHECK(off.relative() < 1e-4);
    CHECK(off.relative() > -c.shared_uplinks - 1e-4);
    // The energy of the copies that are not simulated is the stand-in's.
    CHECK(off.approx["energy_per_step_j"].get<double>() ==
          Approx(off.fast["energy_per_step_j"].get<double>()).epsilon(c.shared_uplinks + 1e-4));
    Pair on = fast_and_approx(c, "", "variability on");
    CHECK(std::abs(on.relative()) < 0.01);
  }
}

TEST_CASE("simulate: approx's data-parallel fold keeps the shared uplinks of the copies beside the stand-in",
          "[simulate]") {
  // Four nodes under 4:1 oversubscribed leaves: the 8 copies on each node send their pipeline
  // transfers and the cross-node phase of their hierarchical all-reduce where the stand-in
  // sends, so the shared links' capacity is divided by 8 as for folded rails (without that
  // division approx came out 31.7% fast here).
  Json t = dgx();
  t["name"] = "dgx-a100-4-nodes-oversubscribed";
  t["fabric"]["oversubscription"] = 4;
  t["fabric"]["switch_radix"] = 16;
  FoldCase c{"oversubscribed gpt2 pp2 dp16", "gpt2-124m", t, 4,
             {{"name", "oversubscribed-pp2-dp16"}, {"pp_size", 2}, {"dp_size", 16}, {"zero_stage", 0},
              {"micro_batch_size", 1}, {"global_batch_size", 64}, {"overlap_grad_reduce", true}}};
  Pair p = fast_and_approx(c, " --variability off", "variability off");
  CHECK_THAT(p.approx["mode_detail"].get<std::string>(), Contains("fold_dp"));
  CHECK(std::abs(p.relative()) < 1e-4);
}

TEST_CASE("simulate: approx keeps every data-parallel copy where they are not alike", "[simulate]") {
  // Unequal devices: one device of the node at 0.8 makes its copy unlike the others.
  Json t = dgx();
  t["num_nodes"] = 1;
  t["heterogeneity"] = {{"devices", {{{"device", 3}, {"compute_speed_factor", 0.8}}}}};
  Json plan = {{"name", "tiny-dp4"}, {"dp_size", 4}, {"micro_batch_size", 1}, {"global_batch_size", 8}};
  Json approx = simulate(test::model_arg("tiny") + " --plan " + test::write_temp_file("plan-dp4.json", plan.dump(2)) +
                             " --topology " + test::write_temp_file("dgx-1-node-unequal.json", t.dump(2)) +
                             " --no-scaling --mode approx",
                         "unequal");
  CHECK_THAT(approx["mode_detail"].get<std::string>(), !Contains("fold_dp"));
  CHECK(approx["simulated_ranks"].get<int64_t>() == 4);
}

namespace {

// pp 2 × dp `dp` of gpt2-124m, one rank per device, on 8-GPU nodes.
std::string pp2_args(int dp) {
  Json plan = {{"name", "pp2-dp" + std::to_string(dp)}, {"pp_size", 2}, {"dp_size", dp}, {"micro_batch_size", 1},
               {"global_batch_size", 2 * dp}};
  return test::model_arg("gpt2-124m") + " --topology " + source_path("topologies/dgx-a100-80gb.json") +
         " --nodes " + std::to_string(2 * dp / 8) + " --plan " +
         test::write_temp_file("plan-pp2-dp" + std::to_string(dp) + ".json", plan.dump(2)) + " --no-scaling";
}

}  // namespace

TEST_CASE("simulate: fast mode names what --mode approx would simulate at scale", "[simulate]") {
  // 256 ranks (pp 2 × dp 128): approx would simulate one copy per stage.
  std::string dir = fresh_dir("approx-dp-note");
  CommandResult fast = run_stepcast("simulate" + pp2_args(128) + " --no-records --mode fast --out " + dir);
  INFO(fast.output);
  REQUIRE(fast.exit_code == 0);
  CHECK_THAT(fast.output, Contains("note: --mode approx would simulate 2 ranks instead of 256"));
  Json prediction = read_json(dir + "/prediction.json");
  CHECK(prediction["mode"] == "fast");
  CHECK(prediction["mode_requested"] == "fast");
  CHECK(prediction["mode_choice"].is_null());
}

TEST_CASE("simulate: --mode auto (the default) runs approx from 256 ranks fast mode would simulate",
          "[simulate]") {
  // 256 ranks: auto is approx, the same prediction as --mode approx, and says why.
  Json chosen = simulate(pp2_args(128) + " --no-records", "auto-256");
  Json approx = simulate(pp2_args(128) + " --no-records --mode approx", "approx-256");
  CHECK(chosen["mode"] == "approx");
  CHECK(chosen["mode_requested"] == "auto");
  CHECK_THAT(chosen["mode_choice"].get<std::string>(),
             Contains("chose approx: fast mode would simulate 256 ranks (256 or more), approx 2"));
  CHECK(chosen["simulated_ranks"].get<int64_t>() == 2);
  CHECK(chosen["step_time_s"].get<double>() == approx["step_time_s"].get<double>());
  // 128 ranks: auto is fast mode, the same prediction as --mode fast.
  Json small = simulate(pp2_args(64) + " --no-records", "auto-128");
  Json fast = simulate(pp2_args(64) + " --no-records --mode fast", "fast-128");
  CHECK(small["mode"] == "fast");
  CHECK_THAT(small["mode_choice"].get<std::string>(), Contains("chose fast: it simulates 128 ranks"));
  CHECK(small["simulated_ranks"].get<int64_t>() == 128);
  CHECK(small["step_time_s"].get<double>() == fast["step_time_s"].get<double>());
  CommandResult bad = run_stepcast("simulate" + pp2_args(64) + " --no-records --mode quick");
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.output, Contains("--mode 'quick': valid: auto, fast, full, approx"));
}
