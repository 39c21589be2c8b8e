// The compute cost model of cost_model.hpp, and the interpolation of measured tables.
#include "cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <sstream>

#include "errors.hpp"

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

const char* phase_suffix(Phase phase) {
  return phase == Phase::backward ? "_backward" : "_forward";
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

BandwidthTable::BandwidthTable(const std::vector<MemoryPoint>& points) {
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

double BandwidthTable::bandwidth_bytes_per_s(double bytes) const {
  STEPCAST_CHECK(!empty(), "bandwidth of an empty memory table");
  return std::exp(interpolate_line(log_bytes_, log_bandwidth_, std::log(std::max(bytes, 1.0))));
}

std::string memory_family(const Op& op) {
  switch (op.kind) {
    case OpKind::norm:
      return std::string("norm") + phase_suffix(op.phase);
    case OpKind::activation:
      if (op.name == "swiglu" || op.name == "gelu" || op.name == "rotary") {
        return op.name + phase_suffix(op.phase);
      }
      // Its backward is a plain masked scale (dropout_backward), not measured.
      if (op.name == "dropout_add" && op.phase != Phase::backward) return "dropout_add_forward";
      return "";
    case OpKind::loss:
      return op.name == "cross_entropy" ? std::string("cross_entropy") + phase_suffix(op.phase) : "";
    case OpKind::attention:
      if (op.name == "softmax") return std::string("softmax") + phase_suffix(op.phase);
      return "";
    case OpKind::optimizer_step:
      return op.name == "adamw" ? "adamw" : "";
    default:
      return "";
  }
}

std::string gemm_variant(const Op& op) {
  if (op.kind == OpKind::gemm && !op.grad.empty()) return op.grad;
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

std::vector<LeaveOneOut> memory_leave_one_out(const std::vector<MemoryPoint>& points) {
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
    out.push_back({what.str(), points[i].time_s, BandwidthTable(others).time_s(points[i].bytes)});
  }
  return out;
}

ComputeCostModel::ComputeCostModel(const DeviceSpec& device, Dtype dtype,
                                   const DeviceProfile& profile, const std::string& topology_file)
    : matrix_peak_(device.peak_for(dtype, topology_file)),
      bandwidth_(device.memory_bandwidth_bytes_per_s * profile.memory_bandwidth_fraction),
      gemm_(profile.gemm_for(dtype)),
      profile_(profile) {
  auto fp32 = device.peak_flops_per_s.find(Dtype::fp32);
  vector_peak_ = fp32 != device.peak_flops_per_s.end() ? fp32->second : matrix_peak_;
  if (profile.memory_bandwidth_bytes_per_s) bandwidth_ = *profile.memory_bandwidth_bytes_per_s;
  if (profile.measured && profile.measured->dtype == dtype) {
    std::map<std::string, std::vector<GemmPoint>> gemm;
    for (const GemmPoint& p : profile.measured->gemm) gemm[p.variant].push_back(p);
    for (const auto& [variant, points] : gemm) gemm_tables_.emplace(variant, GemmRateTable(points));
    std::map<std::string, std::vector<MemoryPoint>> memory;
    for (const MemoryPoint& p : profile.measured->memory) memory[p.family].push_back(p);
    for (const auto& [family, points] : memory) memory_tables_.emplace(family, BandwidthTable(points));
  }
}

double ComputeCostModel::measured_matrix_time_s(const Op& op) const {
  if (op.flops <= 0) return 0;
  std::string variant = gemm_variant(op);
  if (!gemm_tables_.count(variant)) {
    variant = gemm_tables_.count("forward") ? "forward" : gemm_tables_.begin()->first;
  }
  auto key = std::make_tuple(variant, op.m, op.n, op.k);
  auto it = rate_cache_.find(key);
  if (it == rate_cache_.end()) {
    double rate = gemm_tables_.at(variant).flops_per_s(double(op.m), double(op.n), double(op.k));
    it = rate_cache_.emplace(key, rate).first;
  }
  return op.flops / it->second;
}

double ComputeCostModel::op_time_s(const Op& op) const {
  STEPCAST_CHECK(is_compute(op.kind), "op_time_s of a non-compute op");
  double memory_time = op.bytes / bandwidth_;
  bool matrix = op.kind == OpKind::gemm ||
                (op.kind == OpKind::attention && (op.name == "score" || op.name == "value"));
  if (matrix) {
    if (!gemm_tables_.empty()) return measured_matrix_time_s(op);
    double compute_time = op.flops / (matrix_peak_ * gemm_.peak_fraction);
    return std::max(compute_time, memory_time) + gemm_.overhead_s;
  }
  if (op.kind == OpKind::attention && op.name == "flash") {
    double fraction = op.phase == Phase::backward ? profile_.flash_backward_peak_fraction
                                                  : profile_.flash_forward_peak_fraction;
    return op.flops / (matrix_peak_ * fraction) + profile_.kernel_overhead_s;
  }
  auto table = memory_tables_.find(memory_family(op));
  if (table != memory_tables_.end() && op.bytes > 0) return table->second.time_s(op.bytes);
  double compute_time = op.flops / vector_peak_;
  return std::max(compute_time, memory_time) + profile_.kernel_overhead_s;
}

}  // namespace stepcast
