// Measured collective tables correct the α-β model (plans/collective_cost.hpp): a collective of a
// measured group's shape takes its measured time, folded (analytic) or as flows; another shape
// takes the model corrected at the same size; without tables nothing changes. Each simulating
// TEST_CASE runs one SimGrid engine.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "collective_cost.hpp"
#include "components.hpp"
#include "lower.hpp"
#include "operand_reuse.hpp"
#include "profile.hpp"
#include "sim_fixtures.hpp"
#include "simulator.hpp"
#include "test_support.hpp"

using namespace stepcast;
using namespace stepcast::test;

namespace {

// A GPU-like profile (concurrent streams) on the test device, with nccl all_reduce tables.
DeviceProfile profile_with_tables(const Topology& t, std::vector<CollectivePoint> points) {
  DeviceProfile p = roofline_profile(t);
  p.is_roofline = false;
  p.name = "measured-collectives";
  p.gemm[Dtype::fp32] = GemmEfficiency{};
  MeasuredTables tables;
  tables.dtype = Dtype::fp32;
  tables.collectives = std::move(points);
  p.measured = tables;
  return p;
}

CollectivePoint nccl_point(int64_t group, int64_t nodes, double bytes, double time_s) {
  return {"all_reduce", "nccl", group, bytes, time_s, bytes / time_s, 0, "", nodes};
}

// The system of star_topology_json(2, 8, 300e9, 2e-6, 8, 25e9, 3e-6): 8 devices on NVLink-like
// links, 8 NICs a node, as a profile's measured.system.
MeasuredSystem eight_nic_system() {
  MeasuredSystem system;
  system.devices_per_node = 8;
  system.intra_node_bandwidth_bytes_per_s = 300e9;
  system.intra_node_latency_s = 2e-6;
  system.nics_per_node = 8;
  system.nic_bandwidth_bytes_per_s = 25e9;
  system.nic_latency_s = 3e-6;
  return system;
}

// Log-log interpolation between two points, as CollectiveTable does.
double log_log(double b0, double t0, double b1, double t1, double b) {
  double x = std::log(b / b0) / std::log(b1 / b0);
  return std::exp(std::log(t0) + x * std::log(t1 / t0));
}

}  // namespace

TEST_CASE("collective cost: the measured group's own shape takes its measured time", "[collective]") {
  Topology t = parse_test_topology(star_topology_json(2, 8, 100e9, 2e-6, 8, 25e9, 3e-6));
  LinkFigures links = link_figures(t);
  DeviceProfile p = profile_with_tables(
      t, {nccl_point(8, 1, 1e6, 80e-6), nccl_point(8, 1, 1e8, 3e-3), nccl_point(16, 2, 1e6, 300e-6),
          nccl_point(16, 2, 1e8, 9e-3)});
  CollectiveCostModel model(p, t);
  REQUIRE(model.has_tables());
  GroupShape node{8, 1, 8};
  for (double bytes : {1e6, 1e7, 1e8}) {
    Algorithm a = choose_algorithm(OpKind::all_reduce, bytes, node, links);
    CHECK(model.time_s(OpKind::all_reduce, a, bytes, node) ==
          Approx(log_log(1e6, 80e-6, 1e8, 3e-3, bytes)).epsilon(1e-9));
    CHECK(model.correction(OpKind::all_reduce, a, bytes, node) ==
          Approx(log_log(1e6, 80e-6, 1e8, 3e-3, bytes) / collective_time_s(OpKind::all_reduce, a, bytes, node, links)));
  }
  // Two nodes: the 2-node table, not the in-node one.
  GroupShape two{16, 2, 8};
  CHECK(model.time_s(OpKind::all_reduce, Algorithm::ring, 1e7, two) ==
        Approx(log_log(1e6, 300e-6, 1e8, 9e-3, 1e7)).epsilon(1e-9));
  CHECK(model.table_for(OpKind::all_reduce, two)->shape.nodes == 2);
  // Four nodes: the 2-node table's ratio to NCCL's model, on the 4-node model.
  GroupShape four{32, 4, 8};
  double r2 = log_log(1e6, 300e-6, 1e8, 9e-3, 1e7) / nccl_time_s(OpKind::all_reduce, 1e7, two, links);
  CHECK(model.time_s(OpKind::all_reduce, Algorithm::hierarchical, 1e7, four) ==
        Approx(r2 * nccl_time_s(OpKind::all_reduce, 1e7, four, links)));
  // Outside the measured sizes the ratio of the nearest measured size.
  double r_max = 3e-3 / nccl_ring_time_s(OpKind::all_reduce, 1e8, node, links);
  CHECK(model.time_s(OpKind::all_reduce, Algorithm::ring, 1e10, node) ==
        Approx(r_max * nccl_ring_time_s(OpKind::all_reduce, 1e10, node, links)));
  // reduce_scatter borrows the all_reduce ratio; a group of one takes no time.
  double r7 = log_log(1e6, 80e-6, 1e8, 3e-3, 1e7) / nccl_ring_time_s(OpKind::all_reduce, 1e7, node, links);
  CHECK(model.time_s(OpKind::reduce_scatter, Algorithm::ring, 1e7, node) ==
        Approx(r7 * nccl_ring_time_s(OpKind::reduce_scatter, 1e7, node, links)));
  CHECK(model.correction(OpKind::all_reduce, Algorithm::ring, 1e7, GroupShape{1, 1, 1}) == 1);
  // Without tables the α-β model; the CPU backend's ring/tree tables are not nccl tables.
  CollectiveCostModel none(roofline_profile(t), t);
  CHECK_FALSE(none.has_tables());
  CHECK(none.correction(OpKind::all_reduce, Algorithm::ring, 1e7, node) == 1);
}

