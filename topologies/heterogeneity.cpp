// Loading and writing back a topology's "heterogeneity"; see heterogeneity.hpp.
//   "heterogeneity": {
//     "node_groups": [{"nodes": 96, "device_name": "A100-SXM4-80GB", "compute_speed_factor": 1},
//                     {"nodes": 32, "device_name": "A100 (power-capped)", "compute_speed_factor": 0.8}],
//     "nodes":   [{"node": 3, "compute_speed_factor": 0.5, "link_bandwidth_factor": 0.25}],
//     "devices": [{"device": 17, "compute_speed_factor": 0.5}]
//   }
// Every part is optional; a node entry gives at least one of its two factors.
#include "heterogeneity.hpp"

#include "errors.hpp"

namespace stepcast {

namespace {

const std::string kFactorValid = "a number in (0, 100]: the device's compute rate over the topology's "
                                 "device's (0.5: its compute ops take twice as long)";
const std::string kLinkValid = "a number in (0, 100]: the node's NIC bandwidth over the topology's "
                               "nic_bandwidth_bytes_per_s (0.25: a quarter of it)";

double read_factor(ObjectReader& reader, const std::string& key, const std::string& valid) {
  if (!reader.has(key)) reader.fail(key, "missing required key", valid);
  double value = reader.get_number_in(key, -1e308, 1e308, 0);
  if (!(value > 0 && value <= kMaxSpeedFactor)) {
    reader.fail(key, value <= 0 ? "a factor must be above 0" : "out of range", valid);
  }
  return value;
}

// The objects of the list under `key`, each with its reader's prefix "heterogeneity.KEY[i].".
template <class Each>
void for_each_object(const Json& json, const std::string& file, const std::string& key, Each each) {
  if (!json.contains(key)) return;
  const Json& list = json.at(key);
  if (!list.is_array() || list.empty()) {
    throw_input_error(file, "heterogeneity." + key, list.dump(),
                      list.is_array() ? "an empty list" : "wrong type",
                      "a non-empty list of objects (or leave the key out)");
  }
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string prefix = "heterogeneity." + key + "[" + std::to_string(i) + "].";
    if (!list[i].is_object()) {
      throw_input_error(file, prefix.substr(0, prefix.size() - 1), list[i].dump(), "wrong type", "a JSON object");
    }
    ObjectReader reader(list[i], file, prefix);
    each(reader);
    reader.finish();
  }
}

// The node group holding `node` (groups are consecutive nodes, in order); none without groups.
const NodeGroup* group_of_node(const std::vector<NodeGroup>& groups, int64_t node) {
  int64_t first = 0;
  for (const NodeGroup& g : groups) {
    if (node < first + g.nodes) return &g;
    first += g.nodes;
  }
  return nullptr;
}

}  // namespace

double Heterogeneity::compute_speed_factor(int64_t device, int64_t devices_per_node) const {
  const int64_t node = device / devices_per_node;
  const NodeGroup* g = group_of_node(node_groups, node);
  double factor = g ? g->compute_speed_factor : 1;
  if (auto it = node_compute_speed_factor.find(node); it != node_compute_speed_factor.end()) factor *= it->second;
  if (auto it = device_compute_speed_factor.find(device); it != device_compute_speed_factor.end()) {
    factor *= it->second;
  }
  return factor;
}

double Heterogeneity::link_bandwidth_factor(int64_t node) const {
  auto it = node_link_bandwidth_factor.find(node);
  return it == node_link_bandwidth_factor.end() ? 1.0 : it->second;
}

std::string Heterogeneity::device_name_of_node(int64_t node) const {
  const NodeGroup* g = group_of_node(node_groups, node);
  return g ? g->device_name : "";
}

