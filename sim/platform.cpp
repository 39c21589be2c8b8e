// Builds the SimGrid platform of a topology; see platform.hpp. Only this file and the simulator
// proper touch SimGrid (3.32, S4U).
//
// One Dijkstra zone holds every host and router, joined by explicit edges between neighbours,
// each declared once as a symmetrical route (the reverse edge takes the other half of every
// split-duplex link). Every link is split-duplex: the two directions never share bandwidth.
//
//   device ─ nvlink ─ nvswitch-port ─ NVSwitch router of the node            (intra-node)
//   device ─ pcie ─ nic ─ leaf-port ─ leaf router ─ uplink ─ spine router    (inter-node)
//
//   link           one per  bandwidth, bytes/s per direction       latency, s
//   nvlink         device   intra_node.bandwidth                   intra_node.latency / 2
//   nvswitch-port  device   intra_node.bandwidth                   0
//   pcie           device   nic_bandwidth                          0
//   nic            NIC      nic_bandwidth                          nic_latency
//   leaf-port      NIC      nic_bandwidth                          switch_latency / 2
//   uplink         leaf     NICs on the leaf · nic_bandwidth       (levels − 1) · switch_latency
//                           / (oversubscription · shared_link_divisor)
//
// So device → NVSwitch → device takes intra_node.latency; device → leaf → device on another node
// takes 2·nic_latency + switch_latency (one switch); a route across leaves takes 2·nic_latency +
// (2·levels − 1)·switch_latency, link_figures' inter-node latency: the tree's upper levels are
// folded into the uplinks and one non-blocking spine.
//
// Local device l uses local NIC l·nics_per_node / devices_per_node, so devices share a NIC when a
// node has fewer NICs than devices. Leaves: a one-level tree is a single switch holding every NIC;
// otherwise a leaf has switch_radix / 2 down ports, filled in NIC order (fat_tree, node-major) or
// by rail (rail_optimized: NIC r of switch_radix / 2 consecutive nodes share a rail-r leaf).
// Only listed devices get a host; leaves without one are left out, and so is the NVSwitch of a
// node with fewer than two. Leaf membership and uplink capacity follow the real device indices.
//
// Why pcie and the ports exist: SimGrid's Dijkstra weighs a path by its number of links and
// forbids an edge without links. Intra-node traffic must take the NVSwitch (4 links), not the NICs
// of a shared leaf (6); cross-leaf traffic must take its own NIC and the uplinks (8), not hop over
// the NVSwitch to a device whose NIC sits on the destination leaf (10). Each of these links
// carries the same flows as its neighbour (or a subset) at the same bandwidth and never binds.
//
// Delay hosts (options.delay_hosts) sit in the zone without links: the simulator runs executions
// and analytic delays on them so that they do not share a device host's speed.
#include "platform.hpp"

#include <simgrid/s4u/Engine.hpp>
#include <simgrid/s4u/Host.hpp>
#include <simgrid/s4u/Link.hpp>
#include <simgrid/s4u/NetZone.hpp>
#include <xbt/log.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "collective.hpp"
#include "errors.hpp"

namespace stepcast {

namespace sg4 = simgrid::s4u;
using simgrid::kernel::routing::NetPoint;

void configure_engine(sg4::Engine& engine) {
  STEPCAST_CHECK(engine.get_netzone_root() == nullptr,
                 "configure_engine must run before the platform is built");
  // SimGrid announces every setting at INFO level; only the front end prints.
  xbt_log_control_set("xbt_cfg.thresh:warning");
  // Max-min fair sharing with latency and bandwidth taken as given (weight-S 0, factors 1).
  engine.set_config("network/model:CM02");
  // No acknowledgement flows eating the reverse direction of the links.
  engine.set_config("network/crosstraffic:0");
  // CM02 otherwise caps every flow at TCP-gamma / (2 · route latency), a TCP window: 4 MiB over
  // 2 ms cut a 1 GB/s link to 0.7 GB/s in a probe. RDMA and NVLink transfers have no such window.
  engine.set_config("network/TCP-gamma:0");
  engine.set_config("contexts/factory:raw");
  // A guard page per actor stack costs two memory maps per actor; full mode runs one actor per
  // device and exhausts vm.max_map_count near 40,000 actors. Our actors' stacks are shallow.
  engine.set_config("contexts/guard-size:0");
  // Paje tracing is 10–13× slower and crashes on our platforms; the simulator writes its own trace.
  engine.set_config("tracing:0");
}

namespace {

using Direction = sg4::LinkInRoute::Direction;

// Switch levels of the inter-node tree, counted as link_figures counts them: radix r reaches r end
// points with one level and r/2 times more with each further level.
int fabric_levels(const Topology& topology) {
  const InterNodeFabric& fabric = topology.fabric;
  int64_t endpoints = int64_t(topology.num_nodes) * std::max(1, fabric.nics_per_node);
  STEPCAST_CHECK(fabric.switch_radix >= 4 || endpoints <= fabric.switch_radix,
                 "a switch radix of " + std::to_string(fabric.switch_radix) + " cannot join " +
                     std::to_string(endpoints) + " NICs in a tree");
  int levels = 1;
  double reach = fabric.switch_radix;
  while (reach < double(endpoints)) {
    reach *= fabric.switch_radix / 2.0;
    ++levels;
  }
  return levels;
}

// Which leaf each NIC plugs into and how many NICs share each leaf's uplink.
struct LeafLayout {
  bool single_switch = false;  // one-level tree: every NIC on leaf 0
  bool by_rail = false;        // rail_optimized
  int64_t num_nodes = 0;
  int64_t nics_per_node = 0;
  int64_t down_ports = 0;       // NICs per leaf; the last leaf of a run may hold fewer
  int64_t leaves_per_rail = 0;  // rail_optimized: ceil(num_nodes / down_ports)

