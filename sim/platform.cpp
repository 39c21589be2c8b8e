// Builds the SimGrid platform of a topology; see platform.hpp. Only this file, platform_fabrics.cpp
// and the simulator proper touch SimGrid (3.32, S4U).
//
// One Dijkstra zone holds every host and router, joined by explicit edges between neighbours,
// each declared once as a symmetrical route (the reverse edge takes the other half of every
// split-duplex link) unless said otherwise. Every link is split-duplex: the two directions never
// share bandwidth.
//
//   device ─ nvlink ─ nvswitch-port ─ NVSwitch router of the node            (intra-node)
//   device ─ pcie ─ nic ─ port ─ router of the fabric ─ …                    (inter-node)
//
//   link           one per  bandwidth, bytes/s per direction       latency, s
//   nvlink         device   intra_node.bandwidth                   intra_node.latency / 2
//   nvswitch-port  device   intra_node.bandwidth                   0
//   pcie           device   nic_bandwidth                          0
//   nic            NIC      nic_bandwidth                          nic_latency
//   port           NIC      nic_bandwidth                          switch_latency / 2 (torus: 0)
//
// The fabric behind the ports, by kind (capacities of the router-to-router links are divided by
// options.shared_link_divisor: fast mode folds identical rail-aligned groups into one):
//
// fat_tree, rail_optimized: the port (leaf-port) leads to a leaf router; leaves join one
// non-blocking spine through their uplinks.
//   uplink         leaf     NICs on the leaf · nic_bandwidth       (levels − 1) · switch_latency
//                           / (oversubscription · shared_link_divisor)
// So device → NVSwitch → device takes intra_node.latency; device → leaf → device on another node
// takes 2·nic_latency + switch_latency (one switch); a route across leaves takes 2·nic_latency +
// (2·levels − 1)·switch_latency, link_figures' inter-node latency: the tree's upper levels are
// folded into the uplinks and one non-blocking spine.
// Local device l uses local NIC l·nics_per_node / devices_per_node, so devices share a NIC when a
// node has fewer NICs than devices; with more NICs than devices each device drives
// nics_per_node / devices_per_node of them (its NIC, port and PCIe links that many times the NIC
// rate, on its first NIC's leaf), as link_figures' per-device share says: Open MPI's TCP transport
// stripes a message over every interface it may use (2 NICs of 200 Mbit/s carried 49.4 MB/s for
// one rank), and NCCL spreads its channels over the NICs near a GPU. Leaves: a one-level tree is a single switch holding every NIC;
// otherwise a leaf has switch_radix / 2 down ports, filled in NIC order (fat_tree, node-major) or
// by rail (rail_optimized: NIC r of switch_radix / 2 consecutive nodes share a rail-r leaf).
// Only listed devices get a host; leaves without one are left out, and so is the NVSwitch of a
// node with fewer than two. Leaf membership and uplink capacity follow the real device indices.
//
// dragonfly: node n's NICs plug into router n / nodes_per_router (router-port); a group's routers
// are joined all-to-all by local links, every two groups by one global link, held in group g by
// router ((h − g − 1) mod groups) mod routers_per_group for the link to group h (g's links spread
// round-robin over its routers).
//   local          router pair  local_link_bandwidth              local_link_latency + switch_latency
//   global         group pair   global_link_bandwidth             global_link_latency + switch_latency
//   global-end     group pair   global_link_bandwidth, one each end 0
// Minimal routing: a route between groups crosses exactly one global link, and a local link at
// either end where the global link sits on another router: 2·nic_latency + (2 + hops)·
// switch_latency + the links' latencies; inside a router 2·nic_latency + switch_latency.
//
// torus: node n has a router per dimension (the layers, see platform_fabrics.cpp); its NICs
// enter at the first layer (one-way route host → router) and leave from the last (one-way route
// router → host), and zero-latency fat-pipe turns lead from layer k to layer k + 1 (and back, a
// detour no shortest path takes), so routes are dimension-ordered, the shorter way round each ring.
//   torus          node, dimension  link_bandwidth               link_latency (router and cable)
//   turn           node, dimension  link_bandwidth (fat pipe)    0
// A route k hops long takes 2·nic_latency + k·link_latency.
//
// Why explicit links, not SimGrid's create_torus_zone / create_dragonfly_zone: a cluster zone puts
// a leaf (a host or a nested zone) at every position, joins it to the fabric by one private link
// and routes inside itself. A stepcast node is several device hosts behind an NVSwitch sharing
// NICs, with hosts for the listed devices only, and fast mode divides the router links' capacity;
// a nested zone per node would need gateways and recursive routing for that, and the dragonfly
// zone places routers in chassis and its global (blue) links its own way (3.32 also segfaults on
// some dragonfly parameters instead of refusing them). Explicit links keep one zone, the link
// conventions above and routes whose every link a test can name.
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
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "collective.hpp"
#include "errors.hpp"
#include "platform_fabrics.hpp"

