// Device profiles as files: strict loading (every key checked, points sorted and unique, sources
// named) and writing back (profile_to_json(parse_profile(j)) keeps what j says).

#include "errors.hpp"
#include "profile.hpp"
#include "profile_json_detail.hpp"

namespace stepcast {

namespace {

// A section's `notes` (a string), kept to be written back.
void read_notes(ObjectReader& section, const std::string& where, DeviceProfile& p) {
  std::string notes = section.get_string_or("notes", "");
  if (!notes.empty()) p.section_notes[where] = notes;
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
  if (reader.has("sources")) {
    reader.accept("sources");
    const Json& sources = json.at("sources");
    if (!sources.is_object()) reader.fail("sources", "must be a JSON object", "{\"KEY\": \"citation\"}");
    for (const auto& [key, citation] : sources.items()) {
      if (!citation.is_string() || citation.get<std::string>().empty()) {
        reader.fail("sources." + key, "must be a non-empty string", "the citation: where the figures come from");
      }
      p.sources[key] = citation.get<std::string>();
    }
  } else {
    reader.accept("sources");
  }
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
    e.output_half = g.get_number_or("output_half", 0, false, 0);
    e.k_half = g.get_number_or("k_half", 0, false, 0);
    e.latency_s = g.get_number_or("latency_s", 0, false, 0);
    if (g.has("ceiling_fraction")) e.ceiling_fraction = g.get_number_between("ceiling_fraction", 1e-3, 1.0);
    read_notes(g, std::string("gemm.") + name, p);
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
    read_notes(t, "gemm_tiling", p);
    t.finish();
    p.gemm_tiling = tiling;
  } else {
    reader.accept("gemm_tiling");
  }
  ObjectReader flash = reader.get_object("flash_attention");
  p.flash_forward_peak_fraction = flash.get_number_in("forward_peak_fraction", 1e-3, 1.0, 1.0);
  p.flash_backward_peak_fraction = flash.get_number_in("backward_peak_fraction", 1e-3, 1.0, 1.0);
  read_notes(flash, "flash_attention", p);
  flash.finish();
  ObjectReader memory = reader.get_object("memory");
  p.memory_bandwidth_fraction = memory.get_number_in("bandwidth_fraction", 1e-3, 1.0, 1.0);
  p.kernel_overhead_s = memory.get_number("kernel_overhead_s", 0, false);
  p.memory_bandwidth_bytes_per_s = optional_number(memory, "bandwidth_bytes_per_s", true);
  read_notes(memory, "memory", p);
  memory.finish();
  ObjectReader links = reader.get_object("links");
  p.intra_node_bus_fraction = links.get_number_in("intra_node_bus_fraction", 1e-3, 1.0, 1.0);
  p.inter_node_bus_fraction = links.get_number_in("inter_node_bus_fraction", 1e-3, 1.0, 1.0);
  p.intra_node_bandwidth_bytes_per_s = optional_number(links, "intra_node_bandwidth_bytes_per_s", true);
  p.intra_node_latency_s = optional_number(links, "intra_node_latency_s", false);
  p.inter_node_latency_s = optional_number(links, "inter_node_latency_s", false);
  if (links.has("inter_node_exchange_fraction")) {
    p.inter_node_exchange_fraction = links.get_number_in("inter_node_exchange_fraction", 1e-3, 1.0, 1.0);
  }
  p.inter_node_rate_bytes_per_s = optional_number(links, "inter_node_rate_bytes_per_s", true);
  read_points(links, json.at("links"), "inter_node_at_rates", [&](ObjectReader& r, size_t i) {
    InterNodeAtRate at;
    at.nic_bandwidth_bytes_per_s = r.get_number("nic_bandwidth_bytes_per_s", 0, true);
    at.bus_fraction = r.get_number_between("bus_fraction", 1e-3, 1.0);
    if (r.has("exchange_fraction")) at.exchange_fraction = r.get_number_between("exchange_fraction", 1e-3, 1.0);
    const std::string key = "inter_node_at_rates[" + std::to_string(i) + "]";
    if (!p.inter_node_rate_bytes_per_s) {
      links.fail(key, "is a rate's figures, but the profile's own rate (inter_node_rate_bytes_per_s) is absent",
                 "inter_node_rate_bytes_per_s beside inter_node_at_rates");
    }
    if (at.nic_bandwidth_bytes_per_s == *p.inter_node_rate_bytes_per_s ||
        (i > 0 && !(p.inter_node_at_rates.back().nic_bandwidth_bytes_per_s < at.nic_bandwidth_bytes_per_s))) {
      links.fail(key, "repeats a rate or is out of order",
                 "rates once each, ascending, none the profile's own (inter_node_rate_bytes_per_s)");
    }
    p.inter_node_at_rates.push_back(at);
  });
  read_notes(links, "links", p);
  links.finish();
  if (reader.has("variability")) {
    ObjectReader v = reader.get_object("variability");
    p.variability.device_speed_cv = v.get_number_in("device_speed_cv", 0, 0.5, 0);
    p.variability.op_time_cv = v.get_number_in("op_time_cv", 0, 0.5, 0);
    p.variability_notes = v.get_string_or("notes", "");
    v.finish();
  } else {
    reader.accept("variability");
  }
  if (reader.has("overlap")) {
    ObjectReader o = reader.get_object("overlap");
    p.overlap.sms = o.get_int("sms", 1);
    auto ctas = [&](const std::string& key) {
      const int64_t n = o.get_int(key, 0);
      if (n >= p.overlap.sms) {
        o.fail(key, std::to_string(n) + " CTAs of " + std::to_string(p.overlap.sms) + " SMs",
               "fewer CTAs than the device has SMs (sms)");
      }
      return n;
    };
    p.overlap.ctas_intra_node = ctas("collective_ctas_intra_node");
    p.overlap.ctas_inter_node = ctas("collective_ctas_inter_node");
    p.overlap_notes = o.get_string_or("notes", "");
    o.finish();
  } else {
    reader.accept("overlap");
  }
  if (reader.has("execution")) {
    ObjectReader e = reader.get_object("execution");
    p.execution_in_order = e.get_bool_or("in_order", false);
    p.execution_staged_sends = e.get_bool_or("staged_sends", false);
    read_notes(e, "execution", p);
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
    p.measured = parse_measured(measured, json.at("measured"), p.sources);
  } else {
    reader.accept("measured");
  }
  reader.finish();
  return p;
}

DeviceProfile load_profile(const std::string& path) {
  return parse_profile(load_json_file(path), path);
}

Json profile_to_json(const DeviceProfile& p) {
  Json gemm = Json::object();
  for (const auto& [dtype, e] : p.gemm) {
    Json g = {{"peak_fraction", e.peak_fraction}, {"overhead_s", e.overhead_s}};
    if (e.output_half > 0) g["output_half"] = e.output_half;
    if (e.k_half > 0) g["k_half"] = e.k_half;
    if (e.latency_s > 0) g["latency_s"] = e.latency_s;
    if (e.ceiling_fraction > 0) g["ceiling_fraction"] = e.ceiling_fraction;
    gemm[to_string(dtype)] = g;
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
  // Optional parts only where present, so older profiles print as they always did.
  if (!p.notes.empty()) json["notes"] = p.notes;
  if (!p.sources.empty()) json["sources"] = p.sources;
  if (p.memory_bandwidth_bytes_per_s) json["memory"]["bandwidth_bytes_per_s"] = *p.memory_bandwidth_bytes_per_s;
  if (p.intra_node_bandwidth_bytes_per_s) {
    json["links"]["intra_node_bandwidth_bytes_per_s"] = *p.intra_node_bandwidth_bytes_per_s;
  }
  if (p.intra_node_latency_s) json["links"]["intra_node_latency_s"] = *p.intra_node_latency_s;
  if (p.inter_node_latency_s) json["links"]["inter_node_latency_s"] = *p.inter_node_latency_s;
  if (p.inter_node_exchange_fraction) {
    json["links"]["inter_node_exchange_fraction"] = *p.inter_node_exchange_fraction;
  }
  if (p.inter_node_rate_bytes_per_s) json["links"]["inter_node_rate_bytes_per_s"] = *p.inter_node_rate_bytes_per_s;
  for (const InterNodeAtRate& at : p.inter_node_at_rates) {
    Json r = {{"nic_bandwidth_bytes_per_s", at.nic_bandwidth_bytes_per_s}, {"bus_fraction", at.bus_fraction}};
    if (at.exchange_fraction) r["exchange_fraction"] = *at.exchange_fraction;
    json["links"]["inter_node_at_rates"].push_back(r);
  }
  if (p.variability.device_speed_cv > 0 || p.variability.op_time_cv > 0 || !p.variability_notes.empty()) {
    json["variability"] = {{"device_speed_cv", p.variability.device_speed_cv},
                           {"op_time_cv", p.variability.op_time_cv}};
    if (!p.variability_notes.empty()) json["variability"]["notes"] = p.variability_notes;
  }
  if (p.overlap.modelled()) {
    json["overlap"] = {{"sms", p.overlap.sms},
                       {"collective_ctas_intra_node", p.overlap.ctas_intra_node},
                       {"collective_ctas_inter_node", p.overlap.ctas_inter_node}};
    if (!p.overlap_notes.empty()) json["overlap"]["notes"] = p.overlap_notes;
  }
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
  for (const auto& [where, notes] : p.section_notes) {  // into the sections written above
    size_t dot = where.find('.');
    const std::string outer = where.substr(0, dot);
    if (!json.contains(outer)) continue;
    Json* section = &json[outer];
    if (dot != std::string::npos) {
      if (!section->contains(where.substr(dot + 1))) continue;
      section = &(*section)[where.substr(dot + 1)];
    }
    if (section->is_object()) (*section)["notes"] = notes;
  }
  return json;
}

}  // namespace stepcast
