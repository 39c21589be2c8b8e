// The torus and dragonfly fabrics against closed forms: dimension-ordered torus routes of k hops
// take 2·nic_latency + k·link_latency + S/B and a shared torus link halves each flow's bandwidth;
// dragonfly routes cross one global link between groups (none inside one) with the latencies of
// their hops, and a ring all-reduce across groups runs at the global link's share; fast mode
// (phase flows, folded rails) agrees with full mode on a dp all_reduce on each kind. Each
// simulation runs in a forked child (platform_fixtures.hpp).
#include <catch2/catch.hpp>
#include <iomanip>
#include <regex>
#include <string>
#include <vector>

#include "collective.hpp"
#include "platform.hpp"
#include "platform_fixtures.hpp"
#include "profile.hpp"
#include "sim_fixtures.hpp"
#include "simulator.hpp"
#include "topology.hpp"

using namespace stepcast;
using namespace stepcast::test;
namespace sg4 = simgrid::s4u;

namespace {

// star_topology_json's nodes (intra-node 100 GB/s, 1 us) with the fabric of another kind: `nics`
// NICs of `nic_bw` and `nic_latency` per node and `kind_keys`.
Topology fabric_topology(int nodes, int per_node, int nics, double nic_bw, double nic_latency, const Json& kind_keys) {
  Json json = star_topology_json(nodes, per_node, 100e9, 1e-6, nics, nic_bw, nic_latency);
  for (const char* key : {"switch_latency_s", "oversubscription", "switch_radix"}) json["fabric"].erase(key);
  json["fabric"].update(kind_keys);
  return parse_test_topology(json);
}

Json torus_keys(const Json& dimensions, double link_bw, double link_latency) {
  return {{"kind", "torus"},
          {"dimensions", dimensions},
          {"link_bandwidth_bytes_per_s", link_bw},
          {"link_latency_s", link_latency}};
}

struct DragonflySpec {
  int groups = 3;
  int routers_per_group = 2;
  int nodes_per_router = 2;
  double switch_latency_s = 3e-7;
  double local_bw = 100e9;
  double local_latency_s = 2e-8;
  double global_bw = 50e9;
  double global_latency_s = 5e-7;
};

Json dragonfly_keys(const DragonflySpec& d) {
  return {{"kind", "dragonfly"},
          {"switch_latency_s", d.switch_latency_s},
          {"groups", d.groups},
          {"routers_per_group", d.routers_per_group},
          {"nodes_per_router", d.nodes_per_router},
          {"local_link_bandwidth_bytes_per_s", d.local_bw},
          {"local_link_latency_s", d.local_latency_s},
          {"global_link_bandwidth_bytes_per_s", d.global_bw},
          {"global_link_latency_s", d.global_latency_s}};
}

// The names of the route's links that match `pattern`, in route order.
std::vector<std::string> links_matching(const Json& route, const std::string& pattern) {
  std::vector<std::string> out;
  for (const auto& link : route.at("links")) {
    std::string name = link.get<std::string>();
    if (std::regex_match(name, std::regex(pattern))) out.push_back(name);
  }
  return out;
}

using Names = std::vector<std::string>;

}  // namespace

