// Loading, validating and writing back topology files; see topology.hpp for the data.
// Every key is required except "notes", "profile" and the dtypes under peak_flops_per_s (at
// least one).
// Nothing here knows about SimGrid: the platform is built from the returned struct in sim/.
#include "topology.hpp"

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
const std::vector<std::string> kFabricKinds = {"fat_tree", "rail_optimized"};

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

InterNodeFabric read_fabric(ObjectReader& top, int devices_per_node) {
  ObjectReader reader = top.get_object("fabric");
  InterNodeFabric fabric;
  fabric.kind = parse_fabric_kind(reader.get_enum("kind", kFabricKinds));
  fabric.nics_per_node = get_count(reader, "nics_per_node", 1);
  fabric.nic_bandwidth_bytes_per_s =
      reader.get_number_between("nic_bandwidth_bytes_per_s", kMinBandwidth, kMaxBandwidth);
  fabric.nic_latency_s = reader.get_number_between("nic_latency_s", 0, kMaxLatency);
  fabric.switch_latency_s = reader.get_number_between("switch_latency_s", 0, kMaxLatency);
  fabric.oversubscription = reader.get_number_between("oversubscription", 1, 1000);
  fabric.switch_radix = get_count(reader, "switch_radix", 2);
  reader.finish();
  // A rail joins device i of every node through NIC i, so there is one NIC per device.
  if (fabric.kind == FabricKind::rail_optimized && fabric.nics_per_node != devices_per_node) {
    reader.fail("nics_per_node", "rail_optimized needs one NIC per device",
                "node.devices_per_node (" + std::to_string(devices_per_node) +
                    ") for kind \"rail_optimized\", or kind \"fat_tree\"");
  }
  return fabric;
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
  for (Dtype dtype : {Dtype::int32, Dtype::int64}) {
    if (name == to_string(dtype)) return dtype;
  }
  return parse_dtype(name);
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
  }
  fail_invariant(__FILE__, __LINE__, "unknown FabricKind " + std::to_string(static_cast<int>(kind)));
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
  reader.finish();
  if (nodes_override) {
    if (*nodes_override < 1) {
      throw_input_error(file, "num_nodes", std::to_string(*nodes_override),
                        "out of range (set by --nodes)", "--nodes N with N >= 1");
    }
    topology.num_nodes = *nodes_override;
  }
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
        {"nic_latency_s", fabric.nic_latency_s},
        {"switch_latency_s", fabric.switch_latency_s},
        {"oversubscription", fabric.oversubscription},
        {"switch_radix", fabric.switch_radix}}}};
  if (!topology.profile.empty()) json["profile"] = topology.profile;
  return json;
}

}  // namespace stepcast