TEST_CASE("collective cost: a table measured on another system transfers by NCCL's model", "[collective]") {
  // Measured on nodes with 8 NICs; predicted on nodes with 4: twice the network time where the
  // network bounds the ring.
  Topology four_nics = parse_test_topology(star_topology_json(2, 8, 300e9, 2e-6, 4, 25e9, 3e-6));
  Topology eight_nics = parse_test_topology(star_topology_json(2, 8, 300e9, 2e-6, 8, 25e9, 3e-6));
  DeviceProfile p = profile_with_tables(four_nics, {nccl_point(16, 2, 1e8, 6e-3), nccl_point(16, 2, 1e9, 50e-3)});
  p.measured->system = eight_nic_system();
  CollectiveCostModel model(p, four_nics);
  GroupShape two{16, 2, 8};
  double r = 50e-3 / nccl_time_s(OpKind::all_reduce, 1e9, two, link_figures(eight_nics));
  double predicted = model.time_s(OpKind::all_reduce, Algorithm::hierarchical, 1e9, two);
  CHECK(predicted == Approx(r * nccl_time_s(OpKind::all_reduce, 1e9, two, link_figures(four_nics))));
  CHECK(predicted / 50e-3 == Approx(2.0).epsilon(0.01));  // the NICs bound both
  // On the measured system itself, the measured time.
  CollectiveCostModel same(p, eight_nics);
  CHECK(same.time_s(OpKind::all_reduce, Algorithm::hierarchical, 1e9, two) == Approx(50e-3));
  // measured_system_time_s: on the system measured, whatever the topology: the table inside its
  // sizes, below them the smallest size's ratio times NCCL's model.
  CHECK(*model.measured_system_time_s(OpKind::all_reduce, 1e9, two) == Approx(50e-3));
  double r8 = 6e-3 / nccl_time_s(OpKind::all_reduce, 1e8, two, link_figures(eight_nics));
  CHECK(*model.measured_system_time_s(OpKind::all_reduce, 1e7, two) ==
        Approx(r8 * nccl_time_s(OpKind::all_reduce, 1e7, two, link_figures(eight_nics))));
  CHECK_FALSE(model.measured_system_time_s(OpKind::all_reduce, 1e7, GroupShape{1, 1, 1}));
}

