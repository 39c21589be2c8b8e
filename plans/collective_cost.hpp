// Collective times from a device profile's measured collective tables (nccl-tests rows: NCCL
// picks its own algorithm and protocol per size). NCCL's tuner model (collective.hpp's
// nccl_time_s: the ring, and across nodes for all_reduce the tree where its log latency makes it
// faster) gives a collective's dependence on group size, nodes spanned and links; the
// tables give what it leaves out at each message size (protocol switches, the channels NCCL uses
// for mid-size messages, its launch latency, NVLink SHARP): the correction
//   r(S) = measured time / NCCL's model, for the measured group's shape on the links of the
//          system the tables were measured on (MeasuredSystem; the predicted topology's where the
//          profile does not say), at size S clamped to the sizes measured — across nodes at
//          the size that puts as many bytes on each unit of NIC bandwidth as S does on the
//          group's (network_size_ratio: a group of one member a node reads an 8-member table
//          at 8·S),
// from the measured table closest in span (same kind; inside a node or across nodes; nodes and
// members per node nearest in log, and the size below the table's sizes: table_for). A
// collective then takes r(S) · NCCL's model of its own shape on the predicted topology's links:
// time_s. (Before December 2026 the model was the ring alone, with the topology's wire latencies
// and the nearest span whatever the size: a 4-byte all_reduce over 12,288 A100 took 84 ms; now
// 0.21 ms.) The simulator's flows carry the α-β model of the algorithm lowering chose (collective_time_s);
// correction() is time_s over that. Where the profile has no table for the kind (nor, for
// reduce_scatter and all_gather, an all_reduce table), r = 1, and time_s is the α-β model with the
// NICs at the profile's collective fraction (inter_node_exchange_fraction where it measured one:
// a collective's ranks send and receive at once, which a ping-pong's one-way β leaves out).
// Pure functions of their inputs; the simulator applies them (sim/simulator.hpp).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "collective.hpp"
#include "cost_model.hpp"
#include "profile.hpp"

namespace stepcast {

// One measured table: nccl-tests rows of one collective on one group shape.
struct MeasuredCollective {
  OpKind kind = OpKind::all_reduce;
  GroupShape shape;
  CollectiveTable table;
  double min_bytes = 0, max_bytes = 0;
  std::string source;
};

class CollectiveCostModel {
 public:
  // `topology`: the system predicted, before the profile's link fractions (the constructor
  // applies them). Tables are the profile's collective points of algorithm "nccl".
  CollectiveCostModel(const DeviceProfile& profile, const Topology& topology);

  // The measured time of a collective (without a table: the α-β model of `algorithm`, the
  // algorithm lowering chose).
  double time_s(OpKind kind, Algorithm algorithm, double bytes, const GroupShape& shape) const;
  // time_s on the system the tables were measured on (MeasuredSystem's links): inside a table's
  // sizes its interpolation, outside them r at the nearest measured size times NCCL's
  // model, as time_s extrapolates. How a table's own points are checked against the rest of it
  // (components.hpp). nullopt without a table.
  std::optional<double> measured_system_time_s(OpKind kind, double bytes, const GroupShape& shape) const;
  // time_s over the α-β model of `algorithm` (1 without a table).
  double correction(OpKind kind, Algorithm algorithm, double bytes, const GroupShape& shape) const;
  // The table r(S) comes from for a collective of `bytes` (0: any size): the closest in span,
  // a doubling of the size below a table's sizes counting as a doubling of nodes; nullptr when
  // none.
  const MeasuredCollective* table_for(OpKind kind, const GroupShape& shape, double bytes = 0) const;
  bool has_tables() const { return !tables_.empty(); }
  // Whether time_s can differ from the α-β model on links(): measured tables, or collectives
  // across nodes at another fraction of the NIC rate than point-to-point sends.
  bool corrects() const { return has_tables() || exchange_differs_; }
  const LinkFigures& links() const { return links_; }

