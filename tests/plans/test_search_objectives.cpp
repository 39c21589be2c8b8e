// The planner's energy and cost objectives: the estimate's joules, simulated energies ranked
// first, and `stepcast plan --objective energy|cost` end to end; a re-simulated plan's peak.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "json_input.hpp"
#include "search.hpp"
#include "test_support.hpp"

using namespace stepcast;
using namespace stepcast::test;

TEST_CASE("objective energy: the estimate's joules, and simulated energies ranked first", "[search]") {
  QuickEstimate e;
  e.step_time_s = 2.0;
  e.compute_s = 1.2;
  e.optimizer_s = 0.3;
  // 8 devices: 60 W for 2 s each, and 340 W more for 1.5 s busy: 8 · (120 + 510) J.
  CHECK(estimate_energy_j(e, 8, 60, 400) == Approx(8 * (60 * 2.0 + 340 * 1.5)));
  e.compute_s = 5;  // busy never longer than the step
  CHECK(estimate_energy_j(e, 1, 60, 400) == Approx(400 * 2.0));
  std::vector<Candidate> ranked(4);
  for (size_t i = 0; i < ranked.size(); ++i) ranked[i].plan.name = "p" + std::to_string(i);
  ranked[1].energy_per_step_j = 50;
  ranked[3].energy_per_step_j = 40;
  rank_by_energy(ranked);
  CHECK(ranked[0].plan.name == "p3");
  CHECK(ranked[1].plan.name == "p1");
  CHECK(ranked[2].plan.name == "p0");  // the others keep their order
  CHECK(ranked[3].plan.name == "p2");
}

TEST_CASE("stepcast plan --objective energy and cost rank by the simulated joules and price", "[search][cli]") {
  std::string out = (std::filesystem::temp_directory_path() / "stepcast-test-plan-energy").string();
  std::filesystem::remove_all(out);
  auto r = run_stepcast("plan" + model_arg("tiny") + topology_arg("dgx-a100-80gb") +
                        " --nodes 1 --global-batch-size 16 --objective energy --top 3 --evaluate 4 --out " + out);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  Json plans = load_json_file(out + "/plans.json");
  REQUIRE(plans.at("top").size() == 3);
  double previous = 0;
  for (const auto& t : plans["top"]) {
    CHECK(t.at("energy_source") == "simulate");
    double joules = t.at("energy_per_step_j").get<double>();
    CHECK(joules >= previous);
    // Between every device idle and every device busy for the whole step (60 W and 400 W).
    double step = t.at("step_time_s").get<double>();
    CHECK(joules >= 8 * 60 * step * (1 - 1e-9));
    CHECK(joules <= 8 * 400 * step * (1 + 1e-9));
    previous = joules;
  }
  CHECK(std::filesystem::exists(out + "/report.md"));
  std::ifstream report(out + "/report.md");
  std::string text((std::istreambuf_iterator<char>(report)), std::istreambuf_iterator<char>());
  CHECK_THAT(text, Catch::Contains("J/step"));
  // Cost: the time order, each step at 8 devices × the price.
  auto c = run_stepcast("plan" + model_arg("tiny") + topology_arg("dgx-a100-80gb") +
                        " --nodes 1 --global-batch-size 16 --objective cost --price-per-gpu-hour 2.5 USD --top 3 --evaluate 3"
                        " --out " + out);
  INFO(c.output);
  REQUIRE(c.exit_code == 0);
  plans = load_json_file(out + "/plans.json");
  previous = 0;
  for (const auto& t : plans["top"]) {
    double step = t.at("step_time_s").get<double>();
    CHECK(t.at("cost_per_step").get<double>() == Approx(2.5 * 8 * step / 3600));
    CHECK(t.at("currency") == "USD");
    CHECK(step >= previous);
    previous = step;
  }
  std::filesystem::remove_all(out);
}

TEST_CASE("stepcast compare-strategies gives each simulated strategy its energy per step", "[search][cli]") {
  std::string out = (std::filesystem::temp_directory_path() / "stepcast-test-strategies-energy").string();
  std::filesystem::remove_all(out);
  auto r = run_stepcast("compare-strategies" + model_arg("tiny") + topology_arg("dgx-a100-80gb") +
                        " --nodes 1 --global-batch-size 16 --out " + out);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("J/step"));
  Json s = load_json_file(out + "/strategies.json");
  int simulated = 0;
  for (const auto& row : s.at("strategies")) {
    INFO(row.dump());
    if (!row.at("simulated").get<bool>()) continue;
    ++simulated;
    // Between all 8 devices idle (60 W) and all busy (400 W) for the step.
    double joules = row.at("energy_per_step_j").get<double>(), step = row.at("step_time_s").get<double>();
    CHECK(joules >= 8 * 60 * step * (1 - 1e-9));
    CHECK(joules <= 8 * 400 * step * (1 + 1e-9));
  }
  CHECK(simulated > 0);
  std::filesystem::remove_all(out);
}

