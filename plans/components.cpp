// Component checks and the GEMM shape fit; see components.hpp.
#include "components.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <tuple>

#include "collective.hpp"
#include "collective_cost.hpp"
#include "errors.hpp"
#include "minimize.hpp"

namespace stepcast {

namespace {

std::string gemm_label(const GemmPoint& g) {
  std::ostringstream out;
  out << g.variant << " " << g.m << "x" << g.n << "x" << g.k;
  if (g.count != 1) out << " x" << g.count;
  return out.str();
}

std::string bytes_label(double bytes) {
  std::ostringstream out;
  out << int64_t(bytes) << " B";
  return out.str();
}

// Each point of a table predicted by the others: `table_of(others)` builds the table, `predict`
// asks it at the point.
template <class Point, class Key, class Build, class Predict, class Label>
void leave_one_out(const std::vector<Point>& points, Key key, Build build, Predict predict, Label label,
                   const std::string& family, std::vector<ComponentCheck>& out) {
  for (size_t i = 0; i < points.size(); ++i) {
    std::vector<Point> others;
    for (size_t j = 0; j < points.size(); ++j) {
      if (j != i && key(points[j]) == key(points[i])) others.push_back(points[j]);
    }
    if (others.empty()) continue;
    ComponentCheck c;
    c.family = family;
    c.what = label(points[i]);
    c.source = points[i].source;
    c.method = "leave-one-out";
    c.measured_s = points[i].time_s;
    c.predicted_s = predict(build(others), points[i]);
    out.push_back(c);
  }
}

// Attention points carry a rate; as times, of the FlashAttention flops of one head at the point
// (the ratio is what matters).
double attention_time_s(const AttentionPoint& a, double flops_per_s) {
  double flops = 4.0 * double(a.seq) * double(a.seq) * double(a.head_dim) * (a.causal ? 0.5 : 1.0);
  if (a.pass == "backward") flops *= 2.5;
  if (a.pass == "forward_backward") flops *= 3.5;
  return flops / flops_per_s;
}

ComputeCostModel cost_model_for(const DeviceProfile& profile, const Topology& topology, Dtype dtype) {
  return ComputeCostModel(topology.node.device, dtype, profile, topology.file);
}

}  // namespace

std::map<std::string, FamilyErrors> errors_by_family(const std::vector<ComponentCheck>& checks) {
  std::map<std::string, std::vector<double>> errors;
  for (const ComponentCheck& c : checks) errors[c.family].push_back(std::abs(c.relative_error()));
  std::map<std::string, FamilyErrors> out;
  for (auto& [family, e] : errors) {
    std::sort(e.begin(), e.end());
    size_t n = e.size();
    double median = n % 2 ? e[n / 2] : 0.5 * (e[n / 2 - 1] + e[n / 2]);
    out[family] = {n, median, e.back()};
  }
  return out;
}

Op gemm_point_op(const GemmPoint& point, Dtype dtype) {
  Op op;
  op.kind = OpKind::gemm;
  op.grad = parse_grad(point.variant).value_or(Grad::none);  // "forward": none
  op.m = point.m;
  op.n = point.n;
  op.k = point.k;
  op.flops = point.flops();
  double e = dtype_bytes(dtype);
  op.bytes = double(point.count) * (double(point.m) * double(point.k) + double(point.k) * double(point.n) +
                                    double(point.m) * double(point.n)) * e;
  return op;
}

std::vector<ComponentCheck> check_components(const DeviceProfile& profile, const Topology& topology) {
  std::vector<ComponentCheck> out;
  if (!profile.measured) return out;
  const MeasuredTables& t = *profile.measured;
  // GEMMs.
  if (t.gemm_use == "fit") {
    ComputeCostModel model = cost_model_for(profile, topology, t.dtype);
    for (const GemmPoint& g : t.gemm) {
      bool in_fit = double(g.m) * double(g.n) * double(g.count) >= 1048576;
      ComponentCheck c{"gemm", gemm_label(g), g.source, in_fit ? "model" : "model (outside the fit)", g.time_s,
                       model.op_time_s(gemm_point_op(g, t.dtype))};
      out.push_back(c);
    }
  } else {
    std::vector<GemmPoint> single;
    for (const GemmPoint& g : t.gemm) {
      if (g.count == 1) single.push_back(g);
    }
    leave_one_out(
        single, [](const GemmPoint& g) { return g.variant; },
        [](const std::vector<GemmPoint>& others) { return GemmRateTable(others); },
        [](const GemmRateTable& table, const GemmPoint& g) {
          return g.flops() / table.flops_per_s(double(g.m), double(g.n), double(g.k));
        },
        gemm_label, "gemm", out);
  }
  // Memory-bound kernels.
  leave_one_out(
      t.memory, [](const MemoryPoint& m) { return m.family; },
      [&](const std::vector<MemoryPoint>& others) { return BandwidthTable(others, profile.kernel_overhead_s); },
      [](const BandwidthTable& table, const MemoryPoint& m) { return table.time_s(m.bytes); },
      [](const MemoryPoint& m) { return m.family + " " + bytes_label(m.bytes); }, "memory", out);
  // Fused attention: as times of one head (attention_time_s).
  struct TimedAttention {
    AttentionPoint point;
    double time_s;
    std::string source;
  };
  std::vector<TimedAttention> attention;
  for (const AttentionPoint& a : t.attention) {
    if (a.impl == "flash") attention.push_back({a, attention_time_s(a, a.flops_per_s), a.source});
  }
  leave_one_out(
      attention,
      [](const TimedAttention& a) { return std::make_tuple(a.point.pass, a.point.head_dim, a.point.causal); },
      [](const std::vector<TimedAttention>& others) {
        std::vector<AttentionPoint> points;
        for (const auto& o : others) points.push_back(o.point);
        return AttentionRateTable(points);
      },
      [](const AttentionRateTable& table, const TimedAttention& a) {
        return attention_time_s(a.point, table.flops_per_s(a.point.pass, a.point.seq, a.point.head_dim));
      },
      [](const TimedAttention& a) {
        std::ostringstream label;
        label << a.point.pass << (a.point.causal ? " causal" : "") << " s " << a.point.seq << " d "
              << a.point.head_dim;
        return label.str();
      },
      "attention", out);
  // Materialized attention: the six ops of the point's shape, costed op by op and corrected by
  // the profile's other materialized points (ComputeCostModel::materialized_correction).
  for (size_t i = 0; i < t.attention.size(); ++i) {
    const AttentionPoint& a = t.attention[i];
    if (a.impl != "materialized") continue;
    DeviceProfile others = profile;
    others.measured->attention.erase(others.measured->attention.begin() + std::ptrdiff_t(i));
    ComputeCostModel model = cost_model_for(others, topology, t.dtype);
    double predicted = 0;
    for (const Op& op : materialized_attention_ops(a.batch, a.heads, a.seq, a.head_dim, t.dtype)) {
      predicted += model.op_time_s(op);
    }
    std::ostringstream label;
    label << "materialized" << (a.causal ? " causal" : "") << " s " << a.seq << " d " << a.head_dim << " (batch "
          << a.batch << ", " << a.heads << " heads)";
    out.push_back({"attention", label.str(), a.source, "leave-one-out", materialized_point_time_s(a), predicted});
  }
  // Collectives: nccl-tests tables as the collective cost model reads them (beyond a table's
  // sizes, its correction at the nearest size times NCCL's model), the CPU's as the in-order
  // model does (CollectiveTable).
  auto key = [](const CollectivePoint& c) { return std::make_tuple(c.kind, c.algorithm, c.group_size, c.nodes); };
  auto label = [](const CollectivePoint& c) {
    std::ostringstream text;
    text << c.kind << " " << c.algorithm << " " << c.group_size << " ranks";
    if (c.nodes > 1) text << " on " << c.nodes << " nodes";
    text << " " << bytes_label(c.bytes);
    return text.str();
  };
  std::vector<CollectivePoint> nccl, in_order;
  for (const CollectivePoint& c : t.collectives) (c.algorithm == "nccl" ? nccl : in_order).push_back(c);
  leave_one_out(
      nccl, key,
      [&](const std::vector<CollectivePoint>& others) {
        DeviceProfile p = profile;
        p.measured->collectives = others;
        return CollectiveCostModel(p, topology);
      },
      [](const CollectiveCostModel& model, const CollectivePoint& c) {
        std::optional<OpKind> kind = collective_kind(c.kind);
        STEPCAST_CHECK(kind, "a collective point of kind " + c.kind);
        const GroupShape shape{c.group_size, c.nodes, c.group_size / c.nodes};
        std::optional<double> time = model.measured_system_time_s(*kind, c.bytes, shape);
        STEPCAST_CHECK(time, "a leave-one-out collective model without the point's table");
        return *time;
      },
      label, "collective", out);
  leave_one_out(
      in_order, key, [](const std::vector<CollectivePoint>& others) { return CollectiveTable(others); },
      [](const CollectiveTable& table, const CollectivePoint& c) { return table.time_s(c.bytes); }, label,
      "collective", out);
  // Point-to-point send tables as the cost model reads them where the streams run concurrently
  // (CollectiveCostModel::p2p_time_s; an in-order profile's are in its link fits instead).
  if (!profile.execution_in_order) {
    for (const bool across : {false, true}) {
      const std::vector<P2pPoint>& points = across ? t.p2p_inter_node : t.p2p;
      leave_one_out(
          points, [](const P2pPoint&) { return 0; },
          [&](const std::vector<P2pPoint>& others) {
            DeviceProfile p = profile;
            (across ? p.measured->p2p_inter_node : p.measured->p2p) = others;
            return CollectiveCostModel(p, topology);
          },
          [across](const CollectiveCostModel& model, const P2pPoint& q) {
            std::optional<double> time = model.measured_system_p2p_time_s(q.bytes, across);
            STEPCAST_CHECK(time, "a leave-one-out send model without the point's table");
            return *time;
          },
          [across](const P2pPoint& q) {
            return std::string(across ? "send across nodes " : "send ") + bytes_label(q.bytes);
          },
          "p2p", out);
    }
  }
  return out;
}

GemmShapeFit fit_gemm_shape_model(const DeviceProfile& profile, const Topology& topology, Dtype dtype,
                                  double min_outputs) {
  if (!profile.measured || profile.measured->gemm_use != "fit" || profile.measured->gemm.empty()) {
    throw InputError(profile.file + ": key 'measured.gemm_use': no GEMM points to fit; valid: "
                     "\"fit\" with measured.gemm_points");
  }
  GemmEfficiency start = profile.gemm_for(dtype);
  const std::vector<GemmPoint>& all = profile.measured->gemm;
  std::vector<GemmPoint> points;
  for (const GemmPoint& g : all) {
    if (double(g.m) * double(g.n) * double(g.count) >= min_outputs) points.push_back(g);
  }
  if (points.size() < 4) {
    throw InputError(profile.file + ": key 'measured.gemm_points': " + std::to_string(points.size()) +
                     " points of at least " + std::to_string(int64_t(min_outputs)) +
                     " outputs; valid: four or more to fit four parameters");
  }
  // Parameters: logit(peak_fraction), log(output_half), log(k_half), log(latency_s).
  auto unpack = [&](const std::vector<double>& x) {
    GemmEfficiency e = start;
    e.peak_fraction = 1.0 / (1.0 + std::exp(-x[0]));
    e.output_half = std::exp(x[1]);
    e.k_half = std::exp(x[2]);
    e.latency_s = std::exp(x[3]);
    return e;
  };
  auto profile_with = [&](const GemmEfficiency& e) {
    DeviceProfile p = profile;
    p.gemm[dtype] = e;
    p.gemm_tiling.reset();  // the shape model replaces wave quantization
    return p;
  };
  // Each source weighs as one: a sweep of many shapes from one machine counts as much as one
  // careful measurement from another (machines of one model differ by several percent).
  std::map<std::string, double> per_source;
  for (const GemmPoint& g : points) per_source[g.source] += 1;
  auto cost = [&](const std::vector<double>& x) {
    DeviceProfile p = profile_with(unpack(x));
    ComputeCostModel model = cost_model_for(p, topology, dtype);
    double sum = 0;
    for (const GemmPoint& g : points) {
      double r = std::log(model.op_time_s(gemm_point_op(g, dtype)) / g.time_s);
      sum += r * r / per_source[g.source];
    }
    return sum / double(per_source.size());
  };
  double f0 = std::clamp(start.peak_fraction, 0.05, 0.99);
  std::vector<double> x0 = {std::log(f0 / (1 - f0)), std::log(std::max(start.output_half, 1e5)),
                            std::log(std::max(start.k_half, 64.0)), std::log(std::max(start.latency_s, 1e-6))};
  MinimizeResult best = minimize_nelder_mead(cost, x0, 0.5, 1e-12);
  // Further starts from the optimum escape a collapsed simplex.
  for (int restart = 0; restart < 2; ++restart) best = minimize_nelder_mead(cost, best.x, 0.2, 1e-12);
  GemmShapeFit fit;
  fit.efficiency = unpack(best.x);
  // A term fitted to nothing (an output_half under one element, a latency under a nanosecond) is none.
  if (fit.efficiency.output_half < 1) fit.efficiency.output_half = 0;
  if (fit.efficiency.latency_s < 1e-9) fit.efficiency.latency_s = 0;
  fit.rms_log_error = std::sqrt(best.value);
  DeviceProfile fitted = profile_with(fit.efficiency);
  ComputeCostModel model = cost_model_for(fitted, topology, dtype);
  for (const GemmPoint& g : all) {
    bool in_fit = double(g.m) * double(g.n) * double(g.count) >= min_outputs;
    fit.points.push_back({"gemm", gemm_label(g), g.source, in_fit ? "model" : "model (outside the fit)",
                          g.time_s, model.op_time_s(gemm_point_op(g, dtype))});
  }
  return fit;
}

}  // namespace stepcast
