// The inter-node fabric of a platform, one builder per kind, for build_platform (platform.cpp): a
// builder creates the routers a node's NICs plug into and the links between routers, in the one
// Dijkstra zone of the platform. Internal to sim/; the layouts are described atop platform.cpp.
#pragma once

#include <simgrid/s4u/Link.hpp>
#include <simgrid/s4u/NetZone.hpp>

#include <cstdint>
#include <memory>
#include <string>

#include "platform.hpp"

namespace stepcast::platform_detail {

// Where a NIC's traffic enters the fabric (up) and where traffic to it leaves (down): one router
// except on the torus, whose dimension-order routing takes one router layer per dimension.
struct FabricPort {
  simgrid::kernel::routing::NetPoint* up = nullptr;
  simgrid::kernel::routing::NetPoint* down = nullptr;
  double port_latency_s = 0;  // of the port link between the NIC and the router
  std::string port_suffix;    // the port link is named "nic<i>" + port_suffix
};

class FabricBuilder {
 public:
  virtual ~FabricBuilder() = default;
  // The router(s) of local NIC `local_nic` of `node`, created on first use.
  virtual FabricPort attach(int64_t node, int64_t local_nic) = 0;
  // The links between routers, once every listed device's NIC is attached.
  virtual void connect() = 0;
};

// A split-duplex link: the two directions never share bandwidth.
inline simgrid::s4u::Link* duplex_link(simgrid::s4u::NetZone* zone, const std::string& name,
                                       double bandwidth_bytes_per_s, double latency_s) {
  return zone->create_split_duplex_link(name, bandwidth_bytes_per_s)->set_latency(latency_s);
}

// Dragonfly and torus (platform_fabrics.cpp). `shared_link_divisor` divides the capacity of the
// router-to-router links, which the rails fast mode folds would share.
std::unique_ptr<FabricBuilder> make_dragonfly_builder(simgrid::s4u::NetZone* zone, const Topology& topology,
                                                      double shared_link_divisor);
std::unique_ptr<FabricBuilder> make_torus_builder(simgrid::s4u::NetZone* zone, const Topology& topology,
                                                  double shared_link_divisor);

}  // namespace stepcast::platform_detail
