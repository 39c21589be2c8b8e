// The SimGrid platform of a topology: one host per simulated device, the NVSwitch of each node,
// each device's NIC and the inter-node fabric's routers and links: leaf switches under one
// non-blocking spine, a dragonfly's groups or a torus (layout and latencies at the top of
// platform.cpp). Hosts run at 1 flop/s, so an execution of `amount` flops lasts `amount`
// seconds: the cost model gives seconds, SimGrid only orders events and shares bandwidth.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "topology.hpp"

namespace simgrid::s4u {
class Engine;
class Host;
}  // namespace simgrid::s4u

namespace stepcast {

// Engine settings every stepcast simulation uses: network/model CM02 (max-min fair sharing, no
// correction factors: LV08 multiplies µs latencies by 13 and trims bandwidth, see SIMGRID-NOTES)
// with no cross traffic and no TCP window bound, raw contexts without guard pages, no tracing.
// Call once, before build_platform.
void configure_engine(simgrid::s4u::Engine& engine);
// The engine a simulation runs in: SimGrid's log at its critical level only, configure_engine's
// settings. One per process.
std::unique_ptr<simgrid::s4u::Engine> create_engine();

struct PlatformOptions {
  // Global device indices (node·devices_per_node + local) that get a host.
  std::vector<int64_t> devices;
  // Divides the capacity of links several NICs share (leaf uplinks, dragonfly and torus router
  // links): fast mode folds identical rail-aligned groups into one.
  double shared_link_divisor = 1;
  // Extra hosts off the network, for executions and analytic delays that must not share a
  // device host's speed.
  int64_t delay_hosts = 0;
  std::vector<double> delay_host_speeds{};  // their pstates' speeds; empty: 1 flop/s only
};

struct Platform {
  std::vector<simgrid::s4u::Host*> hosts;  // same order as options.devices
  std::unordered_map<int64_t, simgrid::s4u::Host*> host_of_device;
  std::vector<simgrid::s4u::Host*> delay_hosts;  // options.delay_hosts of them, 1 flop/s, no links
};

// Builds and seals the whole platform in `engine` (which must have none yet). Declares O(devices)
// routes; SimGrid finds each path on first use and caches it per source host.
Platform build_platform(simgrid::s4u::Engine& engine, const Topology& topology,
                        const PlatformOptions& options);

}  // namespace stepcast
