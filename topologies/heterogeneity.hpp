// Unequal devices and links in one topology (the optional key "heterogeneity"): node groups of
// other device types, per-node and per-device compute speed factors (stragglers), per-node link
// bandwidth factors (a degraded NIC or cable). Pure data and its loader; the simulator applies it
// (sim/sim_plan.cpp: compute op times, sim/platform.cpp: a node's NIC links).
// A speed factor multiplies a device's compute rate: 0.5 makes each of its compute ops take twice
// as long, 2 half as long. A device's factor is the product of its group's, its node's and its own.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "json_input.hpp"

namespace stepcast {

// Consecutive nodes of one device type: the first group holds nodes 0 .. nodes−1, the next the
// following ones; the groups' nodes add up to num_nodes.
struct NodeGroup {
  int64_t nodes = 0;
  std::string device_name;          // for people and outputs
  double compute_speed_factor = 1;  // its compute rate over the topology's device's
};

struct Heterogeneity {
  std::vector<NodeGroup> node_groups;                      // empty: every node the topology's device
  std::map<int64_t, double> node_compute_speed_factor;     // node → factor
  std::map<int64_t, double> node_link_bandwidth_factor;    // node → factor on its NICs' bandwidth
  std::map<int64_t, double> device_compute_speed_factor;   // device (node·devices_per_node + local) → factor

  bool empty() const {
    return node_groups.empty() && node_compute_speed_factor.empty() &&
           node_link_bandwidth_factor.empty() && device_compute_speed_factor.empty();
  }
  // The compute speed factor of `device` (1 where nothing is given).
  double compute_speed_factor(int64_t device, int64_t devices_per_node) const;
  // The bandwidth factor of `node`'s NICs (1 where nothing is given).
  double link_bandwidth_factor(int64_t node) const;
  // The device type of `node`'s group ("" without groups).
  std::string device_name_of_node(int64_t node) const;
};

// Factors are in (0, kMaxSpeedFactor]: 0 would stall the simulated clock, a larger one is a typo.
inline constexpr double kMaxSpeedFactor = 100;

// Reads the object under "heterogeneity" of `file`; InputError naming the key and the value for a
// factor ≤ 0 or above kMaxSpeedFactor, an empty group, a node or device listed twice.
Heterogeneity parse_heterogeneity(const Json& json, const std::string& file);
// Checks indices and groups against the topology's size (after --nodes): every node and device
// listed exists, the groups' nodes add up to num_nodes.
void check_heterogeneity(const Heterogeneity& h, const std::string& file, int64_t num_nodes,
                         int64_t devices_per_node, bool nodes_overridden);
// The same keys as the input (omitting empty parts).
Json heterogeneity_to_json(const Heterogeneity& h);

}  // namespace stepcast