Heterogeneity parse_heterogeneity(const Json& json, const std::string& file) {
  if (!json.is_object()) {
    throw_input_error(file, "heterogeneity", json.dump(), "wrong type",
                      "an object with any of node_groups, nodes, devices");
  }
  ObjectReader top(json, file, "heterogeneity.");
  top.accept_any_of({"node_groups", "nodes", "devices"});
  top.finish();  // a misspelt part is named, with the closest valid one
  Heterogeneity h;
  for_each_object(json, file, "node_groups", [&](ObjectReader& r) {
    NodeGroup g;
    g.nodes = r.get_int("nodes", 1);
    g.device_name = r.get_string("device_name");
    if (g.device_name.empty()) r.fail("device_name", "is empty", "the group's device type, e.g. \"H100-SXM5-80GB\"");
    g.compute_speed_factor = read_factor(r, "compute_speed_factor", kFactorValid);
    h.node_groups.push_back(g);
  });
  for_each_object(json, file, "nodes", [&](ObjectReader& r) {
    const int64_t node = r.get_int("node", 0);
    if (!r.has("compute_speed_factor") && !r.has("link_bandwidth_factor")) {
      r.fail("node", "a node entry without a factor",
             "compute_speed_factor and/or link_bandwidth_factor beside \"node\"");
    }
    if (h.node_compute_speed_factor.count(node) || h.node_link_bandwidth_factor.count(node)) {
      r.fail("node", "node " + std::to_string(node) + " listed twice", "each node in one entry");
    }
    if (r.has("compute_speed_factor")) h.node_compute_speed_factor[node] = read_factor(r, "compute_speed_factor", kFactorValid);
    if (r.has("link_bandwidth_factor")) h.node_link_bandwidth_factor[node] = read_factor(r, "link_bandwidth_factor", kLinkValid);
  });
  for_each_object(json, file, "devices", [&](ObjectReader& r) {
    const int64_t device = r.get_int("device", 0);
    if (h.device_compute_speed_factor.count(device)) {
      r.fail("device", "device " + std::to_string(device) + " listed twice", "each device in one entry");
    }
    h.device_compute_speed_factor[device] = read_factor(r, "compute_speed_factor", kFactorValid);
  });
  return h;
}

void check_heterogeneity(const Heterogeneity& h, const std::string& file, int64_t num_nodes,
                         int64_t devices_per_node, bool nodes_overridden) {
  const std::string nodes_text =
      "num_nodes = " + std::to_string(num_nodes) + (nodes_overridden ? " (set by --nodes)" : "");
  if (!h.node_groups.empty()) {
    int64_t sum = 0;
    std::string terms;
    for (const NodeGroup& g : h.node_groups) {
      sum += g.nodes;
      terms += (terms.empty() ? "" : " + ") + std::to_string(g.nodes);
    }
    if (sum != num_nodes) {
      throw_input_error(file, "heterogeneity.node_groups", "[" + terms + " nodes]",
                        "the groups hold " + terms + " = " + std::to_string(sum) + " nodes, not " + nodes_text,
                        "groups whose nodes add up to " + std::to_string(num_nodes));
    }
  }
  auto check_node = [&](int64_t node, const char* what) {
    if (node >= num_nodes) {
      throw_input_error(file, std::string("heterogeneity.nodes.node (") + what + ")", std::to_string(node),
                        "no such node: " + nodes_text, "a node index in [0, " + std::to_string(num_nodes - 1) + "]");
    }
  };
  for (const auto& [node, f] : h.node_compute_speed_factor) check_node(node, "compute_speed_factor");
  for (const auto& [node, f] : h.node_link_bandwidth_factor) check_node(node, "link_bandwidth_factor");
  const int64_t devices = num_nodes * devices_per_node;
  for (const auto& [device, f] : h.device_compute_speed_factor) {
    if (device >= devices) {
      throw_input_error(file, "heterogeneity.devices.device", std::to_string(device),
                        "no such device: " + nodes_text + " × " + std::to_string(devices_per_node) +
                            " devices per node = " + std::to_string(devices) + " devices",
                        "a device index in [0, " + std::to_string(devices - 1) + "] (node · devices_per_node + local)");
    }
  }
}

Json heterogeneity_to_json(const Heterogeneity& h) {
  Json out = Json::object();
  for (const NodeGroup& g : h.node_groups) {
    out["node_groups"].push_back(
        {{"nodes", g.nodes}, {"device_name", g.device_name}, {"compute_speed_factor", g.compute_speed_factor}});
  }
  std::map<int64_t, Json> nodes;
  for (const auto& [node, f] : h.node_compute_speed_factor) nodes[node]["compute_speed_factor"] = f;
  for (const auto& [node, f] : h.node_link_bandwidth_factor) nodes[node]["link_bandwidth_factor"] = f;
  for (auto& [node, entry] : nodes) {
    entry["node"] = node;
    out["nodes"].push_back(entry);
  }
  for (const auto& [device, f] : h.device_compute_speed_factor) {
    out["devices"].push_back({{"device", device}, {"compute_speed_factor", f}});
  }
  return out;
}

}  // namespace stepcast
