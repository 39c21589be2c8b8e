// plan, scale and compare-strategies spread over an MPI job (cli/distributed_simulations.hpp):
// under scripts/mpirun -np 2 they write what one process writes (wall times aside), a refused
// input is reported once, and a rank whose simulations are killed mid-sweep (stepcast-with-faults,
// STEPCAST_TEST_SIM_DIE) is named while its simulations run on the other rank.
#include <catch2/catch.hpp>

#include <string>

#include "test_support.hpp"

using namespace stepcast;
using namespace stepcast::test;

namespace {

// `j` without the keys that measure this run's wall time (wall_s, search_wall_s, ...).
Json without_wall_times(Json j) {
  if (j.is_object()) {
    Json out = Json::object();
    for (auto& [key, value] : j.items()) {
      if (key.size() >= 6 && key.compare(key.size() - 6, 6, "wall_s") == 0) continue;
      out[key] = without_wall_times(value);
    }
    return out;
  }
  if (j.is_array()) {
    Json out = Json::array();
    for (auto& value : j) out.push_back(without_wall_times(value));
    return out;
  }
  return j;
}

std::string mpirun2() { return source_path("scripts/mpirun") + " -np 2 "; }

size_t count_of(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

const std::string kPlanArguments = " plan" + model_arg("tiny") + topology_arg("localhost-cpu") +
                                   " --global-batch-size 8 --top 3 --evaluate 6 --jobs 1 --out ";

}  // namespace

TEST_CASE("spread: plan under mpirun -np 2 writes the single process's plans.json", "[spread]") {
  std::string one = fresh_dir("spread-plan-1"), two = fresh_dir("spread-plan-2");
  CommandResult single = run_shell(std::string(STEPCAST_BINARY) + kPlanArguments + one);
  INFO(single.output);
  REQUIRE(single.exit_code == 0);
  CommandResult spread = run_shell("timeout 120 " + mpirun2() + STEPCAST_BINARY + kPlanArguments + two);
  INFO(spread.output);
  REQUIRE(spread.exit_code == 0);
  Json a = read_json(one + "/plans.json"), b = read_json(two + "/plans.json");
  REQUIRE(a.at("plans").size() >= 6);
  for (size_t i = 0; i < 6; ++i) CHECK(b["plans"][i]["step_time_source"] == "simulate");
  CHECK(without_wall_times(a) == without_wall_times(b));
  CHECK(count_of(spread.output, "stepcast plan: tiny") == 1);  // rank 0 alone prints
}

TEST_CASE("spread: scale and compare-strategies under mpirun -np 2 write the single process's figures", "[spread]") {
  const std::string scale = " scale" + model_arg("tiny") + topology_arg("localhost-cpu") + " --plan " +
                            source_path("examples/tiny-cpu.json") + " --nodes 1,2,4,8 --out ";
  std::string one = fresh_dir("spread-scale-1"), two = fresh_dir("spread-scale-2");
  CommandResult single = run_shell(std::string(STEPCAST_BINARY) + scale + one);
  INFO(single.output);
  REQUIRE(single.exit_code == 0);
  CommandResult spread = run_shell("timeout 120 " + mpirun2() + STEPCAST_BINARY + scale + two);
  INFO(spread.output);
  REQUIRE(spread.exit_code == 0);
  Json a = read_json(one + "/scale.json"), b = read_json(two + "/scale.json");
  REQUIRE(a.at("points").size() == 4);
  CHECK(without_wall_times(a) == without_wall_times(b));

  const std::string strategies = " compare-strategies" + model_arg("tiny") + topology_arg("localhost-cpu") +
                                 " --nodes 2 --global-batch-size 16 --out ";
  one = fresh_dir("spread-strategies-1"), two = fresh_dir("spread-strategies-2");
  single = run_shell(std::string(STEPCAST_BINARY) + strategies + one);
  INFO(single.output);
  REQUIRE(single.exit_code == 0);
  spread = run_shell("timeout 120 " + mpirun2() + STEPCAST_BINARY + strategies + two);
  INFO(spread.output);
  REQUIRE(spread.exit_code == 0);
  CHECK(without_wall_times(read_json(one + "/strategies.json")) ==
        without_wall_times(read_json(two + "/strategies.json")));
}

TEST_CASE("spread: a refused input is reported once, by rank 0, with exit 2", "[spread]") {
  CommandResult r =
      run_shell("timeout 120 " + mpirun2() + STEPCAST_BINARY + " scale" + model_arg("tiny") +
                topology_arg("localhost-cpu") + " --plan " + source_path("examples/tiny-cpu.json") + " --nodes 1,x");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(count_of(r.output, "stepcast scale: error:") == 1);
}

TEST_CASE("spread: a rank whose simulations are killed mid-sweep is named and the sweep completes on the others",
          "[spread]") {
  std::string one = fresh_dir("spread-fault-1"), two = fresh_dir("spread-fault-2");
  CommandResult single = run_shell(std::string(STEPCAST_BINARY) + kPlanArguments + one);
  INFO(single.output);
  REQUIRE(single.exit_code == 0);
  // Rank 1 runs its first simulation, then every one it starts is killed (SIGKILL).
  CommandResult r = run_shell("STEPCAST_TEST_SIM_DIE=1:1 timeout 120 " +
                              with_faults(mpirun2() + STEPCAST_BINARY + kPlanArguments + two));
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("rank 1 (") && Catch::Contains("killed by signal 9"));
  CHECK_THAT(r.output, Catch::Contains("ranks that failed during the sweep: rank 1 ("));
  // Every simulation it lost ran on rank 0: the results are the single process's.
  Json a = read_json(one + "/plans.json"), b = read_json(two + "/plans.json");
  CHECK(without_wall_times(a) == without_wall_times(b));
}
