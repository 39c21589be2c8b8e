// Parameter servers run for real (`stepcast run` under mpirun, one process per worker and per
// server): one worker with two servers trains the single-rank loss curve (fp64, dropout on: each
// server's AdamW on its slices is the whole model's, clipped by the worker's norm); two
// free-running workers with one server under a staleness bound train a falling loss, the servers
// applying one update per worker step, no gradient older than the bound allows; what the run
// cannot do is refused before it starts.
#include <catch2/catch.hpp>

#include "run_fixtures.hpp"

using namespace stepcast;
using namespace stepcast::test;

namespace {

Json ps_plan(int64_t workers, int64_t servers, int64_t staleness, const char* dtype) {
  return {{"dp_size", workers}, {"micro_batch_size", 2}, {"global_batch_size", 2 * workers}, {"dtype", dtype},
          {"dropout", 0.1}, {"data_parallel_mode", "async"}, {"staleness", staleness}, {"parameter_servers", servers}};
}

}  // namespace

TEST_CASE("run: one worker with two parameter servers gives the single-rank loss curve (fp64)", "[run][ps]") {
  const int steps = 4;
  Json single = {{"micro_batch_size", 2}, {"global_batch_size", 2}, {"dtype", "fp64"}, {"dropout", 0.1}};
  RunResult reference = run_plan("tiny", single, steps);
  RunResult ps = run_plan("tiny", ps_plan(1, 2, 1, "fp64"), steps);
  INFO(reference.output << ps.output);
  REQUIRE(reference.exit_code == 0);
  REQUIRE(ps.exit_code == 0);
  CHECK(max_relative_difference(losses(ps), losses(reference)) < 1e-12);
  CHECK(ps.measurement.at("parameter_servers").at("updates") == 2 * steps);  // each server, each step
  CHECK(ps.measurement.at("parameter_servers").at("staleness_updates_max") == 0);
}

TEST_CASE("run: free-running workers with a parameter server train a falling loss within the bound", "[run][ps]") {
  const int steps = 12;
  const int64_t staleness = 2;
  RunResult r = run_plan("tiny", ps_plan(2, 1, staleness, "fp32"), steps);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const std::vector<double> l = losses(r);
  REQUIRE(l.size() == size_t(steps));
  CHECK(l.back() < l.front() - 0.5);
  const Json& ps = r.measurement.at("parameter_servers");
  CHECK(ps.at("updates") == 2 * steps);
  // A push meets the updates of the other worker's steps since its pull: under the bound at most
  // staleness + 1 of them (it may be that many steps ahead, and one in flight).
  CHECK(ps.at("staleness_updates_max").get<int64_t>() <= staleness + 1);
  CHECK(ps.at("staleness_updates_mean").get<double>() > 0);
  CHECK(ps.at("worker_step_s").size() == 2);
  CHECK_THAT(r.output, Catch::Contains("parameter servers: 1,"));
}

TEST_CASE("run: parameter servers refuse checkpoints and a wrong number of processes", "[run][ps]") {
  RunResult checkpoints =
      run_plan("tiny", ps_plan(1, 1, 1, "fp32"), 2, "--checkpoint-dir " + fresh_dir("ps-checkpoints") + " --checkpoint-every 1");
  CHECK(checkpoints.exit_code == 2);
  CHECK_THAT(checkpoints.output, Catch::Contains("key 'parameter_servers' = 1: checkpoints"));
  Json plan = ps_plan(1, 1, 1, "fp32");
  const std::string file = write_temp_file("ps-np.plan.json", plan.dump());
  CommandResult wrong = run_shell(source_path("scripts/mpirun") + " -np 1 " + STEPCAST_BINARY + " run --model " +
                                    source_path("models/tiny.json") + " --plan " + file + " --topology " +
                                    source_path("topologies/localhost-cpu.json") + " --steps 1 --quiet 2>&1");
  CHECK(wrong.exit_code == 2);
  CHECK_THAT(wrong.output, Catch::Contains("+ parameter_servers), mpirun started 1: run mpirun -np 2"));
}
