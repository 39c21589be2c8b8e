// Run-to-run variability (sim/variability.hpp): the draws are a pure function of the seed, have
// the moments they claim, and a segment's deviation grows with the group it is the slowest of;
// simulate applies them reproducibly and reports them as their own part of the breakdown.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>

#include "json_input.hpp"
#include "test_support.hpp"
#include "variability.hpp"

using namespace stepcast;
using Catch::Matchers::Contains;

TEST_CASE("variability: draws are reproducible, standard normal, truncated at 3", "[variability]") {
  VariabilityDraws a({0.02, 0.01}, 7), b({0.02, 0.01}, 7), c({0.02, 0.01}, 8);
  CHECK(a.normal(3, 4, 5) == b.normal(3, 4, 5));
  CHECK(a.normal(3, 4, 5) != c.normal(3, 4, 5));
  CHECK(a.device_factor(12) == b.device_factor(12));
  const int n = 200000;
  double sum = 0, squares = 0, lowest = 0, highest = 0;
  for (int i = 0; i < n; ++i) {
    double z = a.normal(i, 1, 2);
    sum += z;
    squares += z * z;
    lowest = std::min(lowest, z);
    highest = std::max(highest, z);
  }
  double mean = sum / n, sd = std::sqrt(squares / n - mean * mean);
  CHECK(std::abs(mean) < 0.01);
  CHECK(sd == Approx(1.0).epsilon(0.01));  // truncation at ±3 removes 0.3% of the mass
  CHECK(lowest >= -3);
  CHECK(highest <= 3);
  CHECK(lowest < -2.5);
  CHECK(highest > 2.5);
}

TEST_CASE("variability: device factors spread as the profile says — no spread, no change", "[variability]") {
  VariabilityDraws draws({0.03, 0}, 1);
  double sum = 0, squares = 0;
  const int n = 50000;
  for (int r = 0; r < n; ++r) {
    double f = draws.device_factor(r);
    sum += f;
    squares += f * f;
  }
  double mean = sum / n, sd = std::sqrt(squares / n - mean * mean);
  CHECK(mean == Approx(1.0).epsilon(0.002));
  CHECK(sd == Approx(0.03).epsilon(0.03));
  VariabilityDraws none({0, 0}, 1);
  CHECK_FALSE(none.enabled());
  CHECK(none.device_factor(5) == 1);
  CHECK(none.segment_deviation_s(0, 0, 1.0, 8) == 0);
}

TEST_CASE("variability: a segment waits for the slowest of its group", "[variability]") {
  // E[max of n standard normals]: 0 (n = 1), 0.5642 (2), 1.0294 (4), 1.4236 (8).
  VariabilityDraws draws({0, 0.01}, 3);
  const double expected[] = {0, 0.5642, 1.0294, 1.4236};
  const int64_t members[] = {1, 2, 4, 8};
  for (int g = 0; g < 4; ++g) {
    double sum = 0;
    const int n = 40000;
    for (int i = 0; i < n; ++i) sum += draws.segment_deviation_s(0, i, 1.0, members[g]);  // √Σd² = 1 s
    INFO("members " << members[g]);
    CHECK(sum / n / 0.01 == Approx(expected[g]).margin(0.02));
  }
  // The deviation scales with √(Σ d²): four ops of 1 s deviate like one of 2 s.
  CHECK(draws.segment_deviation_s(1, 1, 4.0, 1) == Approx(2 * draws.segment_deviation_s(1, 1, 1.0, 1)));
}

TEST_CASE("variability: a segment's draw is exactly the largest of its members' normals", "[variability]") {
  // segment_deviation_s passes over members that cannot be the largest; the result must be the
  // same, bit for bit, as drawing every member (groups beyond 16 members are drawn in turns).
  VariabilityDraws draws({0, 0.02}, 11);
  int64_t checked = 0;
  for (int64_t members : {1, 2, 3, 8, 16, 17, 40}) {
    for (int64_t rank = 0; rank < 60; ++rank) {
      for (int64_t segment = 0; segment < 60; ++segment) {
        double largest = -3;
        for (int64_t j = 0; j < members; ++j) largest = std::max(largest, draws.normal(rank, segment, j));
        INFO("members " << members << ", rank " << rank << ", segment " << segment);
        REQUIRE(draws.segment_deviation_s(rank, segment, 9.0, members) == 0.02 * 3.0 * largest);
        ++checked;
      }
    }
  }
  CHECK(checked == 7 * 60 * 60);
}

