// The compute cost model of cost_model.hpp, and the interpolation of measured tables.
#include "cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <sstream>

#include "errors.hpp"
#include "operand_reuse.hpp"
#include "op_signature.hpp"

namespace stepcast {

namespace {

constexpr double kMissing = std::numeric_limits<double>::quiet_NaN();

// Linear interpolation of ys over ascending xs at q, q clamped to [xs.front(), xs.back()];
// NaN entries are skipped (two nearest measured neighbours, extrapolating at a line's end).
double interpolate_line(const std::vector<double>& xs, const std::vector<double>& ys, double q) {
  q = std::clamp(q, xs.front(), xs.back());
  std::vector<size_t> have;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (!std::isnan(ys[i])) have.push_back(i);
  }
  if (have.empty()) return kMissing;
  if (have.size() == 1) return ys[have[0]];
  size_t hi = 0;
  while (hi < have.size() && xs[have[hi]] < q) ++hi;
  if (hi < have.size() && xs[have[hi]] == q) return ys[have[hi]];
  size_t a, b;
  if (hi == 0) {
    a = have[0], b = have[1];
  } else if (hi == have.size()) {
    a = have[have.size() - 2], b = have[have.size() - 1];
  } else {
    a = have[hi - 1], b = have[hi];
  }
  double t = (q - xs[a]) / (xs[b] - xs[a]);
  return ys[a] + t * (ys[b] - ys[a]);
}

std::vector<double> log2_axis(const std::set<int64_t>& values) {
  std::vector<double> out;
  for (int64_t v : values) out.push_back(std::log2(double(v)));
  return out;
}

size_t index_of(const std::vector<double>& axis, int64_t value) {
  double x = std::log2(double(value));
  return size_t(std::lower_bound(axis.begin(), axis.end(), x) - axis.begin());
}

}  // namespace

GemmRateTable::GemmRateTable(const std::vector<GemmPoint>& points) {
  if (points.empty()) return;
  std::set<int64_t> ms, ns, ks;
  for (const GemmPoint& p : points) {
    ms.insert(p.m);
    ns.insert(p.n);
    ks.insert(p.k);
  }
  axes_ = {log2_axis(ms), log2_axis(ns), log2_axis(ks)};
  std::vector<double> sum(ms.size() * ns.size() * ks.size(), 0.0), count(sum.size(), 0.0);
  for (const GemmPoint& p : points) {
    STEPCAST_CHECK(p.time_s > 0, "GEMM point with a non-positive time");
    size_t i = (index_of(axes_[0], p.m) * ns.size() + index_of(axes_[1], p.n)) * ks.size() +
               index_of(axes_[2], p.k);
    sum[i] += std::log(p.flops() / p.time_s);
    count[i] += 1;
  }
  values_.assign(sum.size(), kMissing);
  for (size_t i = 0; i < sum.size(); ++i) {
    if (count[i] > 0) values_[i] = sum[i] / count[i];
  }
}

double GemmRateTable::log_rate(const std::array<double, 3>& query,
                               const std::array<int, 3>& order) const {
  const size_t size[3] = {axes_[0].size(), axes_[1].size(), axes_[2].size()};
  auto flat = [&](const std::array<size_t, 3>& i) { return (i[0] * size[1] + i[1]) * size[2] + i[2]; };
  const int a = order[0], b = order[1], c = order[2];
  // Along axis a on every (b, c) line, then along b for every c, then along c.
  std::vector<double> plane(size[b] * size[c]);
  std::vector<double> line(size[a]);
  for (size_t ib = 0; ib < size[b]; ++ib) {
    for (size_t ic = 0; ic < size[c]; ++ic) {
      std::array<size_t, 3> i{};
      i[b] = ib;
      i[c] = ic;
      for (size_t ia = 0; ia < size[a]; ++ia) {
        i[a] = ia;
        line[ia] = values_[flat(i)];
      }
      plane[ib * size[c] + ic] = interpolate_line(axes_[a], line, query[a]);
    }
  }
  std::vector<double> row(size[c]), column(size[b]);
  for (size_t ic = 0; ic < size[c]; ++ic) {
    for (size_t ib = 0; ib < size[b]; ++ib) column[ib] = plane[ib * size[c] + ic];
    row[ic] = interpolate_line(axes_[b], column, query[b]);
  }
  return interpolate_line(axes_[c], row, query[c]);
}

