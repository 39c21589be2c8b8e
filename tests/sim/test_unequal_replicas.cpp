// Unequal data-parallel replicas (plan microbatches_per_replica) in the simulator, end to end
// (`simulate`, fast and full mode) against closed forms on the tiny GPT over two CPU devices,
// dp 2, no overlap: on equal devices a replica of 3 and one of 1 microbatches take the step of
// two replicas of 3 (the short one waits at the gradients' all-reduce); with device 1 at half
// speed, moving a microbatch from it to device 0 (3 and 1 instead of 2 and 2) saves exactly one
// microbatch's time on equal devices (2 and 2 less 1 and 1), and the step's zero fill of the
// gradient buffer at full speed (the slow device's fill, before the all-reduce, takes twice it);
// and approx mode does not fold the unequal copies.
#include <catch2/catch.hpp>

#include <string>

#include "cost_model.hpp"
#include "lower.hpp"
#include "profile.hpp"
#include "test_support.hpp"
#include "zero_fill.hpp"

using namespace stepcast;
using namespace stepcast::test;

namespace {

Json dp2_plan(const Json& batch) {
  Json p = {{"dp_size", 2}, {"micro_batch_size", 2}, {"dtype", "fp32"}, {"dropout", 0.0}};
  p.update(batch);
  return p;
}

// The step simulate predicts for `plan` on localhost-cpu (device 1 at `speed`).
Json predict(const Json& plan, double speed, const std::string& mode) {
  static int counter = 0;
  const std::string name = "unequal-" + std::to_string(++counter);
  Json t = load_json_file(source_path("topologies/localhost-cpu.json"));
  if (speed != 1) t["heterogeneity"] = {{"devices", {{{"device", 1}, {"compute_speed_factor", speed}}}}};
  const std::string topology = write_temp_file(name + "-topology.json", t.dump());
  const std::string plan_file = write_temp_file(name + "-plan.json", plan.dump());
  const std::string out = fresh_dir(name);
  CommandResult r = run_stepcast("simulate --model " + source_path("models/tiny-gpt.json") + " --topology " + topology +
                                 " --plan " + plan_file + " --profile roofline --no-scaling --no-records --mode " +
                                 mode + " --out " + out);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  return load_json_file(out + "/prediction.json");
}

double step_of(const Json& plan, double speed, const std::string& mode) {
  return predict(plan, speed, mode).at("step_time_s").get<double>();
}

// The once-a-step zero fills of `plan`'s dp rank 1 (its persistent gradient buffers) on a device
// at full speed, under the roofline.
double step_fill_s(const Json& plan_json) {
  ModelConfig model = load_model(source_path("models/tiny-gpt.json"));
  Topology topology = load_topology(source_path("topologies/localhost-cpu.json"));
  Plan plan = parse_plan(plan_json, "plan.json");
  validate_plan(plan, model, topology);
  StepProgram program = lower_program(model, topology, plan);
  const Role& role = program.role_of_rank(1);
  ZeroFills z = zero_fills(role);
  std::vector<int32_t> persistent;
  for (const Op& op : role.ops) {
    if (z.filled[size_t(op.id)] && op.persistent) persistent.push_back(op.id);
  }
  ComputeCostModel cost(topology.node.device, Dtype::fp32, roofline_profile(topology), topology.file);
  return cost.fills_time_s(role, persistent);
}

}  // namespace

TEST_CASE("simulate: unequal replicas against closed forms in fast and full mode", "[simulate][replicas]") {
  const Json three_one = dp2_plan({{"microbatches_per_replica", {3, 1}}});
  for (const std::string mode : {"fast", "full"}) {
    INFO("mode " << mode);
    // Equal devices: the replica of 3 paces the step, as two replicas of 3 do.
    const double unequal = step_of(three_one, 1, mode);
    CHECK(unequal == Approx(step_of(dp2_plan({{"global_batch_size", 12}}), 1, mode)).epsilon(1e-9));
    // Device 1 at 0.5: 3 and 1 instead of 2 and 2 saves one microbatch of equal devices.
    const double one_microbatch =
        step_of(dp2_plan({{"global_batch_size", 8}}), 1, mode) - step_of(dp2_plan({{"global_batch_size", 4}}), 1, mode);
    REQUIRE(one_microbatch > 0);
    const double even = step_of(dp2_plan({{"global_batch_size", 8}}), 0.5, mode);
    const double balanced = step_of(three_one, 0.5, mode);
    const double fill = step_fill_s(dp2_plan({{"global_batch_size", 8}}));
    REQUIRE(fill > 0);
    CHECK(even - balanced == Approx(one_microbatch + fill).epsilon(1e-6));
  }
  // The prediction carries the plan's split, and tokens per step follow the global batch.
  Json prediction = predict(three_one, 0.5, "approx");
  CHECK(prediction.at("inputs").at("plan").at("microbatches_per_replica") == Json({3, 1}));
  // approx does not fold unequal copies (only the copies of a uniform topology alike): its step
  // is fast mode's.
  CHECK(prediction.at("step_time_s").get<double>() == Approx(step_of(three_one, 0.5, "fast")).epsilon(1e-9));
  Json uniform = predict(three_one, 1, "approx");
  CHECK(uniform.at("step_time_s").get<double>() == Approx(step_of(three_one, 1, "fast")).epsilon(1e-9));
}
