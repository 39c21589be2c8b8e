// `stepcast goodput` end to end: its step time is simulate's (no variability), goodput.json's
// parts add up to time_to_train_s, auto takes the interval table's fastest, --checkpoint-every
// is obeyed, a per-node MTBF is divided by the nodes the plan occupies, and Monte-Carlo gives
// the same figures for the same seed.
#include <catch2/catch.hpp>

#include <cmath>

#include "json_input.hpp"
#include "test_support.hpp"

using namespace stepcast;
using namespace stepcast::test;

namespace {

const std::string kInputs = model_arg("tiny") + topology_arg("dgx-a100-80gb") + plan_arg("tiny-cpu");

Json goodput(const std::string& name, const std::string& options) {
  std::string out = fresh_dir(name);
  CommandResult r = run_stepcast("goodput" + kInputs + " --out " + out + " " + options);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("time to train"));
  return read_json(out + "/goodput.json");
}

}  // namespace

TEST_CASE("goodput: the step time is simulate's, and the parts add up", "[goodput]") {
  std::string sim_out = fresh_dir("goodput-sim");
  CommandResult s = run_stepcast("simulate" + kInputs + " --variability off --no-scaling --no-records --out " + sim_out);
  INFO(s.output);
  REQUIRE(s.exit_code == 0);
  double step_s = read_json(sim_out + "/prediction.json")["step_time_s"].get<double>();
  Json g = goodput("goodput-simulated", "--tokens 1e6 --job-mtbf-hours 0.05");
  CHECK(g["step_time_s"].get<double>() == step_s);
  CHECK(g["steps"].get<int64_t>() == int64_t(std::ceil(1e6 / g["tokens_per_step"].get<double>())));
  double sum = g["compute_s"].get<double>() + g["checkpoint_s"].get<double>() + g["lost_work_s"].get<double>() +
               g["restart_reload_s"].get<double>();
  CHECK(sum == Approx(g["time_to_train_s"].get<double>()).epsilon(1e-9));
  CHECK(g["time_to_train_s"].get<double>() > g["time_to_train_without_failures_s"].get<double>());
  // auto: the fastest row of the interval table.
  double fastest = INFINITY;
  int64_t fastest_steps = 0;
  for (const Json& row : g["interval_table"]) {
    if (row["time_to_train_s"].is_number() && row["time_to_train_s"].get<double>() < fastest) {
      fastest = row["time_to_train_s"].get<double>();
      fastest_steps = row["interval_steps"].get<int64_t>();
    }
  }
  CHECK(g["interval"]["chosen_steps"].get<int64_t>() == fastest_steps);
  CHECK(g["time_to_train_s"].get<double>() == fastest);
  CHECK(g["checkpoint"]["storage"]["source"].get<std::string>().find("BLOOM") != std::string::npos);
}

TEST_CASE("goodput: --checkpoint-every, per-node MTBF and seeded Monte-Carlo", "[goodput]") {
  const std::string base = "--tokens 1e6 --step-time-s 0.5 --restart-s 30 ";
  Json fixed = goodput("goodput-fixed", base + "--job-mtbf-hours 0.5 --checkpoint-every 7");
  CHECK(fixed["interval"]["chosen_steps"] == 7);
  CHECK(fixed["interval"]["chosen_by"] == "--checkpoint-every");
  // tiny-cpu's 2 ranks sit on one 8-GPU node: a per-node MTBF is the job's.
  Json per_node = goodput("goodput-per-node", base + "--mtbf-hours 0.5 --checkpoint-every 7");
  CHECK(per_node["failures_model"]["nodes_used"] == 1);
  CHECK(per_node["time_to_train_s"] == fixed["time_to_train_s"]);
  Json a = goodput("goodput-mc-a", base + "--job-mtbf-hours 0.5 --monte-carlo 200 --seed 5");
  Json b = goodput("goodput-mc-b", base + "--job-mtbf-hours 0.5 --monte-carlo 200 --seed 5");
  Json c = goodput("goodput-mc-c", base + "--job-mtbf-hours 0.5 --monte-carlo 200 --seed 6");
  CHECK(a["monte_carlo"] == b["monte_carlo"]);
  CHECK(a["monte_carlo"]["mean_s"] != c["monte_carlo"]["mean_s"]);
  double expected = a["time_to_train_s"].get<double>();
  CHECK(std::abs(a["monte_carlo"]["mean_s"].get<double>() - expected) / expected < 0.05);
}

TEST_CASE("goodput: Monte-Carlo where failures outpace the checkpoints ends, saying why", "[goodput]") {
  // A 0.36 s MTBF against 50 s of work between checkpoints: no run would ever end (drawing it
  // looped forever before).
  Json g = goodput("goodput-mc-never",
                   "--tokens 1e6 --step-time-s 0.5 --restart-s 30 --job-mtbf-hours 0.0001 --checkpoint-every 100 "
                   "--monte-carlo 10");
  REQUIRE(g.contains("monte_carlo"));
  CHECK_THAT(g["monte_carlo"]["skipped"].get<std::string>(), Catch::Contains("not drawn"));
  CHECK_FALSE(g["monte_carlo"].contains("mean_s"));
  CHECK(g["monte_carlo"]["runs"] == 10);
}
