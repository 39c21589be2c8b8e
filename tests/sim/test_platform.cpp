// The SimGrid platform against closed forms: one flow inside a node and across leaves, a ring
// all-reduce inside a DGX node, NIC and uplink sharing, bandwidth scaling, and a 16,384-device
// build. SimGrid allows one simulation per process, so each simulation runs in a forked child that
// sends back what it measured as JSON and the checks run in the test process: the [sim] cases may
// run together in one process or one per process (as ctest runs them).
#include <catch2/catch.hpp>
#include <chrono>
#include <iostream>
#include <simgrid/s4u.hpp>
#include <string>
#include <vector>

#include "collective.hpp"
#include "json_input.hpp"
#include "platform.hpp"
#include "platform_fixtures.hpp"
#include "test_support.hpp"
#include "topology.hpp"

using namespace stepcast;
using namespace stepcast::test;
namespace sg4 = simgrid::s4u;

namespace {

struct SmallTopology {
  int num_nodes = 8;
  int devices_per_node = 1;
  int nics_per_node = 1;
  std::string kind = "fat_tree";
  double oversubscription = 1;
  int switch_radix = 4;
  double intra_bandwidth_bytes_per_s = 100e9;
  double intra_latency_s = 1e-6;
  double nic_bandwidth_bytes_per_s = 10e9;
  double nic_latency_s = 1e-6;
  double switch_latency_s = 1e-7;
};

// Writes `spec` as a topology file and loads it.
Topology small_topology(const SmallTopology& spec, const std::string& file_name) {
  Json json = {
      {"name", file_name},
      {"notes", "test topology"},
      {"num_nodes", spec.num_nodes},
      {"node",
       {{"devices_per_node", spec.devices_per_node},
        {"device",
         {{"name", "dev"},
          {"peak_flops_per_s", {{"bf16", 100e12}}},
          {"memory_bytes", 16e9},
          {"memory_bandwidth_bytes_per_s", 1e12},
          {"runtime_allowance_bytes", 1e9},
          {"memory_reserved_bytes", 0}}},
        {"intra_node",
         {{"kind", "nvlink"},
          {"bandwidth_bytes_per_s", spec.intra_bandwidth_bytes_per_s},
          {"latency_s", spec.intra_latency_s}}}}},
      {"fabric",
       {{"kind", spec.kind},
        {"nics_per_node", spec.nics_per_node},
        {"nic_bandwidth_bytes_per_s", spec.nic_bandwidth_bytes_per_s},
        {"nic_latency_s", spec.nic_latency_s},
        {"switch_latency_s", spec.switch_latency_s},
        {"oversubscription", spec.oversubscription},
        {"switch_radix", spec.switch_radix}}}};
  return load_topology(test::write_temp_file(file_name, json.dump(2)));
}

}  // namespace

TEST_CASE("one flow inside a node takes the NVSwitch in S/B + intra latency", "[sim]") {
  Topology topology = load_topology(test::source_path("topologies/dgx-a100-80gb.json"));
  const uint64_t bytes = 3'000'000'000;
  Json result = simulate_in_child([&](sg4::Engine& engine) {
    // Nodes 0 and 1 share leaf 0, so a NIC path between devices of node 0 exists too.
    Platform platform = build_platform(engine, topology, {device_range(0, 16), 1});
    Json route = route_of(platform, 0, 5);
    return Json{{"route", route}, {"end_s", time_flows(engine, platform, {{0, 5, bytes}})}};
  });
  const Json& route = result.at("route");
  INFO(route.dump());
  CHECK(route.at("links").size() == 4);
  CHECK(crosses_link(route, "dev0-nvlink_UP"));
  CHECK(crosses_link(route, "dev5-nvlink_DOWN"));
  CHECK_FALSE(crosses(route, "nic"));
  CHECK(route.at("latency_s").get<double>() == Approx(2e-6).epsilon(1e-12));
  const double expected_s = bytes / 300e9 + 2e-6;
  CHECK(result.at("end_s")[0].get<double>() == Approx(expected_s).epsilon(1e-9));
}

