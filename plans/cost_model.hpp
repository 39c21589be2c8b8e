// Time of one compute op on one device: a roofline over the device's peak flop/s and memory
// bandwidth, scaled by the profile's achievable fractions, plus the profile's fixed cost per
// kernel. Pure functions: the simulator charges these times, SimGrid only orders them.
//   gemm, attention score/value:  max(F / (peak·gemm_fraction), B / (bw·memory_fraction)) + gemm overhead
//   attention flash:              F / (peak·flash_fraction) + kernel overhead
//   everything else:              max(F / vector_peak, B / (bw·memory_fraction)) + kernel overhead
// where vector_peak is the device's fp32 peak (elementwise work runs on the vector units).
#pragma once

#include "profile.hpp"
#include "program.hpp"
#include "topology.hpp"

namespace stepcast {

class ComputeCostModel {
 public:
  ComputeCostModel(const DeviceSpec& device, Dtype dtype, const DeviceProfile& profile,
                   const std::string& topology_file);
  double op_time_s(const Op& op) const;
  double matrix_peak_flops_per_s() const { return matrix_peak_; }

 private:
  double matrix_peak_, vector_peak_, bandwidth_;
  GemmEfficiency gemm_;
  DeviceProfile profile_;
};

}  // namespace stepcast
