// Collective shapes, α-β times and the algorithm choice; see collective.hpp.
#include "collective.hpp"

#include <algorithm>
#include <cmath>
#include <set>

#include "errors.hpp"
#include "op_signature.hpp"

namespace stepcast {

GroupShape group_shape(const RankGrid& grid, GroupKind kind, int64_t rank,
                       int64_t devices_per_node) {
  std::vector<int64_t> members = grid.group(kind, rank);
  std::set<int64_t> nodes;
  for (int64_t r : members) nodes.insert(r / devices_per_node);
  GroupShape shape;
  shape.size = int64_t(members.size());
  shape.nodes = int64_t(nodes.size());
  shape.members_per_node = shape.size / shape.nodes;
  return shape;
}

namespace {

// Mean dimension-order hop count between two distinct nodes of a torus: a ring of d nodes puts
// floor(d²/4) hops between a node and all d of its ring (itself included); the dimensions add, and
// leaving out the pairs of a node with itself scales by N / (N − 1).
double torus_mean_hops(const std::vector<int>& dimensions) {
  double hops = 0;
  double nodes = 1;
  for (int d : dimensions) {
    hops += std::floor(double(d) * d / 4) / d;
    nodes *= d;
  }
  return nodes > 1 ? hops * nodes / (nodes - 1) : 0;
}

}  // namespace

bool rail_staged_all_to_all(const Topology& topology) {
  const IntraNodeKind kind = topology.node.intra_node.kind;
  return kind == IntraNodeKind::nvswitch || kind == IntraNodeKind::nvlink;
}

LinkFigures link_figures(const Topology& topology) {
  LinkFigures links;
  links.rail_staged = rail_staged_all_to_all(topology);
  links.intra_bandwidth_bytes_per_s = topology.node.intra_node.bandwidth_bytes_per_s;
  links.intra_latency_s = topology.node.intra_node.latency_s;
  const auto& fabric = topology.fabric;
  const double node_nic_bandwidth = fabric.nics_per_node * fabric.nic_bandwidth_bytes_per_s;
  const double devices = topology.node.devices_per_node;
  if (fabric.kind == FabricKind::torus) {
    // A ring step leaves the node over at least one torus link, which the node's devices (each in
    // its own rail-aligned ring) share; the latency is a hop count averaged over node pairs.
    const TorusFabric& torus = fabric.torus;
    links.inter_bandwidth_bytes_per_s = std::min(node_nic_bandwidth, torus.link_bandwidth_bytes_per_s) / devices;
    links.inter_latency_s = 2 * fabric.nic_latency_s + torus_mean_hops(torus.dimensions) * torus.link_latency_s;
    return links;
  }
  if (fabric.kind == FabricKind::dragonfly) {
    // The longest minimal route: router, local link, router, global link, router, local link,
    // router. A ring crossing routers and groups shares each local and global link it takes among
    // the node's devices (one rail-aligned ring each); a dragonfly of one group or one router per
    // group has no global or local hop.
    const DragonflyFabric& d = fabric.dragonfly;
    double bandwidth = node_nic_bandwidth;
    double latency = 2 * fabric.nic_latency_s + fabric.switch_latency_s;
    for (int end = 0; end < (d.groups > 1 ? 2 : 1) && d.routers_per_group > 1; ++end) {
      bandwidth = std::min(bandwidth, d.local_link_bandwidth_bytes_per_s);
      latency += d.local_link_latency_s + fabric.switch_latency_s;
    }
    if (d.groups > 1) {
      bandwidth = std::min(bandwidth, d.global_link_bandwidth_bytes_per_s);
      latency += d.global_link_latency_s + fabric.switch_latency_s;
    }
    links.inter_bandwidth_bytes_per_s = bandwidth / devices;
    links.inter_latency_s = latency;
    return links;
  }
  // NIC at both ends plus the switches of a path up to the tree's top and down again. With
  // radix r a two-level tree connects r²/2 end points; deeper trees add two hops per level.
  int64_t endpoints = topology.num_nodes * std::max(1, fabric.nics_per_node);
  int levels = 1;
  double reach = fabric.switch_radix;
  while (reach < endpoints) {
    reach *= std::max(2.0, fabric.switch_radix / 2.0);  // radix 2 would never grow
    ++levels;
  }
  // A device's share of the node's NICs, through a leaf that may be oversubscribed. A tree of one
  // switch has no uplink (sim/platform.cpp builds none), so its oversubscription takes nothing.
  const double oversubscription = levels > 1 ? fabric.oversubscription : 1.0;
  links.inter_bandwidth_bytes_per_s = node_nic_bandwidth / devices / oversubscription;
  links.inter_latency_s = 2 * fabric.nic_latency_s + (2 * levels - 1) * fabric.switch_latency_s;
  return links;
}

namespace {

double ring_steps(OpKind kind, int64_t n) {
  return kind == OpKind::all_reduce ? 2.0 * (n - 1) : double(n - 1);
}

double ring_time(OpKind kind, double bytes, int64_t n, double bandwidth, double latency) {
  if (n <= 1) return 0;
  double steps = ring_steps(kind, n);
  return steps * latency + steps * (bytes / n) / bandwidth;
}

}  // namespace

int64_t tree_depth(int64_t group_size) {
  int64_t depth = 0;
  while ((int64_t(1) << depth) < group_size) ++depth;
  return depth;
}

std::optional<OpKind> collective_kind(const std::string& name) {
  if (name == "all_reduce") return OpKind::all_reduce;
  if (name == "reduce_scatter") return OpKind::reduce_scatter;
  if (name == "all_gather") return OpKind::all_gather;
  if (name == "all_to_all") return OpKind::all_to_all;
  return std::nullopt;
}

double bus_bandwidth_factor(OpKind kind, int64_t group_size) {
  double n = double(group_size);
  if (kind == OpKind::all_reduce) return 2 * (n - 1) / n;
  if (kind == OpKind::reduce_scatter || kind == OpKind::all_gather) return (n - 1) / n;
  return 1.0;
}

// all_to_all, every pair exchanging at once: this member's chunks for the k − 1 others on its node
// over the intra-node link and for the n − k elsewhere over its share of the NICs, concurrently.
double pairwise_time(double bytes, const GroupShape& shape, const LinkFigures& links) {
  const double n = double(shape.size), k = double(shape.members_per_node);
  const double intra = (k - 1) / n * bytes / links.intra_bandwidth_bytes_per_s;
  if (shape.nodes <= 1) return links.intra_latency_s + intra;
  const double inter = (n - k) / n * bytes / links.inter_bandwidth_bytes_per_s;
  // Rail staging: what goes to other rails crosses NVLink first, beside the direct chunks.
  const double staged = links.rail_staged ? (n - k) / n * (k - 1) / k * bytes / links.intra_bandwidth_bytes_per_s : 0;
  return links.inter_latency_s + std::max(intra + staged, inter);
}

double collective_time_s(OpKind kind, Algorithm algorithm, double bytes, const GroupShape& shape,
                         const LinkFigures& links) {
  int64_t n = shape.size;
  if (n <= 1) return 0;
  STEPCAST_CHECK((kind == OpKind::all_to_all) == (algorithm == Algorithm::pairwise || algorithm == Algorithm::none),
                 "all_to_all runs pairwise, and only all_to_all does");
  bool multi_node = shape.nodes > 1;
  double bandwidth = multi_node ? links.inter_bandwidth_bytes_per_s : links.intra_bandwidth_bytes_per_s;
  double latency = multi_node ? links.inter_latency_s : links.intra_latency_s;
  switch (algorithm) {
    case Algorithm::ring:
      return ring_time(kind, bytes, n, bandwidth, latency);
    case Algorithm::tree: {
      STEPCAST_CHECK(kind == OpKind::all_reduce, "tree is an all_reduce algorithm");
      return 2 * tree_depth(n) * (latency + bytes / bandwidth);
    }
    case Algorithm::hierarchical: {
      int64_t k = shape.members_per_node;
      int64_t nodes = shape.nodes;
      double intra = 0;
      if (k > 1) {
        // reduce_scatter (and all_gather) inside the node, each of the n−1 steps carrying S/k.
        double one_phase = ring_time(OpKind::reduce_scatter, bytes, k,
                                     links.intra_bandwidth_bytes_per_s, links.intra_latency_s);
        intra = kind == OpKind::all_reduce ? 2 * one_phase : one_phase;
      }
      double inter = ring_time(kind, bytes / k, nodes, links.inter_bandwidth_bytes_per_s,
                               links.inter_latency_s);
      return intra + inter;
    }
    case Algorithm::pairwise:
      return pairwise_time(bytes, shape, links);
    case Algorithm::none:
      return 0;
  }
  return 0;
}

namespace {

// NCCL's tuner latencies for its LL protocol, the one it runs latency-bound messages with
// (src/graph/tuning.cc, ncclTunerConstantsDefaults, NVIDIA/nccl master of 2026; seconds): the
// base of a ring and of a tree, a step over NVLink (times 1.8 once the communicator spans
// nodes), a ring step and a tree level across the network.
constexpr double kNcclRingBase = 6.6e-6, kNcclTreeBase = 6.8e-6;
constexpr double kNcclNvlinkStep = 0.6e-6, kNcclMultiNodeLL = 1.8;
constexpr double kNcclNetRingStep = 2.7e-6, kNcclNetTreeLevel = 5.0e-6;
// The tuner's correction of the tree's bandwidth by size ("Trees are not perfectly sticking to
// the model for medium sizes", src/graph/tuning.cc, treeCorrectionFactor, its Simple protocol's
// row, the protocol whose bandwidth the tree's term is): index ⌊log2(bytes / 64)⌋, 64 B up to
// 256 MiB; outside, 1.
constexpr double kNcclTreeCorrection[23] = {.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5,
                                            .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9};

double nccl_tree_correction(double bytes) {
  int log_size = -1;  // NCCL's log2i(bytes >> 6): −1 below 64 B
  for (double b = bytes / 64; b >= 1; b /= 2) ++log_size;
  return log_size >= 0 && log_size < 23 ? kNcclTreeCorrection[log_size] : 1.0;
}

double nccl_intra_step(const GroupShape& shape) {
  return shape.nodes > 1 ? kNcclNvlinkStep * kNcclMultiNodeLL : kNcclNvlinkStep;
}

// `volume` through each member's NVLink and, across nodes, through the group's k members' NICs
// (V / k each), the two pipelined: the larger.
double nccl_transfer_s(double volume, const GroupShape& shape, const LinkFigures& links) {
  const double intra = shape.members_per_node > 1 ? volume / links.intra_bandwidth_bytes_per_s : 0.0;
  const double inter = volume / (double(shape.members_per_node) * links.inter_bandwidth_bytes_per_s);
  return std::max(intra, inter);
}

}  // namespace

double nccl_ring_time_s(OpKind kind, double bytes, const GroupShape& shape, const LinkFigures& links) {
  const int64_t n = shape.size;
  if (n <= 1) return 0;
  if (kind == OpKind::all_to_all) return pairwise_time(bytes, shape, links);
  const double volume = bus_bandwidth_factor(kind, n) * bytes;
  const double steps = ring_steps(kind, n);
  if (shape.nodes <= 1) {
    return kNcclRingBase + steps * nccl_intra_step(shape) + volume / links.intra_bandwidth_bytes_per_s;
  }
  const double crossings = kind == OpKind::all_reduce ? 2.0 * double(shape.nodes - 1) : double(shape.nodes - 1);
  const double latency = kNcclRingBase + (steps - crossings) * nccl_intra_step(shape) + crossings * kNcclNetRingStep;
  return nccl_transfer_s(volume, shape, links) + latency;
}

double nccl_tree_time_s(double bytes, const GroupShape& shape, const LinkFigures& links) {
  STEPCAST_CHECK(shape.nodes > 1, "NCCL's tree is modelled across nodes");
  const double n = double(shape.size), k = double(shape.members_per_node);
  const double volume = bus_bandwidth_factor(OpKind::all_reduce, shape.size) * bytes * n / (n - 1);
  int64_t levels = 0;  // NCCL's log2i: the floor
  for (int64_t nodes = shape.nodes; nodes > 1; nodes /= 2) ++levels;
  const double latency = kNcclTreeBase + 2 * ((k - 1) * nccl_intra_step(shape) + double(levels) * kNcclNetTreeLevel);
  return nccl_transfer_s(volume, shape, links) / (0.92 * nccl_tree_correction(bytes)) + latency;
}

double nccl_time_s(OpKind kind, double bytes, const GroupShape& shape, const LinkFigures& links) {
  const double ring = nccl_ring_time_s(kind, bytes, shape, links);
  if (kind != OpKind::all_reduce || shape.nodes <= 1) return ring;
  return std::min(ring, nccl_tree_time_s(bytes, shape, links));
}

Algorithm choose_algorithm(OpKind kind, double bytes, const GroupShape& shape,
                           const LinkFigures& links) {
  if (shape.size <= 1) return Algorithm::none;
  if (kind == OpKind::all_to_all) return Algorithm::pairwise;
  std::vector<Algorithm> candidates = {Algorithm::ring};
  if (kind == OpKind::all_reduce) candidates.push_back(Algorithm::tree);
  bool hierarchical_possible = shape.nodes > 1 && shape.members_per_node > 1;
  if (hierarchical_possible &&
      (kind == OpKind::all_reduce || kind == OpKind::reduce_scatter || kind == OpKind::all_gather)) {
    candidates.push_back(Algorithm::hierarchical);
  }
  Algorithm best = candidates.front();
  double best_time = collective_time_s(kind, best, bytes, shape, links);
  for (size_t i = 1; i < candidates.size(); ++i) {
    double t = collective_time_s(kind, candidates[i], bytes, shape, links);
    if (t < best_time) {
      best_time = t;
      best = candidates[i];
    }
  }
  return best;
}

int64_t collective_scratch_elements(OpKind kind, Algorithm algorithm, const GroupShape& shape,
                                    int64_t payload_elements) {
  auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / std::max<int64_t>(1, b); };
  int64_t piece = ceil_div(payload_elements, shape.size);  // ring chunk
  if (kind == OpKind::all_reduce && algorithm == Algorithm::tree) piece = payload_elements;
  if (kind == OpKind::all_reduce && algorithm == Algorithm::hierarchical) {
    piece = ceil_div(payload_elements,
                     shape.members_per_node > 1 ? shape.members_per_node : shape.nodes);
  }
  return 2 * std::max<int64_t>(1, piece);
}

CollectiveLocalWork collective_local_work(const Op& op, int64_t group_size) {
  CollectiveLocalWork work;
  if (group_size <= 1 || op.name == OpName::fp8_amax || op.name == OpName::moe_route_gather) return work;
  if (op.kind != OpKind::all_gather && op.kind != OpKind::reduce_scatter) return work;
  const OpSignature* signature = find_signature(op);
  if (!signature || !bind_slots(*signature, op).error.empty()) return work;  // operands an executor could not run
  const double part = op.bytes / double(group_size);
  if (op.kind == OpKind::all_gather) {
    Operands slots(op);
    if (!slots.has_in("counts") && op.name != OpName::param_gather) work.copy_bytes = part;
  } else if (op.kind == OpKind::reduce_scatter) {
    if (op.name != OpName::grad_bucket) {
      work.copy_bytes = part;
    } else {
      Operands slots(op);
      // (full, shard) pairs in, the shards out: sharded gradients.
      if (slots.ins("grads").size() == 2 * slots.outs("grads").size()) work.add_bytes = part;
    }
  }
  return work;
}

}  // namespace stepcast
