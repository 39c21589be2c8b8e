// Topology loading: the shipped files load with the counts their notes claim, --nodes overrides,
// and every kind of bad input is answered with the file, the key and what would be valid.
#include <catch2/catch.hpp>

#include "errors.hpp"
#include "test_support.hpp"
#include "topology.hpp"

using namespace stepcast;
using Catch::Matchers::Contains;

namespace {

// A small valid topology; each bad-input case changes one thing in it.
const char* kSmallTopology = R"({
  "name": "small",
  "notes": "two nodes of two devices",
  "num_nodes": 2,
  "node": {
    "devices_per_node": 2,
    "device": {
      "name": "dev",
      "peak_flops_per_s": {"bf16": 100e12, "fp32": 10e12},
      "memory_bytes": 16e9,
      "memory_bandwidth_bytes_per_s": 1e12,
      "runtime_allowance_bytes": 1e9,
      "memory_reserved_bytes": 0.5e9
    },
    "intra_node": {"kind": "nvlink", "bandwidth_bytes_per_s": 100e9, "latency_s": 1e-6}
  },
  "fabric": {
    "kind": "rail_optimized",
    "nics_per_node": 2,
    "nic_bandwidth_bytes_per_s": 25e9,
    "nic_latency_s": 1e-6,
    "switch_latency_s": 1e-7,
    "oversubscription": 1,
    "switch_radix": 40
  }
})";

const std::string kFile = "small.json";

Json small_topology() { return parse_json_text(kSmallTopology, kFile); }

// The message parse_topology throws for `json`; fails the test when it does not throw.
std::string error_of(const Json& json, std::optional<int> nodes_override = std::nullopt) {
  try {
    parse_topology(json, kFile, nodes_override);
  } catch (const InputError& e) {
    return e.what();
  }
  FAIL("parse_topology accepted invalid input: " << json.dump());
  return "";
}

}  // namespace

TEST_CASE("shipped topologies load with their device counts", "[topology]") {
  struct Expected {
    const char* file;
    int64_t num_devices;
    int devices_per_node;
  };
  const Expected cases[] = {{"topologies/dgx-a100-80gb.json", 1024, 8},
                            {"topologies/dgx-h100.json", 16384, 8},
                            {"topologies/h200-1gpu.json", 1, 1},
                            {"topologies/dgx-b200.json", 32, 8},
                            {"topologies/gb200-nvl72.json", 2304, 72},
                            {"topologies/localhost-cpu.json", 2, 2}};
  for (const auto& c : cases) {
    INFO(c.file);
    std::string path = test::source_path(c.file);
    Topology topology = load_topology(path);
    CHECK(topology.file == path);
    CHECK(topology.num_devices() == c.num_devices);
    CHECK(topology.node.devices_per_node == c.devices_per_node);
    const DeviceSpec& device = topology.node.device;
    CHECK(device.runtime_allowance_bytes + device.memory_reserved_bytes < device.memory_bytes);
  }
}

TEST_CASE("shipped topologies carry the published figures", "[topology]") {
  Topology a100 = load_topology(test::source_path("topologies/dgx-a100-80gb.json"));
  CHECK(a100.node.device.peak_for(Dtype::bf16, a100.file) == 312e12);
  CHECK(a100.node.device.memory_bytes == 81920.0 * 1024 * 1024);
  CHECK(a100.node.intra_node.kind == IntraNodeKind::nvswitch);
  CHECK(a100.fabric.kind == FabricKind::fat_tree);
  CHECK(a100.fabric.nics_per_node * a100.fabric.nic_bandwidth_bytes_per_s == 200e9);

  Topology h100 = load_topology(test::source_path("topologies/dgx-h100.json"));
  // The whitepaper rounds each figure: fp8 1978.9 is twice bf16 989.4 to four digits.
  CHECK(h100.node.device.peak_for(Dtype::fp8, h100.file) ==
        Approx(2 * h100.node.device.peak_for(Dtype::bf16, h100.file)).epsilon(1e-4));
  CHECK(h100.node.device.memory_bytes == 81559.0 * 1024 * 1024);
  CHECK(h100.fabric.kind == FabricKind::rail_optimized);
  CHECK(h100.fabric.nics_per_node == h100.node.devices_per_node);

  Topology h200 = load_topology(test::source_path("topologies/h200-1gpu.json"));
  CHECK(h200.node.device.memory_bytes == 143771.0 * 1024 * 1024);
  CHECK(h200.node.device.peak_for(Dtype::bf16, h200.file) ==
        h100.node.device.peak_for(Dtype::bf16, h100.file));

  Topology cpu = load_topology(test::source_path("topologies/localhost-cpu.json"));
  CHECK(cpu.node.intra_node.kind == IntraNodeKind::shared_memory);
  CHECK(cpu.node.device.memory_reserved_bytes == 0);
}

