// The simulator costs a program's compute ops from the profile's tables as the program asks: the
// loss of a plan without cross_entropy_loss_fusion at the unfused cross entropy's tables, with it
// at the fused one's. One SimGrid engine per test case.
#include <catch2/catch.hpp>

#include "profile.hpp"
#include "sim_fixtures.hpp"
#include "simulator.hpp"

using namespace stepcast;
using namespace stepcast::test;

namespace {

// One loss backward of 64 KiB on one device, its profile holding the fused loss's table at
// 1 GB/s and the unfused one's at 4 GB/s: the op's time.
double loss_backward_s(bool fusion) {
  Topology t = parse_test_topology(star_topology_json(1, 1, 1e11, 0, 1, 1e11, 0));
  DeviceProfile profile = roofline_profile(t);
  profile.is_roofline = false;
  profile.name = "measured-loss";
  profile.gemm[Dtype::fp32] = GemmEfficiency{};
  MeasuredTables tables;
  tables.dtype = Dtype::fp32;
  for (double bytes : {16384.0, 1048576.0}) {
    tables.memory.push_back({"cross_entropy_backward", bytes, bytes / 1e9, ""});
    tables.memory.push_back({"cross_entropy_unfused_backward", bytes, bytes / 4e9, ""});
  }
  profile.measured = tables;
  StepProgram p = empty_program(1, 1, 1, 1);
  p.plan["cross_entropy_loss_fusion"] = fusion;
  Op loss;
  loss.kind = OpKind::loss;
  loss.name = OpName::cross_entropy;
  loss.phase = Phase::backward;
  loss.bytes = 65536;
  push_op(p.roles[0], loss);
  SimulationOutput out = simulate_program(p, t, profile, SimulateOptions{});
  REQUIRE(!out.records.empty());
  return out.records[0].end_s - out.records[0].start_s;
}

}  // namespace

TEST_CASE("sim: an unfused loss takes the unfused cross entropy's table", "[sim]") {
  CHECK(loss_backward_s(false) == Approx(65536 / 4e9).epsilon(1e-9));
}

TEST_CASE("sim: a fused loss takes the fused cross entropy's table", "[sim]") {
  CHECK(loss_backward_s(true) == Approx(65536 / 1e9).epsilon(1e-9));
}