TEST_CASE("one flow across leaves takes S/NIC bandwidth + link_figures' inter-node latency",
          "[sim]") {
  Topology topology = load_topology(test::source_path("topologies/dgx-a100-80gb.json"));
  const double inter_latency_s = link_figures(topology).inter_latency_s;
  const uint64_t bytes = 1'000'000'000;
  // Fat tree, radix 40: leaf 0 holds NICs 0..19 (nodes 0, 1 and half of 2), leaf 1 NICs 20..39.
  Json result = simulate_in_child([&](sg4::Engine& engine) {
    std::vector<int64_t> devices = device_range(0, 16);
    for (int64_t d : device_range(24, 8)) devices.push_back(d);
    Platform platform = build_platform(engine, topology, {devices, 1});
    Json cross_leaf = route_of(platform, 0, 24);
    Json same_leaf = route_of(platform, 0, 8);
    return Json{{"cross_leaf", cross_leaf},
                {"same_leaf", same_leaf},
                {"end_s", time_flows(engine, platform, {{0, 24, bytes}})}};
  });
  const Json& cross_leaf = result.at("cross_leaf");
  INFO(cross_leaf.dump());
  CHECK(crosses_link(cross_leaf, "nic0_UP"));
  CHECK(crosses_link(cross_leaf, "leaf0-uplink_UP"));
  CHECK(crosses_link(cross_leaf, "leaf1-uplink_DOWN"));
  CHECK(crosses_link(cross_leaf, "nic24_DOWN"));
  CHECK_FALSE(crosses(cross_leaf, "nvlink"));
  CHECK(cross_leaf.at("latency_s").get<double>() == Approx(inter_latency_s).epsilon(1e-12));
  // 20 NICs behind a non-blocking uplink: the NIC is the bottleneck.
  CHECK(result.at("end_s")[0].get<double>() ==
        Approx(bytes / 25e9 + inter_latency_s).epsilon(1e-9));

  const Json& same_leaf = result.at("same_leaf");
  INFO(same_leaf.dump());
  CHECK(crosses_link(same_leaf, "nic0_UP"));
  CHECK(crosses_link(same_leaf, "nic8_DOWN"));
  CHECK_FALSE(crosses(same_leaf, "uplink"));
  CHECK_FALSE(crosses(same_leaf, "nvlink"));
  // Both NICs and the one leaf switch between them.
  CHECK(same_leaf.at("latency_s").get<double>() == Approx(2 * 1e-6 + 1.3e-7).epsilon(1e-12));
}

TEST_CASE("rail-optimized leaves hold one rail and cross-rail traffic takes its own NIC",
          "[sim]") {
  // 64 DGX H100 nodes, radix 64: rail r of nodes 0..31 on leaf 2r, of nodes 32..63 on leaf 2r+1.
  Topology topology = load_topology(test::source_path("topologies/dgx-h100.json"), 64);
  const double inter_latency_s = link_figures(topology).inter_latency_s;
  Json result = simulate_in_child([&](sg4::Engine& engine) {
    std::vector<int64_t> devices = device_range(8, 8);              // node 1
    for (int64_t d : device_range(40, 8)) devices.push_back(d);     // node 5
    for (int64_t d : device_range(320, 8)) devices.push_back(d);    // node 40
    Platform platform = build_platform(engine, topology, {devices, 1});
    return Json{{"intra", route_of(platform, 11, 12)},
                {"same_rail", route_of(platform, 11, 43)},
                {"cross_rail", route_of(platform, 11, 44)},
                {"far_same_rail", route_of(platform, 11, 323)}};
  });
  INFO(result.dump());
  const Json& intra = result.at("intra");
  CHECK(intra.at("links").size() == 4);
  CHECK_FALSE(crosses(intra, "nic"));
  CHECK(intra.at("latency_s").get<double>() == Approx(2e-6).epsilon(1e-12));

  const Json& same_rail = result.at("same_rail");
  CHECK(crosses_link(same_rail, "nic11_UP"));
  CHECK(crosses_link(same_rail, "nic43_DOWN"));
  CHECK_FALSE(crosses(same_rail, "uplink"));
  CHECK(same_rail.at("latency_s").get<double>() == Approx(2e-6 + 1.3e-7).epsilon(1e-12));

  // Rail 3 to rail 4: up through rail 3's leaf, down through rail 4's; no NVSwitch detour.
  const Json& cross_rail = result.at("cross_rail");
  CHECK(crosses_link(cross_rail, "nic11_UP"));
  CHECK(crosses_link(cross_rail, "leaf6-uplink_UP"));
  CHECK(crosses_link(cross_rail, "leaf8-uplink_DOWN"));
  CHECK(crosses_link(cross_rail, "nic44_DOWN"));
  CHECK_FALSE(crosses(cross_rail, "nvlink"));
  CHECK(cross_rail.at("latency_s").get<double>() == Approx(inter_latency_s).epsilon(1e-12));

  const Json& far_same_rail = result.at("far_same_rail");
  CHECK(crosses_link(far_same_rail, "leaf6-uplink_UP"));
  CHECK(crosses_link(far_same_rail, "leaf7-uplink_DOWN"));
  CHECK(far_same_rail.at("latency_s").get<double>() == Approx(inter_latency_s).epsilon(1e-12));
}