double GemmRateTable::flops_per_s(double m, double n, double k) const {
  STEPCAST_CHECK(!empty(), "rate of an empty GEMM table");
  std::array<double, 3> query = {std::log2(m), std::log2(n), std::log2(k)};
  double total = 0;
  for (const auto& order : {std::array<int, 3>{0, 1, 2}, {1, 2, 0}, {2, 0, 1}}) {
    total += log_rate(query, order);
  }
  return std::exp(total / 3);
}

BandwidthTable::BandwidthTable(const std::vector<MemoryPoint>& points, double fixed_s) : fixed_s_(fixed_s) {
  std::map<double, std::pair<double, int>> by_size;  // bytes → (Σ log bandwidth, count)
  for (const MemoryPoint& p : points) {
    STEPCAST_CHECK(p.time_s > 0 && p.bytes > 0, "memory point with a non-positive size or time");
    auto& [sum, count] = by_size[p.bytes];
    sum += std::log(p.bytes / p.time_s);
    ++count;
  }
  for (const auto& [bytes, s] : by_size) {
    log_bytes_.push_back(std::log(bytes));
    log_bandwidth_.push_back(s.first / s.second);
  }
}

double BandwidthTable::time_s(double bytes) const {
  STEPCAST_CHECK(!empty(), "time of an empty memory table");
  bytes = std::max(bytes, 1.0);
  const double smallest = std::exp(log_bytes_.front());
  if (bytes < smallest) {
    const double t0 = smallest / std::exp(log_bandwidth_.front());
    const double fixed = std::clamp(fixed_s_, 0.0, t0);
    return fixed + (t0 - fixed) * bytes / smallest;
  }
  return bytes / std::exp(interpolate_line(log_bytes_, log_bandwidth_, std::log(bytes)));
}

CollectiveTable::CollectiveTable(const std::vector<CollectivePoint>& points) {
  std::map<double, std::pair<double, int>> by_size;  // bytes → (Σ log time, count)
  for (const CollectivePoint& p : points) {
    STEPCAST_CHECK(p.time_s > 0 && p.bytes > 0, "collective point with a non-positive size or time");
    auto& [sum, count] = by_size[p.bytes];
    sum += std::log(p.time_s);
    ++count;
  }
  for (const auto& [bytes, s] : by_size) {
    log_bytes_.push_back(std::log(bytes));
    log_time_.push_back(s.first / s.second);
  }
  // Fewer bytes never take longer: a point above a larger message's time (a burst of load from
  // elsewhere while it was measured) takes that time.
  for (size_t i = log_time_.size(); i-- > 1;) log_time_[i - 1] = std::min(log_time_[i - 1], log_time_[i]);
}

double CollectiveTable::time_s(double bytes) const {
  STEPCAST_CHECK(!empty(), "time of an empty collective table");
  double q = std::log(std::max(bytes, 1.0));
  if (q <= log_bytes_.front()) return std::exp(log_time_.front());
  if (q >= log_bytes_.back()) return std::exp(log_time_.back() + q - log_bytes_.back());
  return std::exp(interpolate_line(log_bytes_, log_time_, q));
}

double AttentionRateTable::flops_per_s(const std::string& pass, int64_t seq, int64_t head_dim) const {
  STEPCAST_CHECK(!points_.empty(), "rate of an empty attention table");
  std::string wanted = pass;
  bool have_pass = std::any_of(points_.begin(), points_.end(),
                               [&](const AttentionPoint& p) { return p.pass == wanted; });
  if (!have_pass) wanted = "forward_backward";
  if (!std::any_of(points_.begin(), points_.end(), [&](const AttentionPoint& p) { return p.pass == wanted; })) {
    wanted = points_.front().pass;
  }
  // The nearest head dimension, causal points where there are any.
  double best = std::numeric_limits<double>::infinity();
  int64_t dim = 0;
  bool causal = false;
  for (const AttentionPoint& p : points_) {
    if (p.pass != wanted) continue;
    double d = std::abs(std::log2(double(p.head_dim) / double(std::max<int64_t>(1, head_dim)))) +
               (p.causal ? 0.0 : 0.01);
    if (d < best) {
      best = d;
      dim = p.head_dim;
      causal = p.causal;
    }
  }
  std::vector<double> xs, ys;
  for (const AttentionPoint& p : points_) {
    if (p.pass == wanted && p.head_dim == dim && p.causal == causal) {
      xs.push_back(std::log(double(p.seq)));
      ys.push_back(std::log(p.flops_per_s));
    }
  }
  return std::exp(interpolate_line(xs, ys, std::log(double(std::max<int64_t>(1, seq)))));
}