TEST_CASE("the --nodes override replaces num_nodes", "[topology]") {
  std::string path = test::source_path("topologies/dgx-a100-80gb.json");
  Topology topology = load_topology(path, 4);
  CHECK(topology.num_nodes == 4);
  CHECK(topology.num_devices() == 32);

  std::string message;
  try {
    load_topology(path, 0);
  } catch (const InputError& e) {
    message = e.what();
  }
  CHECK_THAT(message, Contains(path));
  CHECK_THAT(message, Contains("num_nodes"));
  CHECK_THAT(message, Contains("--nodes"));
  CHECK_THAT(error_of(small_topology(), -3), Contains("--nodes"));
}

TEST_CASE("peak_for names the file, the key and the dtypes present", "[topology]") {
  Topology topology = parse_topology(small_topology(), kFile);
  CHECK(topology.node.device.peak_for(Dtype::fp32, kFile) == 10e12);
  std::string message;
  try {
    topology.node.device.peak_for(Dtype::fp8, "cluster.json");
  } catch (const InputError& e) {
    message = e.what();
  }
  CHECK_THAT(message, Contains("cluster.json"));
  CHECK_THAT(message, Contains("node.device.peak_flops_per_s.fp8"));
  CHECK_THAT(message, Contains("fp32, bf16"));
}

TEST_CASE("dtype names, sizes and enum strings", "[topology]") {
  CHECK(parse_dtype("bf16") == Dtype::bf16);
  CHECK(parse_dtype("fp8") == Dtype::fp8);
  CHECK_FALSE(parse_dtype("bfloat16").has_value());
  CHECK(dtype_bytes(Dtype::fp64) == 8);
  CHECK(dtype_bytes(Dtype::tf32) == 4);
  CHECK(dtype_bytes(Dtype::fp16) == 2);
  CHECK(dtype_bytes(Dtype::fp8) == 1);
  for (Dtype dtype : {Dtype::fp64, Dtype::fp32, Dtype::tf32, Dtype::bf16, Dtype::fp16, Dtype::fp8}) {
    CHECK(parse_dtype(to_string(dtype)) == dtype);
  }
  CHECK(std::string(to_string(IntraNodeKind::shared_memory)) == "shared_memory");
  CHECK(std::string(to_string(FabricKind::rail_optimized)) == "rail_optimized");
}

TEST_CASE("topology_to_json writes back a file that loads to the same topology", "[topology]") {
  for (const char* file : {"topologies/dgx-a100-80gb.json", "topologies/dgx-h100.json", "topologies/h200-1gpu.json",
                           "topologies/dgx-b200.json", "topologies/gb200-nvl72.json", "topologies/localhost-cpu.json"}) {
    INFO(file);
    Topology topology = load_topology(test::source_path(file));
    Json written = topology_to_json(topology);
    Topology reread = parse_topology(written, "written.json");
    CHECK(topology_to_json(reread) == written);
    CHECK(reread.num_devices() == topology.num_devices());
  }
  Json written = topology_to_json(load_topology(test::source_path("topologies/dgx-h100.json"), 16));
  CHECK(written["num_nodes"] == 16);
  CHECK(written["fabric"]["kind"] == "rail_optimized");
}

TEST_CASE("malformed JSON reports file, line and column", "[topology]") {
  std::string text = "{\n  \"name\": \"small\",\n  \"num_nodes\": 2,,\n}\n";
  std::string message;
  try {
    parse_json_text(text, "broken.json");
  } catch (const InputError& e) {
    message = e.what();
  }
  CHECK_THAT(message, Contains("broken.json:3:"));

  std::string path = test::write_temp_file("broken-topology.json", text);
  message.clear();
  try {
    load_topology(path);
  } catch (const InputError& e) {
    message = e.what();
  }
  CHECK_THAT(message, Contains(path + ":3:"));
}

