// The dragonfly and the torus as routers and links of the platform's Dijkstra zone; see the
// layout atop platform.cpp. Links: split-duplex, bytes/s per direction, latencies in seconds.
#include "platform_fabrics.hpp"

#include <map>
#include <vector>

#include "errors.hpp"

namespace stepcast::platform_detail {

namespace {

namespace sg4 = simgrid::s4u;
using simgrid::kernel::routing::NetPoint;
using Direction = sg4::LinkInRoute::Direction;

sg4::LinkInRoute up(const sg4::Link* link) { return sg4::LinkInRoute(link, Direction::UP); }

// Groups of routers_per_group routers, all-to-all local links inside a group, one global link
// (with a port link at each end) between every two groups. Only groups holding a listed device
// are drawn: a minimal route never leaves its two end groups.
class DragonflyBuilder : public FabricBuilder {
 public:
  DragonflyBuilder(sg4::NetZone* zone, const Topology& topology, double divisor)
      : zone_(zone), fabric_(topology.fabric), shape_(topology.fabric.dragonfly), divisor_(divisor) {}

  FabricPort attach(int64_t node, int64_t /*local_nic*/) override {
    const int64_t router = node / shape_.nodes_per_router;
    std::vector<NetPoint*>& routers = group(router / shape_.routers_per_group);
    NetPoint* point = routers[size_t(router % shape_.routers_per_group)];
    return {point, point, fabric_.switch_latency_s / 2, "-router-port"};
  }

  void connect() override {
    const double local_bw = shape_.local_link_bandwidth_bytes_per_s / divisor_;
    const double local_latency_s = shape_.local_link_latency_s + fabric_.switch_latency_s;
    for (const auto& [g, routers] : groups_) {
      for (size_t a = 0; a < routers.size(); ++a) {
        for (size_t b = a + 1; b < routers.size(); ++b) {
          const std::string name = "group" + std::to_string(g) + "-local" + std::to_string(a) + "-" + std::to_string(b);
          sg4::Link* local = duplex_link(zone_, name, local_bw, local_latency_s);
          zone_->add_route(routers[a], routers[b], nullptr, nullptr, {up(local)}, true);
        }
      }
    }
    // The global link weighs three links (two zero-latency ports of its bandwidth, which carry
    // exactly its flows): Dijkstra counts links, and a path through a third group (two global
    // links, 6) must cost more than the minimal one (local, global, local: 5).
    const double global_bw = shape_.global_link_bandwidth_bytes_per_s / divisor_;
    const double global_latency_s = shape_.global_link_latency_s + fabric_.switch_latency_s;
    for (auto i = groups_.begin(); i != groups_.end(); ++i) {
      for (auto j = std::next(i); j != groups_.end(); ++j) {
        const std::string name = "global" + std::to_string(i->first) + "-" + std::to_string(j->first);
        sg4::Link* end_i = duplex_link(zone_, name + "-end" + std::to_string(i->first), global_bw, 0);
        sg4::Link* global = duplex_link(zone_, name, global_bw, global_latency_s);
        sg4::Link* end_j = duplex_link(zone_, name + "-end" + std::to_string(j->first), global_bw, 0);
        zone_->add_route(i->second[global_router(i->first, j->first)], j->second[global_router(j->first, i->first)],
                         nullptr, nullptr, {up(end_i), up(global), up(end_j)}, true);
      }
    }
  }

 private:
  // The router of group `from` holding its global link to group `to`: group g's links to the
  // g − 1 others, taken in the order g+1, g+2, … (mod groups), go round-robin over its routers.
  size_t global_router(int64_t from, int64_t to) const {
    const int64_t groups = shape_.groups;
    return size_t(((to - from - 1 + groups) % groups) % shape_.routers_per_group);
  }

  std::vector<NetPoint*>& group(int64_t g) {
    auto [it, inserted] = groups_.try_emplace(g);
    if (inserted) {
      for (int r = 0; r < shape_.routers_per_group; ++r) {
        it->second.push_back(zone_->create_router("group" + std::to_string(g) + "-router" + std::to_string(r)));
      }
    }
    return it->second;
  }