std::vector<AttentionGemm> attention_gemms(const Op& op) {
  const bool score = op.name == OpName::score || op.name == OpName::cp_score;
  const bool value = op.name == OpName::value || op.name == OpName::cp_value;
  if (op.kind != OpKind::attention || (!score && !value)) return {};
  // s query rows against n key rows (n = s but under context parallelism).
  const int64_t s = op.m, n = op.n > 0 ? op.n : op.m, d = op.k, count = std::max<int64_t>(1, op.batch);
  const bool backward = op.phase == Phase::backward;
  if (score && !backward) return {{"forward", s, n, d, count}};
  if (value && !backward) return {{"dgrad", s, d, n, count}};
  if (value) return {{"forward", s, n, d, count}, {"wgrad", d, n, s, count}};
  return {{"dgrad", s, d, n, count}, {"wgrad", d, n, s, count}};
}

double gemm_wave_efficiency(const GemmTiling& tiling, int64_t m, int64_t n, int64_t count) {
  STEPCAST_CHECK(tiling.sm_count > 0 && tiling.tile_m > 0 && tiling.tile_n > 0, "bad GEMM tiling");
  if (m <= 0 || n <= 0 || count <= 0) return 1;
  auto efficiency = [&](int64_t tm, int64_t tn) {
    double tiles = double((m + tm - 1) / tm) * double((n + tn - 1) / tn) * double(count);
    double waves = std::ceil(tiles / double(tiling.sm_count));
    return double(m) * double(n) * double(count) /
           (waves * double(tiling.sm_count) * double(tm) * double(tn));
  };
  return std::max(efficiency(tiling.tile_m, tiling.tile_n), efficiency(tiling.tile_n, tiling.tile_m));
}

std::string gemm_variant(const Op& op) {
  if (op.kind == OpKind::gemm && op.grad != Grad::none) return to_string(op.grad);
  return "forward";
}

std::vector<LeaveOneOut> gemm_leave_one_out(const std::vector<GemmPoint>& points) {
  std::vector<LeaveOneOut> out;
  for (size_t i = 0; i < points.size(); ++i) {
    std::vector<GemmPoint> others;
    for (size_t j = 0; j < points.size(); ++j) {
      if (j != i && points[j].variant == points[i].variant) others.push_back(points[j]);
    }
    if (others.empty()) continue;
    const GemmPoint& p = points[i];
    GemmRateTable table(others);
    std::ostringstream what;
    what << p.variant << " " << p.m << "x" << p.n << "x" << p.k;
    out.push_back({what.str(), p.time_s,
                   p.flops() / table.flops_per_s(double(p.m), double(p.n), double(p.k))});
  }
  return out;
}

std::vector<LeaveOneOut> memory_leave_one_out(const std::vector<MemoryPoint>& points, double fixed_s) {
  std::vector<LeaveOneOut> out;
  for (size_t i = 0; i < points.size(); ++i) {
    std::vector<MemoryPoint> others;
    for (size_t j = 0; j < points.size(); ++j) {
      if (j != i && points[j].family == points[i].family && points[j].bytes != points[i].bytes) {
        others.push_back(points[j]);
      }
    }
    if (others.empty()) continue;
    std::ostringstream what;
    what << points[i].family << " " << int64_t(points[i].bytes) << " B";
    out.push_back({what.str(), points[i].time_s, BandwidthTable(others, fixed_s).time_s(points[i].bytes)});
  }
  return out;
}

