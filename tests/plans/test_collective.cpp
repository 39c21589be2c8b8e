// Collective shapes, α-β times and the algorithm choice against closed forms.
#include <catch2/catch.hpp>

#include "collective.hpp"
#include "test_support.hpp"

using namespace stepcast;

namespace {

LinkFigures uniform_links(double bandwidth, double latency) {
  return {bandwidth, latency, bandwidth, latency};
}

}  // namespace

TEST_CASE("ring all_reduce time is 2(n-1)/n·S/B + 2(n-1)·α", "[collective]") {
  const double S = 1e9, B = 1e11, alpha = 5e-6;
  for (int64_t n : {2, 4, 8, 64}) {
    GroupShape shape{n, 1, n};
    double expected = 2.0 * (n - 1) / n * S / B + 2.0 * (n - 1) * alpha;
    CHECK(collective_time_s(OpKind::all_reduce, Algorithm::ring, S, shape, uniform_links(B, alpha)) ==
          Approx(expected).epsilon(1e-12));
    double half = double(n - 1) / n * S / B + double(n - 1) * alpha;
    CHECK(collective_time_s(OpKind::reduce_scatter, Algorithm::ring, S, shape,
                            uniform_links(B, alpha)) == Approx(half).epsilon(1e-12));
  }
}

TEST_CASE("bus bandwidth factors are nccl-tests'", "[collective]") {
  CHECK(bus_bandwidth_factor(OpKind::all_reduce, 8) == Approx(2.0 * 7 / 8));
  CHECK(bus_bandwidth_factor(OpKind::all_gather, 8) == Approx(7.0 / 8));
  CHECK(bus_bandwidth_factor(OpKind::reduce_scatter, 8) == Approx(7.0 / 8));
  CHECK(bus_bandwidth_factor(OpKind::broadcast, 8) == 1);
}

TEST_CASE("algorithm choice: tree for small messages across many nodes, ring for large", "[collective]") {
  LinkFigures links{300e9, 2e-6, 25e9, 5e-6};
  GroupShape across{128, 128, 1};  // one member per node
  CHECK(choose_algorithm(OpKind::all_reduce, 4, across, links) == Algorithm::tree);
  CHECK(choose_algorithm(OpKind::all_reduce, 4e9, across, links) == Algorithm::ring);
  GroupShape in_node{8, 1, 8};
  CHECK(choose_algorithm(OpKind::all_reduce, 4e9, in_node, links) == Algorithm::ring);
  GroupShape spread{64, 8, 8};  // 8 nodes × 8: the node-local phase is cheap
  CHECK(choose_algorithm(OpKind::all_reduce, 4e9, spread, links) == Algorithm::hierarchical);
  CHECK(choose_algorithm(OpKind::reduce_scatter, 4e9, spread, links) == Algorithm::hierarchical);
  CHECK(choose_algorithm(OpKind::all_reduce, 4e9, GroupShape{1, 1, 1}, links) == Algorithm::none);
}

TEST_CASE("group shapes follow the rank grid and the node size", "[collective]") {
  RankGrid grid(8, 16, 8, "tp-dp-pp");
  GroupShape tp = group_shape(grid, GroupKind::tp, 0, 8);
  CHECK((tp.size == 8 && tp.nodes == 1 && tp.members_per_node == 8));
  GroupShape dp = group_shape(grid, GroupKind::dp, 0, 8);
  CHECK((dp.size == 16 && dp.nodes == 16 && dp.members_per_node == 1));
  RankGrid small_tp(2, 16, 1, "tp-dp-pp");
  GroupShape dp2 = group_shape(small_tp, GroupKind::dp, 0, 8);
  CHECK((dp2.size == 16 && dp2.nodes == 4 && dp2.members_per_node == 4));
}

