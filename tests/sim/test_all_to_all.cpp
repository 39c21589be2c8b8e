// all_to_all in the simulator: the pairwise exchange, and its rail staging across NVLink nodes
// (NCCL's PXN), against closed forms. Each TEST_CASE runs at most one SimGrid engine (ctest runs
// each case in its own process).
#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include "collective.hpp"
#include "collective_steps.hpp"
#include "profile.hpp"
#include "sim_fixtures.hpp"
#include "simulator.hpp"

using namespace stepcast;
using namespace stepcast::test;

namespace {

SimulationOutput run_full(const StepProgram& p, const Topology& t) {
  SimulateOptions o;
  o.mode = SimMode::full;
  return simulate_program(p, t, roofline_profile(t), o);
}

}  // namespace

TEST_CASE("sim: an all_to_all's chunks leave at once, the node's NIC pacing the ones across nodes", "[sim]") {
  // dp 8 on 2 nodes of 4 devices, one NIC each: a member sends 3/8 of S over NVLink (and, rail-
  // staged, the 3/8 for the other node's other positions) and 4/8 of S over its quarter of the
  // NIC, concurrently (pairwise, as NCCL's grouped sends); latencies 0.
  StepProgram p = empty_program(1, 8, 1, 4);
  const double S = 800e6;
  push_op(p.roles[0], collective_op(OpKind::all_to_all, GroupKind::dp, Algorithm::pairwise, S, Stream::comm));
  Topology t = parse_test_topology(star_topology_json(2, 4, 100e9, 0, 1, 10e9, 0));
  const double expected = std::max(6.0 / 8 * S / 100e9, 4.0 / 8 * S / (10e9 / 4));
  GroupShape shape{8, 2, 4};
  CHECK(collective_time_s(OpKind::all_to_all, Algorithm::pairwise, S, shape, link_figures(t)) ==
        Approx(expected).epsilon(1e-12));
  SimulateOptions full;
  full.mode = SimMode::full;
  CHECK(simulate_program(p, t, roofline_profile(t), full).step_time_s == Approx(expected).epsilon(1e-6));
}

TEST_CASE("sim: an all_to_all across NVLink nodes stages other rails' chunks over NVLink (PXN)", "[sim]") {
  // dp 4 on 2 nodes of 2 devices, a NIC each; NVLink slower than a NIC so that the staging
  // shows. Direct, member 0 would send 1 chunk over NVLink (to 1) and 2 over its NIC (to 2 and 3):
  // max(S/4 / B_intra, 2·S/4 / B_nic) = 2 ms. Rail-staged, it sends member 1 its chunk and the one
  // for member 3 (2 chunks over NVLink: 4 ms) and member 2 what node 0 has for it (2 chunks).
  StepProgram p = empty_program(1, 4, 1, 2);
  const double S = 8e6, b_intra = 1e9, b_nic = 10e9;
  push_op(p.roles[0], collective_op(OpKind::all_to_all, GroupKind::dp, Algorithm::pairwise, S, Stream::comm));
  Topology t = parse_test_topology(star_topology_json(2, 2, b_intra, 0, 2, b_nic, 0));
  const double expected = std::max(2 * S / 4 / b_intra, 2 * S / 4 / b_nic);
  CHECK(collective_time_s(OpKind::all_to_all, Algorithm::pairwise, S, GroupShape{4, 2, 2}, link_figures(t)) ==
        Approx(expected).epsilon(1e-12));
  CHECK(run_full(p, t).step_time_s == Approx(expected).epsilon(1e-6));
}

TEST_CASE("sim: an all_to_all across shared-memory nodes sends every chunk directly", "[sim]") {
  // As above on nodes without NVLink (MPI between CPU nodes): no staging, max(S/4 / B_intra,
  // 2·S/4 / B_nic) = 2 ms.
  StepProgram p = empty_program(1, 4, 1, 2);
  const double S = 8e6, b_intra = 1e9, b_nic = 10e9;
  push_op(p.roles[0], collective_op(OpKind::all_to_all, GroupKind::dp, Algorithm::pairwise, S, Stream::comm));
  Json j = star_topology_json(2, 2, b_intra, 0, 2, b_nic, 0);
  j["node"]["intra_node"]["kind"] = "shared_memory";
  Topology t = parse_test_topology(j);
  const double expected = std::max(S / 4 / b_intra, 2 * S / 4 / b_nic);
  CHECK(collective_time_s(OpKind::all_to_all, Algorithm::pairwise, S, GroupShape{4, 2, 2}, link_figures(t)) ==
        Approx(expected).epsilon(1e-12));
  CHECK(run_full(p, t).step_time_s == Approx(expected).epsilon(1e-6));
}

TEST_CASE("collective steps: a rail-staged all_to_all forwards each node's chunks for a rail in one flow",
          "[sim_steps]") {
  // 8 members on 2 nodes; member 1 is node 0's position 1. Chunk S/8 = 100, scaled by the
  // destination's factor (an ep dispatch: bytes to an ep rank follow its load).
  GroupLayout layout{{0, 0, 0, 0, 1, 1, 1, 1}, true};
  std::vector<double> load{1, 1, 1, 1, 2, 3, 1, 1};
  auto steps = collective_steps(OpKind::all_to_all, Algorithm::pairwise, 800, layout, 1, true, {&load, true});
  REQUIRE(steps.size() == 1);
  const CollectiveStep& s = steps[0];
  REQUIRE(s.sends.size() == 4);  // 3 node-mates over NVLink, position 1 of node 1 over the NIC
  REQUIRE(s.recvs.size() == 4);
  // To member 0: its own chunk and the one for member 4 (node 1, position 0, load 2).
  CHECK(s.sends[0].peer == 0);
  CHECK(s.sends[0].bytes == Approx(100 * (1 + 2)));
  CHECK(s.sends[1].peer == 2);
  CHECK(s.sends[1].bytes == Approx(100 * (1 + 1)));
  // To member 5: what node 0's four members have for it (load 3).
  CHECK(s.sends[3].peer == 5);
  CHECK(s.sends[3].bytes == Approx(4 * 100 * 3));
  // From member 0: member 0's chunks for position 1 on both nodes (members 1 and 5).
  CHECK(s.recvs[0].peer == 0);
  CHECK(s.recvs[0].bytes == Approx(100 * (1 + 3)));
  CHECK(s.recvs[3].peer == 5);
  CHECK(s.recvs[3].bytes == Approx(4 * 100 * 1));
  // Every chunk is sent once over a NIC, and the ones for other rails once more over NVLink:
  // summed over members, the sends carry each chunk of another node twice less its own rail's.
  double sent = 0, direct = 0;
  for (int64_t m = 0; m < 8; ++m) {
    auto member_steps = collective_steps(OpKind::all_to_all, Algorithm::pairwise, 800, layout, m, true, {&load, true});
    for (const Transfer& t : member_steps[0].sends) sent += t.bytes;
    for (int64_t d = 0; d < 8; ++d) {
      if (d != m) direct += 100 * load[size_t(d)];
    }
  }
  double forwarded = 0;  // chunks to another node, not on the sender's rail
  for (int64_t m = 0; m < 8; ++m) {
    for (int64_t d = 0; d < 8; ++d) {
      if (m / 4 != d / 4 && m % 4 != d % 4) forwarded += 100 * load[size_t(d)];
    }
  }
  CHECK(sent == Approx(direct + forwarded));
}