TEST_CASE("torus: routes are dimension-ordered, the shorter way round, k hops in 2·nic + k·hop", "[sim]") {
  // 4 x 4 x 4 nodes of one device; node = x + 4y + 16z. Routers exist for every node, hosts only
  // for the listed devices.
  const double nic_latency = 1e-6, hop_latency = 1e-7, nic_bw = 25e9, link_bw = 10e9;
  const Topology topology = fabric_topology(64, 1, 1, nic_bw, nic_latency, torus_keys({4, 4, 4}, link_bw, hop_latency));
  const uint64_t bytes = 1'000'000'000;
  Json result = simulate_in_child([&](sg4::Engine& engine) {
    Platform platform = build_platform(engine, topology, {{0, 3, 21, 63}, 1});
    return Json{{"to21", route_of(platform, 0, 21)},
                {"from21", route_of(platform, 21, 0)},
                {"to3", route_of(platform, 0, 3)},
                {"to63", route_of(platform, 0, 63)},
                {"end_s", time_flows(engine, platform, {{0, 21, bytes}})}};
  });
  INFO(result.dump());
  const std::string torus = R"(torus\d+-d\d_(UP|DOWN))";
  // (0,0,0) → (1,1,1): x, then y, then z, 3 hops.
  CHECK(links_matching(result.at("to21"), torus) == Names{"torus0-d0_UP", "torus1-d1_UP", "torus5-d2_UP"});
  CHECK(links_matching(result.at("to21"), "node\\d+-turn\\d") == Names{"node1-turn0", "node5-turn1"});
  CHECK(result.at("to21").at("latency_s").get<double>() == Approx(2 * nic_latency + 3 * hop_latency).epsilon(1e-12));
  // Back: x first again, so not the same links reversed.
  CHECK(links_matching(result.at("from21"), torus) == Names{"torus20-d0_DOWN", "torus16-d1_DOWN", "torus0-d2_DOWN"});
  // (3,0,0) is one hop away over the wraparound link (node 3's link to its +x neighbour, node 0,
  // taken backwards), (3,3,3) three.
  CHECK(links_matching(result.at("to3"), torus) == Names{"torus3-d0_DOWN"});
  CHECK(result.at("to3").at("latency_s").get<double>() == Approx(2 * nic_latency + hop_latency).epsilon(1e-12));
  CHECK(links_matching(result.at("to63"), torus) == Names{"torus3-d0_DOWN", "torus15-d1_DOWN", "torus63-d2_DOWN"});
  CHECK_FALSE(crosses(result.at("to63"), "nvlink"));
  // The torus link (10 GB/s) is slower than the NIC (25 GB/s).
  CHECK(result.at("end_s")[0].get<double>() ==
        Approx(bytes / link_bw + 2 * nic_latency + 3 * hop_latency).epsilon(1e-9));
}

TEST_CASE("torus: two flows sharing a torus link take twice as long as one", "[sim]") {
  // 8 x 2 nodes of one device: 0 → 2 and 1 → 3 both cross link 1 → 2; 3 → 5 shares nothing with
  // 0 → 2. A ring of two (y) has one link between its nodes.
  const double nic_latency = 1e-6, hop_latency = 2e-7, link_bw = 10e9;
  const Topology topology = fabric_topology(16, 1, 1, 25e9, nic_latency, torus_keys({8, 2}, link_bw, hop_latency));
  const uint64_t bytes = 500'000'000;
  const double latency = 2 * nic_latency + 2 * hop_latency;
  auto run = [&](const std::vector<Flow>& flows) {
    return simulate_in_child([&](sg4::Engine& engine) {
      Platform platform = build_platform(engine, topology, {device_range(0, 16), 1});
      return Json{{"y", route_of(platform, 0, 8)}, {"end_s", time_flows(engine, platform, flows)}};
    });
  };
  Json alone = run({{0, 2, bytes}});
  CHECK(alone.at("end_s")[0].get<double>() == Approx(bytes / link_bw + latency).epsilon(1e-9));
  Json shared = run({{0, 2, bytes}, {1, 3, bytes}});
  for (const auto& end_s : shared.at("end_s"))
    CHECK(end_s.get<double>() == Approx(2 * bytes / link_bw + latency).epsilon(1e-9));
  Json apart = run({{0, 2, bytes}, {3, 5, bytes}});
  for (const auto& end_s : apart.at("end_s"))
    CHECK(end_s.get<double>() == Approx(bytes / link_bw + latency).epsilon(1e-9));
  CHECK(links_matching(alone.at("y"), R"(torus\d+-d\d_(UP|DOWN))") == Names{"torus0-d1_UP"});
}

