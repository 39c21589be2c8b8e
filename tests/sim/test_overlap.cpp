// Compute beside a collective (the profile's overlap figures): the compute stream runs on the SMs
// the collective leaves while it runs, in closed form. Each TEST_CASE runs one SimGrid engine.
#include <catch2/catch.hpp>

#include <vector>

#include "profile.hpp"
#include "sim_fixtures.hpp"
#include "simulator.hpp"

using namespace stepcast;
using namespace stepcast::test;

namespace {

// A dp ring all_reduce of 64 MB on the comm stream beside 10 ms of compute, on 4 devices (one a
// node, or all in one node), with a profile whose overlap figures leave the compute 90% of the
// SMs beside a collective across nodes and 80% beside one inside a node.
// Each call runs one SimGrid engine: one a test case.
void check_compute_beside_a_collective(SimMode mode, bool across_nodes, bool interference = true) {
  StepProgram p = empty_program(1, 4, 1, 1);
  push_op(p.roles[0], collective_op(OpKind::all_reduce, GroupKind::dp, Algorithm::ring, 64e6, Stream::comm));
  push_op(p.roles[0], compute_op(10e-3));
  Topology t = parse_test_topology(across_nodes ? star_topology_json(4, 1, 100e9, 2e-6, 1, 25e9, 3e-6)
                                                : star_topology_json(1, 4, 25e9, 3e-6, 1, 25e9, 3e-6));
  DeviceProfile profile = roofline_profile(t);
  profile.overlap = {100, 20, 10};
  SimulateOptions o;
  o.mode = mode;
  o.overlap_interference = interference;
  SimulationOutput out = simulate_program(p, t, profile, o);
  std::erase_if(out.records, [](const OpRecord& r) { return r.rank != 0; });
  REQUIRE(out.records.size() == 2);
  if (!interference) {  // turned off: the compute runs at full speed beside it
    CHECK_FALSE(out.overlap_interference);
    CHECK(out.step_time_s == Approx(10e-3).epsilon(1e-9));
    CHECK(out.breakdown.overlap_interference_s == 0);
    return;
  }
  REQUIRE(out.overlap_interference);
  const double ring = out.records[0].end_s - out.records[0].start_s;
  REQUIRE(ring < 10e-3);
  // The compute does 1 - share of its work a second while the ring runs, then the rest: it ends
  // at 10 ms + share · ring. The collective's own time does not change.
  const double share = across_nodes ? 0.1 : 0.2;
  if (across_nodes) CHECK(ring == Approx(2.0 * 3 / 4 * 64e6 / 25e9 + 2.0 * 3 * (2 * 3e-6)).epsilon(1e-9));
  CHECK(out.records[1].end_s - out.records[1].start_s == Approx(10e-3 + share * ring).epsilon(1e-9));
  CHECK(out.step_time_s == Approx(10e-3 + share * ring).epsilon(1e-9));
  CHECK(out.breakdown.overlap_interference_s == Approx(share * ring).epsilon(1e-9));
  CHECK(out.breakdown.compute_s == Approx(10e-3).epsilon(1e-9));
  CHECK(out.breakdown.total() == Approx(out.step_time_s).epsilon(1e-12));
}

}  // namespace

TEST_CASE("sim: compute beside a collective across nodes runs on the SMs it leaves (fast)", "[sim][overlap]") {
  check_compute_beside_a_collective(SimMode::fast, true);
}

TEST_CASE("sim: compute beside a collective across nodes runs on the SMs it leaves (full)", "[sim][overlap]") {
  check_compute_beside_a_collective(SimMode::full, true);
}

TEST_CASE("sim: compute beside a collective inside a node runs on the SMs it leaves (full)", "[sim][overlap]") {
  check_compute_beside_a_collective(SimMode::full, false);
}

TEST_CASE("sim: with overlap interference off, compute beside a collective runs at full speed", "[sim][overlap]") {
  check_compute_beside_a_collective(SimMode::fast, true, false);
}
