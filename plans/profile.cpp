// Device profiles: loading and writing (with the optional measured tables), checking against the
// topology, the roofline default, and the α-β fits of measured transfers.
#include "profile.hpp"

#include <cmath>
#include <filesystem>

#include "collective.hpp"
#include "errors.hpp"

namespace stepcast {

GemmEfficiency DeviceProfile::gemm_for(Dtype dtype) const {
  auto it = gemm.find(dtype);
  if (it != gemm.end()) return it->second;
  if (is_roofline) return GemmEfficiency{};
  throw InputError(file + ": key 'gemm." + to_string(dtype) + "': the profile has no GEMM figures " +
                   "for this dtype; valid: a profile measured with the plan's dtype");
}

namespace {

const std::vector<std::string> kGemmVariants = {"forward", "dgrad", "wgrad"};
const std::vector<std::string> kCollectiveKinds = {"all_reduce", "reduce_scatter", "all_gather"};
const std::vector<std::string> kCollectiveAlgorithms = {"ring", "tree", "mpi"};

// The array at `key` of `parent` (read through `reader`), each element handed to `read_one`
// with an ObjectReader prefixed "KEY[i].".
template <class F>
void read_points(ObjectReader& reader, const Json& parent, const std::string& key, F read_one) {
  if (!reader.has(key)) {
    reader.accept(key);
    return;
  }
  reader.accept(key);
  const Json& list = parent.at(key);
  if (!list.is_array()) {
    reader.fail(key, "must be a JSON array", "[{...}, ...]");
  }
  for (size_t i = 0; i < list.size(); ++i) {
    ObjectReader point(list[i], reader.file(), reader.key_path(key) + "[" + std::to_string(i) + "].");
    read_one(point);
    point.finish();
  }
}

MeasuredTables parse_measured(ObjectReader& reader, const Json& json) {
  MeasuredTables t;
  t.dtype = *parse_dtype(reader.get_enum("dtype", {"fp64", "fp32"}));
  if (reader.has("method")) t.method = json.at("method");
  if (reader.has("fits")) t.fits = json.at("fits");
  reader.accept("method");
  reader.accept("fits");
  read_points(reader, json, "gemm_points", [&](ObjectReader& p) {
    GemmPoint g;
    g.variant = p.get_enum("variant", kGemmVariants);
    g.m = p.get_int("m", 1);
    g.n = p.get_int("n", 1);
    g.k = p.get_int("k", 1);
    g.time_s = p.get_number("time_s", 0, true);
    p.accept("flops_per_s");  // derived: flops / time_s
    t.gemm.push_back(g);
  });
  read_points(reader, json, "memory_points", [&](ObjectReader& p) {
    MemoryPoint m;
    m.family = p.get_string("family");
    m.bytes = p.get_number("bytes", 0, true);
    m.time_s = p.get_number("time_s", 0, true);
    p.accept("bandwidth_bytes_per_s");  // derived: bytes / time_s
    t.memory.push_back(m);
  });
  read_points(reader, json, "collective_points", [&](ObjectReader& p) {
    CollectivePoint c;
    c.kind = p.get_enum("kind", kCollectiveKinds);
    c.algorithm = p.get_enum("algorithm", kCollectiveAlgorithms);
    c.group_size = p.get_int("group_size", 2);
    c.bytes = p.get_number("bytes", 0, true);
    c.time_s = p.get_number("time_s", 0, true);
    c.algbw_bytes_per_s = p.get_number("algbw_bytes_per_s", 0, true);
    c.busbw_bytes_per_s = p.get_number("busbw_bytes_per_s", 0, true);
    t.collectives.push_back(c);
  });
  read_points(reader, json, "p2p_points", [&](ObjectReader& p) {
    P2pPoint q;
    q.bytes = p.get_number("bytes", 0, true);
    q.time_s = p.get_number("time_s", 0, true);
    p.accept("bandwidth_bytes_per_s");  // derived: bytes / time_s
    t.p2p.push_back(q);
  });
  reader.finish();
  return t;
}

std::optional<double> optional_number(ObjectReader& reader, const std::string& key, bool exclusive) {
  if (!reader.has(key)) {
    reader.accept(key);
    return std::nullopt;
  }
  return reader.get_number(key, 0, exclusive);
}

}  // namespace

DeviceProfile parse_profile(const Json& json, const std::string& file) {
  ObjectReader reader(json, file);
  DeviceProfile p;
  p.file = file;
  p.name = reader.get_string("name");
  p.notes = reader.get_string_or("notes", "");
  p.device = reader.get_string("device");
  p.backend = reader.get_enum("backend", {"datasheet", "cpu", "cuda"});
  p.is_roofline = reader.get_bool_or("roofline", false);
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
  if (p.gemm.empty() && !p.is_roofline) reader.fail("gemm", "has no dtype", "figures for at least one dtype");
  if (reader.has("gemm_tiling")) {
    ObjectReader t = reader.get_object("gemm_tiling");
    GemmTiling tiling;
    tiling.sm_count = t.get_int("sm_count", 1);
    tiling.tile_m = t.get_int("tile_m", 1);
    tiling.tile_n = t.get_int("tile_n", 1);
    t.accept("notes");
    t.finish();
    p.gemm_tiling = tiling;
  } else {
    reader.accept("gemm_tiling");
  }
  ObjectReader flash = reader.get_object("flash_attention");
  p.flash_forward_peak_fraction = flash.get_number_in("forward_peak_fraction", 1e-3, 1.0, 1.0);
  p.flash_backward_peak_fraction = flash.get_number_in("backward_peak_fraction", 1e-3, 1.0, 1.0);
  flash.accept("notes");
  flash.finish();
  ObjectReader memory = reader.get_object("memory");
  p.memory_bandwidth_fraction = memory.get_number_in("bandwidth_fraction", 1e-3, 1.0, 1.0);
  p.kernel_overhead_s = memory.get_number("kernel_overhead_s", 0, false);
  p.memory_bandwidth_bytes_per_s = optional_number(memory, "bandwidth_bytes_per_s", true);
  memory.accept("notes");
  memory.finish();
  ObjectReader links = reader.get_object("links");
  p.intra_node_bus_fraction = links.get_number_in("intra_node_bus_fraction", 1e-3, 1.0, 1.0);
  p.inter_node_bus_fraction = links.get_number_in("inter_node_bus_fraction", 1e-3, 1.0, 1.0);
  p.intra_node_bandwidth_bytes_per_s = optional_number(links, "intra_node_bandwidth_bytes_per_s", true);
  p.intra_node_latency_s = optional_number(links, "intra_node_latency_s", false);
  links.accept("notes");
  links.finish();
  if (reader.has("execution")) {
    ObjectReader e = reader.get_object("execution");
    p.execution_in_order = e.get_bool_or("in_order", false);
    p.execution_staged_sends = e.get_bool_or("staged_sends", false);
    e.accept("notes");
    e.finish();
    if (p.execution_staged_sends && !p.execution_in_order) {
      reader.fail("execution", "staged_sends needs in_order", "\"in_order\": true, or no staged_sends");
    }
  } else {
    reader.accept("execution");
  }
  if (reader.has("machine")) {
    ObjectReader m = reader.get_object("machine");
    MachineInfo info;
    info.hostname = m.get_string_or("hostname", "");
    info.cpu_model = m.get_string_or("cpu_model", "");
    info.cores = m.get_int_or("cores", 0, 0);
    m.finish();
    p.machine = info;
  } else {
    reader.accept("machine");
  }
  if (reader.has("libraries")) {
    reader.accept("libraries");
    const Json& libraries = json.at("libraries");
    if (!libraries.is_object()) reader.fail("libraries", "must be a JSON object", "{\"name\": \"version\"}");
    for (const auto& [name, version] : libraries.items()) {
      if (!version.is_string()) reader.fail("libraries", "versions must be strings", "{\"name\": \"version\"}");
      p.libraries[name] = version.get<std::string>();
    }
  } else {
    reader.accept("libraries");
  }
  if (reader.has("measured")) {
    ObjectReader measured = reader.get_object("measured");
    p.measured = parse_measured(measured, json.at("measured"));
  } else {
    reader.accept("measured");
  }
  reader.finish();
  return p;
}

DeviceProfile load_profile(const std::string& path) {
  return parse_profile(load_json_file(path), path);
}

namespace {

Json measured_to_json(const MeasuredTables& t) {
  Json gemm = Json::array(), memory = Json::array(), collectives = Json::array(), p2p = Json::array();
  for (const GemmPoint& g : t.gemm) {
    gemm.push_back({{"variant", g.variant}, {"m", g.m}, {"n", g.n}, {"k", g.k}, {"time_s", g.time_s},
                    {"flops_per_s", g.flops() / g.time_s}});
  }
  for (const MemoryPoint& m : t.memory) {
    memory.push_back({{"family", m.family}, {"bytes", m.bytes}, {"time_s", m.time_s},
                      {"bandwidth_bytes_per_s", m.bytes / m.time_s}});
  }
  for (const CollectivePoint& c : t.collectives) {
    collectives.push_back({{"kind", c.kind}, {"algorithm", c.algorithm}, {"group_size", c.group_size},
                           {"bytes", c.bytes}, {"time_s", c.time_s},
                           {"algbw_bytes_per_s", c.algbw_bytes_per_s},
                           {"busbw_bytes_per_s", c.busbw_bytes_per_s}});
  }
  for (const P2pPoint& q : t.p2p) {
    p2p.push_back({{"bytes", q.bytes}, {"time_s", q.time_s}, {"bandwidth_bytes_per_s", q.bytes / q.time_s}});
  }
  return {{"dtype", to_string(t.dtype)}, {"method", t.method},         {"fits", t.fits},
          {"gemm_points", gemm},         {"memory_points", memory},    {"collective_points", collectives},
          {"p2p_points", p2p}};
}

}  // namespace

Json profile_to_json(const DeviceProfile& p) {
  Json gemm = Json::object();
  for (const auto& [dtype, e] : p.gemm) {
    gemm[to_string(dtype)] = {{"peak_fraction", e.peak_fraction}, {"overhead_s", e.overhead_s}};
  }
  Json json = {{"name", p.name},
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
  // Optional parts only where present, so datasheet profiles print as they always did.
  if (!p.notes.empty()) json["notes"] = p.notes;
  if (p.memory_bandwidth_bytes_per_s) json["memory"]["bandwidth_bytes_per_s"] = *p.memory_bandwidth_bytes_per_s;
  if (p.intra_node_bandwidth_bytes_per_s) {
    json["links"]["intra_node_bandwidth_bytes_per_s"] = *p.intra_node_bandwidth_bytes_per_s;
  }
  if (p.intra_node_latency_s) json["links"]["intra_node_latency_s"] = *p.intra_node_latency_s;
  if (p.execution_in_order) {
    json["execution"] = {{"in_order", true}, {"staged_sends", p.execution_staged_sends}};
  }
  if (p.machine) {
    json["machine"] = {{"hostname", p.machine->hostname},
                       {"cpu_model", p.machine->cpu_model},
                       {"cores", p.machine->cores}};
  }
  if (!p.libraries.empty()) json["libraries"] = p.libraries;
  if (p.gemm_tiling) {
    json["gemm_tiling"] = {{"sm_count", p.gemm_tiling->sm_count},
                           {"tile_m", p.gemm_tiling->tile_m},
                           {"tile_n", p.gemm_tiling->tile_n}};
  }
  if (p.measured) json["measured"] = measured_to_json(*p.measured);
  return json;
}

DeviceProfile roofline_profile(const Topology& topology) {
  DeviceProfile p;
  p.name = "roofline";
  p.file = "roofline";
  p.device = topology.node.device.name;
  p.backend = "datasheet";
  p.is_roofline = true;
  return p;
}

bool topology_device_is_cpu(const Topology& topology) {
  return topology.node.device.name.rfind("cpu", 0) == 0 ||
         topology.node.intra_node.kind == IntraNodeKind::shared_memory;
}

void check_profile_matches(const DeviceProfile& profile, const Topology& topology,
                           bool allow_mismatch) {
  if (profile.is_roofline) return;
  const std::string& device = topology.node.device.name;
  bool cpu_topology = topology_device_is_cpu(topology);
  if ((profile.backend == "cpu" && !cpu_topology) || (profile.backend == "cuda" && cpu_topology)) {
    throw_input_error(profile.file, "backend", "\"" + profile.backend + "\"",
                      "the profile measured backend " + profile.backend + " on device \"" +
                          profile.device + "\", but topology " + topology.file + "'s device \"" +
                          device + "\" is a " + (cpu_topology ? "CPU core" : "GPU"),
                      std::string("a profile of backend ") + (cpu_topology ? "cpu" : "cuda") +
                          " measured on \"" + device + "\"");
  }
  if (profile.device == device || allow_mismatch) return;
  throw_input_error(profile.file, "device", "\"" + profile.device + "\"",
                    "is another device than topology " + topology.file + "'s node.device.name \"" +
                        device + "\"",
                    "a profile of \"" + device + "\", or --allow-profile-mismatch to cost this "
                    "device with another's figures");
}

std::string ProfileChoice::describe() const {
  if (profile.is_roofline) {
    return origin == "roofline" ? "roofline (--profile roofline)"
                                : "roofline (the topology names no profile that exists)";
  }
  return profile.file + " (" + profile.name + (origin == "topology" ? ", the topology's)" : ")");
}

ProfileChoice choose_profile(const std::optional<std::string>& option, const Topology& topology,
                             bool allow_mismatch) {
  ProfileChoice choice;
  if (option && *option == "roofline") {
    choice.profile = roofline_profile(topology);
    choice.argument = "roofline";
    choice.origin = "roofline";
    return choice;
  }
  if (option) {
    choice.profile = load_profile(*option);
    choice.argument = *option;
    choice.origin = "--profile";
  } else if (topology.profile_file.empty()) {
    choice.warning = "topology " + topology.file + " names no device profile (key 'profile'); " +
                     "costing with the roofline on its datasheet peaks";
  } else if (!std::filesystem::is_regular_file(topology.profile_file)) {
    choice.warning = "topology " + topology.file + " names device profile " + topology.profile_file +
                     " (key 'profile' = \"" + topology.profile + "\"), which does not exist; " +
                     "costing with the roofline on its datasheet peaks";
  } else {
    choice.profile = load_profile(topology.profile_file);
    choice.argument = topology.profile_file;
    choice.origin = "topology";
  }
  if (choice.argument.empty()) {
    choice.profile = roofline_profile(topology);
    choice.argument = "roofline";
    choice.origin = "none";
    return choice;
  }
  check_profile_matches(choice.profile, topology, allow_mismatch);
  return choice;
}

Topology apply_link_fractions(const Topology& topology, const DeviceProfile& profile) {
  Topology t = topology;
  if (profile.intra_node_bandwidth_bytes_per_s) {
    t.node.intra_node.bandwidth_bytes_per_s = *profile.intra_node_bandwidth_bytes_per_s;
  } else {
    t.node.intra_node.bandwidth_bytes_per_s *= profile.intra_node_bus_fraction;
  }
  if (profile.intra_node_latency_s) t.node.intra_node.latency_s = *profile.intra_node_latency_s;
  t.fabric.nic_bandwidth_bytes_per_s *= profile.inter_node_bus_fraction;
  return t;
}

std::vector<std::string> machine_differences(const DeviceProfile& profile, const MachineInfo& here,
                                             const std::map<std::string, std::string>& libraries) {
  std::vector<std::string> out;
  if (!profile.machine) return out;
  auto differ = [&](const std::string& field, const std::string& there, const std::string& mine) {
    if (there != mine) out.push_back(field + ": '" + there + "' in the profile, '" + mine + "' here");
  };
  differ("machine.cpu_model", profile.machine->cpu_model, here.cpu_model);
  differ("machine.cores", std::to_string(profile.machine->cores), std::to_string(here.cores));
  for (const auto& [name, version] : profile.libraries) {
    auto it = libraries.find(name);
    if (it != libraries.end()) differ("libraries." + name, version, it->second);
  }
  return out;
}

std::optional<LinkFit> fit_link(const std::vector<LinkSample>& samples) {
  if (samples.size() < 2) return std::nullopt;
  // Minimise Σ ((a_i·α + c_i·γ − t_i) / t_i)², γ = 1/β: weighted normal equations.
  double saa = 0, sac = 0, scc = 0, sat = 0, sct = 0;
  for (const LinkSample& s : samples) {
    double w = 1.0 / (s.time_s * s.time_s);
    saa += w * s.latency_terms * s.latency_terms;
    sac += w * s.latency_terms * s.bytes_terms;
    scc += w * s.bytes_terms * s.bytes_terms;
    sat += w * s.latency_terms * s.time_s;
    sct += w * s.bytes_terms * s.time_s;
  }
  double det = saa * scc - sac * sac;
  double alpha = 0, gamma = 0;
  if (det > 1e-12 * saa * scc) {
    alpha = (sat * scc - sac * sct) / det;
    gamma = (saa * sct - sac * sat) / det;
  }
  if (alpha < 0 || det <= 1e-12 * saa * scc) {  // no latency term: bandwidth alone
    alpha = 0;
    gamma = sct / scc;
  }
  if (!(gamma > 0)) return std::nullopt;
  LinkFit fit;
  fit.latency_s = alpha;
  fit.bandwidth_bytes_per_s = 1.0 / gamma;
  fit.samples = int64_t(samples.size());
  for (const LinkSample& s : samples) {
    double predicted = s.latency_terms * alpha + s.bytes_terms * gamma;
    fit.max_relative_error = std::max(fit.max_relative_error, std::abs(predicted - s.time_s) / s.time_s);
  }
  return fit;
}

std::vector<LinkSample> p2p_link_samples(const std::vector<P2pPoint>& points) {
  std::vector<LinkSample> out;
  for (const P2pPoint& p : points) out.push_back({1.0, p.bytes, p.time_s});
  return out;
}

std::vector<LinkSample> collective_link_samples(const std::vector<CollectivePoint>& points,
                                                int64_t group_size) {
  std::vector<LinkSample> out;
  const double n = double(group_size);
  for (const CollectivePoint& c : points) {
    if (c.group_size != group_size) continue;
    if (c.algorithm == "ring") {
      double steps = c.kind == "all_reduce" ? 2 * (n - 1) : n - 1;
      out.push_back({steps, steps * c.bytes / n, c.time_s});
    } else if (c.algorithm == "tree" && c.kind == "all_reduce") {
      double rounds = 2.0 * double(tree_depth(group_size));
      out.push_back({rounds, rounds * c.bytes, c.time_s});
    }
  }
  return out;
}

}  // namespace stepcast