TEST_CASE("dragonfly: one global link between groups, none inside one — latency of the hops", "[sim]") {
  // 3 groups of 2 routers of 2 nodes: node n on router n / 2, of group n / 4. Group 0 holds its
  // link to group 1 on router 0 and to group 2 on router 1; group 1 its link to group 0 on router 1.
  DragonflySpec d;
  d.global_bw = 5e9;
  const double nic_latency = 1e-6;
  const Topology topology = fabric_topology(12, 1, 1, 25e9, nic_latency, dragonfly_keys(d));
  const LinkFigures links = link_figures(topology);
  const uint64_t bytes = 500'000'000;
  Json result = simulate_in_child([&](sg4::Engine& engine) {
    Platform platform = build_platform(engine, topology, {device_range(0, 12), 1});
    return Json{{"same_router", route_of(platform, 0, 1)}, {"same_group", route_of(platform, 0, 2)},
                {"global_only", route_of(platform, 0, 6)}, {"local_global_local", route_of(platform, 2, 4)},
                {"back", route_of(platform, 4, 2)},        {"end_s", time_flows(engine, platform, {{2, 4, bytes}})}};
  });
  INFO(result.dump());
  const std::string global = R"(global\d+-\d+_(UP|DOWN))", local = R"(group\d+-local\d+-\d+_(UP|DOWN))";
  const double sw = d.switch_latency_s;
  CHECK(links_matching(result.at("same_router"), global).empty());
  CHECK(links_matching(result.at("same_router"), local).empty());
  CHECK(result.at("same_router").at("latency_s").get<double>() == Approx(2 * nic_latency + sw).epsilon(1e-12));

  CHECK(links_matching(result.at("same_group"), global).empty());
  CHECK(links_matching(result.at("same_group"), local) == Names{"group0-local0-1_UP"});
  CHECK(result.at("same_group").at("latency_s").get<double>() ==
        Approx(2 * nic_latency + 2 * sw + d.local_latency_s).epsilon(1e-12));

  CHECK(links_matching(result.at("global_only"), global) == Names{"global0-1_UP"});
  CHECK(links_matching(result.at("global_only"), local).empty());
  CHECK(result.at("global_only").at("latency_s").get<double>() ==
        Approx(2 * nic_latency + 2 * sw + d.global_latency_s).epsilon(1e-12));

  // Router 1 of group 0 → router 0 (holds the link to group 1) → router 1 of group 1 → router 0.
  const Json& lgl = result.at("local_global_local");
  CHECK(links_matching(lgl, global) == Names{"global0-1_UP"});
  CHECK(links_matching(lgl, local) == Names{"group0-local0-1_DOWN", "group1-local0-1_DOWN"});
  const double lgl_latency = 2 * nic_latency + 4 * sw + 2 * d.local_latency_s + d.global_latency_s;
  CHECK(lgl.at("latency_s").get<double>() == Approx(lgl_latency).epsilon(1e-12));
  CHECK(links.inter_latency_s == Approx(lgl_latency).epsilon(1e-12));  // the longest minimal route
  CHECK(links_matching(result.at("back"), global) == Names{"global0-1_DOWN"});
  // The global link (5 GB/s) is the slowest on the path.
  CHECK(result.at("end_s")[0].get<double>() == Approx(bytes / d.global_bw + lgl_latency).epsilon(1e-9));
}

