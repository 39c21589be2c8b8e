// `stepcast calibrate` against an oracle: runs whose step times come from a profile with known
// scales (GEMM rate × 0.8, link bandwidth × 0.7) are given to calibrate as Megatron-LM logs and
// measurement.json files written here; it must find the scales again, and predict each run from
// the others (leave-one-out). Plus the Megatron-LM log reader and the refusals.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <unistd.h>
#include <sstream>

#include "calibrate.hpp"
#include "errors.hpp"
#include "json_input.hpp"
#include "test_support.hpp"

using namespace stepcast;
using Catch::Matchers::Contains;

namespace {

struct LogPlan {
  int64_t tp, pp, mbs, gbs;
};

// A Megatron-LM log as Megatron prints it: the arguments block and iteration lines (the first
// slower: warm-up).
std::string megatron_log(const LogPlan& p, int64_t world_size, double step_s) {
  std::ostringstream log;
  log << "using world size: " << world_size << ", data-parallel size: " << world_size / (p.tp * p.pp) << "\n"
      << "------------------------ arguments ------------------------\n"
      << "  bf16 ............................................ True\n"
      << "  global_batch_size ............................... " << p.gbs << "\n"
      << "  hidden_dropout .................................. 0.1\n"
      << "  micro_batch_size ................................ " << p.mbs << "\n"
      << "  num_layers ...................................... 12\n"
      << "  pipeline_model_parallel_size .................... " << p.pp << "\n"
      << "  seq_length ...................................... 1024\n"
      << "  tensor_model_parallel_size ...................... " << p.tp << "\n"
      << "  use_distributed_optimizer ....................... False\n"
      << "  world_size ...................................... " << world_size << "\n"
      << "-------------------- end of arguments ---------------------\n";
  for (int i = 1; i <= 6; ++i) {
    double ms = step_s * 1e3 * (i == 1 ? 1.8 : 1.0 + 0.001 * (i % 3));
    log << " iteration       " << 10 * i << "/     100 | consumed samples: " << 10 * i * p.gbs
        << " | elapsed time per iteration (ms): " << ms << " | learning rate: 1.0E-04 |\n";
  }
  return log.str();
}

}  // namespace