ComputeCostModel::ComputeCostModel(const DeviceSpec& device, Dtype dtype,
                                   const DeviceProfile& profile, const std::string& topology_file,
                                   const std::string& norm_type, bool cross_entropy_fusion)
    : norm_type_(norm_type),
      cross_entropy_fusion_(cross_entropy_fusion),
      matrix_peak_(device.peak_for(dtype, topology_file)),
      bandwidth_(device.memory_bandwidth_bytes_per_s * profile.memory_bandwidth_fraction),
      gemm_(profile.gemm_for(dtype)),
      profile_(profile),
      dtype_(dtype) {
  auto fp32 = device.peak_flops_per_s.find(Dtype::fp32);
  vector_peak_ = fp32 != device.peak_flops_per_s.end() ? fp32->second : matrix_peak_;
  if (profile.memory_bandwidth_bytes_per_s) bandwidth_ = *profile.memory_bandwidth_bytes_per_s;
  auto sixteen_bit = [](Dtype d) { return d == Dtype::bf16 || d == Dtype::fp16; };
  if (profile.measured && (profile.measured->dtype == dtype ||
                           (sixteen_bit(profile.measured->dtype) && sixteen_bit(dtype)))) {
    std::map<std::string, std::vector<GemmPoint>> gemm;
    for (const GemmPoint& p : profile.measured->gemm) {
      // Interpolated only where they form a table of single GEMMs; batched points and fitted
      // evidence are checked against the model instead (validate --sweep published).
      if (profile.measured->gemm_use == "table" && p.count == 1) gemm[p.variant].push_back(p);
    }
    for (const auto& [variant, points] : gemm) gemm_tables_.emplace(variant, GemmRateTable(points));
    std::map<std::string, std::vector<GemmPoint>> gemm_reuse;
    for (const GemmPoint& p : profile.measured->gemm_reuse) {
      if (gemm.count(p.variant) && p.count == 1) gemm_reuse[p.variant].push_back(p);
    }
    for (const auto& [variant, points] : gemm_reuse) {
      const double element_bytes = dtype_bytes(profile.measured->dtype);
      gemm_reuse_tables_.emplace(
          variant, std::make_shared<GemmReuseTable>(points, profile.measured->gemm_table_pool_bytes, element_bytes));
    }
    std::map<std::string, std::vector<MemoryPoint>> memory;
    for (const MemoryPoint& p : profile.measured->memory) memory[p.family].push_back(p);
    for (const auto& [family, points] : memory) {
      memory_tables_.emplace(family, BandwidthTable(points, profile.kernel_overhead_s));
    }
    std::map<std::tuple<std::string, std::string, int64_t>, std::vector<CollectivePoint>> collectives;
    // Inside a node only, as the in-order model uses them (in_order_measured_collective_s).
    for (const CollectivePoint& c : profile.measured->collectives) {
      if (c.nodes == 1) collectives[{c.kind, c.algorithm, c.group_size}].push_back(c);
    }
    for (const auto& [key, points] : collectives) collective_tables_.emplace(key, CollectiveTable(points));
    std::map<std::tuple<std::string, std::string, int64_t>, std::vector<CollectivePoint>> reuse;
    for (const CollectivePoint& c : profile.measured->collective_reuse) {
      if (c.nodes == 1) reuse[{c.kind, c.algorithm, c.group_size}].push_back(c);
    }
    for (const auto& [key, points] : reuse) {
      if (collectives.count(key)) {
        collective_reuse_tables_.emplace(key, std::make_shared<CollectiveReuseTable>(collectives.at(key), points));
      }
    }
    std::vector<AttentionPoint> flash, cp_flash, materialized, causal;
    for (const AttentionPoint& a : profile.measured->attention) {
      if (a.impl == "flash") flash.push_back(a);
      else if (a.impl == "cp_flash") cp_flash.push_back(a);
      else (a.causal ? causal : materialized).push_back(a);
    }
    attention_table_ = AttentionRateTable(flash);
    cp_attention_table_ = AttentionRateTable(cp_flash);
    // Non-causal points where there are any: the plan's causal mask is inside its softmax op, as
    // in Megatron's fused kernel, where a causal point of standard attention adds a pass of its own.
    materialized_ = materialized.empty() ? causal : materialized;
  }
}

std::vector<Op> materialized_attention_ops(int64_t batch, int64_t heads, int64_t seq, int64_t head_dim,
                                           Dtype act) {
  const double e = dtype_bytes(act);
  const double square = double(batch) * double(heads) * double(seq) * double(seq);
  const double qkv = e * double(seq) * double(batch) * 3.0 * double(heads) * double(head_dim);
  const double ctx = qkv / 3;
  const double core = 4.0 * square * double(head_dim);  // score and value forward, 2 flops a MAC
  auto op = [&](OpName name, Phase phase, double flops, double bytes) {
    Op o;
    o.kind = OpKind::attention;
    o.stream = Stream::compute;
    o.name = name;
    o.phase = phase;
    o.flops = flops;
    o.bytes = bytes;
    o.batch = batch * heads;
    o.m = o.n = seq;
    o.k = head_dim;
    return o;
  };
  const double s = e * square;
  return {op(OpName::score, Phase::forward, core / 2, qkv + s),               // qkv → scores
          op(OpName::softmax, Phase::forward, 5 * square, 2 * s),             // scores → probs
          op(OpName::value, Phase::forward, core / 2, s + qkv + ctx),         // probs, qkv → ctx
          op(OpName::value, Phase::backward, core, ctx + 2 * s + 2 * qkv),    // d_ctx, probs, qkv → d_probs, d_qkv
          op(OpName::softmax, Phase::backward, 4 * square, 3 * s),            // d_probs, probs → d_scores
          op(OpName::score, Phase::backward, core, s + 3 * qkv)};             // d_scores, qkv, d_qkv → d_qkv
}