TEST_CASE("missing keys are named with their full path", "[topology]") {
  Json json = small_topology();
  json["fabric"].erase("switch_radix");
  std::string message = error_of(json);
  CHECK_THAT(message, Contains(kFile));
  CHECK_THAT(message, Contains("'fabric.switch_radix'"));
  CHECK_THAT(message, Contains("missing required key"));

  json = small_topology();
  json["node"].erase("device");
  CHECK_THAT(error_of(json), Contains("'node.device'"));

  // "notes" is the one optional key.
  json = small_topology();
  json.erase("notes");
  CHECK(parse_topology(json, kFile).name == "small");
}

TEST_CASE("unknown keys suggest the closest valid one", "[topology]") {
  Json json = small_topology();
  json["fabric"]["nic_bandwith_bytes_per_s"] = 25e9;
  std::string message = error_of(json);
  CHECK_THAT(message, Contains(kFile));
  CHECK_THAT(message, Contains("'fabric.nic_bandwith_bytes_per_s'"));
  CHECK_THAT(message, Contains("did you mean 'nic_bandwidth_bytes_per_s'"));

  json = small_topology();
  json["node"]["device"]["peak_flops_per_s"]["bf61"] = 1e12;
  message = error_of(json);
  CHECK_THAT(message, Contains("'node.device.peak_flops_per_s.bf61'"));
  CHECK_THAT(message, Contains("did you mean 'bf16'"));

  json = small_topology();
  json["num_node"] = 2;
  CHECK_THAT(error_of(json), Contains("did you mean 'num_nodes'"));

  json = small_topology();
  json["fabric"]["kind"] = "fat-tree";
  message = error_of(json);
  CHECK_THAT(message, Contains("'fabric.kind'"));
  CHECK_THAT(message, Contains("\"fat_tree\""));
}

TEST_CASE("values of the wrong type are rejected", "[topology]") {
  Json json = small_topology();
  json["node"]["devices_per_node"] = "2";
  std::string message = error_of(json);
  CHECK_THAT(message, Contains(kFile));
  CHECK_THAT(message, Contains("'node.devices_per_node'"));
  CHECK_THAT(message, Contains("wrong type"));

  json = small_topology();
  json["num_nodes"] = 2.5;
  CHECK_THAT(error_of(json), Contains("'num_nodes'"));

  json = small_topology();
  json["node"]["device"]["memory_bytes"] = "16 GB";
  CHECK_THAT(error_of(json), Contains("'node.device.memory_bytes'"));

  json = small_topology();
  json["fabric"] = 3;
  CHECK_THAT(error_of(json), Contains("'fabric'"));
}

TEST_CASE("zero or negative rates, sizes and counts are rejected", "[topology]") {
  Json json = small_topology();
  json["node"]["intra_node"]["bandwidth_bytes_per_s"] = 0;
  std::string message = error_of(json);
  CHECK_THAT(message, Contains(kFile));
  CHECK_THAT(message, Contains("'node.intra_node.bandwidth_bytes_per_s'"));
  CHECK_THAT(message, Contains("a number in [1000, 1e+15]"));

  json = small_topology();
  json["fabric"]["nic_bandwidth_bytes_per_s"] = -1;
  CHECK_THAT(error_of(json), Contains("'fabric.nic_bandwidth_bytes_per_s'"));

  json = small_topology();
  json["node"]["device"]["peak_flops_per_s"]["bf16"] = 0;
  CHECK_THAT(error_of(json), Contains("'node.device.peak_flops_per_s.bf16'"));

  json = small_topology();
  json["node"]["device"]["peak_flops_per_s"] = Json::object();
  message = error_of(json);
  CHECK_THAT(message, Contains("'node.device.peak_flops_per_s'"));
  CHECK_THAT(message, Contains("at least one"));

  json = small_topology();
  json["num_nodes"] = 0;
  CHECK_THAT(error_of(json), Contains("'num_nodes'"));

  json = small_topology();
  json["fabric"]["switch_radix"] = 1;
  CHECK_THAT(error_of(json), Contains("'fabric.switch_radix'"));
}