namespace stepcast {

namespace sg4 = simgrid::s4u;
using simgrid::kernel::routing::NetPoint;

std::unique_ptr<sg4::Engine> create_engine() {
  static char name[] = "stepcast", log[] = "--log=root.thresh:critical";
  int argc = 2;
  char* argv[] = {name, log, nullptr};
  auto engine = std::make_unique<sg4::Engine>(&argc, argv);
  configure_engine(*engine);
  return engine;
}

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
  const InterNodeFabric& fabric = topology.fabric;
  STEPCAST_CHECK(topology.num_nodes >= 1 && topology.node.devices_per_node >= 1,
                 file + ": no devices");
  STEPCAST_CHECK(fabric.nics_per_node >= 1, file + ": no NICs");
  STEPCAST_CHECK(is_rate(topology.node.intra_node.bandwidth_bytes_per_s) &&
                     is_rate(fabric.nic_bandwidth_bytes_per_s),
                 file + ": a bandwidth is not a positive number");
  STEPCAST_CHECK(is_latency(topology.node.intra_node.latency_s) && is_latency(fabric.nic_latency_s) &&
                     is_latency(fabric.switch_latency_s),
                 file + ": a latency is negative or not a number");
  if (is_switch_tree(fabric.kind)) {
    STEPCAST_CHECK(fabric.switch_radix >= 2, file + ": switch_radix below 2");
    STEPCAST_CHECK(std::isfinite(fabric.oversubscription) && fabric.oversubscription >= 1,
                   file + ": oversubscription below 1");
  } else if (fabric.kind == FabricKind::dragonfly) {
    const DragonflyFabric& d = fabric.dragonfly;
    STEPCAST_CHECK(d.groups >= 1 && d.routers_per_group >= 1 && d.nodes_per_router >= 1 &&
                       int64_t(d.groups) * d.routers_per_group * d.nodes_per_router == topology.num_nodes,
                   file + ": the dragonfly's sizes do not place num_nodes nodes");
    STEPCAST_CHECK(is_rate(d.local_link_bandwidth_bytes_per_s) && is_rate(d.global_link_bandwidth_bytes_per_s) &&
                       is_latency(d.local_link_latency_s) && is_latency(d.global_link_latency_s),
                   file + ": a dragonfly link figure is not a positive number");
  } else {
    const TorusFabric& torus = fabric.torus;
    int64_t nodes = 1;
    for (int size : torus.dimensions) nodes *= size >= 1 ? size : 0;
    STEPCAST_CHECK((torus.dimensions.size() == 2 || torus.dimensions.size() == 3) &&
                       nodes == topology.num_nodes,
                   file + ": the torus's dimensions do not place num_nodes nodes");
    STEPCAST_CHECK(is_rate(torus.link_bandwidth_bytes_per_s) && is_latency(torus.link_latency_s),
                   file + ": a torus link figure is not a positive number");
  }
}

// Leaves under one spine; see the layout at the top.
class TreeBuilder : public platform_detail::FabricBuilder {
 public:
  TreeBuilder(sg4::NetZone* zone, const Topology& topology, double divisor)
      : zone_(zone), fabric_(topology.fabric), divisor_(divisor) {
    const int levels = fabric_levels(topology);
    layout_ = leaf_layout(topology, levels);
    uplink_latency_s_ = (levels - 1) * fabric_.switch_latency_s;
    // The route across leaves must cost what the analytical model charges.
    const double cross_leaf_latency_s =
        2 * (fabric_.nic_latency_s + fabric_.switch_latency_s / 2) + 2 * uplink_latency_s_;
    const double model_latency_s = link_figures(topology).inter_latency_s;
    STEPCAST_CHECK(std::abs(cross_leaf_latency_s - model_latency_s) <= 1e-12 * model_latency_s,
                   "cross-leaf latency " + std::to_string(cross_leaf_latency_s) +
                       " s differs from link_figures' " + std::to_string(model_latency_s) + " s");
  }

  platform_detail::FabricPort attach(int64_t node, int64_t local_nic) override {
    auto [leaf, new_leaf] = router_of_leaf_.try_emplace(layout_.leaf_of(node, local_nic), nullptr);
    if (new_leaf) leaf->second = zone_->create_router("leaf" + std::to_string(leaf->first));
    return {leaf->second, leaf->second, fabric_.switch_latency_s / 2, "-leaf-port"};
  }