TEST_CASE("dragonfly: a ring all_reduce across groups runs at the global link's share", "[sim]") {
  // 2 groups of 2 routers of one node; nodes of 2 devices, a 10 GB/s NIC each. Two rings (one per
  // local device index, as dp groups under tp 2) over the 4 nodes each cross the 8 GB/s global
  // link once per direction: 4 GB/s per ring, below the NICs. No latencies: the bandwidth term
  // alone, 2(n−1)/n·S/B, with B link_figures' inter-node bandwidth.
  DragonflySpec d;
  d.groups = 2;
  d.nodes_per_router = 1;
  d.switch_latency_s = d.local_latency_s = d.global_latency_s = 0;
  d.global_bw = 8e9;
  Json json = star_topology_json(4, 2, 100e9, 0, 2, 10e9, 0);
  for (const char* key : {"switch_latency_s", "oversubscription", "switch_radix"}) json["fabric"].erase(key);
  json["fabric"].update(dragonfly_keys(d));
  const Topology topology = parse_test_topology(json);
  const uint64_t bytes = 400'000'000;
  Json result = simulate_in_child([&](sg4::Engine& engine) {
    Platform platform = build_platform(engine, topology, {device_range(0, 8), 1});
    double last_end_s = 0;
    for (int rail = 0; rail < 2; ++rail) {
      std::vector<sg4::Host*> ring;
      for (int node = 0; node < 4; ++node) ring.push_back(platform.host_of_device.at(2 * node + rail));
      add_ring_all_reduce(ring, bytes, "rail" + std::to_string(rail) + "-", last_end_s);
    }
    engine.run();
    return Json(last_end_s);
  });
  const double n = 4;
  const double expected_s = 2 * (n - 1) / n * bytes / (d.global_bw / 2);
  CHECK(result.get<double>() == Approx(expected_s).epsilon(1e-9));
  const LinkFigures links = link_figures(topology);
  CHECK(links.inter_bandwidth_bytes_per_s == d.global_bw / 2);
  CHECK(collective_time_s(OpKind::all_reduce, Algorithm::ring, bytes, GroupShape{4, 4, 1}, links) ==
        Approx(expected_s).epsilon(1e-12));
}

namespace {

// One dp ring all_reduce of `bytes` under tp 2, dp = nodes (one dp member per node), simulated in
// `mode` in a child process; returns the step time.
double dp_all_reduce_step_s(const Topology& topology, SimMode mode, double bytes) {
  StepProgram program = empty_program(2, topology.num_nodes, 1, 2);
  push_op(program.roles[0], collective_op(OpKind::all_reduce, GroupKind::dp, Algorithm::ring, bytes, Stream::comm));
  Json result = json_from_child([&] {
    SimulateOptions options;
    options.mode = mode;
    return Json(simulate_program(program, topology, roofline_profile(topology), options).step_time_s);
  });
  return result.get<double>();
}

}  // namespace

TEST_CASE("fast and full mode agree on a dp all_reduce on a torus and a dragonfly", "[sim]") {
  // 8 nodes of 2 devices, a NIC each: the two dp rings (one per tp index) share the fabric's links,
  // which fast mode simulates once with half their capacity (fold_rail_groups) and as one flow per
  // neighbour pair plus the ring's latency (phase_flows). The bandwidth terms are equal. So are the
  // latency terms here (to 1e-9): the ring crosses 1 or 2 torus hops (1 to 3 dragonfly hops) a
  // step, and each full-mode step waits for its slowest edge, the latency fast mode charges each
  // step from the critical rank's route. Where the bandwidth of the edges differs too, the two
  // may part by up to the spread of the route latencies: 1e-6 is the stated tolerance. The links
  // are sized so that the torus or global link binds: link_figures' ring time (mean hop count, or
  // the longest minimal route) is then within 0.1%.
  const double bytes = 64e6;
  const Topology torus = fabric_topology(8, 2, 2, 25e9, 1e-6, torus_keys({4, 2}, 20e9, 1e-7));
  DragonflySpec d;
  d.groups = 2;
  d.global_bw = 20e9;
  const Topology dragonfly = fabric_topology(8, 2, 2, 25e9, 1e-6, dragonfly_keys(d));
  for (const Topology* topology : {&torus, &dragonfly}) {
    INFO(to_string(topology->fabric.kind));
    const double full_s = dp_all_reduce_step_s(*topology, SimMode::full, bytes);
    const double fast_s = dp_all_reduce_step_s(*topology, SimMode::fast, bytes);
    const double model_s =
        collective_time_s(OpKind::all_reduce, Algorithm::ring, bytes, GroupShape{8, 8, 1}, link_figures(*topology));
    INFO(std::setprecision(12) << "full " << full_s << " s, fast " << fast_s << " s, link_figures' ring " << model_s
                               << " s");
    CHECK(fast_s == Approx(full_s).epsilon(1e-6));
    CHECK(full_s == Approx(model_s).epsilon(1e-3));
    // The bandwidth term alone: each ring gets half of a 20 GB/s link.
    CHECK(full_s > 2.0 * 7 / 8 * bytes / 10e9);
  }
}
