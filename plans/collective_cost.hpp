// Collective times from a device profile's measured collective tables (nccl-tests rows: NCCL
// picks its own algorithm and protocol per size). The α-β model of collective.hpp gives a
// collective's shape dependence (group size, nodes spanned, ring steps and latency); the tables
// give what the model leaves out at each message size (protocol switches, the channels NCCL uses
// for mid-size messages, its launch latency, NVLink SHARP): the correction
//   r(S) = measured time / modelled time, both for the measured group's shape, at size S,
// taken from the measured table closest in span (same kind; inside a node or across nodes; nodes
// and members per node nearest in log), with S clamped to the sizes it measured. A collective
// then costs r(S) · its own modelled time. Where the profile has no table for the kind (nor, for
// reduce_scatter and all_gather, an all_reduce table), r = 1.
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
  // `links`: the topology's link figures after the profile's fractions (what the simulator's
  // platform is built from). Tables are the profile's collective points of algorithm "nccl".
  CollectiveCostModel(const DeviceProfile& profile, const LinkFigures& links);

  // r(S) for `kind` over `shape` (1 without a table).
  double correction(OpKind kind, double bytes, const GroupShape& shape) const;
  // The corrected time of a collective of `algorithm` (as lowering chose it).
  double time_s(OpKind kind, Algorithm algorithm, double bytes, const GroupShape& shape) const;
  // The table r(S) comes from; nullptr when none.
  const MeasuredCollective* table_for(OpKind kind, const GroupShape& shape) const;
  bool has_tables() const { return !tables_.empty(); }
  const LinkFigures& links() const { return links_; }

 private:
  LinkFigures links_;
  std::vector<MeasuredCollective> tables_;
};

}  // namespace stepcast