TEST_CASE("figures far outside any machine are refused (SimGrid's clock would stall on them)",
          "[topology]") {
  Json json = small_topology();
  json["node"]["device"]["peak_flops_per_s"]["bf16"] = 1e-300;
  std::string message = error_of(json);
  CHECK_THAT(message, Contains("'node.device.peak_flops_per_s.bf16'"));
  CHECK_THAT(message, Contains("a number in [1e+06, 1e+18]"));
  json = small_topology();
  json["node"]["device"]["memory_bandwidth_bytes_per_s"] = 1e300;
  CHECK_THAT(error_of(json), Contains("'node.device.memory_bandwidth_bytes_per_s'"));
  json = small_topology();
  json["fabric"]["switch_latency_s"] = 5;
  CHECK_THAT(error_of(json), Contains("'fabric.switch_latency_s'"));
}

TEST_CASE("latencies may be zero but not negative", "[topology]") {
  Json json = small_topology();
  json["fabric"]["nic_latency_s"] = 0;
  json["fabric"]["switch_latency_s"] = 0;
  json["node"]["intra_node"]["latency_s"] = 0;
  CHECK(parse_topology(json, kFile).fabric.nic_latency_s == 0);

  json = small_topology();
  json["fabric"]["nic_latency_s"] = -1e-6;
  std::string message = error_of(json);
  CHECK_THAT(message, Contains(kFile));
  CHECK_THAT(message, Contains("'fabric.nic_latency_s'"));
  CHECK_THAT(message, Contains("a number in [0, 1]"));

  json = small_topology();
  json["node"]["intra_node"]["latency_s"] = -1e-6;
  CHECK_THAT(error_of(json), Contains("'node.intra_node.latency_s'"));
}

TEST_CASE("oversubscription below 1 is rejected", "[topology]") {
  Json json = small_topology();
  json["fabric"]["oversubscription"] = 0.5;
  std::string message = error_of(json);
  CHECK_THAT(message, Contains(kFile));
  CHECK_THAT(message, Contains("'fabric.oversubscription'"));
  CHECK_THAT(message, Contains("a number in [1, 1000]"));

  json["fabric"]["oversubscription"] = 4;
  CHECK(parse_topology(json, kFile).fabric.oversubscription == 4);
}

TEST_CASE("memory allowances must leave room for training state", "[topology]") {
  Json json = small_topology();
  json["node"]["device"]["runtime_allowance_bytes"] = 15.5e9;
  std::string message = error_of(json);
  CHECK_THAT(message, Contains(kFile));
  CHECK_THAT(message, Contains("'node.device.memory_reserved_bytes'"));
  CHECK_THAT(message, Contains("< memory_bytes"));

  json = small_topology();
  json["node"]["device"]["memory_reserved_bytes"] = -1;
  CHECK_THAT(error_of(json), Contains("'node.device.memory_reserved_bytes'"));
}

TEST_CASE("rail_optimized needs one NIC per device", "[topology]") {
  Json json = small_topology();
  json["fabric"]["nics_per_node"] = 1;
  std::string message = error_of(json);
  CHECK_THAT(message, Contains(kFile));
  CHECK_THAT(message, Contains("'fabric.nics_per_node'"));
  CHECK_THAT(message, Contains("node.devices_per_node (2)"));

  json["fabric"]["kind"] = "fat_tree";
  CHECK(parse_topology(json, kFile).fabric.nics_per_node == 1);
}

namespace {

// The small topology on `nodes` nodes with the fabric of another kind (NIC keys kept).
Json with_fabric(const Json& kind_keys, int nodes) {
  Json json = small_topology();
  json["num_nodes"] = nodes;
  Json fabric = {{"nics_per_node", 2}, {"nic_bandwidth_bytes_per_s", 25e9}, {"nic_latency_s", 1e-6}};
  fabric.update(kind_keys);
  json["fabric"] = fabric;
  return json;
}

Json torus_keys(const Json& dimensions) {
  return {{"kind", "torus"},
          {"dimensions", dimensions},
          {"link_bandwidth_bytes_per_s", 50e9},
          {"link_latency_s", 1e-7}};
}

Json dragonfly_keys(int groups, int routers_per_group, int nodes_per_router) {
  return {{"kind", "dragonfly"},
          {"switch_latency_s", 3e-7},
          {"groups", groups},
          {"routers_per_group", routers_per_group},
          {"nodes_per_router", nodes_per_router},
          {"local_link_bandwidth_bytes_per_s", 25e9},
          {"local_link_latency_s", 2e-8},
          {"global_link_bandwidth_bytes_per_s", 100e9},
          {"global_link_latency_s", 5e-7}};
}

}  // namespace