double materialized_point_time_s(const AttentionPoint& a) {
  return 3.5 * 4.0 * double(a.batch) * double(a.heads) * double(a.seq) * double(a.seq) * double(a.head_dim) /
         (a.causal ? 2.0 : 1.0) / a.flops_per_s;
}

double ComputeCostModel::materialized_correction(int64_t seq, int64_t head_dim) const {
  if (materialized_.empty()) return 1;
  auto cached = correction_cache_.find({seq, head_dim});
  if (cached != correction_cache_.end()) return cached->second;
  // log r by head dimension, over log seq.
  std::map<int64_t, std::pair<std::vector<double>, std::vector<double>>> lines;
  for (const AttentionPoint& a : materialized_) {
    double composed = 0;
    for (const Op& o : materialized_attention_ops(a.batch, a.heads, a.seq, a.head_dim, dtype_)) {
      composed += base_op_time_s(o);
    }
    auto& [xs, ys] = lines[a.head_dim];
    xs.push_back(std::log(double(a.seq)));
    ys.push_back(std::log(materialized_point_time_s(a) / composed));
  }
  const double q = std::log(double(std::max<int64_t>(1, seq)));
  std::vector<double> dims, log_r;
  for (const auto& [dim, line] : lines) {
    dims.push_back(std::log(double(dim)));
    log_r.push_back(interpolate_line(line.first, line.second, q));
  }
  double r = std::exp(interpolate_line(dims, log_r, std::log(double(std::max<int64_t>(1, head_dim)))));
  correction_cache_.emplace(std::make_pair(seq, head_dim), r);
  return r;
}

std::optional<double> ComputeCostModel::measured_collective_time_s(OpKind kind, Algorithm algorithm,
                                                                   int64_t group_size, double bytes,
                                                                   const OperandReuse* operands) const {
  std::tuple<std::string, std::string, int64_t> key{to_string(kind), to_string(algorithm), group_size};
  if (operands) {
    auto reuse = collective_reuse_tables_.find(key);
    if (reuse != collective_reuse_tables_.end()) return reuse->second->time_s(bytes, *operands);
  }
  auto it = collective_tables_.find(key);
  if (it == collective_tables_.end()) return std::nullopt;
  return it->second.time_s(bytes);
}

double ComputeCostModel::fill_time_s(double bytes) const {
  if (bytes <= 0) return 0;
  auto table = memory_tables_.find("copy");
  if (table != memory_tables_.end()) return table->second.time_s(bytes);
  return bytes / bandwidth_ + profile_.kernel_overhead_s;
}

double ComputeCostModel::fills_time_s(const Role& role, const std::vector<int32_t>& allocs) const {
  double t = 0;
  for (int32_t alloc : allocs) t += fill_time_s(role.ops.at(size_t(alloc)).bytes);
  return t;
}

double ComputeCostModel::staging_copy_time_s(double bytes) const {
  if (bytes <= 0) return 0;
  auto table = memory_tables_.find("copy");
  if (table != memory_tables_.end()) return table->second.time_s(2 * bytes);
  return 2 * bytes / bandwidth_ + profile_.kernel_overhead_s;
}

double ComputeCostModel::add_into_time_s(double bytes) const {
  if (bytes <= 0) return 0;
  auto table = memory_tables_.find("residual_add");
  if (table != memory_tables_.end()) return table->second.time_s(3 * bytes);
  return 3 * bytes / bandwidth_ + profile_.kernel_overhead_s;
}

