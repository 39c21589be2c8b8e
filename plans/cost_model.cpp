// The compute cost model of cost_model.hpp.
#include "cost_model.hpp"

#include <algorithm>

#include "errors.hpp"

namespace stepcast {

ComputeCostModel::ComputeCostModel(const DeviceSpec& device, Dtype dtype,
                                   const DeviceProfile& profile, const std::string& topology_file)
    : matrix_peak_(device.peak_for(dtype, topology_file)),
      bandwidth_(device.memory_bandwidth_bytes_per_s),
      gemm_(profile.gemm_for(dtype)),
      profile_(profile) {
  auto fp32 = device.peak_flops_per_s.find(Dtype::fp32);
  vector_peak_ = fp32 != device.peak_flops_per_s.end() ? fp32->second : matrix_peak_;
}

double ComputeCostModel::op_time_s(const Op& op) const {
  STEPCAST_CHECK(is_compute(op.kind), "op_time_s of a non-compute op");
  double memory_time = op.bytes / (bandwidth_ * profile_.memory_bandwidth_fraction);
  bool matrix = op.kind == OpKind::gemm ||
                (op.kind == OpKind::attention && (op.name == "score" || op.name == "value"));
  if (matrix) {
    double compute_time = op.flops / (matrix_peak_ * gemm_.peak_fraction);
    return std::max(compute_time, memory_time) + gemm_.overhead_s;
  }
  if (op.kind == OpKind::attention && op.name == "flash") {
    double fraction = op.phase == Phase::backward ? profile_.flash_backward_peak_fraction
                                                  : profile_.flash_forward_peak_fraction;
    return op.flops / (matrix_peak_ * fraction) + profile_.kernel_overhead_s;
  }
  double compute_time = op.flops / vector_peak_;
  return std::max(compute_time, memory_time) + profile_.kernel_overhead_s;
}

}  // namespace stepcast