TEST_CASE("calibrate: the Megatron-LM log reader", "[calibrate]") {
  MegatronLog log = parse_megatron_log(megatron_log({2, 2, 4, 64}, 16, 1.5), "run.log");
  CHECK(log.world_size == 16);
  CHECK(log.plan["tp_size"] == 2);
  CHECK(log.plan["pp_size"] == 2);
  CHECK(log.plan["dp_size"] == 4);
  CHECK(log.plan["micro_batch_size"] == 4);
  CHECK(log.plan["global_batch_size"] == 64);
  CHECK(log.plan["dtype"] == "bf16");
  CHECK(log.plan["dropout"] == 0.1);
  CHECK(*log.seq_length == 1024);
  REQUIRE(log.iteration_times_s.size() == 6);
  CHECK(log.step_time_s == Approx(1.5 * 1.0015).epsilon(1e-3));  // the warm-up iteration left out

  // The launch line instead of the arguments block.
  MegatronLog flags = parse_megatron_log(
      "torchrun pretrain_gpt.py --tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 "
      "--num-layers-per-virtual-pipeline-stage 2 --num-layers 16 --sequence-parallel --micro-batch-size 1 "
      "--global-batch-size 32 --world-size 32 --recompute-granularity selective --use-flash-attn\n"
      " iteration 1 | elapsed time per iteration (ms): 900.0 |\n iteration 2 | elapsed time per iteration (ms): 800.0 |\n",
      "flags.log");
  CHECK(flags.plan["tp_size"] == 4);
  CHECK(flags.plan["schedule"] == "interleaved_1f1b");
  CHECK(flags.plan["virtual_pp_size"] == 4);
  CHECK(flags.plan["sequence_parallel"] == true);
  CHECK(flags.plan["recompute"] == "selective");
  CHECK(flags.plan["attention_impl"] == "flash");
  CHECK(flags.step_time_s == Approx(0.8));

  // The partial distributed optimizer (hybrid sharding) as Megatron-LM prints it.
  std::string partial = megatron_log({1, 1, 1, 16}, 8, 1.0);
  partial.replace(partial.find("False"), 5, "True");
  partial.insert(partial.find("  pipeline_model_parallel_size"),
                 "  num_distributed_optimizer_instances ............. 2\n");
  MegatronLog hybrid = parse_megatron_log(partial, "hybrid.log");
  CHECK(hybrid.plan["zero_stage"] == 1);
  CHECK(hybrid.plan["num_distributed_optimizer_instances"] == 2);

  // A 2021 (Megatron-LM v2) log prints its scatter/gather of pipeline transfers.
  std::string v2 = megatron_log({2, 2, 4, 64}, 16, 1.5);
  v2.insert(v2.find("  pipeline_model_parallel_size"), "  scatter_gather_tensors_in_pipeline ............. True\n");
  CHECK(parse_megatron_log(v2, "v2.log").plan["scatter_gather_tensors_in_pipeline"] == true);
  CHECK_FALSE(log.plan.contains("scatter_gather_tensors_in_pipeline"));

  CHECK_THROWS_WITH(parse_megatron_log("------------------------ arguments ------------------------\n"
                                       "  world_size ............ 8\n",
                                       "empty.log"),
                    Contains("empty.log") && Contains("elapsed time per iteration"));
  std::string no_world = megatron_log({1, 1, 1, 8}, 8, 1.0);
  no_world.replace(no_world.find("  world_size"), std::string("  world_size ...................................... 8\n").size(), "");
  CHECK_THROWS_WITH(parse_megatron_log(no_world, "w.log"), Contains("world_size") && Contains("missing"));
  CHECK_THROWS_WITH(parse_megatron_log(megatron_log({3, 1, 1, 8}, 8, 1.0), "odd.log"),
                    Contains("not a multiple"));
  CHECK_THROWS_WITH(parse_megatron_log(" iteration 1 | elapsed time per iteration (ms): -5 |\n", "neg.log"),
                    Contains("neg.log:1") && Contains("positive"));
}

TEST_CASE("calibrate: parameters apply as named, and the set is checked", "[calibrate]") {
  DeviceProfile base = load_profile(test::source_path("profiles/a100-sxm4-80gb.json"));
  Calibration c;
  c.gemm_scale = 0.5;
  c.link_scale = 0.25;
  c.overhead_s = 1e-6;
  c.device_speed_cv = 0.03;
  DeviceProfile p = apply_calibration(base, c);
  CHECK(p.gemm.at(Dtype::bf16).peak_fraction == Approx(base.gemm.at(Dtype::bf16).peak_fraction * 0.5));
  CHECK(p.gemm.at(Dtype::bf16).overhead_s == Approx(base.gemm.at(Dtype::bf16).overhead_s + 1e-6));
  CHECK(p.inter_node_bus_fraction == Approx(base.inter_node_bus_fraction * 0.25));
  CHECK(p.variability.device_speed_cv == 0.03);
  // A GEMM ceiling (the best a search found) scales with the rates it caps; none stays none.
  CHECK(p.gemm.at(Dtype::bf16).ceiling_fraction == 0);
  DeviceProfile blackwell = load_profile(test::source_path("profiles/b200-sxm.json"));
  REQUIRE(blackwell.gemm.at(Dtype::bf16).ceiling_fraction > 0);
  CHECK(apply_calibration(blackwell, c).gemm.at(Dtype::bf16).ceiling_fraction ==
        Approx(blackwell.gemm.at(Dtype::bf16).ceiling_fraction * 0.5));
  // Point-to-point tables inside and across nodes take the link scale alike, and so does a
  // collective's share of the NICs.
  base.inter_node_exchange_fraction = 0.8;
  base.measured->p2p = {{1e6, 1e-4, ""}};
  base.measured->p2p_inter_node = {{1e6, 4e-4, ""}};
  p = apply_calibration(base, c);
  CHECK(p.measured->p2p.at(0).time_s == Approx(4e-4));
  CHECK(p.measured->p2p_inter_node.at(0).time_s == Approx(16e-4));
  REQUIRE(p.inter_node_exchange_fraction);
  CHECK(*p.inter_node_exchange_fraction == Approx(0.2));
  c = Calibration{};
  c.gemm_scale = 5;  // a fraction stops at 1
  CHECK(apply_calibration(base, c).gemm.at(Dtype::bf16).peak_fraction == 1.0);
  CHECK(parse_calibration_params("gemm,links").size() == 2);
  CHECK_THROWS_WITH(parse_calibration_params("gemm,speed"), Contains("'speed'") && Contains("overhead"));
  CHECK_THROWS_WITH(parse_calibration_params("gemm,gemm"), Contains("twice"));
}

