// A device profile: how close one backend on one device comes to the topology's peak rates —
// GEMM fraction of peak and fixed cost per kernel, fused attention's fraction of peak, memory-bound
// kernels' fraction of bandwidth, and the bus-bandwidth fraction collectives reach on each link.
// Shipped datasheet profiles (profiles/*.json) are built from component figures only; `stepcast
// profile` (issue 5) writes measured ones in the same format.
#pragma once

#include <map>
#include <string>

#include "json_input.hpp"
#include "topology.hpp"

namespace stepcast {

struct GemmEfficiency {
  double peak_fraction = 1;  // of the device's dense peak for the dtype, for large GEMMs
  double overhead_s = 0;     // fixed time per GEMM (launch, ramp-up and tail)
};

struct DeviceProfile {
  std::string name;
  std::string file;
  std::string device;   // must equal the topology's node.device.name
  std::string backend;  // "datasheet", "cpu", "cuda"
  std::map<Dtype, GemmEfficiency> gemm;
  double flash_forward_peak_fraction = 1;
  double flash_backward_peak_fraction = 1;
  double memory_bandwidth_fraction = 1;
  double kernel_overhead_s = 0;           // fixed time of every other kernel
  double intra_node_bus_fraction = 1;     // achievable fraction of the intra-node link rate
  double inter_node_bus_fraction = 1;     // achievable fraction of the NIC rate
  bool is_roofline = false;               // no profile: pure roofline on the datasheet peaks

  GemmEfficiency gemm_for(Dtype dtype) const;
};

DeviceProfile load_profile(const std::string& path);
DeviceProfile parse_profile(const Json& json, const std::string& file);
Json profile_to_json(const DeviceProfile& profile);
// The pure roofline: every fraction 1, no fixed costs.
DeviceProfile roofline_profile(const Topology& topology);
// Refuses (InputError) a profile of another device than the topology's.
void check_profile_matches(const DeviceProfile& profile, const Topology& topology);
// The topology with link bandwidths scaled by the profile's achievable bus fractions: what the
// simulator's platform is built from.
Topology apply_link_fractions(const Topology& topology, const DeviceProfile& profile);

}  // namespace stepcast