TEST_CASE("collective cost: NCCL's tree takes an all_reduce across many nodes where its latency wins",
          "[collective]") {
  // 8 devices a node on NVLink (300 GB/s, 2 µs), 8 NICs of 25 GB/s at 3 µs.
  Topology t = parse_test_topology(star_topology_json(2, 8, 300e9, 2e-6, 8, 25e9, 3e-6));
  LinkFigures links = link_figures(t);
  // NCCL's tuner: 6.8 µs + 2·((k − 1)·intra + ⌊log2 N⌋·5 µs), a step over NVLink 0.6 µs × 1.8 across
  // nodes, and the bus volume 2S at 0.92 of the ring's bandwidth, the NICs (8 × 25 GB/s for the
  // node's 8 members) bounding it.
  const double intra = 0.6e-6 * 1.8;
  GroupShape world{12288, 1536, 8};
  const double bytes = 4;
  const double tree =
      2 * bytes / (8 * links.inter_bandwidth_bytes_per_s) / 0.92 + 6.8e-6 + 2 * (7 * intra + 10 * 5e-6);
  CHECK(nccl_tree_time_s(bytes, world, links) == Approx(tree).epsilon(1e-12));
  // The ring's latency: 6.6 µs and 2(n − 1) steps, 2(N − 1) of them across nodes at 2.7 µs — 31 ms.
  const double ring = nccl_ring_time_s(OpKind::all_reduce, bytes, world, links);
  CHECK(ring - 2 * bytes * 12287 / 12288 / std::min(links.intra_bandwidth_bytes_per_s,
                                                     8 * links.inter_bandwidth_bytes_per_s) ==
        Approx(6.6e-6 + (2 * 12287 - 2 * 1535) * intra + 2 * 1535 * 2.7e-6));
  CHECK(nccl_time_s(OpKind::all_reduce, bytes, world, links) == Approx(tree));
  CHECK(tree < ring / 100);
  // The tuner's correction of the tree at mid sizes (treeCorrectionFactor, Simple): 0.8 at 64 MiB,
  // 0.5 at 1 MiB, none from 512 MiB.
  const double tree_latency = 6.8e-6 + 2 * (7 * intra + 10 * 5e-6);
  for (auto [size, factor] : {std::pair{67108864.0, 0.8}, {1048576.0, 0.5}, {1073741824.0, 1.0}}) {
    CHECK(nccl_tree_time_s(size, world, links) ==
          Approx(2 * size / (8 * links.inter_bandwidth_bytes_per_s) / (0.92 * factor) + tree_latency));
  }
  // ⌊log2 3⌋ = 1, as NCCL's log2i.
  CHECK(nccl_tree_time_s(bytes, GroupShape{24, 3, 8}, links) ==
        Approx(2 * bytes / (8 * links.inter_bandwidth_bytes_per_s) / 0.92 + 6.8e-6 + 2 * (7 * intra + 5e-6)));
  // Inside a node the ring: 6.6 µs and 0.6 µs a step.
  CHECK(nccl_ring_time_s(OpKind::all_reduce, bytes, GroupShape{8, 1, 8}, links) ==
        Approx(6.6e-6 + 14 * 0.6e-6 + 2 * bytes * 7 / 8 / links.intra_bandwidth_bytes_per_s));
  // A large message on two nodes: the ring's bandwidth wins; reduce_scatter and all_gather, and a
  // group inside a node, are rings.
  GroupShape two{16, 2, 8};
  CHECK(nccl_time_s(OpKind::all_reduce, 1e9, two, links) == nccl_ring_time_s(OpKind::all_reduce, 1e9, two, links));
  CHECK(nccl_time_s(OpKind::reduce_scatter, bytes, world, links) ==
        nccl_ring_time_s(OpKind::reduce_scatter, bytes, world, links));
  CHECK(nccl_time_s(OpKind::all_reduce, bytes, GroupShape{8, 1, 8}, links) ==
        nccl_ring_time_s(OpKind::all_reduce, bytes, GroupShape{8, 1, 8}, links));
  // Through a 2-node table (at sizes where the ring wins there), the world's 4-byte all_reduce
  // is the table's correction times the tree, not the ring: under a millisecond.
  DeviceProfile p = profile_with_tables(t, {nccl_point(16, 2, 1e8, 6e-3), nccl_point(16, 2, 1e9, 50e-3)});
  CollectiveCostModel model(p, t);
  REQUIRE(nccl_time_s(OpKind::all_reduce, 1e8, two, links) == nccl_ring_time_s(OpKind::all_reduce, 1e8, two, links));
  const double r = 6e-3 / nccl_ring_time_s(OpKind::all_reduce, 1e8, two, links);
  CHECK(model.time_s(OpKind::all_reduce, Algorithm::tree, bytes, world) == Approx(r * tree));
  CHECK(model.time_s(OpKind::all_reduce, Algorithm::tree, bytes, world) < 1e-3);
}

