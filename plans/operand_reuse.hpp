// How long ago a rank last touched an op's operands, and what that does to a collective's time.
//
// A host backend's collective copies its operands through the caches (packing into the scratch,
// MPI's shared-memory transfer, unpacking): back to back on one buffer, as a profile times it,
// they stay in the core's caches; in a step the rank's other ops have touched their own data in
// between, and a ZeRO-3 gather's shard, a gradient bucket or a new output buffer comes from the
// last-level cache or from memory. On the development VM (`stepcast profile`, two ranks) a 4 MiB
// all_gather took 0.45 ms back to back and 0.66 ms with its operands 150 MiB away.
//
// The reuse distance of an operand byte: its LRU stack distance over the rank's arena — the
// distinct bytes the rank's ops touched since an op last touched that byte's address (each op
// touches every buffer it reads or writes, at the buffer's place in the arena, arena_plan.hpp; a
// compute op at most its own traffic, op.bytes, of each from the buffer's start, as a norm reads
// only its weight of a layer's parameters), plus the op's own operand bytes. That is the
// profile's measure: a call cycling through a pool of P bytes finds its operands P bytes away
// (back to back, its own bytes). The role's ops are walked twice in list order (a CPU rank runs
// them so) and the second step's distances kept, so that weights and optimizer state last
// touched in the previous step have theirs.
#pragma once

#include <cstdint>
#include <vector>

#include "cost_model.hpp"
#include "profile.hpp"
#include "program.hpp"

namespace stepcast {

// Bytes of an op's operands whose reuse distance is distance_bytes.
struct ReusePiece {
  double bytes = 0;
  double distance_bytes = 0;
};

// The operands of one op by reuse distance, and their total (the op's own footprint).
struct OperandReuse {
  std::vector<ReusePiece> pieces;
  double footprint_bytes = 0;
};

// For every op `wanted` marks (by op id): its operands by reuse distance, pieces of equal distance
// merged; an address no op touched in the two walks is as far as every byte the walk touched.
// Other ops get an empty OperandReuse.
std::vector<OperandReuse> operand_reuse(const Role& role, const std::vector<char>& wanted);

// Time of one collective (kind, algorithm, group size) by message size and reuse distance: the
// back-to-back points (the collective_points: distance = the op's footprint) and the points of
// each pool (collective_reuse_points, distance = the pool), each level a CollectiveTable over
// bytes. At a size, log(time) is piecewise linear in log(distance) between the back-to-back time
// and the pools' that measured that size (a pool measures sizes of which it holds two slots),
// clamped at both ends, and never falls as the distance grows (a faster point far out is noise).
class CollectiveReuseTable {
 public:
  CollectiveReuseTable(const std::vector<CollectivePoint>& back_to_back,
                       const std::vector<CollectivePoint>& reuse);
  double time_s(double bytes, double distance_bytes, double footprint_bytes) const;
  // Σ over the pieces of their share of the footprint · time_s at their distance.
  double time_s(double bytes, const OperandReuse& operands) const;

 private:
  struct Level {
    double distance_bytes = 0, max_bytes = 0;
    CollectiveTable table;
  };
  CollectiveTable back_to_back_;
  std::vector<Level> levels_;  // by distance, ascending
};

// Time of one GEMM variant by its operands' reuse distance, relative to the profile's GEMM table
// (a CPU profile's gemm_reuse_points): the points of each distance a GemmRateTable over the
// shapes measured there — distance 0 back to back, at the call's own footprint (m·k + k·n + m·n
// elements), the others the pools the calls rotated through. At (m, n, k), log(time) is piecewise
// linear in log(distance) through those levels (a pool at or below the footprint left out),
// clamped at both ends and never falling as the distance grows (a faster point farther out is
// noise). The table's own calls found their operands table_distance_bytes away, so a GEMM at
// distance d takes the table's time times time(d) / time(table distance).
class GemmReuseTable {
 public:
  // `points`: one variant's; `table_pool_bytes`: MeasuredTables::gemm_table_pool_bytes.
  GemmReuseTable(const std::vector<GemmPoint>& points, double table_pool_bytes, double element_bytes);
  // What measure_gemms' rotation gives: copies of the call's operands `largest operand` apart
  // (16-element aligned) through table_pool_bytes, the calls taking them in turn: every call
  // finds its operands slots · footprint bytes away.
  double table_distance_bytes(int64_t m, int64_t n, int64_t k) const;
  double factor(int64_t m, int64_t n, int64_t k, double distance_bytes) const;
  // Σ over the pieces of their share of the footprint · factor at their distance; 1 without pieces.
  double factor(int64_t m, int64_t n, int64_t k, const OperandReuse& operands) const;

 private:
  double log_time_at(int64_t m, int64_t n, int64_t k, double distance_bytes) const;
  double footprint_bytes(int64_t m, int64_t n, int64_t k) const;
  struct Level {
    double distance_bytes = 0;
    GemmRateTable table;
  };
  std::vector<Level> levels_;  // by distance, ascending; distance 0: back to back
  double table_pool_bytes_ = 0, element_bytes_ = 4;
};

}  // namespace stepcast