TEST_CASE("ring all-reduce among the 8 devices of a DGX A100 node matches 2(n-1)/n S/B + 2(n-1)a",
          "[sim]") {
  Topology topology = load_topology(test::source_path("topologies/dgx-a100-80gb.json"));
  const uint64_t bytes = 800'000'000;
  Json result = simulate_in_child([&](sg4::Engine& engine) {
    Platform platform = build_platform(engine, topology, {device_range(0, 8), 1});
    return Json{{"time_s", time_ring_all_reduce(engine, platform.hosts, bytes)}};
  });
  const double n = 8;
  const double expected_s = 2 * (n - 1) / n * bytes / 300e9 + 2 * (n - 1) * 2e-6;
  CHECK(result.at("time_s").get<double>() == Approx(expected_s).epsilon(1e-6));
}

TEST_CASE("devices that share a NIC share its bandwidth and talk to each other inside the node",
          "[sim]") {
  SmallTopology spec;
  spec.num_nodes = 2;
  spec.devices_per_node = 2;
  spec.nics_per_node = 1;
  const Topology topology = small_topology(spec, "shared-nic.json");
  const double inter_latency_s = link_figures(topology).inter_latency_s;
  const uint64_t bytes = 1'000'000'000;
  Json result = simulate_in_child([&](sg4::Engine& engine) {
    Platform platform = build_platform(engine, topology, {device_range(0, 4), 1});
    return Json{{"intra", route_of(platform, 0, 1)},
                {"end_s", time_flows(engine, platform, {{0, 2, bytes}, {1, 3, bytes}})}};
  });
  INFO(result.dump());
  CHECK_FALSE(crosses(result.at("intra"), "nic"));
  CHECK(result.at("intra").at("latency_s").get<double>() == Approx(1e-6).epsilon(1e-12));
  // One 10 GB/s NIC per node carries both flows.
  for (const auto& end_s : result.at("end_s"))
    CHECK(end_s.get<double>() == Approx(2 * bytes / 10e9 + inter_latency_s).epsilon(1e-9));
}

TEST_CASE("a device on a node of more NICs than devices drives its share of them", "[sim]") {
  SmallTopology spec;
  spec.num_nodes = 2;
  spec.devices_per_node = 1;
  spec.nics_per_node = 2;
  const Topology topology = small_topology(spec, "striped-nics.json");
  const LinkFigures links = link_figures(topology);
  const uint64_t bytes = 1'000'000'000;
  Json result = simulate_in_child([&](sg4::Engine& engine) {
    Platform platform = build_platform(engine, topology, {device_range(0, 2), 1});
    return Json{{"end_s", time_flows(engine, platform, {{0, 1, bytes}})}};
  });
  INFO(result.dump());
  // Both 10 GB/s NICs: link_figures' per-device share, and the platform's flow.
  CHECK(links.inter_bandwidth_bytes_per_s == Approx(20e9));
  CHECK(result.at("end_s")[0].get<double>() == Approx(bytes / 20e9 + links.inter_latency_s).epsilon(1e-9));
}

TEST_CASE("an oversubscribed leaf uplink is shared fairly and shared_link_divisor divides it",
          "[sim]") {
  // 8 nodes of one device and one 10 GB/s NIC, radix 4: two levels, leaves of 2 NICs.
  SmallTopology spec;
  spec.oversubscription = 2;
  const Topology topology = small_topology(spec, "oversubscribed.json");
  const double inter_latency_s = link_figures(topology).inter_latency_s;
  CHECK(inter_latency_s == Approx(2 * 1e-6 + 3 * 1e-7).epsilon(1e-12));
  const uint64_t bytes = 1'000'000'000;
  // Nodes 0 and 1 (leaf 0) send to nodes 2 and 3 (leaf 1): both flows cross leaf 0's uplink.
  const std::vector<Flow> two_flows = {{0, 2, bytes}, {1, 3, bytes}};
  auto run = [&](double divisor, const std::vector<Flow>& flows) {
    return simulate_in_child([&](sg4::Engine& engine) {
      Platform platform = build_platform(engine, topology, {device_range(0, 4), divisor});
      return Json(time_flows(engine, platform, flows));
    });
  };
  // Uplink: 2 NICs · 10 GB/s / 2 = 10 GB/s; one flow alone is held by its NIC.
  Json alone = run(1, {two_flows[0]});
  CHECK(alone[0].get<double>() == Approx(bytes / 10e9 + inter_latency_s).epsilon(1e-9));
  // Two flows: 5 GB/s each.
  Json shared = run(1, two_flows);
  for (const auto& end_s : shared)
    CHECK(end_s.get<double>() == Approx(bytes / 5e9 + inter_latency_s).epsilon(1e-9));
  // Divisor 2: a 5 GB/s uplink, 2.5 GB/s each.
  Json divided = run(2, two_flows);
  for (const auto& end_s : divided)
    CHECK(end_s.get<double>() == Approx(bytes / 2.5e9 + inter_latency_s).epsilon(1e-9));
}

