// operand_reuse.hpp: the reuse walk over a role's arena, and the collectives' reuse tables.
#include "operand_reuse.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <unordered_map>

#include "arena_plan.hpp"
#include "errors.hpp"

namespace stepcast {

namespace {

// The arena's addresses by when an op last touched them: disjoint intervals [start, end) → the
// touch's clock (the op's place in the two walks, 1, 2, …). Untouched addresses are in no
// interval. A Fenwick tree over the clocks holds the bytes whose last touch was at each, so the
// distinct bytes touched after a clock take log time.
class TouchMap {
 public:
  explicit TouchMap(int64_t clocks) : tree_(size_t(clocks) + 1, 0) {}

  // Bytes of [start, end) by the clock of their last touch (0: never touched).
  void query(int64_t start, int64_t end, std::map<int64_t, int64_t>& out) const {
    int64_t at = start;
    auto it = intervals_.upper_bound(start);
    if (it != intervals_.begin()) --it;
    for (; it != intervals_.end() && it->first < end; ++it) {
      int64_t lo = std::max(it->first, start), hi = std::min(it->second.end, end);
      if (lo >= hi) continue;
      if (lo > at) out[0] += lo - at;
      out[it->second.clock] += hi - lo;
      at = hi;
    }
    if (at < end) out[0] += end - at;
  }

  void touch(int64_t start, int64_t end, int64_t clock) {
    // Cut the intervals that straddle start or end, drop those inside, insert the new one.
    split(start);
    split(end);
    auto first = intervals_.lower_bound(start), last = intervals_.lower_bound(end);
    for (auto it = first; it != last; ++it) add(it->second.clock, -(it->second.end - it->first));
    intervals_.erase(first, last);
    intervals_[start] = {end, clock};
    add(clock, end - start);
  }

  // Distinct bytes whose last touch came after `clock`: the LRU stack distance of a byte last
  // touched then (every byte touched so far for 0).
  double distinct_since(int64_t clock) const { return double(total_ - prefix(clock)); }