TEST_CASE("calibrate: finds known scales again from logs and measurements", "[calibrate][simulate]") {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("stepcast-calibrate-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  // The truth: the A100 profile with GEMM rates × 0.8 and link bandwidth × 0.7.
  DeviceProfile base = load_profile(test::source_path("profiles/a100-sxm4-80gb.json"));
  Calibration truth;
  truth.gemm_scale = 0.8;
  truth.link_scale = 0.7;
  std::string truth_file = (dir / "truth.json").string();
  {
    std::ofstream(truth_file) << profile_to_json(apply_calibration(base, truth)).dump();
  }
  const std::vector<LogPlan> plans = {{1, 1, 4, 32}, {2, 1, 4, 16}, {4, 1, 2, 8}, {1, 2, 2, 16}, {2, 2, 4, 16}};
  std::string logs, measurements;
  for (size_t i = 0; i < plans.size(); ++i) {
    const LogPlan& p = plans[i];
    Json plan = {{"tp_size", p.tp}, {"pp_size", p.pp}, {"dp_size", 8 / (p.tp * p.pp)},
                 {"micro_batch_size", p.mbs}, {"global_batch_size", p.gbs}, {"dtype", "bf16"}};
    std::string plan_file = (dir / ("plan" + std::to_string(i) + ".json")).string();
    std::ofstream(plan_file) << plan.dump();
    std::string out = (dir / ("truth" + std::to_string(i))).string();
    test::CommandResult r = test::run_stepcast("simulate" + test::model_arg("gpt2-124m") +
                                               test::topology_arg("dgx-a100-80gb") + " --nodes 1 --plan " +
                                               plan_file + " --profile " + truth_file + " --no-scaling --out " + out);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    Json prediction = load_json_file(out + "/prediction.json");
    double step = prediction["step_time_s"];
    if (i < 3) {
      std::string log_file = (dir / ("run" + std::to_string(i) + ".log")).string();
      std::ofstream(log_file) << megatron_log(p, 8, step);
      logs += " " + log_file;
    } else {
      // As `stepcast run` would have written it: the executor's figures, the same inputs.
      prediction["source"] = "executor";
      std::string m = (dir / ("measurement" + std::to_string(i) + ".json")).string();
      std::ofstream(m) << prediction.dump();
      measurements += " " + m;
    }
  }
  std::string out = (dir / "calibrated").string();
  test::CommandResult r = test::run_stepcast(
      "calibrate" + test::topology_arg("dgx-a100-80gb") + " --megatron-log" + logs + test::model_arg("gpt2-124m") +
      " --measurement" + measurements + " --params gemm,links --out " + out);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  Json report = load_json_file(out + "/calibrate.json");
  CHECK(report["params"]["gemm"].get<double>() == Approx(0.8).epsilon(0.05));
  CHECK(report["params"]["links"].get<double>() == Approx(0.7).epsilon(0.10));
  CHECK(report["mean_abs_error_after"].get<double>() < 0.01);
  CHECK(report["mean_abs_leave_one_out_error"].get<double>() < 0.02);
  WARN("calibrate on the test runs: gemm " << report["params"]["gemm"] << ", links " << report["params"]["links"]
       << ", mean |error| after " << 100 * report["mean_abs_error_after"].get<double>() << "%, leave-one-out "
       << 100 * report["mean_abs_leave_one_out_error"].get<double>() << "%");
  for (const Json& run : report["runs"]) CHECK(std::abs(run["error_before"].get<double>()) > 0.03);
  // The calibrated profile loads and names its origin.
  DeviceProfile calibrated = load_profile(out + "/profile.json");
  CHECK_THAT(calibrated.notes, Contains("stepcast calibrate"));

  // Refusals: a log without iterations, a prediction given as a measurement, no base profile.
  std::string empty_log = (dir / "empty.log").string();
  std::ofstream(empty_log) << "nothing here\n";
  test::CommandResult bad = test::run_stepcast("calibrate" + test::topology_arg("dgx-a100-80gb") +
                                               " --megatron-log " + empty_log + test::model_arg("gpt2-124m") +
                                               " --out " + out);
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.output, Contains("empty.log") && Contains("elapsed time per iteration"));
  std::string prediction_file = (dir / "truth0/prediction.json").string();
  bad = test::run_stepcast("calibrate" + test::topology_arg("dgx-a100-80gb") + " --measurement " +
                           prediction_file + " --out " + out);
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.output, Contains("'source'") && Contains("executor"));
  bad = test::run_stepcast("calibrate" + test::topology_arg("localhost-cpu") + " --measurement " +
                           prediction_file + " --out " + out);
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.output, Contains("base profile"));
  fs::remove_all(dir);
}