  sg4::NetZone* zone_;
  const InterNodeFabric& fabric_;
  const DragonflyFabric& shape_;
  double divisor_;
  std::map<int64_t, std::vector<NetPoint*>> groups_;  // ordered: links are made in group order
};

// One router per node and dimension: layer k holds the ring links of dimension k only, a node's
// NICs enter at layer 0 and leave from the last layer, and turn links lead from layer k to
// layer k + 1 of the same node (and back, at a cost no shortest path pays). The shortest paths are
// therefore dimension-ordered (x, then y, then z); Dijkstra takes the shorter way round each ring
// (either, when both are d/2 hops). A ring of two nodes has one link between them, a ring of one
// none. Every node's routers are drawn: routes cross nodes without listed devices.
class TorusBuilder : public FabricBuilder {
 public:
  TorusBuilder(sg4::NetZone* zone, const Topology& topology, double divisor)
      : zone_(zone), torus_(topology.fabric.torus), nodes_(topology.num_nodes), divisor_(divisor) {
    const size_t layers = torus_.dimensions.size();
    routers_.reserve(size_t(nodes_) * layers);
    for (int64_t node = 0; node < nodes_; ++node) {
      for (size_t k = 0; k < layers; ++k) {
        routers_.push_back(zone_->create_router("node" + std::to_string(node) + "-torus-d" + std::to_string(k)));
      }
    }
  }

  FabricPort attach(int64_t node, int64_t /*local_nic*/) override {
    return {router(node, 0), router(node, torus_.dimensions.size() - 1), 0, "-router-port"};
  }

  void connect() override {
    const double bw = torus_.link_bandwidth_bytes_per_s / divisor_;
    int64_t stride = 1;
    for (size_t k = 0; k < torus_.dimensions.size(); ++k) {
      const int64_t size = torus_.dimensions[k];
      for (int64_t node = 0; node < nodes_; ++node) {
        const int64_t coord = (node / stride) % size;
        if (size == 1 || (size == 2 && coord == 1)) continue;
        const int64_t next = coord + 1 < size ? node + stride : node - (size - 1) * stride;
        sg4::Link* link =
            duplex_link(zone_, "torus" + std::to_string(node) + "-d" + std::to_string(k), bw, torus_.link_latency_s);
        zone_->add_route(router(node, k), router(next, k), nullptr, nullptr, {up(link)}, true);
      }
      stride *= size;
    }
    // A turn carries every flow turning at its node, so it must not share bandwidth: a fat pipe
    // caps each flow at one torus link's bandwidth, which the flow's own torus links also do.
    // The same link also leads back from layer k + 1 to layer k, which no shortest path takes (a
    // path must still climb every layer, so a step back costs two turns more than the
    // dimension-ordered path) but which keeps every router reachable from every source: SimGrid
    // 3.32's Dijkstra adds link counts to the ULONG_MAX of an unreachable vertex, wraps round, and
    // then loops for ever on the predecessors it wrote.
    for (int64_t node = 0; node < nodes_; ++node) {
      for (size_t k = 0; k + 1 < torus_.dimensions.size(); ++k) {
        sg4::Link* turn = zone_
                              ->create_link("node" + std::to_string(node) + "-turn" + std::to_string(k),
                                            torus_.link_bandwidth_bytes_per_s)
                              ->set_sharing_policy(sg4::Link::SharingPolicy::FATPIPE)
                              ->set_latency(0);
        zone_->add_route(router(node, k), router(node, k + 1), nullptr, nullptr, {sg4::LinkInRoute(turn)}, false);
        zone_->add_route(router(node, k + 1), router(node, k), nullptr, nullptr, {sg4::LinkInRoute(turn)}, false);
      }
    }
  }

 private:
  NetPoint* router(int64_t node, size_t layer) const {
    return routers_[size_t(node) * torus_.dimensions.size() + layer];
  }

  sg4::NetZone* zone_;
  const TorusFabric& torus_;
  int64_t nodes_;
  double divisor_;
  std::vector<NetPoint*> routers_;  // node-major, one per dimension
};

}  // namespace

std::unique_ptr<FabricBuilder> make_dragonfly_builder(sg4::NetZone* zone, const Topology& topology,
                                                      double shared_link_divisor) {
  STEPCAST_CHECK(topology.fabric.kind == FabricKind::dragonfly, "not a dragonfly");
  return std::make_unique<DragonflyBuilder>(zone, topology, shared_link_divisor);
}

std::unique_ptr<FabricBuilder> make_torus_builder(sg4::NetZone* zone, const Topology& topology,
                                                  double shared_link_divisor) {
  STEPCAST_CHECK(topology.fabric.kind == FabricKind::torus, "not a torus");
  return std::make_unique<TorusBuilder>(zone, topology, shared_link_divisor);
}

}  // namespace stepcast::platform_detail
