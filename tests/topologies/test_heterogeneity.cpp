// Unequal devices and power figures in a topology: speed factors multiply (group × node × device),
// link factors are per node, they write back as read; a factor <= 0, groups that do not add up,
// an index past the machine and half a set of power figures are refused with file, key and value.
#include <catch2/catch.hpp>

#include <optional>

#include "errors.hpp"
#include "test_support.hpp"
#include "topology.hpp"

using namespace stepcast;
using Catch::Matchers::Contains;

namespace {

// Four nodes of two devices.
Json small_topology() {
  return Json::parse(R"({
    "name": "small", "num_nodes": 4,
    "node": {
      "devices_per_node": 2,
      "device": {"name": "dev", "peak_flops_per_s": {"fp32": 10e12}, "memory_bytes": 16e9,
                 "memory_bandwidth_bytes_per_s": 1e12, "runtime_allowance_bytes": 0, "memory_reserved_bytes": 0},
      "intra_node": {"kind": "nvlink", "bandwidth_bytes_per_s": 100e9, "latency_s": 1e-6}
    },
    "fabric": {"kind": "fat_tree", "nics_per_node": 1, "nic_bandwidth_bytes_per_s": 25e9, "nic_latency_s": 1e-6,
               "switch_latency_s": 1e-7, "oversubscription": 1, "switch_radix": 40}
  })");
}

std::string refusal(const Json& j, std::optional<int> nodes = std::nullopt) {
  try {
    parse_topology(j, "het.json", nodes);
  } catch (const InputError& e) {
    return e.what();
  }
  return "accepted";
}

}  // namespace

TEST_CASE("heterogeneity: factors multiply, links per node, written back as read", "[topology]") {
  Json j = small_topology();
  j["heterogeneity"] = Json::parse(R"({
    "node_groups": [{"nodes": 3, "device_name": "dev", "compute_speed_factor": 1},
                    {"nodes": 1, "device_name": "older dev", "compute_speed_factor": 0.5}],
    "nodes": [{"node": 3, "compute_speed_factor": 0.8}, {"node": 1, "link_bandwidth_factor": 0.25}],
    "devices": [{"device": 7, "compute_speed_factor": 0.5}, {"device": 0, "compute_speed_factor": 2}]
  })");
  Topology t = parse_topology(j, "het.json");
  const Heterogeneity& h = t.heterogeneity;
  CHECK(h.compute_speed_factor(0, 2) == 2);
  CHECK(h.compute_speed_factor(1, 2) == 1);
  CHECK(h.compute_speed_factor(6, 2) == Approx(0.5 * 0.8));
  CHECK(h.compute_speed_factor(7, 2) == Approx(0.5 * 0.8 * 0.5));
  CHECK(h.link_bandwidth_factor(1) == 0.25);
  CHECK(h.link_bandwidth_factor(2) == 1);
  CHECK(h.device_name_of_node(3) == "older dev");
  Json written = topology_to_json(t);
  CHECK(topology_to_json(parse_topology(written, "again.json")) == written);
  // A uniform topology writes no heterogeneity: its programs keep their bytes.
  CHECK_FALSE(topology_to_json(parse_topology(small_topology(), "u.json")).contains("heterogeneity"));
}

TEST_CASE("heterogeneity: bad factors, groups and indices name file, key and value", "[topology]") {
  auto with = [](const char* text) {
    Json j = small_topology();
    j["heterogeneity"] = Json::parse(text);
    return j;
  };
  CHECK_THAT(refusal(with(R"({"devices": [{"device": 1, "compute_speed_factor": 0}]})")),
             Contains("het.json") && Contains("heterogeneity.devices[0].compute_speed_factor") &&
                 Contains("= 0") && Contains("(0, 100]"));
  CHECK_THAT(refusal(with(R"({"nodes": [{"node": 1, "compute_speed_factor": -0.5}]})")),
             Contains("heterogeneity.nodes[0].compute_speed_factor") && Contains("-0.5"));
  CHECK_THAT(refusal(with(R"({"nodes": [{"node": 1, "link_bandwidth_factor": 0}]})")),
             Contains("link_bandwidth_factor") && Contains("(0, 100]"));
  CHECK_THAT(refusal(with(R"({"node_groups": [{"nodes": 3, "device_name": "a", "compute_speed_factor": 1},
                                              {"nodes": 2, "device_name": "b", "compute_speed_factor": 0.5}]})")),
             Contains("heterogeneity.node_groups") && Contains("3 + 2 = 5 nodes, not num_nodes = 4") &&
                 Contains("add up to 4"));
  // Groups that add up to the file's num_nodes, but not to --nodes.
  CHECK_THAT(refusal(with(R"({"node_groups": [{"nodes": 4, "device_name": "a", "compute_speed_factor": 1}]})"), 8),
             Contains("set by --nodes"));
  CHECK_THAT(refusal(with(R"({"devices": [{"device": 8, "compute_speed_factor": 0.5}]})")),
             Contains("no such device") && Contains("[0, 7]"));
  CHECK_THAT(refusal(with(R"({"nodes": [{"node": 4, "compute_speed_factor": 0.5}]})")), Contains("no such node"));
  CHECK_THAT(refusal(with(R"({"nodes": [{"node": 1}]})")), Contains("without a factor"));
  CHECK_THAT(refusal(with(R"({"nodes": [{"node": 1, "compute_speed_factor": 0.5}, {"node": 1, "link_bandwidth_factor": 0.5}]})")),
             Contains("listed twice"));
  CHECK_THAT(refusal(with(R"({"device": [{"device": 1, "compute_speed_factor": 0.5}]})")), Contains("devices"));
  CHECK_THAT(refusal(with(R"({"devices": []})")), Contains("an empty list"));
}

TEST_CASE("topology power figures: all three or none, busy at least idle", "[topology]") {
  Json j = small_topology();
  Topology none = parse_topology(j, "p.json");
  CHECK_FALSE(none.node.device.has_power());
  j["node"]["device"]["power_idle_w"] = 60;
  CHECK_THAT(refusal(j), Contains("power_busy_w") && Contains("missing required key"));
  j["node"]["device"]["power_busy_w"] = 400;
  j["node"]["device"]["power_source"] = "a datasheet";
  Topology t = parse_topology(j, "p.json");
  CHECK(t.node.device.power_idle_w == 60);
  CHECK(t.node.device.power_busy_w == 400);
  CHECK(t.node.device.has_power());
  j["node"]["device"]["power_busy_w"] = 50;
  CHECK_THAT(refusal(j), Contains("below power_idle_w"));
  // The shipped DGX topologies carry sourced figures: the SXM modules' TDP.
  CHECK(load_topology(test::source_path("topologies/dgx-a100-80gb.json")).node.device.power_busy_w == 400);
  CHECK(load_topology(test::source_path("topologies/dgx-h100.json")).node.device.power_busy_w == 700);
}
