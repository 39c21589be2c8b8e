// A profile's component figures checked against the cost model that uses them, and the GEMM
// shape model fitted to its published GEMM points.
//  - GEMM points the shape model was fitted to (measured.gemm_use "fit"): predicted by the model;
//  - table points (GEMMs of a grid, memory-bound kernels, fused attention, collectives): each
//    predicted from its table without it (leave-one-out), so a reader sees how well the table
//    holds between the sizes it measured; an nccl-tests table through the collective cost model
//    (CollectiveCostModel::measured_system_time_s: beyond the other sizes, the nearest one's
//    correction times NCCL's model (nccl_time_s), as a collective is costed); a send table
//    (nccl-tests' sendrecv) through CollectiveCostModel::measured_system_p2p_time_s.
// Errors are (predicted − measured) / measured. Pure functions.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "cost_model.hpp"
#include "profile.hpp"
#include "topology.hpp"

namespace stepcast {

struct ComponentCheck {
  std::string family;  // "gemm", "attention", "memory", "collective", "p2p"
  std::string what;    // "forward 2048x3072x12288", "norm_forward 8388608 B", ...
  std::string source;  // key of the profile's sources; empty: measured by `stepcast profile`
  std::string method;  // "model" or "leave-one-out"
  double measured_s = 0;
  double predicted_s = 0;
  double relative_error() const { return (predicted_s - measured_s) / measured_s; }
};

// Every component point of `profile` (of its measured tables' dtype) predicted as above, on the
// topology's device.
std::vector<ComponentCheck> check_components(const DeviceProfile& profile, const Topology& topology);

// |relative error| by family: how many points, the median (the mean of the middle two for an
// even count) and the largest. `profile check` and `validate --sweep published` print these.
struct FamilyErrors {
  size_t points = 0;
  double median_abs_error = 0;
  double largest_abs_error = 0;
};
std::map<std::string, FamilyErrors> errors_by_family(const std::vector<ComponentCheck>& checks);

// The program op a GEMM point stands for (a gemm op of its variant; `count` GEMMs in its flops),
// with bytes as lowering counts them in `dtype`.
Op gemm_point_op(const GemmPoint& point, Dtype dtype);

// Least squares in log time of the GEMM shape model (GemmEfficiency: peak_fraction, output_half,
// k_half, latency_s; overhead_s kept) to the profile's GEMM points of gemm_use "fit", for `dtype`, each
// source weighing as one (its points share its weight). Returns the fitted efficiency and the
// points' errors under it; rms_log_error is that weighted root mean square.
struct GemmShapeFit {
  GemmEfficiency efficiency;
  std::vector<ComponentCheck> points;
  double rms_log_error = 0;
};
// Points of fewer than `min_outputs` output elements (m·n·count) stay out of the fit (their errors
// are still reported, as predictions of the fitted model): below about a million outputs a GEMM is
// a handful of tiles, bound by its launch and latency_s. A fitted output_half under one element or
// latency_s under a nanosecond is written as 0 (none).
GemmShapeFit fit_gemm_shape_model(const DeviceProfile& profile, const Topology& topology, Dtype dtype,
                                  double min_outputs = 1048576);

}  // namespace stepcast