TEST_CASE("stepcast plan --heterogeneous balances pipeline stages and replicas by their devices' speeds",
          "[search][cli]") {
  // Four CPU devices, the last two at half speed: with pp 2 (order tp-dp-pp) stage 1 runs on
  // them, so the tiny model's 4 layers split 3 / 1 (largest layers / speed: 3, against 4 for
  // 2 / 2). The search holds each pipeline plan's balanced split beside the even one (its
  // estimate slows stage 1 twice), and each data-parallel plan whose replicas differ in speed
  // with its microbatches split by them (dp 4: 3, 3, 1, 1 of 8; tp 2 dp 2: 3 and 1 of 4 per
  // 2 samples). The balanced plans simulate faster than their even twins (simulated for the
  // comparison) and lead the table.
  Json t = load_json_file(source_path("topologies/localhost-cpu.json"));
  t["node"]["devices_per_node"] = 4;
  t["heterogeneity"] = {{"devices",
                         {{{"device", 2}, {"compute_speed_factor", 0.5}}, {{"device", 3}, {"compute_speed_factor", 0.5}}}}};
  if (t.contains("profile")) t.erase("profile");
  const std::string topology = write_temp_file("heterogeneous-cpu.json", t.dump());
  const std::string out = fresh_dir("plan-heterogeneous");
  auto r = run_stepcast("plan" + model_arg("tiny") + " --topology " + topology +
                        " --profile roofline --global-batch-size 8 --top 4 --evaluate 40 --heterogeneous --out " + out);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("balanced for the topology's unequal devices"));
  CHECK_THAT(r.output, Catch::Contains("microbatches per data-parallel replica by replica speed"));
  Json plans = load_json_file(out + "/plans.json");
  const Json& balanced = plans.at("heterogeneous");
  int adopted = 0;
  for (const auto& b : balanced) {
    CHECK(b.at("stage_speeds") == Json({1.0, 0.5}));
    if (!b.at("adopted").get<bool>()) continue;
    ++adopted;
    CHECK(b.at("balanced_layers_per_stage") == Json({3, 1}));
    CHECK(b.at("balanced_step_time_s").get<double>() < b.at("step_time_s").get<double>());
  }
  REQUIRE(adopted > 0);
  int replicas_adopted = 0;
  for (const auto& b : plans.at("heterogeneous_replicas")) {
    INFO(b.dump());
    if (!b.at("adopted").get<bool>()) continue;
    ++replicas_adopted;
    const Json& speeds = b.at("replica_speeds");
    const Json& split = b.at("balanced_microbatches_per_replica");
    if (speeds.size() == 4) {
      CHECK(speeds == Json({1.0, 1.0, 0.5, 0.5}));
      CHECK(split == Json({3, 3, 1, 1}));
    } else {
      CHECK(speeds == Json({1.0, 0.5}));
      CHECK(split.at(0).get<int64_t>() == 3 * split.at(1).get<int64_t>());
    }
    CHECK(b.at("balanced_step_time_s").get<double>() < b.at("step_time_s").get<double>());
  }
  REQUIRE(replicas_adopted > 0);
  // The first plan is a balanced one, its file holding its split.
  const Json& first = plans.at("top").at(0);
  const std::string name = first.at("name").get<std::string>();
  const Json file = load_json_file(out + "/" + first.at("plan_file").get<std::string>());
  INFO(name);
  if (name.size() > 3 && name.compare(name.size() - 3, 3, "-hm") == 0) {
    CHECK(file.contains("microbatches_per_replica"));
  } else {
    CHECK_THAT(name, Catch::EndsWith("-hb"));
    CHECK(file.at("layers_per_stage") == Json({3, 1}));
  }
  // Without heterogeneity the option is refused, naming the key.
  auto refused = run_stepcast("plan" + model_arg("tiny") + topology_arg("localhost-cpu") +
                              " --global-batch-size 8 --heterogeneous");
  CHECK(refused.exit_code == 2);
  CHECK_THAT(refused.output, Catch::Contains("heterogeneity"));
}

TEST_CASE("stepcast plan shows a re-simulated plan's peak as memory gives it, placement included", "[search][cli]") {
  // small-gpt's ZeRO-3 plans leave gaps in the arena (memory_placement_bytes): the screen ranks
  // by the live peak, the plans it re-simulates report simulate's peak, which is memory's.
  std::string out = (std::filesystem::temp_directory_path() / "stepcast-test-plan-placement").string();
  std::filesystem::remove_all(out);
  auto r = run_stepcast("plan" + model_arg("small-gpt") + topology_arg("localhost-cpu") +
                        " --global-batch-size 8 --top 12 --evaluate all --out " + out);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  Json plans = load_json_file(out + "/plans.json");
  int64_t with_gaps = 0;
  for (const Json& t : plans.at("top")) {
    REQUIRE(t.at("step_time_source") == "simulate");
    std::string file = out + "/" + t.at("plan_file").get<std::string>();
    auto m = run_stepcast("memory" + model_arg("small-gpt") + topology_arg("localhost-cpu") + " --plan " + file +
                          " --out " + out + "/memory-" + t.at("name").get<std::string>());
    REQUIRE(m.exit_code == 0);
    Json memory = load_json_file(out + "/memory-" + t.at("name").get<std::string>() + "/memory.json");
    CHECK(t.at("peak_bytes_max").get<double>() == memory.at("peak_bytes_max").get<double>());
    with_gaps += memory.at("ranks")[0].at("memory_placement_bytes").get<double>() > 0;
  }
  CHECK(with_gaps > 0);
  std::filesystem::remove_all(out);
}