TEST_CASE("torus and dragonfly fabrics load and write back exactly", "[topology]") {
  Topology torus = parse_topology(with_fabric(torus_keys({4, 4, 4}), 64), kFile);
  CHECK(torus.fabric.kind == FabricKind::torus);
  CHECK(torus.fabric.torus.dimensions == std::vector<int>{4, 4, 4});
  CHECK(torus.fabric.torus.link_bandwidth_bytes_per_s == 50e9);
  CHECK(torus.fabric.torus.link_latency_s == 1e-7);
  CHECK_FALSE(is_switch_tree(torus.fabric.kind));

  Topology dragonfly = parse_topology(with_fabric(dragonfly_keys(3, 4, 2), 24), kFile);
  const DragonflyFabric& d = dragonfly.fabric.dragonfly;
  CHECK(dragonfly.fabric.kind == FabricKind::dragonfly);
  CHECK(d.groups == 3);
  CHECK(d.routers_per_group == 4);
  CHECK(d.nodes_per_router == 2);
  CHECK(d.global_link_bandwidth_bytes_per_s == 100e9);
  CHECK(dragonfly.fabric.switch_latency_s == 3e-7);

  for (const Topology& topology : {torus, dragonfly}) {
    INFO(to_string(topology.fabric.kind));
    Json written = topology_to_json(topology);
    Topology reread = parse_topology(written, "written.json");
    CHECK(topology_to_json(reread) == written);
    CHECK(written["fabric"]["kind"] == to_string(topology.fabric.kind));
    // Only the kind's own keys are written: the tree's would be refused on reading.
    CHECK_FALSE(written["fabric"].contains("switch_radix"));
    CHECK_FALSE(written["fabric"].contains("oversubscription"));
  }
  CHECK(topology_to_json(torus)["fabric"]["dimensions"] == Json({4, 4, 4}));
  CHECK(std::string(to_string(FabricKind::dragonfly)) == "dragonfly");
  CHECK(std::string(to_string(FabricKind::torus)) == "torus");
  // A 2-D torus and a one-group dragonfly are valid too.
  CHECK(parse_topology(with_fabric(torus_keys({8, 2}), 16), kFile).fabric.torus.dimensions.size() == 2);
  CHECK(parse_topology(with_fabric(dragonfly_keys(1, 2, 2), 4), kFile).num_nodes == 4);
}

TEST_CASE("a torus whose dimensions do not place num_nodes nodes is refused", "[topology]") {
  std::string message = error_of(with_fabric(torus_keys({4, 4, 3}), 64));
  CHECK_THAT(message, Contains(kFile));
  CHECK_THAT(message, Contains("'fabric.dimensions'"));
  CHECK_THAT(message, Contains("[4, 4, 3]"));
  CHECK_THAT(message, Contains("4 x 4 x 3 = 48 nodes, not num_nodes = 64"));
  CHECK_THAT(message, Contains("whose product is num_nodes, 64"));

  // --nodes changes num_nodes, not the torus.
  message = error_of(with_fabric(torus_keys({4, 4, 4}), 64), 32);
  CHECK_THAT(message, Contains("'fabric.dimensions'"));
  CHECK_THAT(message, Contains("not num_nodes = 32 (set by --nodes)"));
  CHECK(parse_topology(with_fabric(torus_keys({4, 4, 4}), 8), kFile, 64).num_nodes == 64);

  // Sizes whose product overflows an int are named as too many.
  message = error_of(with_fabric(torus_keys({65536, 65536, 2}), 64));
  CHECK_THAT(message, Contains("more than 2147483647"));
}

