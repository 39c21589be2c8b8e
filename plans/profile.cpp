// Device profiles: loading, checking against the topology, the roofline default.
#include "profile.hpp"

#include "errors.hpp"

namespace stepcast {

GemmEfficiency DeviceProfile::gemm_for(Dtype dtype) const {
  auto it = gemm.find(dtype);
  if (it != gemm.end()) return it->second;
  if (is_roofline) return GemmEfficiency{};
  throw InputError(file + ": key 'gemm." + to_string(dtype) + "': the profile has no GEMM figures " +
                   "for this dtype; valid: a profile measured with the plan's dtype");
}

DeviceProfile parse_profile(const Json& json, const std::string& file) {
  ObjectReader reader(json, file);
  DeviceProfile p;
  p.file = file;
  p.name = reader.get_string("name");
  reader.accept("notes");
  p.device = reader.get_string("device");
  p.backend = reader.get_enum("backend", {"datasheet", "cpu", "cuda"});
  ObjectReader gemm = reader.get_object("gemm");
  for (const char* name : {"fp64", "fp32", "tf32", "bf16", "fp16", "fp8"}) {
    if (!gemm.has(name)) {
      gemm.accept(name);
      continue;
    }
    ObjectReader g = gemm.get_object(name);
    GemmEfficiency e;
    e.peak_fraction = g.get_number_in("peak_fraction", 1e-3, 1.0, 1.0);
    e.overhead_s = g.get_number("overhead_s", 0, false);
    g.accept("notes");
    g.finish();
    p.gemm[*parse_dtype(name)] = e;
  }
  gemm.finish();
  if (p.gemm.empty()) reader.fail("gemm", "has no dtype", "figures for at least one dtype");
  ObjectReader flash = reader.get_object("flash_attention");
  p.flash_forward_peak_fraction = flash.get_number_in("forward_peak_fraction", 1e-3, 1.0, 1.0);
  p.flash_backward_peak_fraction = flash.get_number_in("backward_peak_fraction", 1e-3, 1.0, 1.0);
  flash.accept("notes");
  flash.finish();
  ObjectReader memory = reader.get_object("memory");
  p.memory_bandwidth_fraction = memory.get_number_in("bandwidth_fraction", 1e-3, 1.0, 1.0);
  p.kernel_overhead_s = memory.get_number("kernel_overhead_s", 0, false);
  memory.accept("notes");
  memory.finish();
  ObjectReader links = reader.get_object("links");
  p.intra_node_bus_fraction = links.get_number_in("intra_node_bus_fraction", 1e-3, 1.0, 1.0);
  p.inter_node_bus_fraction = links.get_number_in("inter_node_bus_fraction", 1e-3, 1.0, 1.0);
  links.accept("notes");
  links.finish();
  reader.finish();
  return p;
}

DeviceProfile load_profile(const std::string& path) {
  return parse_profile(load_json_file(path), path);
}

Json profile_to_json(const DeviceProfile& p) {
  Json gemm = Json::object();
  for (const auto& [dtype, e] : p.gemm) {
    gemm[to_string(dtype)] = {{"peak_fraction", e.peak_fraction}, {"overhead_s", e.overhead_s}};
  }
  return {{"name", p.name},
          {"device", p.device},
          {"backend", p.backend},
          {"roofline", p.is_roofline},
          {"gemm", gemm},
          {"flash_attention",
           {{"forward_peak_fraction", p.flash_forward_peak_fraction},
            {"backward_peak_fraction", p.flash_backward_peak_fraction}}},
          {"memory",
           {{"bandwidth_fraction", p.memory_bandwidth_fraction},
            {"kernel_overhead_s", p.kernel_overhead_s}}},
          {"links",
           {{"intra_node_bus_fraction", p.intra_node_bus_fraction},
            {"inter_node_bus_fraction", p.inter_node_bus_fraction}}}};
}

DeviceProfile roofline_profile(const Topology& topology) {
  DeviceProfile p;
  p.name = "roofline";
  p.file = "(no --profile)";
  p.device = topology.node.device.name;
  p.backend = "datasheet";
  p.is_roofline = true;
  return p;
}

void check_profile_matches(const DeviceProfile& profile, const Topology& topology) {
  if (profile.is_roofline || profile.device == topology.node.device.name) return;
  throw_input_error(profile.file, "device", "\"" + profile.device + "\"",
                    "is another device than topology " + topology.file + "'s node.device.name",
                    "a profile of \"" + topology.node.device.name + "\"");
}

Topology apply_link_fractions(const Topology& topology, const DeviceProfile& profile) {
  Topology t = topology;
  t.node.intra_node.bandwidth_bytes_per_s *= profile.intra_node_bus_fraction;
  t.fabric.nic_bandwidth_bytes_per_s *= profile.inter_node_bus_fraction;
  return t;
}

}  // namespace stepcast