TEST_CASE("without latency doubling every bandwidth halves a communication-bound pattern",
          "[sim]") {
  // 4 nodes of 2 devices and 2 NICs, radix 4 (a leaf per node), uplinks oversubscribed 2:1.
  SmallTopology spec;
  spec.num_nodes = 4;
  spec.devices_per_node = 2;
  spec.nics_per_node = 2;
  spec.oversubscription = 2;
  spec.intra_latency_s = 0;
  spec.nic_latency_s = 0;
  spec.switch_latency_s = 0;
  SmallTopology doubled = spec;
  doubled.intra_bandwidth_bytes_per_s *= 2;
  doubled.nic_bandwidth_bytes_per_s *= 2;
  // All-to-all: every device sends to every other at once, contending on NICs and uplinks.
  std::vector<Flow> flows;
  for (int64_t src = 0; src < 8; ++src)
    for (int64_t dst = 0; dst < 8; ++dst)
      if (src != dst) flows.push_back({src, dst, uint64_t(100'000'000 * (1 + (src + dst) % 3))});
  auto last_end_s = [&](const SmallTopology& s, const std::string& file) {
    const Topology topology = small_topology(s, file);
    Json end_s = simulate_in_child([&](sg4::Engine& engine) {
      Platform platform = build_platform(engine, topology, {device_range(0, 8), 1});
      return Json(time_flows(engine, platform, flows));
    });
    double last = 0;
    for (const auto& t : end_s) last = std::max(last, t.get<double>());
    return last;
  };
  const double base_s = last_end_s(spec, "no-latency.json");
  const double doubled_s = last_end_s(doubled, "no-latency-doubled.json");
  CHECK(base_s > 0);
  CHECK(doubled_s == Approx(base_s / 2).epsilon(1e-9));
}

TEST_CASE("a 16384-device DGX H100 platform builds and routes its far corners", "[sim]") {
  Topology topology = load_topology(test::source_path("topologies/dgx-h100.json"));
  REQUIRE(topology.num_devices() == 16384);
  const double inter_latency_s = link_figures(topology).inter_latency_s;
  Json result = simulate_in_child([&](sg4::Engine& engine) {
    auto start = std::chrono::steady_clock::now();
    Platform platform = build_platform(engine, topology, {device_range(0, 16384), 1});
    auto built = std::chrono::steady_clock::now();
    Json far = route_of(platform, 0, 16383);
    auto routed = std::chrono::steady_clock::now();
    return Json{{"hosts", platform.hosts.size()},
                {"engine_hosts", engine.get_host_count()},
                {"far", far},
                {"intra", route_of(platform, 16376, 16383)},
                {"build_wall_s", std::chrono::duration<double>(built - start).count()},
                {"first_route_wall_s", std::chrono::duration<double>(routed - built).count()}};
  });
  std::cout << "16,384-device platform: built in " << result.at("build_wall_s").get<double>()
            << " s wall, first route from a host in "
            << result.at("first_route_wall_s").get<double>() << " s wall\n";
  CHECK(result.at("hosts").get<size_t>() == 16384);
  CHECK(result.at("engine_hosts").get<size_t>() == 16384);
  const Json& far = result.at("far");
  INFO(far.dump());
  CHECK(crosses_link(far, "nic0_UP"));
  CHECK(crosses_link(far, "nic16383_DOWN"));
  CHECK_FALSE(crosses(far, "nvlink"));
  CHECK(far.at("latency_s").get<double>() == Approx(inter_latency_s).epsilon(1e-12));
  CHECK(inter_latency_s == Approx(2e-6 + 5 * 1.3e-7).epsilon(1e-12));  // three levels
  CHECK_FALSE(crosses(result.at("intra"), "nic"));
}

TEST_CASE("build_platform rejects devices outside the topology or listed twice", "[sim]") {
  Topology topology = load_topology(test::source_path("topologies/localhost-cpu.json"));
  auto error_of = [&](std::vector<int64_t> devices) {
    Json result = simulate_in_child([&](sg4::Engine& engine) {
      try {
        build_platform(engine, topology, {devices, 1});
      } catch (const std::logic_error& e) {
        return Json(e.what());
      }
      return Json("");
    });
    return result.get<std::string>();
  };
  using Catch::Matchers::Contains;
  CHECK_THAT(error_of({0, 2}), Contains("device 2 outside 0..1"));
  CHECK_THAT(error_of({1, 1}), Contains("device 1 listed twice"));
}