  int64_t leaf_of(int64_t node, int64_t local_nic) const {
    if (single_switch) return 0;
    if (by_rail) return local_nic * leaves_per_rail + node / down_ports;
    return (node * nics_per_node + local_nic) / down_ports;
  }

  int64_t nics_on(int64_t leaf) const {
    if (single_switch) return num_nodes * nics_per_node;
    if (by_rail) return std::min(down_ports, num_nodes - (leaf % leaves_per_rail) * down_ports);
    return std::min(down_ports, num_nodes * nics_per_node - leaf * down_ports);
  }
};

LeafLayout leaf_layout(const Topology& topology, int levels) {
  LeafLayout layout;
  layout.single_switch = levels == 1;
  layout.by_rail = topology.fabric.kind == FabricKind::rail_optimized;
  layout.num_nodes = topology.num_nodes;
  layout.nics_per_node = topology.fabric.nics_per_node;
  layout.down_ports = topology.fabric.switch_radix / 2;
  layout.leaves_per_rail = (layout.num_nodes + layout.down_ports - 1) / layout.down_ports;
  return layout;
}

bool is_rate(double value) { return std::isfinite(value) && value > 0; }
bool is_latency(double value) { return std::isfinite(value) && value >= 0; }

// What the loader guarantees and SimGrid would choke on (zero bandwidth, negative latency).
void check_topology(const Topology& topology) {
  const std::string& file = topology.file;
  STEPCAST_CHECK(topology.num_nodes >= 1 && topology.node.devices_per_node >= 1,
                 file + ": no devices");
  STEPCAST_CHECK(topology.fabric.nics_per_node >= 1, file + ": no NICs");
  STEPCAST_CHECK(topology.fabric.switch_radix >= 2, file + ": switch_radix below 2");
  STEPCAST_CHECK(is_rate(topology.node.intra_node.bandwidth_bytes_per_s) &&
                     is_rate(topology.fabric.nic_bandwidth_bytes_per_s),
                 file + ": a bandwidth is not a positive number");
  STEPCAST_CHECK(is_latency(topology.node.intra_node.latency_s) &&
                     is_latency(topology.fabric.nic_latency_s) &&
                     is_latency(topology.fabric.switch_latency_s),
                 file + ": a latency is negative or not a number");
  STEPCAST_CHECK(std::isfinite(topology.fabric.oversubscription) &&
                     topology.fabric.oversubscription >= 1,
                 file + ": oversubscription below 1");
}

}  // namespace

Platform build_platform(sg4::Engine& engine, const Topology& topology,
                        const PlatformOptions& options) {
  STEPCAST_CHECK(engine.get_netzone_root() == nullptr, "the engine already has a platform");
  STEPCAST_CHECK(!options.devices.empty(), "a platform needs at least one device");
  STEPCAST_CHECK(std::isfinite(options.shared_link_divisor) && options.shared_link_divisor >= 1,
                 "shared_link_divisor " + std::to_string(options.shared_link_divisor) +
                     " is not a number >= 1");
  check_topology(topology);
  STEPCAST_CHECK(options.delay_hosts >= 0, "a negative number of delay hosts");
  const int64_t devices_per_node = topology.node.devices_per_node;
  std::unordered_set<int64_t> listed;
  std::unordered_map<int64_t, int64_t> listed_on_node;
  for (int64_t device : options.devices) {
    STEPCAST_CHECK(device >= 0 && device < topology.num_devices(),
                   "device " + std::to_string(device) + " outside 0.." +
                       std::to_string(topology.num_devices() - 1));
    STEPCAST_CHECK(listed.insert(device).second,
                   "device " + std::to_string(device) + " listed twice");
    ++listed_on_node[device / devices_per_node];
  }

  const IntraNodeFabric& intra = topology.node.intra_node;
  const InterNodeFabric& fabric = topology.fabric;
  const int64_t nics_per_node = fabric.nics_per_node;
  const int levels = fabric_levels(topology);
  const LeafLayout layout = leaf_layout(topology, levels);
  const double uplink_latency_s = (levels - 1) * fabric.switch_latency_s;
  // The route across leaves must cost what the analytical model charges.
  const double cross_leaf_latency_s =
      2 * (fabric.nic_latency_s + fabric.switch_latency_s / 2) + 2 * uplink_latency_s;
  const double model_latency_s = link_figures(topology).inter_latency_s;
  STEPCAST_CHECK(std::abs(cross_leaf_latency_s - model_latency_s) <= 1e-12 * model_latency_s,
                 "cross-leaf latency " + std::to_string(cross_leaf_latency_s) +
                     " s differs from link_figures' " + std::to_string(model_latency_s) + " s");

  sg4::NetZone* zone = sg4::create_dijkstra_zone("stepcast", /*cache=*/true);
  auto duplex = [zone](const std::string& name, double bandwidth_bytes_per_s, double latency_s) {
    return zone->create_split_duplex_link(name, bandwidth_bytes_per_s)->set_latency(latency_s);
  };
  auto up = [](const sg4::Link* link) { return sg4::LinkInRoute(link, Direction::UP); };

  struct Nic {
    sg4::Link* nic = nullptr;
    sg4::Link* leaf_port = nullptr;
    int64_t leaf = 0;
  };
  std::map<int64_t, NetPoint*> nvswitch_of_node;
  std::map<int64_t, Nic> nic_of_index;
  std::map<int64_t, NetPoint*> router_of_leaf;  // ordered: uplinks are made in leaf order

  Platform platform;
  platform.hosts.reserve(options.devices.size());
  for (int64_t device : options.devices) {
    const int64_t node = device / devices_per_node;
    const int64_t local_nic = (device % devices_per_node) * nics_per_node / devices_per_node;
    const int64_t nic_index = node * nics_per_node + local_nic;
    const std::string name = "dev" + std::to_string(device);

    sg4::Host* host = zone->create_host(name, 1.0);
    platform.host_of_device.emplace(device, host);
    platform.hosts.push_back(host);

    // A device alone on its node has no NVSwitch: fewer vertices make each Dijkstra faster.
    if (listed_on_node.at(node) > 1) {
      auto [nvswitch, new_node] = nvswitch_of_node.try_emplace(node, nullptr);
      if (new_node) {
        nvswitch->second = zone->create_router("node" + std::to_string(node) + "-nvswitch");
      }
      sg4::Link* nvlink =
          duplex(name + "-nvlink", intra.bandwidth_bytes_per_s, intra.latency_s / 2);
      sg4::Link* nvswitch_port = duplex(name + "-nvswitch-port", intra.bandwidth_bytes_per_s, 0);
      zone->add_route(host->get_netpoint(), nvswitch->second, nullptr, nullptr,
                      {up(nvlink), up(nvswitch_port)}, true);
    }

    auto [nic, new_nic] = nic_of_index.try_emplace(nic_index, Nic{});
    if (new_nic) {
      const std::string nic_name = "nic" + std::to_string(nic_index);
      nic->second.nic = duplex(nic_name, fabric.nic_bandwidth_bytes_per_s, fabric.nic_latency_s);
      nic->second.leaf_port = duplex(nic_name + "-leaf-port", fabric.nic_bandwidth_bytes_per_s,
                                     fabric.switch_latency_s / 2);
      nic->second.leaf = layout.leaf_of(node, local_nic);
    }
    auto [leaf, new_leaf] = router_of_leaf.try_emplace(nic->second.leaf, nullptr);
    if (new_leaf) leaf->second = zone->create_router("leaf" + std::to_string(leaf->first));
    sg4::Link* pcie = duplex(name + "-pcie", fabric.nic_bandwidth_bytes_per_s, 0);
    zone->add_route(host->get_netpoint(), leaf->second, nullptr, nullptr,
                    {up(pcie), up(nic->second.nic), up(nic->second.leaf_port)}, true);
  }

  if (router_of_leaf.size() > 1) {
    NetPoint* spine = zone->create_router("spine");
    for (const auto& [leaf, router] : router_of_leaf) {
      const int64_t nics = layout.nics_on(leaf);
      STEPCAST_CHECK(nics >= 1, "leaf " + std::to_string(leaf) + " holds no NIC");
      const double capacity_bytes_per_s = double(nics) * fabric.nic_bandwidth_bytes_per_s /
                                          (fabric.oversubscription * options.shared_link_divisor);
      sg4::Link* uplink =
          duplex("leaf" + std::to_string(leaf) + "-uplink", capacity_bytes_per_s, uplink_latency_s);
      zone->add_route(router, spine, nullptr, nullptr, {up(uplink)}, true);
    }
  }
  platform.delay_hosts.reserve(size_t(options.delay_hosts));
  for (int64_t i = 0; i < options.delay_hosts; ++i)
    platform.delay_hosts.push_back(zone->create_host("delay" + std::to_string(i), 1.0));
  zone->seal();
  return platform;
}

}  // namespace stepcast