 private:
  struct Span {
    int64_t end = 0;
    int64_t clock = 0;
  };
  void split(int64_t at) {
    auto it = intervals_.upper_bound(at);
    if (it == intervals_.begin()) return;
    --it;
    if (it->first < at && at < it->second.end) {
      intervals_[at] = {it->second.end, it->second.clock};
      it->second.end = at;
    }
  }
  void add(int64_t clock, int64_t bytes) {
    total_ += bytes;
    for (size_t i = size_t(clock); i < tree_.size(); i += i & (~i + 1)) tree_[i] += bytes;
  }
  int64_t prefix(int64_t clock) const {  // bytes last touched at clocks 1 … clock
    int64_t sum = 0;
    for (size_t i = size_t(clock); i > 0; i -= i & (~i + 1)) sum += tree_[i];
    return sum;
  }
  std::map<int64_t, Span> intervals_;
  std::vector<int64_t> tree_;
  int64_t total_ = 0;
};

// ys piecewise linear over ascending xs at q, clamped at both ends (the reuse tables' log time
// over log distance).
double clamped_line(const std::vector<double>& xs, const std::vector<double>& ys, double q) {
  if (q <= xs.front()) return ys.front();
  if (q >= xs.back()) return ys.back();
  size_t i = size_t(std::upper_bound(xs.begin(), xs.end(), q) - xs.begin());
  double t = (q - xs[i - 1]) / (xs[i] - xs[i - 1]);
  return ys[i - 1] + t * (ys[i] - ys[i - 1]);
}

}  // namespace

std::vector<OperandReuse> operand_reuse(const Role& role, const std::vector<char>& wanted) {
  STEPCAST_CHECK(wanted.size() == role.ops.size(), "operand_reuse: one flag per op");
  const ArenaPlan arena = plan_arena(role);
  std::vector<OperandReuse> out(role.ops.size());
  std::unordered_map<BufferName, std::pair<int64_t, int64_t>> place;  // buffer → [start, end)
  TouchMap touched(2 * int64_t(role.ops.size()));
  int64_t clock = 0;
  std::vector<std::pair<int64_t, int64_t>> operands;
  std::map<int64_t, int64_t> by_clock;
  std::vector<std::map<double, double>> kept(role.ops.size());  // second walk: bytes by stack distance
  for (int walk = 0; walk < 2; ++walk) {
    for (const Op& op : role.ops) {
      ++clock;
      if (op.kind == OpKind::alloc) {
        int64_t start = arena.offset_of_op[size_t(op.id)];
        place[op.buffer] = {start, start + int64_t(op.bytes)};
        continue;
      }
      if (op.kind == OpKind::free) continue;
      operands.clear();
      // A compute op reads a slice of a parameter buffer (a norm its weight of a layer's): at
      // most its own traffic (op.bytes) of each operand, from the operand's start.
      const bool capped = is_compute(op.kind) && op.bytes > 0;
      auto add = [&](const BufferName& b) {
        auto it = place.find(b);
        if (it == place.end() || it->second.second <= it->second.first) return;
        std::pair<int64_t, int64_t> range = it->second;
        if (capped) range.second = std::min(range.second, range.first + int64_t(op.bytes));
        if (std::find(operands.begin(), operands.end(), range) == operands.end()) operands.push_back(range);
      };
      for (const BufferName& b : op.inputs) add(b);
      for (const BufferName& b : op.outputs) add(b);
      if (walk == 1 && wanted[size_t(op.id)]) {
        by_clock.clear();
        for (auto [start, end] : operands) touched.query(start, end, by_clock);
        for (const auto& [last, bytes] : by_clock) {
          kept[size_t(op.id)][touched.distinct_since(last)] += double(bytes);
        }
      }
      for (auto [start, end] : operands) touched.touch(start, end, clock);
    }
  }
  for (const Op& op : role.ops) {
    if (!wanted[size_t(op.id)]) continue;
    OperandReuse& r = out[size_t(op.id)];
    for (const auto& [distance, bytes] : kept[size_t(op.id)]) r.footprint_bytes += bytes;
    for (const auto& [distance, bytes] : kept[size_t(op.id)]) {
      r.pieces.push_back({bytes, distance + r.footprint_bytes});
    }
  }
  return out;
}

CollectiveReuseTable::CollectiveReuseTable(const std::vector<CollectivePoint>& back_to_back,
                                           const std::vector<CollectivePoint>& reuse)
    : back_to_back_(back_to_back) {
  std::map<double, std::vector<CollectivePoint>> by_distance;
  for (const CollectivePoint& p : reuse) by_distance[p.reuse_distance_bytes].push_back(p);
  for (const auto& [distance, points] : by_distance) {
    double most = 0;
    for (const CollectivePoint& p : points) most = std::max(most, p.bytes);
    levels_.push_back({distance, most, CollectiveTable(points)});
  }
}

double CollectiveReuseTable::time_s(double bytes, double distance_bytes, double footprint_bytes) const {
  // (log distance, log time) at this size: back to back at the op's own footprint, then the
  // pools that measured the size, farther than that.
  std::vector<double> xs = {std::log(std::max(footprint_bytes, 1.0))};
  std::vector<double> ys = {std::log(back_to_back_.time_s(bytes))};
  for (const Level& level : levels_) {
    if (bytes > level.max_bytes * (1 + 1e-9) || level.distance_bytes <= footprint_bytes) continue;
    xs.push_back(std::log(level.distance_bytes));
    ys.push_back(std::max(ys.back(), std::log(level.table.time_s(bytes))));
  }
  return std::exp(clamped_line(xs, ys, std::log(std::max(distance_bytes, 1.0))));
}

double CollectiveReuseTable::time_s(double bytes, const OperandReuse& operands) const {
  if (operands.pieces.empty() || !(operands.footprint_bytes > 0)) return back_to_back_.time_s(bytes);
  double t = 0;
  for (const ReusePiece& p : operands.pieces) {
    t += p.bytes / operands.footprint_bytes * time_s(bytes, p.distance_bytes, operands.footprint_bytes);
  }
  return t;
}

GemmReuseTable::GemmReuseTable(const std::vector<GemmPoint>& points, double table_pool_bytes, double element_bytes)
    : table_pool_bytes_(table_pool_bytes), element_bytes_(element_bytes) {
  std::map<double, std::vector<GemmPoint>> by_distance;
  for (const GemmPoint& p : points) by_distance[p.reuse_distance_bytes].push_back(p);
  for (const auto& [distance, level] : by_distance) levels_.push_back({distance, GemmRateTable(level)});
}

double GemmReuseTable::footprint_bytes(int64_t m, int64_t n, int64_t k) const {
  return (double(m) * double(k) + double(k) * double(n) + double(m) * double(n)) * element_bytes_;
}

double GemmReuseTable::table_distance_bytes(int64_t m, int64_t n, int64_t k) const {
  const double stride = std::ceil(std::max({double(m) * k, double(n) * k, double(m) * n}) / 16) * 16;
  const double slots = std::max(1.0, std::floor(table_pool_bytes_ / element_bytes_ / stride));
  return slots * footprint_bytes(m, n, k);
}

double GemmReuseTable::log_time_at(int64_t m, int64_t n, int64_t k, double distance_bytes) const {
  const double flops = 2.0 * double(m) * double(n) * double(k);
  const double footprint = footprint_bytes(m, n, k);
  std::vector<double> xs, ys;
  for (const Level& level : levels_) {
    const double at = level.distance_bytes > 0 ? level.distance_bytes : footprint;
    if (level.distance_bytes > 0 && at <= footprint) continue;
    double y = std::log(flops / level.table.flops_per_s(double(m), double(n), double(k)));
    if (!ys.empty()) y = std::max(y, ys.back());
    xs.push_back(std::log(at));
    ys.push_back(y);
  }
  if (xs.empty()) return 0;
  return clamped_line(xs, ys, std::log(std::max(distance_bytes, 1.0)));
}

double GemmReuseTable::factor(int64_t m, int64_t n, int64_t k, double distance_bytes) const {
  return std::exp(log_time_at(m, n, k, distance_bytes) - log_time_at(m, n, k, table_distance_bytes(m, n, k)));
}

double GemmReuseTable::factor(int64_t m, int64_t n, int64_t k, const OperandReuse& operands) const {
  if (operands.pieces.empty() || !(operands.footprint_bytes > 0)) return 1;
  double f = 0;
  for (const ReusePiece& p : operands.pieces) {
    f += p.bytes / operands.footprint_bytes * factor(m, n, k, p.distance_bytes);
  }
  return f;
}

// ComputeCostModel's GEMM at its operands' reuse distances (cost_model.hpp).
double ComputeCostModel::op_time_s(const Op& op, const OperandReuse* operands) const {
  double t = op_time_s(op);
  if (!operands || gemm_reuse_tables_.empty() || op.kind != OpKind::gemm || op.fp8_slots[0] >= 0) return t;
  auto table = gemm_reuse_tables_.find(gemm_variant(op));
  if (table == gemm_reuse_tables_.end()) table = gemm_reuse_tables_.find("forward");
  if (table == gemm_reuse_tables_.end()) return t;
  return t * table->second->factor(op.m, op.n, op.k, *operands);
}

}  // namespace stepcast
