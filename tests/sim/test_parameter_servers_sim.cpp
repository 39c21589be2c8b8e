// Parameter servers in the simulator (`simulate`, tests/plans/test_parameter_servers.cpp for the
// program), against closed forms on the tiny model over localhost-cpu devices, roofline: one
// worker and one server take the synchronous step plus the transfers of the gradient to the server
// and of the weights back, and the server's copy of the weights into the worker's reply slot (the
// update moves from the worker to the server); two equal workers
// meet one other update between pull and push; with one worker at a quarter of the speed, a
// staleness bound of 1 holds the fast worker to the slow one's pace, and a bound it never reaches
// lets it run free (its compute a quarter of the slow one's, its transfers through the node's NIC
// to the server on the other node as long), the throughput the sum of both rates.
#include <catch2/catch.hpp>

#include <string>

#include "lower.hpp"
#include "plan.hpp"
#include "test_support.hpp"

using namespace stepcast;
using namespace stepcast::test;

namespace {

Json ps_plan(int64_t workers, int64_t staleness) {
  return {{"dp_size", workers}, {"micro_batch_size", 2}, {"global_batch_size", 2 * workers}, {"dtype", "fp32"},
          {"dropout", 0.0}, {"data_parallel_mode", "async"}, {"staleness", staleness}, {"parameter_servers", 1}};
}

Json predict(const Json& plan, double speed_of_1) {
  static int counter = 0;
  const std::string name = "ps-sim-" + std::to_string(++counter);
  Json t = load_json_file(source_path("topologies/localhost-cpu.json"));
  t["num_nodes"] = 2;
  if (speed_of_1 != 1) t["heterogeneity"] = {{"devices", {{{"device", 1}, {"compute_speed_factor", speed_of_1}}}}};
  const std::string topology = write_temp_file(name + "-topology.json", t.dump());
  const std::string plan_file = write_temp_file(name + "-plan.json", plan.dump());
  const std::string out = fresh_dir(name);
  CommandResult r = run_stepcast("simulate --model " + source_path("models/tiny.json") + " --topology " + topology +
                                 " --plan " + plan_file + " --profile roofline --no-scaling --out " + out);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  return load_json_file(out + "/prediction.json");
}

}  // namespace

TEST_CASE("simulate: parameter servers against closed forms", "[simulate][ps]") {
  // One worker, one server: the synchronous step (prediction's async.sync_step_time_s) plus the
  // two transfers at the intra-node bandwidth, and their latencies (a few microseconds).
  Json one = predict(ps_plan(1, 1), 1);
  const Json& a = one.at("async");
  ModelConfig model = load_model(source_path("models/tiny.json"));
  Topology topology = load_topology(source_path("topologies/localhost-cpu.json"), 2);
  Plan plan = parse_plan(ps_plan(1, 1), "ps.json");
  validate_plan(plan, model, topology);
  double bytes = 0, pulled = 0;
  const StepProgram program = lower_program(model, topology, plan);
  for (const Op& op : program.roles.front().ops) {
    if (is_p2p(op.kind)) bytes += op.bytes;
    if (op.kind == OpKind::recv) pulled += op.bytes;
  }
  // The transfers, and the server's copy of the weights into the worker's staging slot (read
  // and written once at the memory bandwidth).
  const double transfers = bytes / topology.node.intra_node.bandwidth_bytes_per_s;
  const double copy = 2 * pulled / topology.node.device.memory_bandwidth_bytes_per_s;
  const double extra = one.at("step_time_s").get<double>() - a.at("sync_step_time_s").get<double>();
  INFO("transfers " << transfers << " s, copy " << copy << " s, the step's extra " << extra << " s");
  CHECK(extra >= transfers + copy);
  CHECK(extra <= transfers + copy + 20e-6);
  CHECK(a.at("parameter_servers").at("staleness_updates_max") == 0);

  // Two equal workers: each push meets the other's update.
  Json two = predict(ps_plan(2, 1), 1);
  CHECK(two.at("async").at("parameter_servers").at("staleness_updates_mean").get<double>() == Approx(1).epsilon(0.05));

  // Worker 1 at a quarter of the speed.
  Json held = predict(ps_plan(2, 1), 0.25);
  Json free = predict(ps_plan(2, 64), 0.25);
  auto steps = [](const Json& p) { return p.at("async").at("parameter_servers").at("worker_step_s"); };
  const double held_fast = steps(held)[0], held_slow = steps(held)[1];
  const double free_fast = steps(free)[0], free_slow = steps(free)[1];
  INFO("staleness 1: " << held_fast << " and " << held_slow << " s; staleness 64: " << free_fast << " and " << free_slow);
  CHECK(held_fast == Approx(held_slow).epsilon(0.02));
  // Free, the fast worker steps at its own compute and transfers: well under half the slow one's.
  CHECK(free_fast < 0.5 * free_slow);
  CHECK(free_slow <= held_slow * 1.02);
  // The equivalent step: one global batch at the two workers' summed rate.
  CHECK(free.at("step_time_s").get<double>() == Approx(2 / (1 / free_fast + 1 / free_slow)).epsilon(1e-9));
  CHECK(free.at("tokens_per_s").get<double>() > 1.5 * held.at("tokens_per_s").get<double>());
}
