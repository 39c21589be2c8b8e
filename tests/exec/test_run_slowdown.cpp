// A straggler on the CPU executor (`run --slowdown RANK:FACTOR`) against simulate's prediction for
// the same topology factor (compute_speed_factor 1 / FACTOR), as ratios to the uniform step so
// that the cost model's bias cancels (the roofline: measuring a profile first would double the
// test's time): a 2-rank dp run with rank 1 at 2×. It times real runs, so it is its own ctest,
// run_slowdown_against_simulate (hidden tag [.run-slowdown]), with nothing running beside it
// (RUN_SERIAL, tests/CMakeLists.txt): beside other tests, their load has pushed the ratio past
// either bound (0.62 and 1.54 seen in CI).
#include <catch2/catch.hpp>

#include <filesystem>

#include "run_fixtures.hpp"
#include "test_support.hpp"

using namespace stepcast;
using namespace stepcast::test;

TEST_CASE("run --slowdown 1:2 stretches rank 1's compute as simulate predicts", "[.run-slowdown]") {
  const std::string dir = fresh_dir("run-slowdown");
  std::filesystem::create_directories(dir);
  // dp 2, fp32, a few microbatches: compute ops of a few ms each, then the gradients' reduction.
  Json p = {{"dp_size", 2}, {"micro_batch_size", 2}, {"global_batch_size", 8}, {"dtype", "fp32"}, {"dropout", 0.0}};
  const int steps = 6;
  RunResult uniform = run_plan("tiny-gpt", p, steps);
  INFO(uniform.output);
  REQUIRE(uniform.exit_code == 0);
  RunResult slow = run_plan("tiny-gpt", p, steps, "--slowdown 1:2");
  INFO(slow.output);
  REQUIRE(slow.exit_code == 0);
  CHECK(slow.measurement["slowdown"]["rank"] == 1);
  const double measured = slow.measurement["step_time_s"].get<double>() / uniform.measurement["step_time_s"].get<double>();

  // The same plan on localhost-cpu with device 1 at speed 0.5: simulate gives both steps.
  Json t = load_json_file(source_path("topologies/localhost-cpu.json"));
  t["heterogeneity"] = {{"devices", {{{"device", 1}, {"compute_speed_factor", 0.5}}}}};
  const std::string topology = write_temp_file("slowdown-localhost.json", t.dump());
  const std::string plan = write_temp_file("slowdown-plan.json", p.dump());
  CommandResult sim = run_stepcast("simulate --model " + source_path("models/tiny-gpt.json") + " --topology " +
                                   topology + " --plan " + plan + " --profile roofline" +
                                   " --no-scaling --no-records --out " + dir + "/sim");
  INFO(sim.output);
  REQUIRE(sim.exit_code == 0);
  Json prediction = load_json_file(dir + "/sim/prediction.json");
  const Json& h = prediction["heterogeneity"];
  CHECK(h["critical_rank"] == 1);
  const double predicted = prediction["step_time_s"].get<double>() / h["uniform_step_time_s"].get<double>();
  // The slowdown stretches compute only: the step grows, by less than 2×.
  CHECK(predicted > 1.2);
  CHECK(predicted <= 2.0 + 1e-9);
  CHECK(measured > 1.2);
  // Predicted against measured, as ratios to the uniform step. The CPU validation sweep holds
  // steps to 5% on a quiet machine with a full profile; here a quick profile and two short runs
  // share 2 cores with whatever else runs (load 8 seen: 2.68 measured against 1.97 predicted with a
  // quick profile), so
  // the bound is against breakage (a stretch not applied, or applied twice), as validate_ci_sweep's
  // 1.5×; bench/stragglers_cpu.sh prints the figures with repeats.
  INFO("step ratio with rank 1 at 2x: predicted " << predicted << ", measured " << measured);
  // The lower bound 1/2: a stretch applied twice (measured about 3 against 2) still falls below it.
  CHECK(predicted / measured > 0.5);
  CHECK(predicted / measured < 1.5);
}