  void connect() override {
    if (router_of_leaf_.size() <= 1) return;
    NetPoint* spine = zone_->create_router("spine");
    for (const auto& [leaf, router] : router_of_leaf_) {
      const int64_t nics = layout_.nics_on(leaf);
      STEPCAST_CHECK(nics >= 1, "leaf " + std::to_string(leaf) + " holds no NIC");
      const double capacity_bytes_per_s =
          double(nics) * fabric_.nic_bandwidth_bytes_per_s / (fabric_.oversubscription * divisor_);
      sg4::Link* uplink = platform_detail::duplex_link(zone_, "leaf" + std::to_string(leaf) + "-uplink",
                                                       capacity_bytes_per_s, uplink_latency_s_);
      zone_->add_route(router, spine, nullptr, nullptr, {sg4::LinkInRoute(uplink, Direction::UP)}, true);
    }
  }

 private:
  sg4::NetZone* zone_;
  const InterNodeFabric& fabric_;
  double divisor_;
  LeafLayout layout_;
  double uplink_latency_s_ = 0;
  std::map<int64_t, NetPoint*> router_of_leaf_;  // ordered: uplinks are made in leaf order
};

std::unique_ptr<platform_detail::FabricBuilder> make_fabric_builder(sg4::NetZone* zone,
                                                                    const Topology& topology,
                                                                    double divisor) {
  if (topology.fabric.kind == FabricKind::dragonfly)
    return platform_detail::make_dragonfly_builder(zone, topology, divisor);
  if (topology.fabric.kind == FabricKind::torus)
    return platform_detail::make_torus_builder(zone, topology, divisor);
  return std::make_unique<TreeBuilder>(zone, topology, divisor);
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

  sg4::NetZone* zone = sg4::create_dijkstra_zone("stepcast", /*cache=*/true);
  std::unique_ptr<platform_detail::FabricBuilder> builder =
      make_fabric_builder(zone, topology, options.shared_link_divisor);
  auto duplex = [zone](const std::string& name, double bandwidth_bytes_per_s, double latency_s) {
    return platform_detail::duplex_link(zone, name, bandwidth_bytes_per_s, latency_s);
  };
  auto up = [](const sg4::Link* link) { return sg4::LinkInRoute(link, Direction::UP); };
  auto down = [](const sg4::Link* link) { return sg4::LinkInRoute(link, Direction::DOWN); };

  struct Nic {
    sg4::Link* nic = nullptr;
    sg4::Link* port = nullptr;
  };
  std::map<int64_t, NetPoint*> nvswitch_of_node;
  std::map<int64_t, Nic> nic_of_index;

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

    const platform_detail::FabricPort port = builder->attach(node, local_nic);
    auto [nic, new_nic] = nic_of_index.try_emplace(nic_index, Nic{});
    // A degraded node (heterogeneity's link_bandwidth_factor): its NICs, ports and PCIe links.
    const int64_t nics_driven = std::max<int64_t>(1, nics_per_node / devices_per_node);
    const double nic_bandwidth_bytes_per_s = fabric.nic_bandwidth_bytes_per_s * double(nics_driven) *
                                             topology.heterogeneity.link_bandwidth_factor(node);
    if (new_nic) {
      const std::string nic_name = "nic" + std::to_string(nic_index);
      nic->second.nic = duplex(nic_name, nic_bandwidth_bytes_per_s, fabric.nic_latency_s);
      nic->second.port = duplex(nic_name + port.port_suffix, nic_bandwidth_bytes_per_s,
                                port.port_latency_s);
    }
    sg4::Link* pcie = duplex(name + "-pcie", nic_bandwidth_bytes_per_s, 0);
    if (port.up == port.down) {
      zone->add_route(host->get_netpoint(), port.up, nullptr, nullptr,
                      {up(pcie), up(nic->second.nic), up(nic->second.port)}, true);
    } else {
      zone->add_route(host->get_netpoint(), port.up, nullptr, nullptr,
                      {up(pcie), up(nic->second.nic), up(nic->second.port)}, false);
      zone->add_route(port.down, host->get_netpoint(), nullptr, nullptr,
                      {down(nic->second.port), down(nic->second.nic), down(pcie)}, false);
    }
  }
  builder->connect();

  platform.delay_hosts.reserve(size_t(options.delay_hosts));
  const std::vector<double> speeds =
      options.delay_host_speeds.empty() ? std::vector<double>{1.0} : options.delay_host_speeds;
  for (int64_t i = 0; i < options.delay_hosts; ++i)
    platform.delay_hosts.push_back(zone->create_host("delay" + std::to_string(i), speeds));
  zone->seal();
  return platform;
}

}  // namespace stepcast