TEST_CASE("collective cost: a message below a table's sizes takes a table that measured it", "[collective]") {
  // 4 nodes measured from 128 B, 8 nodes from 1 MiB (as the H100 profile's NCCL309 tables): 128 B
  // over 16 nodes is 13 doublings below the 8-node table and 2 doublings of nodes from the 4-node
  // one; 1 GiB over 16 nodes, inside both, takes the nearer span; above a table's sizes counts
  // nothing (NCCL stays on its largest messages' protocol).
  Topology t = parse_test_topology(star_topology_json(2, 8, 300e9, 2e-6, 8, 25e9, 3e-6));
  DeviceProfile p = profile_with_tables(t, {nccl_point(32, 4, 128, 35e-6), nccl_point(32, 4, 1e9, 40e-3),
                                            nccl_point(64, 8, 1048576, 120e-6), nccl_point(64, 8, 2e9, 90e-3)});
  CollectiveCostModel model(p, t);
  GroupShape sixteen{128, 16, 8};
  CHECK(model.table_for(OpKind::all_reduce, sixteen, 128)->shape.nodes == 4);
  CHECK(model.table_for(OpKind::all_reduce, sixteen, 1e9)->shape.nodes == 8);
  CHECK(model.table_for(OpKind::all_reduce, sixteen, 1e10)->shape.nodes == 8);
  CHECK(model.table_for(OpKind::all_reduce, sixteen)->shape.nodes == 8);  // any size: the span
  const LinkFigures links = link_figures(t);
  const double r = 35e-6 / nccl_time_s(OpKind::all_reduce, 128, GroupShape{32, 4, 8}, links);
  CHECK(model.time_s(OpKind::all_reduce, Algorithm::tree, 128, sixteen) ==
        Approx(r * nccl_time_s(OpKind::all_reduce, 128, sixteen, links)));
}

TEST_CASE("collective cost: across nodes a table is read at the same bytes per unit of NIC bandwidth",
          "[collective]") {
  // A 2-node table of 8 members a node, measured on nodes of 8 NICs. A data-parallel group of one
  // member a node (tensor parallel 8) sends through one NIC what the table's group spreads over
  // eight: 1e8 bytes read at 8e8. On nodes of 4 NICs a group of 8 members a node: at 2e8. Inside a
  // node, and with the table's own shape, at the size itself.
  Topology eight_nics = parse_test_topology(star_topology_json(2, 8, 300e9, 2e-6, 8, 25e9, 3e-6));
  Topology four_nics = parse_test_topology(star_topology_json(2, 8, 300e9, 2e-6, 4, 25e9, 3e-6));
  std::vector<CollectivePoint> points = {nccl_point(16, 2, 1e7, 2e-3), nccl_point(16, 2, 1e9, 50e-3)};
  DeviceProfile p = profile_with_tables(eight_nics, points);
  const LinkFigures links = link_figures(eight_nics);
  const GroupShape table{16, 2, 8}, rail{2, 2, 1};
  auto r_at = [&](double bytes) {
    return log_log(1e7, 2e-3, 1e9, 50e-3, bytes) / nccl_time_s(OpKind::all_reduce, bytes, table, links);
  };
  CollectiveCostModel model(p, eight_nics);
  CHECK(model.time_s(OpKind::all_reduce, Algorithm::ring, 1e8, rail) ==
        Approx(r_at(8e8) * nccl_time_s(OpKind::all_reduce, 1e8, rail, links)));
  CHECK(model.time_s(OpKind::all_reduce, Algorithm::ring, 1e8, table) == Approx(log_log(1e7, 2e-3, 1e9, 50e-3, 1e8)));
  // Read at 8e9: past the table's sizes, its largest size's ratio.
  CHECK(model.time_s(OpKind::all_reduce, Algorithm::ring, 1e9, rail) ==
        Approx(r_at(1e9) * nccl_time_s(OpKind::all_reduce, 1e9, rail, links)));
  p.measured->system = eight_nic_system();
  CollectiveCostModel fewer_nics(p, four_nics);
  CHECK(fewer_nics.time_s(OpKind::all_reduce, Algorithm::ring, 1e8, table) ==
        Approx(r_at(2e8) * nccl_time_s(OpKind::all_reduce, 1e8, table, link_figures(four_nics))));
  // Inside a node (an in-node table): the size itself.
  DeviceProfile node_table = profile_with_tables(eight_nics, {nccl_point(8, 1, 1e7, 1e-3), nccl_point(8, 1, 1e9, 8e-3)});
  CollectiveCostModel in_node(node_table, eight_nics);
  CHECK(in_node.time_s(OpKind::all_reduce, Algorithm::ring, 1e8, GroupShape{2, 1, 2}) ==
        Approx(log_log(1e7, 1e-3, 1e9, 8e-3, 1e8) / nccl_time_s(OpKind::all_reduce, 1e8, GroupShape{8, 1, 8}, links) *
               nccl_time_s(OpKind::all_reduce, 1e8, GroupShape{2, 1, 2}, links)));
}