double ComputeCostModel::gemm_time_s(const std::string& wanted, int64_t m, int64_t n,
                                     int64_t k) const {
  std::string variant = wanted;
  if (!gemm_tables_.count(variant)) {
    variant = gemm_tables_.count("forward") ? "forward" : gemm_tables_.begin()->first;
  }
  auto key = std::make_tuple(variant, m, n, k);
  auto it = rate_cache_.find(key);
  if (it == rate_cache_.end()) {
    double rate = gemm_tables_.at(variant).flops_per_s(double(m), double(n), double(k));
    it = rate_cache_.emplace(key, rate).first;
  }
  return 2.0 * double(m) * double(n) * double(k) / it->second;
}

double ComputeCostModel::measured_matrix_time_s(const Op& op) const {
  if (op.flops <= 0) return 0;
  std::vector<AttentionGemm> parts = attention_gemms(op);
  if (parts.empty()) {
    // flops / rate: op.flops may count a batch of GEMMs of this shape.
    double one = 2.0 * double(op.m) * double(op.n) * double(op.k);
    return op.flops / one * gemm_time_s(gemm_variant(op), op.m, op.n, op.k);
  }
  double total = 0;
  for (const AttentionGemm& g : parts) {
    // In order (a CPU backend), one GEMM after another; on a GPU one batched launch runs every
    // GEMM's tiles together, at the rate of one GEMM with the batch's rows.
    if (profile_.execution_in_order) total += double(g.count) * gemm_time_s(g.variant, g.m, g.n, g.k);
    else total += gemm_time_s(g.variant, g.m * g.count, g.n, g.k);
  }
  return total;
}

double ComputeCostModel::datasheet_wave_efficiency(const Op& op) const {
  const GemmTiling& tiling = *profile_.gemm_tiling;
  std::vector<AttentionGemm> parts = attention_gemms(op);
  if (parts.empty()) {
    double one = 2.0 * double(op.m) * double(op.n) * double(op.k);
    int64_t count = one > 0 ? std::max<int64_t>(1, std::llround(op.flops / one)) : 1;
    return gemm_wave_efficiency(tiling, op.m, op.n, count);
  }
  // Flop-weighted over the op's GEMMs: total flops / Σ flops_i / efficiency_i.
  double flops = 0, weighted = 0;
  for (const AttentionGemm& g : parts) {
    double f = 2.0 * double(g.m) * double(g.n) * double(g.k) * double(g.count);
    flops += f;
    weighted += f / gemm_wave_efficiency(tiling, g.m, g.n, g.count);
  }
  return weighted > 0 ? flops / weighted : 1;
}

double ComputeCostModel::shape_efficiency(const Op& op) const {
  if (gemm_.output_half <= 0 && gemm_.k_half <= 0) return 1;
  std::vector<AttentionGemm> parts = attention_gemms(op);
  if (parts.empty()) {
    double one = 2.0 * double(op.m) * double(op.n) * double(op.k);
    double count = one > 0 ? std::max(1.0, std::round(op.flops / one)) : 1;
    return gemm_.shape_efficiency(double(op.m), double(op.n), double(op.k), count);
  }
  // Flop-weighted over the op's GEMMs, as for the wave efficiency.
  double flops = 0, weighted = 0;
  for (const AttentionGemm& g : parts) {
    double f = 2.0 * double(g.m) * double(g.n) * double(g.k) * double(g.count);
    flops += f;
    weighted += f / gemm_.shape_efficiency(double(g.m), double(g.n), double(g.k), double(g.count));
  }
  return weighted > 0 ? flops / weighted : 1;
}

void ComputeCostModel::use_fp8(const DeviceSpec& device, const std::string& topology_file) {
  try {
    fp8_ = std::make_shared<const ComputeCostModel>(device, Dtype::fp8, profile_, topology_file, norm_type_,
                                                   cross_entropy_fusion_);
  } catch (const InputError& e) {
    throw InputError(std::string(e.what()) + " (the plan's fp8 runs the linear layers' GEMMs on FP8 tensor cores: "
                     "the device needs an FP8 peak and the profile FP8 GEMM figures)");
  }
}

double ComputeCostModel::op_time_s(const Op& op) const {
  double t = base_op_time_s(op);
  // The materialized core's ops, context parallelism's too (its gathered kind's scores of the
  // local queries over the whole sequence: looked up at the keys' length, n).
  if (!materialized_.empty() && op.kind == OpKind::attention &&
      (op.name == OpName::score || op.name == OpName::softmax || op.name == OpName::value ||
       op.name == OpName::cp_score || op.name == OpName::cp_value)) {
    t *= materialized_correction(op.n > 0 ? op.n : op.m, op.k);
  }
  return t;
}

