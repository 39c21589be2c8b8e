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