TEST_CASE("collective cost: a send takes its measured point-to-point table's time", "[collective]") {
  // nccl-tests sendrecv across 2 nodes of 8 NICs: the table over the α-β time on the measured
  // system, times the α-β time on the predicted one; inside a node, without a table, the α-β time.
  Topology eight_nics = parse_test_topology(star_topology_json(2, 8, 300e9, 2e-6, 8, 25e9, 3e-6));
  Topology four_nics = parse_test_topology(star_topology_json(2, 8, 300e9, 2e-6, 4, 25e9, 3e-6));
  DeviceProfile p = profile_with_tables(eight_nics, {});
  p.measured->p2p_inter_node = {{1e6, 200e-6, ""}, {1e8, 9e-3, ""}};
  const LinkFigures l8 = link_figures(eight_nics), l4 = link_figures(four_nics);
  auto alpha_beta = [](const LinkFigures& l, double bytes) {
    return l.inter_latency_s + bytes / l.inter_bandwidth_bytes_per_s;
  };
  CollectiveCostModel model(p, eight_nics);
  REQUIRE(model.has_p2p_tables());
  CHECK(model.p2p_time_s(1e6, true) == Approx(200e-6));
  CHECK(model.p2p_time_s(1e7, true) == Approx(log_log(1e6, 200e-6, 1e8, 9e-3, 1e7)));
  CHECK(model.p2p_time_s(1e9, true) == Approx(9e-3 / alpha_beta(l8, 1e8) * alpha_beta(l8, 1e9)));  // past the table
  CHECK(model.p2p_time_s(1e7, false) == Approx(l8.intra_latency_s + 1e7 / l8.intra_bandwidth_bytes_per_s));
  // The flow's bytes scaled so that latency + scaled bytes / bandwidth is the table's time.
  const double k = model.p2p_flow_scale(1e7, true);
  CHECK(l8.inter_latency_s + k * 1e7 / l8.inter_bandwidth_bytes_per_s == Approx(model.p2p_time_s(1e7, true)));
  CHECK(model.p2p_flow_scale(1e7, false) == 1);
  // Measured on 8 NICs (measured.system), predicted on 4: half a NIC a device, twice the α-β bandwidth term.
  p.measured->system = eight_nic_system();
  CollectiveCostModel fewer(p, four_nics);
  CHECK(fewer.p2p_time_s(1e8, true) == Approx(9e-3 / alpha_beta(l8, 1e8) * alpha_beta(l4, 1e8)));
  CHECK(*fewer.measured_system_p2p_time_s(1e8, true) == Approx(9e-3));
  CHECK_FALSE(fewer.measured_system_p2p_time_s(1e8, false));
  // A profile that runs in order (a CPU's) has its send tables in its link fits: not applied again.
  DeviceProfile in_order = p;
  in_order.execution_in_order = true;
  CollectiveCostModel cpu(in_order, eight_nics);
  CHECK_FALSE(cpu.has_p2p_tables());
  CHECK(cpu.p2p_time_s(1e7, true) == Approx(alpha_beta(l8, 1e7)));
}

TEST_CASE("components: a send table's points are checked as the cost model reads them", "[collective]") {
  Topology t = parse_test_topology(star_topology_json(2, 8, 300e9, 2e-6, 8, 25e9, 3e-6));
  DeviceProfile p = profile_with_tables(t, {});
  const LinkFigures l = link_figures(t);
  // 1.2 times the α-β time at every size: inside, log-log across the point's gap; the ends, exactly.
  for (double bytes = 1e5; bytes < 2e9; bytes *= 2) {
    const double alpha_beta = l.inter_latency_s + bytes / l.inter_bandwidth_bytes_per_s;
    p.measured->p2p_inter_node.push_back({bytes, 1.2 * alpha_beta, ""});
  }
  std::vector<ComponentCheck> checks = check_components(p, t);
  size_t sends = 0;
  for (const ComponentCheck& c : checks) {
    if (c.family != "p2p") continue;
    ++sends;
    INFO(c.what);
    CHECK(c.what.rfind("send across nodes ", 0) == 0);
    CHECK(std::abs(c.relative_error()) < 0.07);
    if (c.what == "send across nodes 100000 B") CHECK(std::abs(c.relative_error()) < 1e-9);
  }
  CHECK(sends == p.measured->p2p_inter_node.size());
}