TEST_CASE("calibrate: runs faster than the datasheet allows fit to its limit, not to a refused profile",
          "[calibrate][simulate]") {
  // Logs of 20 ms and 10 ms steps of GPT-2 124M on 8 A100s: faster than the profile's GEMM points
  // could be without beating the dense peak (the fit ended in an internal error before).
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("stepcast-calibrate-fast-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string logs;
  const std::vector<std::pair<LogPlan, double>> runs = {{{1, 1, 4, 32}, 0.020}, {{2, 1, 4, 16}, 0.010}};
  for (size_t i = 0; i < runs.size(); ++i) {
    std::string file = (dir / ("fast" + std::to_string(i) + ".log")).string();
    std::ofstream(file) << megatron_log(runs[i].first, 8, runs[i].second);
    logs += " " + file;
  }
  std::string out = (dir / "calibrated").string();
  test::CommandResult r = test::run_stepcast("calibrate" + test::topology_arg("dgx-a100-80gb") + " --megatron-log" +
                                             logs + test::model_arg("gpt2-124m") + " --params gemm --out " + out);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Contains("the GEMM scale stops at"));
  DeviceProfile base = load_profile(test::source_path("profiles/a100-sxm4-80gb.json"));
  Topology a100 = load_topology(test::source_path("topologies/dgx-a100-80gb.json"));
  const double limit = calibration_limits(base, a100.node.device).gemm_scale_max;
  CHECK(limit > 1);
  CHECK(limit < 10);
  Json report = load_json_file(out + "/calibrate.json");
  CHECK(report["params"]["gemm"].get<double>() == Approx(limit).epsilon(1e-6));
  // The fitted profile is one simulate takes.
  test::CommandResult s = test::run_stepcast("simulate" + test::model_arg("gpt2-124m") +
                                             test::topology_arg("dgx-a100-80gb") + " --nodes 1" +
                                             test::plan_arg("tiny-cpu") + " --profile " + out + "/profile.json");
  INFO(s.output);
  CHECK(s.exit_code == 0);
  fs::remove_all(dir);
}
