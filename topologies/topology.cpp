// Loading, validating and writing back topology files; see topology.hpp for the data.
// Every key is required except "notes", "profile", the dtypes under peak_flops_per_s (at least
// one), the device's power keys and fp8_columnwise, and "storage" and "heterogeneity"; fabric's
// keys beyond kind and the NIC's are those of its kind.
// Nothing here knows about SimGrid: the platform is built from the returned struct in sim/.
#include "topology.hpp"

#include <algorithm>
#include <cmath>
#include <climits>
#include <filesystem>
#include <iomanip>
#include <sstream>
#include <vector>

#include "errors.hpp"

namespace stepcast {

namespace {

constexpr Dtype kAllDtypes[] = {Dtype::fp64, Dtype::fp32, Dtype::tf32,
                                Dtype::bf16, Dtype::fp16, Dtype::fp8};

const std::vector<std::string> kIntraNodeKinds = {"nvswitch", "nvlink", "pcie", "shared_memory"};
const std::vector<std::string> kFabricKinds = {"fat_tree", "rail_optimized", "dragonfly", "torus"};
// The keys of fabric beyond kind and the NIC's (nics_per_node, nic_bandwidth_bytes_per_s,
// nic_latency_s), per kind: a key of another kind is refused by name.
const std::vector<std::string> kTreeKeys = {"switch_latency_s", "oversubscription", "switch_radix"};
const std::vector<std::string> kDragonflyKeys = {
    "switch_latency_s", "groups", "routers_per_group", "nodes_per_router",
    "local_link_bandwidth_bytes_per_s", "local_link_latency_s",
    "global_link_bandwidth_bytes_per_s", "global_link_latency_s"};
const std::vector<std::string> kTorusKeys = {"dimensions", "link_bandwidth_bytes_per_s", "link_latency_s"};

std::vector<std::string> dtype_names() {
  std::vector<std::string> names;
  for (Dtype dtype : kAllDtypes) names.push_back(to_string(dtype));
  return names;
}

std::string join(const std::vector<std::string>& words) {
  std::string out;
  for (size_t i = 0; i < words.size(); ++i) out += (i ? ", " : "") + words[i];
  return out;
}

std::string render_number(double value) {
  std::ostringstream out;
  out << std::setprecision(12) << value;
  return out.str();
}

// Counts are ints in the structs; reject what would not fit rather than wrap.
int get_count(ObjectReader& reader, const std::string& key, int min_value) {
  int64_t value = reader.get_int(key, min_value);
  if (value > INT_MAX) {
    reader.fail(key, "out of range", "an integer in [" + std::to_string(min_value) + ", " +
                                         std::to_string(INT_MAX) + "]");
  }
  return static_cast<int>(value);
}

std::string get_name(ObjectReader& reader, const std::string& key) {
  std::string name = reader.get_string(key);
  if (name.empty()) reader.fail(key, "empty name", "a non-empty string");
  return name;
}

IntraNodeKind parse_intra_node_kind(const std::string& name) {
  if (name == "nvswitch") return IntraNodeKind::nvswitch;
  if (name == "nvlink") return IntraNodeKind::nvlink;
  if (name == "pcie") return IntraNodeKind::pcie;
  if (name == "shared_memory") return IntraNodeKind::shared_memory;
  fail_invariant(__FILE__, __LINE__, "intra-node kind not checked by get_enum: " + name);
}

FabricKind parse_fabric_kind(const std::string& name) {
  if (name == "fat_tree") return FabricKind::fat_tree;
  if (name == "rail_optimized") return FabricKind::rail_optimized;
  if (name == "dragonfly") return FabricKind::dragonfly;
  if (name == "torus") return FabricKind::torus;
  fail_invariant(__FILE__, __LINE__, "fabric kind not checked by get_enum: " + name);
}

// What a described machine can be: far outside these a figure is a typo or a unit slip, and
// the simulator's clock (doubles in seconds) would overflow or stall on it. A core of a small CPU
// does ~1e9 flop/s, the largest accelerators ~1e16; links and memories from kB/s to PB/s.
constexpr double kMinPeak = 1e6, kMaxPeak = 1e18;
constexpr double kMinBytes = 1e6, kMaxBytes = 1e15;
constexpr double kMinBandwidth = 1e3, kMaxBandwidth = 1e15;
constexpr double kMaxLatency = 1.0;

std::map<Dtype, double> read_peaks(ObjectReader& device) {
  ObjectReader peaks = device.get_object("peak_flops_per_s");
  // All dtype names are valid keys, so a misspelt one is answered with the closest dtype.
  peaks.accept_any_of(dtype_names());
  std::map<Dtype, double> out;
  for (Dtype dtype : kAllDtypes) {
    if (peaks.has(to_string(dtype))) out[dtype] = peaks.get_number_between(to_string(dtype), kMinPeak, kMaxPeak);
  }
  peaks.finish();
  if (out.empty()) {
    device.fail("peak_flops_per_s", "no dtype given",
                "an object with at least one of " + join(dtype_names()) + ", each in [1e6, 1e18] flop/s");
  }
  return out;
}

// power_idle_w, power_busy_w and power_source: all three or none; 0 <= idle <= busy (a board's
// power is below 10 kW: a larger figure is a unit slip).
void read_power(ObjectReader& reader, DeviceSpec& device) {
  const char* keys[] = {"power_idle_w", "power_busy_w", "power_source"};
  int present = 0;
  for (const char* key : keys) present += reader.has(key) ? 1 : 0;
  if (present == 0) return;
  for (const char* key : keys) {
    if (!reader.has(key)) {
      reader.fail(key, "missing required key (the device gives some of its power figures)",
                  "all of power_idle_w, power_busy_w (watts per device) and power_source, or none");
    }
  }
  device.power_idle_w = reader.get_number_between("power_idle_w", 0, 1e4);
  device.power_busy_w = reader.get_number_in("power_busy_w", 0, 1e4, 0);
  if (!(device.power_busy_w > 0)) reader.fail("power_busy_w", "out of range", "a number of watts in (0, 10000]");
  if (device.power_busy_w < device.power_idle_w) {
    reader.fail("power_busy_w", "below power_idle_w = " + render_number(device.power_idle_w),
                "power_busy_w >= power_idle_w");
  }
  device.power_source = reader.get_string("power_source");
  if (device.power_source.empty()) {
    reader.fail("power_source", "is empty", "where the power figures come from (a datasheet, a measurement)");
  }
}

DeviceSpec read_device(ObjectReader& node) {
  ObjectReader reader = node.get_object("device");
  DeviceSpec device;
  device.name = get_name(reader, "name");
  device.peak_flops_per_s = read_peaks(reader);
  device.memory_bytes = reader.get_number_between("memory_bytes", kMinBytes, kMaxBytes);
  device.memory_bandwidth_bytes_per_s =
      reader.get_number_between("memory_bandwidth_bytes_per_s", kMinBandwidth, kMaxBandwidth);
  device.runtime_allowance_bytes = reader.get_number_between("runtime_allowance_bytes", 0, kMaxBytes);
  device.memory_reserved_bytes = reader.get_number_between("memory_reserved_bytes", 0, kMaxBytes);
  read_power(reader, device);
  device.fp8_transposed_copies =
      reader.get_enum_or("fp8_columnwise", {"native", "transposed"}, "native") == "transposed";
  device.mxfp8 = reader.get_bool_or("mxfp8", false);
  device.fp8_blockwise = reader.get_bool_or("fp8_blockwise", false);
  reader.finish();
  // Something must be left for weights, gradients, optimizer state and activations.
  if (device.runtime_allowance_bytes + device.memory_reserved_bytes >= device.memory_bytes) {
    reader.fail("memory_reserved_bytes",
                "runtime_allowance_bytes + memory_reserved_bytes = " +
                    render_number(device.runtime_allowance_bytes + device.memory_reserved_bytes) +
                    " leaves nothing of memory_bytes = " + render_number(device.memory_bytes),
                "runtime_allowance_bytes + memory_reserved_bytes < memory_bytes");
  }
  return device;
}

IntraNodeFabric read_intra_node(ObjectReader& node) {
  ObjectReader reader = node.get_object("intra_node");
  IntraNodeFabric fabric;
  fabric.kind = parse_intra_node_kind(reader.get_enum("kind", kIntraNodeKinds));
  fabric.bandwidth_bytes_per_s =
      reader.get_number_between("bandwidth_bytes_per_s", kMinBandwidth, kMaxBandwidth);
  fabric.latency_s = reader.get_number_between("latency_s", 0, kMaxLatency);
  reader.finish();
  return fabric;
}

NodeSpec read_node(ObjectReader& top) {
  ObjectReader reader = top.get_object("node");
  NodeSpec node;
  node.devices_per_node = get_count(reader, "devices_per_node", 1);
  node.device = read_device(reader);
  node.intra_node = read_intra_node(reader);
  reader.finish();
  return node;
}

const std::vector<std::string>& keys_of(FabricKind kind) {
  if (kind == FabricKind::dragonfly) return kDragonflyKeys;
  if (kind == FabricKind::torus) return kTorusKeys;
  return kTreeKeys;
}

DragonflyFabric read_dragonfly(ObjectReader& reader) {
  DragonflyFabric dragonfly;
  // The simulator draws every global and local link: g(g-1)/2 + g·r(r-1)/2 of them. The bounds
  // keep that buildable and are above built machines (a Cray XC group has 96 Aries routers).
  auto bounded = [&reader](const std::string& key, int max_value) {
    int value = get_count(reader, key, 1);
    if (value > max_value) {
      reader.fail(key, "out of range", "an integer in [1, " + std::to_string(max_value) + "]");
    }
    return value;
  };
  dragonfly.groups = bounded("groups", 1024);
  dragonfly.routers_per_group = bounded("routers_per_group", 256);
  dragonfly.nodes_per_router = get_count(reader, "nodes_per_router", 1);
  dragonfly.local_link_bandwidth_bytes_per_s =
      reader.get_number_between("local_link_bandwidth_bytes_per_s", kMinBandwidth, kMaxBandwidth);
  dragonfly.local_link_latency_s = reader.get_number_between("local_link_latency_s", 0, kMaxLatency);
  dragonfly.global_link_bandwidth_bytes_per_s =
      reader.get_number_between("global_link_bandwidth_bytes_per_s", kMinBandwidth, kMaxBandwidth);
  dragonfly.global_link_latency_s = reader.get_number_between("global_link_latency_s", 0, kMaxLatency);
  return dragonfly;
}

TorusFabric read_torus(ObjectReader& reader) {
  TorusFabric torus;
  const std::string valid = "a list of 2 or 3 ring sizes, each an integer in [1, " +
                            std::to_string(INT_MAX) + "], e.g. [4, 4, 4]";
  // Elements that are not integers >= 1 are refused by get_int_list, naming the element.
  for (int64_t size : reader.get_int_list("dimensions", 1)) {
    if (size > INT_MAX) reader.fail("dimensions", "a ring size of " + std::to_string(size), valid);
    torus.dimensions.push_back(static_cast<int>(size));
  }
  if (torus.dimensions.size() < 2 || torus.dimensions.size() > 3) {
    const size_t count = torus.dimensions.size();
    reader.fail("dimensions", std::to_string(count) + (count == 1 ? " dimension" : " dimensions"), valid);
  }
  torus.link_bandwidth_bytes_per_s =
      reader.get_number_between("link_bandwidth_bytes_per_s", kMinBandwidth, kMaxBandwidth);
  torus.link_latency_s = reader.get_number_between("link_latency_s", 0, kMaxLatency);
  return torus;
}

InterNodeFabric read_fabric(ObjectReader& top, int devices_per_node) {
  ObjectReader reader = top.get_object("fabric");
  InterNodeFabric fabric;
  fabric.kind = parse_fabric_kind(reader.get_enum("kind", kFabricKinds));
  fabric.nics_per_node = get_count(reader, "nics_per_node", 1);
  fabric.nic_bandwidth_bytes_per_s =
      reader.get_number_between("nic_bandwidth_bytes_per_s", kMinBandwidth, kMaxBandwidth);
  fabric.nic_latency_s = reader.get_number_between("nic_latency_s", 0, kMaxLatency);
  // A key of another kind (switch_radix in a torus) is a mix-up, not a typo: say so.
  for (FabricKind kind : {FabricKind::fat_tree, FabricKind::dragonfly, FabricKind::torus}) {
    for (const std::string& key : keys_of(kind)) {
      const auto& own = keys_of(fabric.kind);
      if (!reader.has(key) || std::find(own.begin(), own.end(), key) != own.end()) continue;
      reader.fail(key, std::string("not a key of kind \"") + to_string(fabric.kind) + "\"",
                  "the keys of \"" + std::string(to_string(fabric.kind)) +
                      "\": kind, nics_per_node, nic_bandwidth_bytes_per_s, nic_latency_s, " +
                      join(own));
    }
  }
  if (is_switch_tree(fabric.kind)) {
    fabric.switch_latency_s = reader.get_number_between("switch_latency_s", 0, kMaxLatency);
    fabric.oversubscription = reader.get_number_between("oversubscription", 1, 1000);
    fabric.switch_radix = get_count(reader, "switch_radix", 2);
  } else if (fabric.kind == FabricKind::dragonfly) {
    fabric.switch_latency_s = reader.get_number_between("switch_latency_s", 0, kMaxLatency);
    fabric.dragonfly = read_dragonfly(reader);
  } else {
    fabric.torus = read_torus(reader);
  }
  reader.finish();
  // A rail joins device i of every node through NIC i, so there is one NIC per device.
  if (fabric.kind == FabricKind::rail_optimized && fabric.nics_per_node != devices_per_node) {
    reader.fail("nics_per_node", "rail_optimized needs one NIC per device",
                "node.devices_per_node (" + std::to_string(devices_per_node) +
                    ") for kind \"rail_optimized\", or kind \"fat_tree\"");
  }
  return fabric;
}

std::string render_dimensions(const std::vector<int>& dimensions) {
  std::string out = "[";
  for (size_t i = 0; i < dimensions.size(); ++i) out += (i ? ", " : "") + std::to_string(dimensions[i]);
  return out + "]";
}

// The dragonfly's and the torus's sizes must place exactly num_nodes nodes (after --nodes).
void check_fabric_size(const Topology& topology, bool nodes_overridden) {
  const InterNodeFabric& fabric = topology.fabric;
  // Products are capped past INT_MAX (every size is an int, so nothing overflows on the way).
  constexpr int64_t kTooMany = int64_t(INT_MAX) + 1;
  auto nodes_text = [&](int64_t product) {
    return (product >= kTooMany ? "more than " + std::to_string(INT_MAX) : std::to_string(product)) +
           " nodes, not num_nodes = " + std::to_string(topology.num_nodes) +
           (nodes_overridden ? " (set by --nodes)" : "");
  };
  const std::string valid_product = "whose product is num_nodes, " + std::to_string(topology.num_nodes);
  if (fabric.kind == FabricKind::torus) {
    int64_t product = 1;
    std::string formula;
    for (int size : fabric.torus.dimensions) {
      product = std::min(product * size, kTooMany);
      formula += (formula.empty() ? "" : " x ") + std::to_string(size);
    }
    if (product != topology.num_nodes) {
      throw_input_error(topology.file, "fabric.dimensions", render_dimensions(fabric.torus.dimensions),
                        "a torus of " + formula + " = " + nodes_text(product),
                        "2 or 3 ring sizes " + valid_product);
    }
  } else if (fabric.kind == FabricKind::dragonfly) {
    const DragonflyFabric& d = fabric.dragonfly;
    const int64_t product =
        std::min(std::min(int64_t(d.groups) * d.routers_per_group, kTooMany) * d.nodes_per_router, kTooMany);
    if (product != topology.num_nodes) {
      throw_input_error(topology.file, "fabric.groups", std::to_string(d.groups),
                        "groups x routers_per_group x nodes_per_router = " + std::to_string(d.groups) +
                            " x " + std::to_string(d.routers_per_group) + " x " +
                            std::to_string(d.nodes_per_router) + " = " + nodes_text(product),
                        "groups, routers_per_group and nodes_per_router " + valid_product);
    }
  }
}

}  // namespace

const char* to_string(Dtype dtype) {
  switch (dtype) {
    case Dtype::fp64: return "fp64";
    case Dtype::fp32: return "fp32";
    case Dtype::tf32: return "tf32";
    case Dtype::bf16: return "bf16";
    case Dtype::fp16: return "fp16";
    case Dtype::fp8: return "fp8";
    case Dtype::int32: return "int32";
    case Dtype::int64: return "int64";
    case Dtype::u8: return "u8";
    case Dtype::fp8_e4m3: return "fp8_e4m3";
    case Dtype::fp8_e5m2: return "fp8_e5m2";
    case Dtype::mxfp8_e4m3: return "mxfp8_e4m3";
    case Dtype::mxfp8_e5m2: return "mxfp8_e5m2";
    case Dtype::fp8_block_e4m3: return "fp8_block_e4m3";
    case Dtype::fp8_block_e5m2: return "fp8_block_e5m2";
    case Dtype::fp8_tile_e4m3: return "fp8_tile_e4m3";
  }
  fail_invariant(__FILE__, __LINE__, "unknown Dtype " + std::to_string(static_cast<int>(dtype)));
}

int dtype_bytes(Dtype dtype) {
  switch (dtype) {
    case Dtype::fp64: return 8;
    case Dtype::fp32: return 4;
    case Dtype::tf32: return 4;
    case Dtype::bf16: return 2;
    case Dtype::fp16: return 2;
    case Dtype::fp8: return 1;
    case Dtype::int32: return 4;
    case Dtype::int64: return 8;
    case Dtype::u8: return 1;
    case Dtype::fp8_e4m3: return 1;
    case Dtype::fp8_e5m2: return 1;
    case Dtype::mxfp8_e4m3: return 1;
    case Dtype::mxfp8_e5m2: return 1;
    case Dtype::fp8_block_e4m3: return 1;
    case Dtype::fp8_block_e5m2: return 1;
    case Dtype::fp8_tile_e4m3: return 1;
  }
  fail_invariant(__FILE__, __LINE__, "unknown Dtype " + std::to_string(static_cast<int>(dtype)));
}

std::optional<Dtype> parse_dtype(const std::string& name) {
  for (Dtype dtype : kAllDtypes) {
    if (name == to_string(dtype)) return dtype;
  }
  return std::nullopt;
}

std::optional<Dtype> parse_buffer_dtype(const std::string& name) {
  for (Dtype dtype : {Dtype::int32, Dtype::int64, Dtype::u8, Dtype::fp8_e4m3, Dtype::fp8_e5m2, Dtype::mxfp8_e4m3,
                      Dtype::mxfp8_e5m2, Dtype::fp8_block_e4m3, Dtype::fp8_block_e5m2, Dtype::fp8_tile_e4m3}) {
    if (name == to_string(dtype)) return dtype;
  }
  return parse_dtype(name);
}

bool is_fp8_storage(Dtype dtype) {
  return dtype == Dtype::fp8_e4m3 || dtype == Dtype::fp8_e5m2 || is_block_scaled(dtype);
}

bool is_mx_storage(Dtype dtype) { return dtype == Dtype::mxfp8_e4m3 || dtype == Dtype::mxfp8_e5m2; }

bool is_block_scaled(Dtype dtype) {
  return is_mx_storage(dtype) || dtype == Dtype::fp8_block_e4m3 || dtype == Dtype::fp8_block_e5m2 ||
         dtype == Dtype::fp8_tile_e4m3;
}

double storage_bytes(Dtype dtype, double elements) {
  // Scale bytes (fp8.hpp's block_bytes): an E8M0 byte per 32, an fp32 per 128 (both 1/32 an
  // element), an fp32 per 128×128 tile; whole bytes, for a layer's copy whose tensors are blocked
  // one by one among unscaled ones (norms, biases).
  const double per_byte = dtype == Dtype::fp8_tile_e4m3 ? 4096 : 32;
  return elements * dtype_bytes(dtype) + (is_block_scaled(dtype) ? std::ceil(elements / per_byte) : 0.0);
}

const char* to_string(IntraNodeKind kind) {
  switch (kind) {
    case IntraNodeKind::nvswitch: return "nvswitch";
    case IntraNodeKind::nvlink: return "nvlink";
    case IntraNodeKind::pcie: return "pcie";
    case IntraNodeKind::shared_memory: return "shared_memory";
  }
  fail_invariant(__FILE__, __LINE__,
                 "unknown IntraNodeKind " + std::to_string(static_cast<int>(kind)));
}

const char* to_string(FabricKind kind) {
  switch (kind) {
    case FabricKind::fat_tree: return "fat_tree";
    case FabricKind::rail_optimized: return "rail_optimized";
    case FabricKind::dragonfly: return "dragonfly";
    case FabricKind::torus: return "torus";
  }
  fail_invariant(__FILE__, __LINE__, "unknown FabricKind " + std::to_string(static_cast<int>(kind)));
}

bool is_switch_tree(FabricKind kind) {
  return kind == FabricKind::fat_tree || kind == FabricKind::rail_optimized;
}

double DeviceSpec::peak_for(Dtype dtype, const std::string& topology_file) const {
  auto it = peak_flops_per_s.find(dtype);
  if (it != peak_flops_per_s.end()) return it->second;
  std::vector<std::string> present;
  for (const auto& [have, peak] : peak_flops_per_s) present.push_back(to_string(have));
  throw_input_error(topology_file, std::string("node.device.peak_flops_per_s.") + to_string(dtype),
                    "", "device '" + name + "' has no " + to_string(dtype) + " peak",
                    "a dtype the device has (" + join(present) + "), or add this key");
}

namespace {

StorageSpec read_storage(ObjectReader& top) {
  constexpr double kMaxStorageBandwidth = 1e15;  // 1 PB/s: past any file system
  ObjectReader reader = top.get_object("storage");
  StorageSpec s;
  s.node_write_bandwidth_bytes_per_s = reader.get_number_between("node_write_bandwidth_bytes_per_s", 1, kMaxStorageBandwidth);
  s.node_read_bandwidth_bytes_per_s = reader.get_number_between("node_read_bandwidth_bytes_per_s", 1, kMaxStorageBandwidth);
  s.aggregate_write_bandwidth_bytes_per_s = reader.get_number_in("aggregate_write_bandwidth_bytes_per_s", 1, kMaxStorageBandwidth, 0);
  s.aggregate_read_bandwidth_bytes_per_s = reader.get_number_in("aggregate_read_bandwidth_bytes_per_s", 1, kMaxStorageBandwidth, 0);
  s.device_to_host_bandwidth_bytes_per_s = reader.get_number_in("device_to_host_bandwidth_bytes_per_s", 1, kMaxStorageBandwidth, 0);
  s.source = reader.get_string("source");
  if (s.source.empty()) reader.fail("source", "is empty", "where the figures come from (a datasheet, a paper)");
  reader.finish();
  return s;
}

}  // namespace

Topology parse_topology(const Json& json, const std::string& file,
                        std::optional<int> nodes_override) {
  ObjectReader reader(json, file);
  Topology topology;
  topology.file = file;
  topology.name = get_name(reader, "name");
  reader.get_string_or("notes", "");  // sources, for people; not used by stepcast
  topology.profile = reader.get_string_or("profile", "");
  if (reader.has("profile") && topology.profile.empty()) {
    reader.fail("profile", "is empty", "a path to a device profile, relative to this file's folder");
  }
  if (!topology.profile.empty()) {
    std::filesystem::path path(topology.profile);
    topology.profile_file =
        path.is_absolute() ? path.string()
                           : (std::filesystem::path(file).parent_path() / path).lexically_normal().string();
  }
  topology.num_nodes = get_count(reader, "num_nodes", 1);
  topology.node = read_node(reader);
  topology.fabric = read_fabric(reader, topology.node.devices_per_node);
  if (reader.has("storage")) topology.storage = read_storage(reader);
  if (reader.has("heterogeneity")) {
    reader.accept("heterogeneity");
    topology.heterogeneity = parse_heterogeneity(json.at("heterogeneity"), file);
  }
  reader.finish();
  if (nodes_override) {
    if (*nodes_override < 1) {
      throw_input_error(file, "num_nodes", std::to_string(*nodes_override),
                        "out of range (set by --nodes)", "--nodes N with N >= 1");
    }
    topology.num_nodes = *nodes_override;
  }
  check_fabric_size(topology, nodes_override.has_value());
  check_heterogeneity(topology.heterogeneity, file, topology.num_nodes, topology.node.devices_per_node,
                      nodes_override.has_value());
  return topology;
}

Topology load_topology(const std::string& path, std::optional<int> nodes_override) {
  return parse_topology(load_json_file(path), path, nodes_override);
}

Json topology_to_json(const Topology& topology) {
  const DeviceSpec& device = topology.node.device;
  Json peaks = Json::object();
  for (const auto& [dtype, peak] : device.peak_flops_per_s) peaks[to_string(dtype)] = peak;
  const IntraNodeFabric& intra = topology.node.intra_node;
  const InterNodeFabric& fabric = topology.fabric;
  Json json{
      {"name", topology.name},
      {"num_nodes", topology.num_nodes},
      {"node",
       {{"devices_per_node", topology.node.devices_per_node},
        {"device",
         {{"name", device.name},
          {"peak_flops_per_s", peaks},
          {"memory_bytes", device.memory_bytes},
          {"memory_bandwidth_bytes_per_s", device.memory_bandwidth_bytes_per_s},
          {"runtime_allowance_bytes", device.runtime_allowance_bytes},
          {"memory_reserved_bytes", device.memory_reserved_bytes}}},
        {"intra_node",
         {{"kind", to_string(intra.kind)},
          {"bandwidth_bytes_per_s", intra.bandwidth_bytes_per_s},
          {"latency_s", intra.latency_s}}}}},
      {"fabric",
       {{"kind", to_string(fabric.kind)},
        {"nics_per_node", fabric.nics_per_node},
        {"nic_bandwidth_bytes_per_s", fabric.nic_bandwidth_bytes_per_s},
        {"nic_latency_s", fabric.nic_latency_s}}}};
  // Absent: native (programs of other devices keep their bytes and hash).
  if (device.fp8_transposed_copies) json["node"]["device"]["fp8_columnwise"] = "transposed";
  if (device.mxfp8) json["node"]["device"]["mxfp8"] = true;
  if (device.fp8_blockwise) json["node"]["device"]["fp8_blockwise"] = true;
  Json& out = json["fabric"];
  if (is_switch_tree(fabric.kind)) {
    out["switch_latency_s"] = fabric.switch_latency_s;
    out["oversubscription"] = fabric.oversubscription;
    out["switch_radix"] = fabric.switch_radix;
  } else if (fabric.kind == FabricKind::dragonfly) {
    const DragonflyFabric& d = fabric.dragonfly;
    out["switch_latency_s"] = fabric.switch_latency_s;
    out["groups"] = d.groups;
    out["routers_per_group"] = d.routers_per_group;
    out["nodes_per_router"] = d.nodes_per_router;
    out["local_link_bandwidth_bytes_per_s"] = d.local_link_bandwidth_bytes_per_s;
    out["local_link_latency_s"] = d.local_link_latency_s;
    out["global_link_bandwidth_bytes_per_s"] = d.global_link_bandwidth_bytes_per_s;
    out["global_link_latency_s"] = d.global_link_latency_s;
  } else {
    out["dimensions"] = fabric.torus.dimensions;
    out["link_bandwidth_bytes_per_s"] = fabric.torus.link_bandwidth_bytes_per_s;
    out["link_latency_s"] = fabric.torus.link_latency_s;
  }
  if (!topology.profile.empty()) json["profile"] = topology.profile;
  // Only where given, so that the programs of uniform topologies keep their bytes (and hashes).
  if (!topology.heterogeneity.empty()) json["heterogeneity"] = heterogeneity_to_json(topology.heterogeneity);
  return json;
}

}  // namespace stepcast
