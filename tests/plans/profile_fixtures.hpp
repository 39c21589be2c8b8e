// Synthetic device profiles for the profile tests (test_profile.cpp, test_profile_op_costs.cpp):
// a smooth GEMM time on the profiler's axis and a measured CPU profile built from it.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "profile.hpp"

namespace stepcast::test {

// The profiler's GEMM axis: √2 steps up to 40, where the rate bends most, then 2× steps.
inline const std::vector<int64_t> kAxis = {10, 14, 20, 28, 40, 80, 160, 320, 640};

// A smooth GEMM time with the shape of a real one: a fixed cost, operand traffic at a
// bandwidth, and flops at a peak (seconds). Its rates span what one core of the development
// machine measures: 14 Gflop/s at 10×10×10, 100 at 80×80×80, 123 at 640×640×640.
inline double synthetic_gemm_time_s(double m, double n, double k) {
  const double peak = 125e9, bandwidth = 40e9, fixed = 0.1e-6;
  return fixed + 4 * (m * k + k * n + m * n) / bandwidth + 2 * m * n * k / peak;
}

inline std::vector<GemmPoint> synthetic_grid(const std::string& variant, double (*time_s)(double, double, double)) {
  std::vector<GemmPoint> points;
  for (int64_t m : kAxis) {
    for (int64_t n : kAxis) {
      for (int64_t k : kAxis) points.push_back({variant, m, n, k, time_s(double(m), double(n), double(k)), "", 1});
    }
  }
  return points;
}

inline double power_law_time_s(double m, double n, double k) {
  return 1e-9 * std::pow(m, 0.9) * std::pow(n, 1.1) * std::pow(k, 0.7);
}

// A measured CPU profile as `stepcast profile` writes it, with synthetic points.
inline DeviceProfile synthetic_profile() {
  DeviceProfile p;
  p.name = "cpu-test";
  p.file = "synthetic.json";
  p.notes = "synthetic";
  p.device = "cpu-core";
  p.backend = "cpu";
  p.gemm[Dtype::fp32] = GemmEfficiency{1.0, 0.0};
  p.memory_bandwidth_bytes_per_s = 8e9;
  p.kernel_overhead_s = 1e-6;
  p.intra_node_bandwidth_bytes_per_s = 3e9;
  p.intra_node_latency_s = 2e-6;
  p.machine = MachineInfo{"host", "Some CPU", 2};
  p.libraries = {{"openblas", "OpenBLAS 0.3.21"}, {"mpi", "Open MPI v4.1.4"}};
  p.execution_in_order = true;
  p.execution_staged_sends = true;
  MeasuredTables t;
  t.dtype = Dtype::fp32;
  t.method = {{"ranks", 2}};
  t.gemm = synthetic_grid("forward", synthetic_gemm_time_s);
  for (double bytes : {16384.0, 65536.0, 262144.0, 1048576.0}) {
    t.memory.push_back({"norm_forward", bytes, 1e-6 + bytes / 10e9, ""});
  }
  t.collectives.push_back({"all_reduce", "ring", 2, 1048576, 4e-4, 2.62144e9, 2.62144e9, "", 1});
  t.p2p.push_back({8, 1e-6, ""});
  t.p2p.push_back({1048576, 3e-4, ""});
  p.measured = t;
  return p;
}

inline double relative(double a, double b) { return std::abs(a - b) / std::abs(b); }

}  // namespace stepcast::test