double ComputeCostModel::base_op_time_s(const Op& op) const {
  STEPCAST_CHECK(is_compute(op.kind), "op_time_s of a non-compute op");
  if (op.kind == OpKind::gemm && op.fp8_slots[0] >= 0 && dtype_ != Dtype::fp8) {
    STEPCAST_CHECK(fp8_ != nullptr, "an FP8 gemm costed before use_fp8");
    return fp8_->op_time_s(op);
  }
  double memory_time = op.bytes / bandwidth_;
  bool matrix = op.kind == OpKind::gemm || (op.kind == OpKind::attention && !attention_gemms(op).empty());
  if (matrix) {
    if (!gemm_tables_.empty()) return measured_matrix_time_s(op);
    double compute_time = op.flops / (matrix_peak_ * gemm_.peak_fraction);
    if (profile_.gemm_tiling) compute_time /= datasheet_wave_efficiency(op);
    compute_time /= shape_efficiency(op);
    if (gemm_.ceiling_fraction > 0) {
      compute_time = std::max(compute_time, op.flops / (matrix_peak_ * gemm_.ceiling_fraction));
    }
    return std::max(compute_time, memory_time) + gemm_.overhead_s + gemm_.latency_s;
  }
  if (op.kind == OpKind::attention && op.name == OpName::flash) {
    // A context-parallel rank's block (it reads K/V: the ring's or the gathered) at the rate of
    // that kernel where the profile measured it.
    const AttentionRateTable& table =
        !cp_attention_table_.empty() && Operands(op).has_in("kv") ? cp_attention_table_ : attention_table_;
    if (!table.empty()) {
      const char* pass = op.phase == Phase::backward ? "backward" : "forward";
      return op.flops / 2 / table.flops_per_s(pass, op.m, op.k);
    }
    double fraction = op.phase == Phase::backward ? profile_.flash_backward_peak_fraction
                                                  : profile_.flash_forward_peak_fraction;
    return op.flops / (matrix_peak_ * fraction) + profile_.kernel_overhead_s;
  }
  std::string family = memory_family(op, norm_type_, cross_entropy_fusion_);
  // A profile without the unfused loss's families: the fused loss's tables at the unfused bytes.
  if (!memory_tables_.count(family) && !cross_entropy_fusion_) family = memory_family(op, norm_type_);
  // A profile from before the LayerNorm families: the RMSNorm ones.
  if (!memory_tables_.count(family) && family.rfind("layernorm", 0) == 0) family = family.substr(5);
  // A profile from before the softmax pass was measured alone: the whole forward's.
  if (family == "cross_entropy_softmax" && !memory_tables_.count(family)) family = "cross_entropy_forward";
  // A profile from before the MoE permutations were measured: copies.
  if (!memory_tables_.count(family) && (family.rfind("moe_permute", 0) == 0 || family.rfind("moe_unpermute", 0) == 0)) {
    family = "copy";
  }
  auto table = memory_tables_.find(family);
  if (table != memory_tables_.end() && op.bytes > 0) return table->second.time_s(op.bytes);
  double compute_time = op.flops / vector_peak_;
  return std::max(compute_time, memory_time) + profile_.kernel_overhead_s;
}

double grouped_gemm_time_s(const ComputeCostModel& cost, const Op& op, const std::vector<int64_t>& rows,
                           std::map<std::pair<int32_t, int64_t>, double>& memo) {
  const double elements = double(op.batch) * (double(op.m) * op.k + double(op.k) * op.n + double(op.m) * op.n);
  const double bytes_per_element = elements > 0 ? op.bytes / elements : 0;
  double total = 0;
  for (int64_t r : rows) {
    if (r <= 0) continue;
    auto [it, fresh] = memo.emplace(std::make_pair(op.id, r), 0.0);
    if (fresh) {
      Op one = op;
      one.batch = 1;
      if (op.grad == Grad::wgrad) one.k = r;
      else one.m = r;
      one.flops = 2.0 * double(one.m) * double(one.n) * double(one.k);
      one.bytes = bytes_per_element * (double(one.m) * one.k + double(one.k) * one.n + double(one.m) * one.n);
      it->second = cost.op_time_s(one);
    }
    total += it->second;
  }
  return total;
}

}  // namespace stepcast