TEST_CASE("components: an nccl table's end points are checked as the cost model extrapolates them",
          "[collective]") {
  // A table 1.3 times NCCL's ring model at every size: leaving out an end point, the rest predict
  // it through the model (a flat extrapolation below the smallest size would be far off).
  Topology t = parse_test_topology(star_topology_json(2, 8, 300e9, 2e-6, 8, 25e9, 3e-6));
  GroupShape node{8, 1, 8};
  std::vector<CollectivePoint> points;
  for (double bytes = 1e5; bytes < 2e9; bytes *= 2) {
    points.push_back(nccl_point(8, 1, bytes, 1.3 * nccl_ring_time_s(OpKind::all_reduce, bytes, node, link_figures(t))));
  }
  std::vector<ComponentCheck> checks = check_components(profile_with_tables(t, points), t);
  REQUIRE(checks.size() == points.size());
  for (const ComponentCheck& c : checks) {
    INFO(c.what);
    CHECK(c.family == "collective");
    CHECK(std::abs(c.relative_error()) < 0.07);  // inside: log-log across the gap (4x) the point leaves
  }
  CHECK(std::abs(checks.front().relative_error()) < 1e-9);  // the ends: the model, exactly
  CHECK(std::abs(checks.back().relative_error()) < 1e-9);
}

TEST_CASE("sim: a measured table sets a folded tensor-parallel all_reduce's time (fast)", "[sim]") {
  const int n = 8;
  Topology t = parse_test_topology(star_topology_json(1, n, 100e9, 2e-6, n, 25e9, 1e-6));
  DeviceProfile p = profile_with_tables(t, {nccl_point(n, 1, 1e6, 80e-6), nccl_point(n, 1, 1e8, 3e-3)});
  StepProgram program = empty_program(n, 1, 1, n);
  push_op(program.roles[0], collective_op(OpKind::all_reduce, GroupKind::tp, Algorithm::ring, 1e7, Stream::compute));
  SimulateOptions o;
  o.mode = SimMode::fast;
  SimulationOutput out = simulate_program(program, t, p, o);
  CHECK(out.simulated_ranks.size() == 1);
  CHECK(out.step_time_s == Approx(log_log(1e6, 80e-6, 1e8, 3e-3, 1e7)).epsilon(1e-9));
  CHECK(out.corrected_collectives == 1);
}

namespace {

// One ring all_reduce of `bytes` over dp 4 (one member per node of `t`), simulated in full
// mode with a profile whose measured table takes `measured` seconds at `bytes` (and half at half).
SimulationOutput dp_all_reduce_measured(const Topology& t, double bytes, double measured) {
  DeviceProfile p = profile_with_tables(t, {nccl_point(4, 4, bytes / 2, measured / 2), nccl_point(4, 4, bytes, measured)});
  StepProgram program = empty_program(1, 4, 1, 1);
  push_op(program.roles[0], collective_op(OpKind::all_reduce, GroupKind::dp, Algorithm::ring, bytes, Stream::comm));
  SimulateOptions o;
  o.mode = SimMode::full;
  return simulate_program(program, t, p, o);
}

}  // namespace

TEST_CASE("sim: a measured table slower than the links delays a dp all_reduce's flows (full)", "[sim]") {
  // dp 4 across 4 nodes, one member each: the flows take the α-β time, the rest follows.
  Topology t = parse_test_topology(star_topology_json(4, 1, 100e9, 2e-6, 1, 25e9, 3e-6));
  const double bytes = 64e6;
  double alpha_beta = 2.0 * 3 / 4 * bytes / 25e9 + 2.0 * 3 * (2 * 3e-6);
  double measured = 1.5 * alpha_beta;
  SimulationOutput out = dp_all_reduce_measured(t, bytes, measured);
  CHECK(out.step_time_s == Approx(measured).epsilon(1e-6));
}

TEST_CASE("sim: a measured table faster than the links shrinks a dp all_reduce's flows (full)", "[sim]") {
  // No latency, so the flows' time is all bandwidth and scales exactly with their bytes.
  Topology t = parse_test_topology(star_topology_json(4, 1, 100e9, 0, 1, 25e9, 0));
  const double bytes = 64e6;
  double alpha_beta = 2.0 * 3 / 4 * bytes / 25e9;
  double measured = 0.8 * alpha_beta;  // e.g. in-network reduction
  SimulationOutput out = dp_all_reduce_measured(t, bytes, measured);
  CHECK(out.step_time_s == Approx(measured).epsilon(1e-6));
  CHECK(out.correction_min == Approx(0.8).epsilon(1e-6));
}