TEST_CASE("torus dimensions: 2 or 3 ring sizes, each at least 1", "[topology]") {
  for (const Json& dimensions : {Json({64}), Json({2, 2, 2, 8}), Json::array()}) {
    INFO(dimensions.dump());
    std::string message = error_of(with_fabric(torus_keys(dimensions), 64));
    CHECK_THAT(message, Contains("'fabric.dimensions'"));
    CHECK_THAT(message, Contains("a list of 2 or 3 ring sizes"));
  }
  for (const Json& dimensions : {Json({8, 0, 8}), Json({-8, -8}), Json({8, 8.5}), Json("8x8")}) {
    INFO(dimensions.dump());
    std::string message = error_of(with_fabric(torus_keys(dimensions), 64));
    CHECK_THAT(message, Contains("'fabric.dimensions'"));
    CHECK_THAT(message, Contains("integers >= 1"));
  }
  CHECK_THAT(error_of(with_fabric(torus_keys({8, 3000000000}), 64)), Contains("a ring size of 3000000000"));
}

TEST_CASE("a dragonfly whose sizes do not place num_nodes nodes is refused", "[topology]") {
  std::string message = error_of(with_fabric(dragonfly_keys(3, 4, 2), 32));
  CHECK_THAT(message, Contains(kFile));
  CHECK_THAT(message, Contains("'fabric.groups'"));
  CHECK_THAT(message, Contains("3 x 4 x 2 = 24 nodes, not num_nodes = 32"));
  CHECK_THAT(error_of(with_fabric(dragonfly_keys(3, 4, 2), 24), 25), Contains("set by --nodes"));

  CHECK_THAT(error_of(with_fabric(dragonfly_keys(0, 4, 2), 24)), Contains("'fabric.groups'"));
  CHECK_THAT(error_of(with_fabric(dragonfly_keys(3, -4, 2), 24)), Contains("'fabric.routers_per_group'"));
  message = error_of(with_fabric(dragonfly_keys(2000, 1, 1), 2000));
  CHECK_THAT(message, Contains("'fabric.groups'"));
  CHECK_THAT(message, Contains("an integer in [1, 1024]"));
}

TEST_CASE("torus and dragonfly keys are required, and a key of another kind is named", "[topology]") {
  for (const std::string key : {"dimensions", "link_bandwidth_bytes_per_s", "link_latency_s"}) {
    Json keys = torus_keys({4, 4});
    keys.erase(key);
    std::string message = error_of(with_fabric(keys, 16));
    CHECK_THAT(message, Contains("'fabric." + key + "'"));
    CHECK_THAT(message, Contains("missing required key"));
  }
  for (const std::string key : {"switch_latency_s", "nodes_per_router", "global_link_bandwidth_bytes_per_s",
                                "global_link_latency_s", "local_link_latency_s"}) {
    Json keys = dragonfly_keys(2, 2, 2);
    keys.erase(key);
    std::string message = error_of(with_fabric(keys, 8));
    CHECK_THAT(message, Contains("'fabric." + key + "'"));
    CHECK_THAT(message, Contains("missing required key"));
  }
  Json keys = torus_keys({4, 4});
  keys["switch_radix"] = 64;
  std::string message = error_of(with_fabric(keys, 16));
  CHECK_THAT(message, Contains("'fabric.switch_radix'"));
  CHECK_THAT(message, Contains("not a key of kind \"torus\""));
  CHECK_THAT(message, Contains("dimensions, link_bandwidth_bytes_per_s, link_latency_s"));

  Json tree = small_topology();
  tree["fabric"]["groups"] = 2;
  CHECK_THAT(error_of(tree), Contains("not a key of kind \"rail_optimized\""));

  keys = dragonfly_keys(2, 2, 2);
  keys["global_link_bandwith_bytes_per_s"] = 1e9;
  CHECK_THAT(error_of(with_fabric(keys, 8)), Contains("did you mean 'global_link_bandwidth_bytes_per_s'"));
  keys = dragonfly_keys(2, 2, 2);
  keys["global_link_bandwidth_bytes_per_s"] = 0;
  CHECK_THAT(error_of(with_fabric(keys, 8)), Contains("'fabric.global_link_bandwidth_bytes_per_s'"));
  keys = torus_keys({4, 4});
  keys["link_latency_s"] = -1e-9;
  CHECK_THAT(error_of(with_fabric(keys, 16)), Contains("a number in [0, 1]"));
}