  // Point-to-point sends (a pipeline's, a context-parallel ring's) from the profile's measured
  // send/recv tables (measured.p2p_points inside a node, p2p_inter_node_points across nodes:
  // nccl-tests' sendrecv_perf, a ping-pong) where it runs concurrently (a GPU's; a profile that
  // runs in order has its tables in its link fits already): r(S) = measured time / the α-β time
  // on the measured system's links, at S clamped to the table's sizes, times the α-β time of the
  // send on the predicted links (latency + S / bandwidth, the links' fractions applied). Without
  // a table, the α-β time.
  double p2p_time_s(double bytes, bool across_nodes) const;
  // The factor on a send's bytes that makes the simulator's flow (the α-β time, uncontended)
  // take p2p_time_s: (p2p_time_s − latency) · bandwidth / bytes, at least 0; 1 without a table.
  double p2p_flow_scale(double bytes, bool across_nodes) const;
  bool has_p2p_tables() const { return !p2p_intra_.empty() || !p2p_inter_.empty(); }
  // p2p_time_s on the system the tables were measured on (the table inside its sizes, r at the
  // nearest size times the α-β time beyond them): how a table's own points are checked against
  // the rest of it (components.hpp). nullopt without a table for the span.
  std::optional<double> measured_system_p2p_time_s(double bytes, bool across_nodes) const;

 private:
  LinkFigures links_;
  // links_ with each inter-node link at its rate's collective fraction (inter_node_fraction_at):
  // the α-β model of a collective without a measured table.
  LinkFigures exchange_links_;
  bool exchange_differs_ = false;
  LinkFigures measured_links_;  // of the system the tables were measured on
  std::vector<MeasuredCollective> tables_;
  CollectiveTable p2p_intra_, p2p_inter_;  // a send's time by size (empty: none measured)
  double p2p_intra_min_ = 0, p2p_intra_max_ = 0, p2p_inter_min_ = 0, p2p_inter_max_ = 0;
  // r(S) of the span's send table times the α-β time on `links`.
  double p2p_corrected_s(double bytes, bool across_nodes, const LinkFigures& links) const;

  // The factor a size is read off table m at, for a group of `shape` on `links` (collective_cost.cpp).
  double network_size_ratio(const MeasuredCollective& m, const GroupShape& shape, const LinkFigures& links) const;
  // r(S) of table m, times NCCL's model (nccl_time_s) of `shape` on `links`.
  double corrected_s(const MeasuredCollective& m, OpKind kind, double bytes, const GroupShape& shape,
                     const LinkFigures& links) const;
};

// The collective model the simulator uses for `profile`: a profile that runs in order (the CPU's)
// keeps its link fractions but not its measured tables as corrections — its collectives inside a
// node take their measured time instead (uncontended_collective_s, the simulator's in-order path).
CollectiveCostModel simulator_collective_model(const DeviceProfile& profile, const Topology& topology);

// In order (the profile runs one collective at a time, as when it measured them), a group inside
// one node takes the measured time of its kind, algorithm and size; nullopt otherwise or where
// the profile has no such table. `operands`: the op's operands by reuse distance, for a profile
// with collective reuse points (ComputeCostModel::measured_collective_time_s).
std::optional<double> in_order_measured_collective_s(const ComputeCostModel& compute, OpKind kind,
                                                     Algorithm algorithm, double bytes, const GroupShape& shape,
                                                     const OperandReuse* operands = nullptr);

// The executor's work around a collective on this device (collective.hpp's collective_local_work):
// the copy at the staging copy's rate, the add at the residual add's.
double collective_local_work_s(const ComputeCostModel& compute, const Op& op, int64_t group_size);

// A collective's time as the simulator costs it when nothing else contends: where the profile
// runs in order and measured this group inside a node, that measured time
// (in_order_measured_collective_s); otherwise time_s (the link fractions and the measured tables'
// correction). 0 for a group of one or an op without an algorithm. The planner's estimates.
double uncontended_collective_s(const ComputeCostModel& compute, const CollectiveCostModel& collectives,
                                OpKind kind, Algorithm algorithm, double bytes, const GroupShape& shape);
// A program's collective op so: uncontended_collective_s, plus in order (a host backend) the
// executor's local work around it (collective_local_work_s), as the simulator charges it; the
// operands' reuse distance is the simulator's alone (it walks the whole role).
double uncontended_collective_op_s(const ComputeCostModel& compute, const CollectiveCostModel& collectives,
                                   const Op& op, const GroupShape& shape);

}  // namespace stepcast