TEST_CASE("sim: a send across nodes takes its measured point-to-point table's time (full)", "[sim]") {
  // pp 2 on 2 nodes of one device: stage 0 sends 64 MB to stage 1. The profile's sendrecv table
  // measured it at 1.7 times the α-β time.
  Topology t = parse_test_topology(star_topology_json(2, 1, 100e9, 2e-6, 1, 25e9, 3e-6));
  const double bytes = 64e6;
  StepProgram program = empty_program(1, 1, 2, 1);
  Op send;
  send.kind = OpKind::send;
  send.stream = Stream::p2p;
  send.peer = Peer::pp_next;
  send.tag = 7;
  send.bytes = bytes;
  push_op(program.roles[0], send);
  Op recv = send;
  recv.kind = OpKind::recv;
  recv.peer = Peer::pp_prev;
  push_op(program.roles[1], recv);
  SimulateOptions o;
  o.mode = SimMode::full;
  const LinkFigures l = link_figures(t);
  auto alpha_beta = [&](double b) { return l.inter_latency_s + b / l.inter_bandwidth_bytes_per_s; };
  DeviceProfile measured = profile_with_tables(t, {});
  measured.measured->p2p_inter_node = {{bytes / 4, 1.7 * alpha_beta(bytes / 4), ""},
                                       {bytes, 1.7 * alpha_beta(bytes), ""}};
  // (Without the table the flow takes the α-β time: the collective cases above.)
  CHECK(simulate_program(program, t, measured, o).step_time_s == Approx(1.7 * alpha_beta(bytes)).epsilon(1e-6));
}

TEST_CASE("sim: in order a collective takes its table's time at its operands' reuse, plus the executor's copy",
          "[sim]") {
  // tiny, dp 2 ZeRO-3 on two CPU cores; the profile measured all_gather and reduce_scatter back
  // to back and, twice as slow, with operands 64 MiB away; copies at 1 GB/s.
  Topology t = load_topology(source_path("topologies/localhost-cpu.json"));
  ModelConfig model = load_model(source_path("models/tiny.json"));
  Plan plan = parse_plan({{"dp_size", 2}, {"zero_stage", 3}, {"micro_batch_size", 1}, {"global_batch_size", 4},
                          {"dtype", "fp32"}}, "zero3.json");
  validate_plan(plan, model, t);
  StepProgram program = lower_program(model, t, plan);
  MeasuredTables tables;
  for (const char* kind : {"all_gather", "reduce_scatter", "all_reduce"}) {
    for (double bytes : {1e3, 1e7}) {
      tables.collectives.push_back({kind, "ring", 2, bytes, bytes * 1e-9 + 1e-6, 0, 0, "", 1});
      tables.collective_reuse.push_back({kind, "ring", 2, bytes, 2 * (bytes * 1e-9 + 1e-6), 0, 0, "", 1, 64e6});
    }
  }
  tables.memory.push_back({"copy", 1e3, 1e-6, ""});
  tables.memory.push_back({"copy", 1e8, 1e-1, ""});
  DeviceProfile p = in_order_measured_profile(t, "reuse-test", tables);
  SimulateOptions o;
  o.mode = SimMode::full;
  SimulationOutput out = simulate_program(program, t, p, o);

  const Role& role = program.roles[0];
  std::vector<char> collectives(role.ops.size(), 0);
  for (const Op& op : role.ops) collectives[size_t(op.id)] = is_collective(op.kind);
  std::vector<OperandReuse> reuse = operand_reuse(role, collectives);
  std::map<std::string, std::vector<CollectivePoint>> back, far;
  for (const CollectivePoint& c : tables.collectives) back[c.kind].push_back(c);
  for (const CollectivePoint& c : tables.collective_reuse) far[c.kind].push_back(c);
  int gathers = 0, slower = 0;
  for (const OpRecord& r : out.records) {
    const Op& op = role.ops[size_t(r.id)];
    if (r.rank != 0 || op.kind != OpKind::all_gather) continue;
    ++gathers;
    CollectiveReuseTable table(back[to_string(op.kind)], far[to_string(op.kind)]);
    double transfer = table.time_s(op.bytes, reuse[size_t(op.id)]);
    double copy = 2 * (op.bytes / 2) * 1e-9;  // the shard, read and written at 1 GB/s
    CHECK(r.end_s - std::max(r.start_s, r.ready_s) == Approx(transfer + copy).epsilon(1e-6));
    slower += transfer > CollectiveTable(back[to_string(op.kind)]).time_s(op.bytes) * 1.01;
  }
  CHECK(gathers > 0);
  CHECK(slower > 0);  // a shard last touched in the previous step is far
}