TEST_CASE("link_figures on a torus: mean dimension-order hops, the slower of NICs and a link", "[collective]") {
  Topology t;
  t.num_nodes = 64;
  t.node.devices_per_node = 4;
  t.node.intra_node.bandwidth_bytes_per_s = 300e9;
  t.fabric.kind = FabricKind::torus;
  t.fabric.nics_per_node = 2;
  t.fabric.nic_bandwidth_bytes_per_s = 50e9;
  t.fabric.nic_latency_s = 1e-6;
  t.fabric.torus = {{4, 4, 4}, 40e9, 1e-7};
  // A ring of 4 puts 0, 1, 2, 1 hops from a node to the others: mean 1 per dimension over all 64
  // destinations, 3 · 64/63 over the 63 others.
  LinkFigures links = link_figures(t);
  CHECK(links.inter_latency_s == Approx(2e-6 + 3.0 * 64 / 63 * 1e-7).epsilon(1e-12));
  CHECK(links.inter_bandwidth_bytes_per_s == Approx(40e9 / 4).epsilon(1e-12));  // link < 2 NICs
  t.fabric.torus.link_bandwidth_bytes_per_s = 400e9;
  CHECK(link_figures(t).inter_bandwidth_bytes_per_s == Approx(100e9 / 4).epsilon(1e-12));
  // 8 x 2: rings of 8 (0,1,2,3,4,3,2,1: mean 2) and of 2 (mean 1/2).
  t.num_nodes = 16;
  t.fabric.torus.dimensions = {8, 2};
  CHECK(link_figures(t).inter_latency_s == Approx(2e-6 + 2.5 * 16 / 15 * 1e-7).epsilon(1e-12));
}

TEST_CASE("link_figures on a dragonfly: the longest minimal route, the slowest link on it", "[collective]") {
  Topology t;
  t.num_nodes = 32;
  t.node.devices_per_node = 2;
  t.node.intra_node.bandwidth_bytes_per_s = 300e9;
  t.fabric.kind = FabricKind::dragonfly;
  t.fabric.nics_per_node = 2;
  t.fabric.nic_bandwidth_bytes_per_s = 25e9;
  t.fabric.nic_latency_s = 1e-6;
  t.fabric.switch_latency_s = 3e-7;
  t.fabric.dragonfly = {4, 4, 2, 100e9, 2e-8, 30e9, 5e-7};
  LinkFigures links = link_figures(t);
  CHECK(links.inter_latency_s == Approx(2e-6 + 4 * 3e-7 + 2 * 2e-8 + 5e-7).epsilon(1e-12));
  CHECK(links.inter_bandwidth_bytes_per_s == Approx(30e9 / 2).epsilon(1e-12));
  // One group: router, local link, router.
  t.fabric.dragonfly.groups = 1;
  t.num_nodes = 8;
  links = link_figures(t);
  CHECK(links.inter_latency_s == Approx(2e-6 + 2 * 3e-7 + 2e-8).epsilon(1e-12));
  CHECK(links.inter_bandwidth_bytes_per_s == Approx(50e9 / 2).epsilon(1e-12));
  // One router per group: router, global link, router.
  t.fabric.dragonfly = {4, 1, 8, 100e9, 2e-8, 30e9, 5e-7};
  t.num_nodes = 32;
  CHECK(link_figures(t).inter_latency_s == Approx(2e-6 + 2 * 3e-7 + 5e-7).epsilon(1e-12));
}

TEST_CASE("link_figures on a fat tree: oversubscription only where a leaf has an uplink", "[collective]") {
  Topology t;
  t.num_nodes = 2;
  t.node.devices_per_node = 1;
  t.node.intra_node.bandwidth_bytes_per_s = 300e9;
  t.fabric.kind = FabricKind::fat_tree;
  t.fabric.nics_per_node = 1;
  t.fabric.nic_bandwidth_bytes_per_s = 25e9;
  t.fabric.nic_latency_s = 1e-6;
  t.fabric.switch_latency_s = 1e-7;
  t.fabric.switch_radix = 4;
  t.fabric.oversubscription = 5;
  // 2 NICs on one switch of 4 ports: no uplink, as the simulator's platform builds it.
  LinkFigures links = link_figures(t);
  CHECK(links.inter_bandwidth_bytes_per_s == Approx(25e9).epsilon(1e-12));
  CHECK(links.inter_latency_s == Approx(2e-6 + 1e-7).epsilon(1e-12));
  // 8 NICs: leaves of 2 under a spine, each leaf's uplink at a fifth of its NICs.
  t.num_nodes = 8;
  links = link_figures(t);
  CHECK(links.inter_bandwidth_bytes_per_s == Approx(25e9 / 5).epsilon(1e-12));
  CHECK(links.inter_latency_s == Approx(2e-6 + 3 * 1e-7).epsilon(1e-12));  // leaf, spine, leaf
}
