// Device profiles: the GEMM shape model, checking against the topology, which profile a command
// uses, the roofline, and the α-β fits of measured transfers. Loading and writing: profile_json.cpp.
#include "profile.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "collective.hpp"
#include "errors.hpp"

namespace stepcast {

double GemmEfficiency::shape_efficiency(double m, double n, double k, double count) const {
  double e = 1;
  double outputs = m * n * count;
  if (output_half > 0) e *= outputs / (outputs + output_half);
  if (k_half > 0) e *= k / (k + k_half);
  return e;
}

GemmEfficiency DeviceProfile::gemm_for(Dtype dtype) const {
  auto it = gemm.find(dtype);
  if (it != gemm.end()) return it->second;
  if (is_roofline) return GemmEfficiency{};
  throw InputError(file + ": key 'gemm." + to_string(dtype) + "': the profile has no GEMM figures " +
                   "for this dtype; valid: a profile measured with the plan's dtype");
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

namespace {

// A GPU profile's measured points cannot beat the device's datasheet: a GEMM or attention rate
// above the dense peak of its dtype, or a memory-bound kernel above the HBM bandwidth, is a
// wrong point (a time off by its unit, a typo), refused before it gives an MFU above 1. (A CPU
// topology's peaks are estimates its measured profile may pass.)
void check_points_within_peaks(const DeviceProfile& profile, const Topology& topology) {
  if (profile.backend == "cpu" || !profile.measured) return;
  const DeviceSpec& device = topology.node.device;
  const MeasuredTables& t = *profile.measured;
  auto peak = device.peak_flops_per_s.find(t.dtype);
  auto refuse = [&](const std::string& key, double value, const std::string& what, double limit) {
    std::ostringstream why, valid;
    why << "implies " << what << " " << value << ", above the device's " << limit << " (topology "
        << topology.file << ")";
    valid << "a measured time (in seconds) at most the datasheet allows";
    throw_input_error(profile.file, key, "", why.str(), valid.str());
  };
  if (peak != device.peak_flops_per_s.end()) {
    for (size_t i = 0; i < t.gemm.size(); ++i) {
      double rate = t.gemm[i].flops() / t.gemm[i].time_s;
      if (rate > peak->second * 1.02) {
        refuse("measured.gemm_points[" + std::to_string(i) + "].time_s", rate, "flop/s", peak->second);
      }
    }
    for (size_t i = 0; i < t.attention.size(); ++i) {
      if (t.attention[i].flops_per_s > peak->second * 1.02) {
        refuse("measured.attention_points[" + std::to_string(i) + "].flops_per_s", t.attention[i].flops_per_s,
               "flop/s", peak->second);
      }
    }
  }
  for (size_t i = 0; i < t.memory.size(); ++i) {
    double bandwidth = t.memory[i].bytes / t.memory[i].time_s;
    if (bandwidth > device.memory_bandwidth_bytes_per_s * 1.05) {
      refuse("measured.memory_points[" + std::to_string(i) + "].time_s", bandwidth, "bytes/s",
             device.memory_bandwidth_bytes_per_s);
    }
  }
}

}  // namespace

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
  // Against the datasheet of the device it was measured on (another device's, under
  // --allow-profile-mismatch, is no bound on it).
  if (profile.device == device) check_points_within_peaks(profile, topology);
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
  } else if (std::error_code ec; !std::filesystem::is_regular_file(topology.profile_file, ec)) {
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

double DeviceProfile::inter_node_fraction_at(double rate, bool collective) const {
  auto fraction = [&](const InterNodeAtRate& r) { return collective ? r.collective_fraction() : r.bus_fraction; };
  std::vector<InterNodeAtRate> rates = inter_node_at_rates;
  if (inter_node_rate_bytes_per_s) {
    rates.push_back({*inter_node_rate_bytes_per_s, inter_node_bus_fraction, inter_node_exchange_fraction});
  }
  if (rates.size() < 2) return collective ? collective_inter_node_fraction() : inter_node_bus_fraction;
  std::sort(rates.begin(), rates.end(), [](const InterNodeAtRate& a, const InterNodeAtRate& b) {
    return a.nic_bandwidth_bytes_per_s < b.nic_bandwidth_bytes_per_s;
  });
  if (rate <= rates.front().nic_bandwidth_bytes_per_s) return fraction(rates.front());
  if (rate >= rates.back().nic_bandwidth_bytes_per_s) return fraction(rates.back());
  size_t hi = 1;
  while (rates[hi].nic_bandwidth_bytes_per_s < rate) ++hi;
  const InterNodeAtRate& a = rates[hi - 1];
  const InterNodeAtRate& b = rates[hi];
  double w = std::log(rate / a.nic_bandwidth_bytes_per_s) /
             std::log(b.nic_bandwidth_bytes_per_s / a.nic_bandwidth_bytes_per_s);
  return fraction(a) + w * (fraction(b) - fraction(a));
}

bool DeviceProfile::collective_fraction_differs() const {
  if (inter_node_exchange_fraction && *inter_node_exchange_fraction != inter_node_bus_fraction) return true;
  return std::any_of(inter_node_at_rates.begin(), inter_node_at_rates.end(),
                     [](const InterNodeAtRate& r) { return r.collective_fraction() != r.bus_fraction; });
}

Topology apply_link_fractions(const Topology& topology, const DeviceProfile& profile, bool collective) {
  Topology t = topology;
  if (profile.intra_node_bandwidth_bytes_per_s) {
    t.node.intra_node.bandwidth_bytes_per_s = *profile.intra_node_bandwidth_bytes_per_s;
  } else {
    t.node.intra_node.bandwidth_bytes_per_s *= profile.intra_node_bus_fraction;
  }
  if (profile.intra_node_latency_s) t.node.intra_node.latency_s = *profile.intra_node_latency_s;
  if (profile.inter_node_latency_s) {
    t.fabric.nic_latency_s = std::max(0.0, (*profile.inter_node_latency_s - t.fabric.switch_latency_s) / 2);
  }
  // The fabric's own links carry the same protocol as the NICs: each its own rate's fraction.
  for (double* rate : {&t.fabric.nic_bandwidth_bytes_per_s, &t.fabric.dragonfly.local_link_bandwidth_bytes_per_s,
                       &t.fabric.dragonfly.global_link_bandwidth_bytes_per_s,
                       &t.fabric.torus.link_bandwidth_bytes_per_s}) {
    *rate *= profile.inter_node_fraction_at(*rate, collective);
  }
  return t;
}

DeviceProfile add_inter_node_rate(const DeviceProfile& base, const DeviceProfile& links) {
  if (!links.inter_node_rate_bytes_per_s) {
    throw InputError("the inter-node link was not measured (no ping-pong across hosts), so there is no rate to add");
  }
  const double rate = *links.inter_node_rate_bytes_per_s;
  DeviceProfile out = base;
  if (!base.inter_node_rate_bytes_per_s || *base.inter_node_rate_bytes_per_s == rate) {
    out.inter_node_rate_bytes_per_s = rate;
    out.inter_node_bus_fraction = links.inter_node_bus_fraction;
    out.inter_node_exchange_fraction = links.inter_node_exchange_fraction;
    out.inter_node_latency_s = links.inter_node_latency_s;
  } else {
    std::erase_if(out.inter_node_at_rates, [&](const InterNodeAtRate& r) { return r.nic_bandwidth_bytes_per_s == rate; });
    out.inter_node_at_rates.push_back({rate, links.inter_node_bus_fraction, links.inter_node_exchange_fraction});
    std::sort(out.inter_node_at_rates.begin(), out.inter_node_at_rates.end(),
              [](const InterNodeAtRate& a, const InterNodeAtRate& b) {
                return a.nic_bandwidth_bytes_per_s < b.nic_bandwidth_bytes_per_s;
              });
  }
  if (out.measured && links.measured) {
    Json record = {{"nic_bandwidth_bytes_per_s", rate}};
    for (const char* key : {"inter_node_p2p", "inter_node_exchange"}) {
      if (links.measured->fits.contains(key)) record[key] = links.measured->fits[key];
    }
    Json& list = out.measured->fits["inter_node_at_rates"];
    if (list.is_array()) {
      for (size_t i = list.size(); i-- > 0;) {
        if (list[i].value("nic_bandwidth_bytes_per_s", 0.0) == rate) list.erase(i);
      }
    }
    list.push_back(record);
  }
  return out;
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
    if (c.group_size != group_size || c.nodes != 1) continue;
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