namespace {

// The test device's profile with the NICs at `p2p` of their rate for sends and `exchange` for
// collectives.
DeviceProfile profile_with_fractions(const Topology& t, double p2p, std::optional<double> exchange) {
  DeviceProfile p = roofline_profile(t);
  p.is_roofline = false;
  p.name = "link-fractions";
  p.gemm[Dtype::fp32] = GemmEfficiency{};
  p.inter_node_bus_fraction = p2p;
  p.inter_node_exchange_fraction = exchange;
  return p;
}

}  // namespace

TEST_CASE("collective cost: collectives across nodes take the profile's exchange fraction, sends their own",
          "[collective]") {
  Topology t = parse_test_topology(star_topology_json(4, 2, 100e9, 2e-6, 2, 25e9, 3e-6));
  DeviceProfile p = profile_with_fractions(t, 0.95, 0.9);
  CollectiveCostModel model(p, t);
  CHECK_FALSE(model.has_tables());
  CHECK(model.corrects());
  // Sends (and the simulator's flows) keep the ping-pong's fraction.
  CHECK(model.links().inter_bandwidth_bytes_per_s ==
        Approx(link_figures(apply_link_fractions(t, p)).inter_bandwidth_bytes_per_s));
  LinkFigures exchange = link_figures(apply_link_fractions(t, p, true));
  CHECK(exchange.inter_bandwidth_bytes_per_s == Approx(model.links().inter_bandwidth_bytes_per_s * 0.9 / 0.95));
  GroupShape across{4, 4, 1};
  for (double bytes : {1e4, 1e7, 1e9}) {
    for (Algorithm a : {Algorithm::ring, Algorithm::tree}) {
      double expected = collective_time_s(OpKind::all_reduce, a, bytes, across, exchange);
      CHECK(model.time_s(OpKind::all_reduce, a, bytes, across) == Approx(expected));
      CHECK(model.correction(OpKind::all_reduce, a, bytes, across) ==
            Approx(expected / collective_time_s(OpKind::all_reduce, a, bytes, across, model.links())));
    }
  }
  CHECK(model.correction(OpKind::all_reduce, Algorithm::ring, 1e9, across) > 1.05);
  // Inside a node nothing changes.
  GroupShape inside{2, 1, 2};
  CHECK(model.correction(OpKind::all_reduce, Algorithm::ring, 1e7, inside) == Approx(1));
  // Without an exchange fraction (or the same one) no correction.
  CHECK_FALSE(CollectiveCostModel(profile_with_fractions(t, 0.95, std::nullopt), t).corrects());
  CHECK_FALSE(CollectiveCostModel(profile_with_fractions(t, 0.95, 0.95), t).corrects());
}

namespace {

// four_nodes: four nodes of one device on 25 GB/s NICs, no latency. dp_all_reduce_step_s: the step
// of one 64 MB dp ring all_reduce (full mode) with `profile`; at_fraction_s: its time with the
// NICs at `fraction` of their rate (2(n−1)/n of the buffer through each NIC).
constexpr double kAllReduceBytes = 64e6;
Topology four_nodes() { return parse_test_topology(star_topology_json(4, 1, 100e9, 0, 1, 25e9, 0)); }
double dp_all_reduce_step_s(const Topology& t, const DeviceProfile& profile) {
  StepProgram program = empty_program(1, 4, 1, 1);
  push_op(program.roles[0],
          collective_op(OpKind::all_reduce, GroupKind::dp, Algorithm::ring, kAllReduceBytes, Stream::comm));
  SimulateOptions o;
  o.mode = SimMode::full;
  return simulate_program(program, t, profile, o).step_time_s;
}
double at_fraction_s(double fraction) { return 2.0 * 3 / 4 * kAllReduceBytes / (25e9 * fraction); }

}  // namespace

TEST_CASE("sim: a dp all_reduce across nodes runs at the profile's exchange fraction of the NICs (full)", "[sim]") {
  Topology t = four_nodes();
  CHECK(dp_all_reduce_step_s(t, profile_with_fractions(t, 0.95, 0.9)) == Approx(at_fraction_s(0.9)).epsilon(1e-6));
}

TEST_CASE("sim: a dp all_reduce across nodes runs at the fraction measured at its NICs' rate (full)", "[sim]") {
  // The profile measured at 4x the NICs' rate (other fractions) and at their rate.
  Topology t = four_nodes();
  DeviceProfile p = profile_with_fractions(t, 0.6, 0.5);
  p.inter_node_rate_bytes_per_s = 100e9;
  p.inter_node_at_rates = {{25e9, 0.95, 0.9}};
  CHECK(dp_all_reduce_step_s(t, p) == Approx(at_fraction_s(0.9)).epsilon(1e-6));
}
