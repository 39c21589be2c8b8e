// `simulate` of an asynchronous data-parallel plan: the previous step's gradient all-reduce runs
// beside this step's compute, so where it is shorter than the compute it is hidden — the step is
// the synchronous step less its exposed all-reduce, plus the stale-gradient copies the optimizer
// phase gains — and prediction.json's "async" gives the synchronous step simulated beside it.
#include <catch2/catch.hpp>

#include <filesystem>

#include "json_input.hpp"
#include "test_support.hpp"

using namespace stepcast;
using namespace stepcast::test;
using Catch::Matchers::Contains;

namespace {

Json simulate_plan(const Json& plan, const std::string& name) {
  const std::string dir = fresh_dir("async-sim-" + name);
  const std::string path = write_temp_file("async-sim-" + name + ".json", plan.dump());
  CommandResult r = run_stepcast("simulate --model " + source_path("models/gpt2-124m.json") + " --topology " +
                                 source_path("topologies/dgx-a100-80gb.json") + " --nodes 2 --plan " + path +
                                 " --profile roofline --variability off --overlap-interference off --no-scaling "
                                 "--no-records --out " + dir);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  if (plan.contains("data_parallel_mode")) CHECK_THAT(r.output, Contains("asynchronous data parallelism (staleness"));
  return load_json_file(dir + "/prediction.json");
}

}  // namespace

TEST_CASE("simulate: async data parallelism hides the all-reduce a synchronous step exposes", "[simulate][async]") {
  // dp 16 over two DGX nodes, no overlap in the synchronous plan: its all-reduce follows the
  // backward pass; GPT-2's 124M gradients cross the nodes in less than the step's compute.
  Json sync = {{"dp_size", 16}, {"micro_batch_size", 4}, {"global_batch_size", 256}, {"dropout", 0.0}};
  Json async = sync;
  async["data_parallel_mode"] = "async";
  const Json s = simulate_plan(sync, "sync");
  const Json a = simulate_plan(async, "async");
  const double sync_exposed = s["breakdown_s"]["exposed_comm"].get<double>();
  REQUIRE(sync_exposed > 1e-3);
  CHECK(a["breakdown_s"]["exposed_comm"].get<double>() == Approx(0).margin(1e-9));
  CHECK(a["breakdown_s"]["compute"].get<double>() == Approx(s["breakdown_s"]["compute"].get<double>()).epsilon(1e-9));
  // The optimizer phase gains the copies into the stale slot (memory-bound, a few percent of it).
  const double stash_s = a["breakdown_s"]["optimizer"].get<double>() - s["breakdown_s"]["optimizer"].get<double>();
  CHECK(stash_s > 0);
  CHECK(stash_s < 0.5 * sync_exposed);
  const double sync_step = s["step_time_s"].get<double>(), async_step = a["step_time_s"].get<double>();
  CHECK(async_step == Approx(sync_step - sync_exposed + stash_s).epsilon(1e-6));
  // The synchronous reference simulated beside it is that same synchronous step.
  const Json& info = a["async"];
  CHECK(info["staleness"] == 1);
  CHECK(info["gradient_age_steps"] == 1);
  CHECK(info["sync_step_time_s"].get<double>() == Approx(sync_step).epsilon(1e-12));
  CHECK(info["throughput_over_sync"].get<double>() == Approx(sync_step / async_step).epsilon(1e-12));
  CHECK(info["tokens_per_s"].get<double>() == Approx(a["tokens_per_s"].get<double>()).epsilon(1e-12));
  CHECK_FALSE(s.contains("async"));
}