namespace {

// A100 datasheet profile with the given variability, written to a temporary file.
std::string profile_with_variability(const std::string& name, double device_cv, double op_cv) {
  Json p = load_json_file(test::source_path("profiles/a100-sxm4-80gb.json"));
  p["variability"] = {{"device_speed_cv", device_cv}, {"op_time_cv", op_cv}};
  return test::write_temp_file(name, p.dump());
}

Json simulate_json(const std::string& args, const std::string& name) {
  std::string dir = (std::filesystem::temp_directory_path() / ("stepcast-variability-" + name)).string();
  test::CommandResult r = test::run_stepcast("simulate" + args + " --no-scaling --no-records --out " + dir);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  return load_json_file(dir + "/prediction.json");
}

}  // namespace

TEST_CASE("variability: simulate draws it from --seed, reports it, and turns it off", "[variability][simulate]") {
  std::string profile = profile_with_variability("variability-profile.json", 0.02, 0.01);
  // tiny-gpt, dp 8 on one DGX A100: every rank computes alone, then the gradients' all_reduce
  // waits for the slowest.
  std::string plan = test::write_temp_file(
      "variability-dp8.json", R"({"dp_size": 8, "micro_batch_size": 1, "global_batch_size": 16})");
  std::string args = test::model_arg("tiny-gpt") + test::topology_arg("dgx-a100-80gb") +
                     " --nodes 1 --plan " + plan + " --profile " + profile;
  Json seed1 = simulate_json(args + " --seed 1", "seed1");
  Json again = simulate_json(args + " --seed 1", "again");
  Json seed2 = simulate_json(args + " --seed 2", "seed2");
  Json off = simulate_json(args + " --variability off", "off");
  CHECK(seed1["step_time_s"] == again["step_time_s"]);
  CHECK(seed1["step_time_s"] != seed2["step_time_s"]);
  CHECK(seed1["variability"]["applied"] == true);
  CHECK(seed1["variability"]["seed"] == 1);
  CHECK(off["variability"]["applied"] == false);
  CHECK(off["breakdown_s"]["variability"] == 0.0);
  // Eight devices: the slowest of eight factors (about +1.4 sd) makes the step slower than
  // nominal, for either seed.
  double nominal = off["step_time_s"];
  CHECK(seed1["step_time_s"].get<double>() > nominal);
  CHECK(seed2["step_time_s"].get<double>() > nominal);
  CHECK(seed1["step_time_s"].get<double>() < nominal * 1.1);
  // The critical rank's own slowdown is its own part; the parts still add up to the step.
  const Json& b = seed1["breakdown_s"];
  CHECK(b["variability"].get<double>() > 0);
  double parts = b["compute"].get<double>() + b["exposed_comm"].get<double>() + b["bubble"].get<double>() +
                 b["optimizer"].get<double>() + b["variability"].get<double>();
  CHECK(parts == Approx(seed1["step_time_s"].get<double>()).epsilon(1e-9));

  test::CommandResult bad = test::run_stepcast("simulate" + args + " --variability maybe");
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.output, Contains("--variability 'maybe'") && Contains("on, off"));
}

TEST_CASE("variability: fast mode's folded tensor parallelism agrees with full mode", "[variability][simulate]") {
  std::string profile = profile_with_variability("variability-tp-profile.json", 0.02, 0.02);
  // tp 4 × dp 2 on one DGX A100: fast mode stands one rank in for each tp group.
  std::string plan = test::write_temp_file(
      "variability-tp4.json",
      R"({"tp_size": 4, "dp_size": 2, "micro_batch_size": 1, "global_batch_size": 4})");
  std::string args = test::model_arg("tiny-gpt") + test::topology_arg("dgx-a100-80gb") +
                     " --nodes 1 --plan " + plan + " --profile " + profile;
  Json fast = simulate_json(args + " --mode fast", "fast");
  Json full = simulate_json(args + " --mode full", "full");
  Json nominal = simulate_json(args + " --mode full --variability off", "nominal");
  double slowdown_fast = fast["step_time_s"].get<double>() / nominal["step_time_s"].get<double>() - 1;
  double slowdown_full = full["step_time_s"].get<double>() / nominal["step_time_s"].get<double>() - 1;
  INFO("fast +" << 100 * slowdown_fast << "%, full +" << 100 * slowdown_full << "%");
  CHECK(slowdown_full > 0);
  CHECK(slowdown_fast > 0);
  // Different draws (full mode draws per rank and op, fast mode per group and segment): the same
  // size of effect, not the same number.
  CHECK(std::abs(slowdown_fast - slowdown_full) < 0.5 * slowdown_full + 0.01);
}
