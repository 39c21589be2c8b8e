// The measured correction of collective times; see collective_cost.hpp.
#include "collective_cost.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "errors.hpp"
#include "profile.hpp"

namespace stepcast {

namespace {

// How far two group shapes are apart: inside a node against across nodes first, then nodes and
// members per node in log.
double span_distance(const GroupShape& a, const GroupShape& b) {
  double cross = (a.nodes > 1) != (b.nodes > 1) ? 100.0 : 0.0;
  return cross + std::abs(std::log2(double(a.nodes) / double(b.nodes))) +
         std::abs(std::log2(double(a.members_per_node) / double(b.members_per_node)));
}

// How far a size lies below a table's sizes, in doublings (0 inside and above): below them a
// table's correction changes with the size far more than with the span (NCCL switches
// protocols, LL to LL128 to Simple, and channel counts as messages shrink), so a doubling below
// counts as a doubling of nodes; above them NCCL stays on its largest messages' protocol and
// channels, and the correction with them.
double size_distance(const MeasuredCollective& m, double bytes) {
  return bytes > 0 && bytes < m.min_bytes ? std::log2(m.min_bytes / bytes) : 0.0;
}

}  // namespace

// Across nodes a size is read off a table at the same bytes per unit of NIC bandwidth the group
// leaves each node through (its k members' shares of the NICs): NCCL spreads a message over
// channels, a pair of them a NIC, and a channel's efficiency follows the bytes it carries
// (NCCL's enqueue cuts the channels of small messages by bytes per channel). A data-parallel
// group of one member per node (tensor parallel 8) carries through its one NIC what an
// 8-member table spreads over eight: it is read at 8 times its size. Inside a node: the size.
double CollectiveCostModel::network_size_ratio(const MeasuredCollective& m, const GroupShape& shape,
                                              const LinkFigures& links) const {
  if (shape.nodes <= 1 || m.shape.nodes <= 1) return 1.0;
  const double table = double(m.shape.members_per_node) * measured_links_.inter_bandwidth_bytes_per_s;
  const double group = double(shape.members_per_node) * links.inter_bandwidth_bytes_per_s;
  return group > 0 ? table / group : 1.0;
}

CollectiveCostModel::CollectiveCostModel(const DeviceProfile& profile, const Topology& topology)
    : links_(link_figures(apply_link_fractions(topology, profile))) {
  measured_links_ = links_;
  exchange_links_ = links_;
  if (profile.collective_fraction_differs()) {
    exchange_links_ = link_figures(apply_link_fractions(topology, profile, true));
    exchange_differs_ = true;
  }
  if (!profile.measured) return;
  if (profile.measured->system) {
    const MeasuredSystem& m = *profile.measured->system;
    Topology system = topology;
    system.node.devices_per_node = int(m.devices_per_node);
    system.node.intra_node.bandwidth_bytes_per_s = m.intra_node_bandwidth_bytes_per_s;
    system.node.intra_node.latency_s = m.intra_node_latency_s;
    system.fabric.nics_per_node = int(m.nics_per_node);
    system.fabric.nic_bandwidth_bytes_per_s = m.nic_bandwidth_bytes_per_s;
    system.fabric.nic_latency_s = m.nic_latency_s;
    system.fabric.switch_latency_s = m.switch_latency_s;
    system.fabric.oversubscription = m.oversubscription;
    measured_links_ = link_figures(apply_link_fractions(system, profile));
  }
  if (!profile.execution_in_order) {
    auto p2p_table = [](const std::vector<P2pPoint>& points, CollectiveTable& table, double& lo, double& hi) {
      if (points.empty()) return;
      std::vector<CollectivePoint> as_points;
      for (const P2pPoint& q : points) as_points.push_back({"send", "nccl", 2, q.bytes, q.time_s, 0, 0, q.source});
      table = CollectiveTable(as_points);
      lo = hi = points.front().bytes;
      for (const P2pPoint& q : points) {
        lo = std::min(lo, q.bytes);
        hi = std::max(hi, q.bytes);
      }
    };
    p2p_table(profile.measured->p2p, p2p_intra_, p2p_intra_min_, p2p_intra_max_);
    p2p_table(profile.measured->p2p_inter_node, p2p_inter_, p2p_inter_min_, p2p_inter_max_);
  }
  std::map<std::tuple<std::string, int64_t, int64_t>, std::vector<CollectivePoint>> grouped;
  for (const CollectivePoint& c : profile.measured->collectives) {
    if (c.algorithm != "nccl" || !collective_kind(c.kind)) continue;
    grouped[{c.kind, c.group_size, c.nodes}].push_back(c);
  }
  for (const auto& [key, points] : grouped) {
    MeasuredCollective m;
    m.kind = *collective_kind(std::get<0>(key));
    m.shape.size = std::get<1>(key);
    m.shape.nodes = std::get<2>(key);
    m.shape.members_per_node = m.shape.size / m.shape.nodes;
    m.table = CollectiveTable(points);
    m.min_bytes = points.front().bytes;
    m.max_bytes = points.front().bytes;
    for (const CollectivePoint& p : points) {
      m.min_bytes = std::min(m.min_bytes, p.bytes);
      m.max_bytes = std::max(m.max_bytes, p.bytes);
    }
    m.source = points.front().source;
    tables_.push_back(std::move(m));
  }
}

const MeasuredCollective* CollectiveCostModel::table_for(OpKind kind, const GroupShape& shape, double bytes) const {
  auto best_of = [&](OpKind wanted) -> const MeasuredCollective* {
    const MeasuredCollective* best = nullptr;
    double best_distance = std::numeric_limits<double>::infinity();
    for (const MeasuredCollective& m : tables_) {
      if (m.kind != wanted) continue;
      double d = span_distance(m.shape, shape) + size_distance(m, bytes);
      if (d < best_distance) {
        best_distance = d;
        best = &m;
      }
    }
    return best;
  };
  const MeasuredCollective* found = best_of(kind);
  // reduce_scatter and all_gather are the two halves of a ring all_reduce: its correction at the
  // same per-rank size stands in where they were not measured.
  if (!found && (kind == OpKind::reduce_scatter || kind == OpKind::all_gather)) {
    found = best_of(OpKind::all_reduce);
  }
  return found;
}

double CollectiveCostModel::corrected_s(const MeasuredCollective& m, OpKind kind, double bytes,
                                        const GroupShape& shape, const LinkFigures& links) const {
  double s = std::clamp(bytes * network_size_ratio(m, shape, links), m.min_bytes, m.max_bytes);
  double measured_model = nccl_time_s(m.kind, s, m.shape, measured_links_);
  STEPCAST_CHECK(measured_model > 0, "a measured collective table on a group of one");
  double r = m.table.time_s(s) / measured_model;
  return r * nccl_time_s(kind, bytes, shape, links);
}

double CollectiveCostModel::time_s(OpKind kind, Algorithm algorithm, double bytes,
                                   const GroupShape& shape) const {
  const MeasuredCollective* m = shape.size > 1 ? table_for(kind, shape, bytes) : nullptr;
  if (!m) return collective_time_s(kind, algorithm, bytes, shape, exchange_links_);
  return corrected_s(*m, kind, bytes, shape, links_);
}

std::optional<double> CollectiveCostModel::measured_system_time_s(OpKind kind, double bytes,
                                                                  const GroupShape& shape) const {
  const MeasuredCollective* m = shape.size > 1 ? table_for(kind, shape, bytes) : nullptr;
  if (!m) return std::nullopt;
  return corrected_s(*m, kind, bytes, shape, measured_links_);
}

double CollectiveCostModel::correction(OpKind kind, Algorithm algorithm, double bytes,
                                       const GroupShape& shape) const {
  if (shape.size <= 1) return 1;
  double model = collective_time_s(kind, algorithm, bytes, shape, links_);
  return model > 0 ? time_s(kind, algorithm, bytes, shape) / model : 1;
}

namespace {

double alpha_beta_s(const LinkFigures& links, double bytes, bool across_nodes) {
  return across_nodes ? links.inter_latency_s + bytes / links.inter_bandwidth_bytes_per_s
                      : links.intra_latency_s + bytes / links.intra_bandwidth_bytes_per_s;
}

}  // namespace

double CollectiveCostModel::p2p_corrected_s(double bytes, bool across_nodes, const LinkFigures& links) const {
  const double model = alpha_beta_s(links, bytes, across_nodes);
  const CollectiveTable& table = across_nodes ? p2p_inter_ : p2p_intra_;
  if (table.empty()) return model;
  const double s = std::clamp(bytes, across_nodes ? p2p_inter_min_ : p2p_intra_min_,
                              across_nodes ? p2p_inter_max_ : p2p_intra_max_);
  return table.time_s(s) / alpha_beta_s(measured_links_, s, across_nodes) * model;
}

double CollectiveCostModel::p2p_time_s(double bytes, bool across_nodes) const {
  return p2p_corrected_s(bytes, across_nodes, links_);
}

std::optional<double> CollectiveCostModel::measured_system_p2p_time_s(double bytes, bool across_nodes) const {
  if ((across_nodes ? p2p_inter_ : p2p_intra_).empty()) return std::nullopt;
  return p2p_corrected_s(bytes, across_nodes, measured_links_);
}

double CollectiveCostModel::p2p_flow_scale(double bytes, bool across_nodes) const {
  if ((across_nodes ? p2p_inter_ : p2p_intra_).empty() || bytes <= 0) return 1.0;
  const double latency = across_nodes ? links_.inter_latency_s : links_.intra_latency_s;
  const double bandwidth = across_nodes ? links_.inter_bandwidth_bytes_per_s : links_.intra_bandwidth_bytes_per_s;
  return std::max(0.0, (p2p_time_s(bytes, across_nodes) - latency) * bandwidth / bytes);
}

CollectiveCostModel simulator_collective_model(const DeviceProfile& profile, const Topology& topology) {
  if (!profile.execution_in_order || !profile.measured) return CollectiveCostModel(profile, topology);
  DeviceProfile fractions_only = profile;
  fractions_only.measured->collectives.clear();
  return CollectiveCostModel(fractions_only, topology);
}

std::optional<double> in_order_measured_collective_s(const ComputeCostModel& compute, OpKind kind,
                                                     Algorithm algorithm, double bytes, const GroupShape& shape,
                                                     const OperandReuse* operands) {
  if (!compute.profile().execution_in_order || shape.nodes != 1) return std::nullopt;
  return compute.measured_collective_time_s(kind, algorithm, shape.size, bytes, operands);
}

double collective_local_work_s(const ComputeCostModel& compute, const Op& op, int64_t group_size) {
  CollectiveLocalWork work = collective_local_work(op, group_size);
  return compute.staging_copy_time_s(work.copy_bytes) + compute.add_into_time_s(work.add_bytes);
}

double uncontended_collective_s(const ComputeCostModel& compute, const CollectiveCostModel& collectives,
                                OpKind kind, Algorithm algorithm, double bytes, const GroupShape& shape) {
  if (algorithm == Algorithm::none || shape.size <= 1) return 0;
  if (auto measured = in_order_measured_collective_s(compute, kind, algorithm, bytes, shape)) return *measured;
  return collectives.time_s(kind, algorithm, bytes, shape);
}

double uncontended_collective_op_s(const ComputeCostModel& compute, const CollectiveCostModel& collectives,
                                   const Op& op, const GroupShape& shape) {
  double s = uncontended_collective_s(compute, collectives, op.kind, op.algorithm, op.bytes, shape);
  if (compute.profile().execution_in_order) s += collective_local_work_s(compute, op, shape.size);
  return s;
}

}  // namespace stepcast
