// machine_canary.hpp's fixed GEMM.
#include "machine_canary.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "cpu_kernels.hpp"

namespace stepcast::cli {

double machine_canary_gflops() {
  constexpr int64_t n = 256, kBlocks = 9, kPerBlock = 12;
  std::vector<float> a(static_cast<size_t>(n * n), 0.5f), b(static_cast<size_t>(n * n), 0.25f),
      c(static_cast<size_t>(n * n), 0.0f);
  cpu::gemm(false, false, n, n, n, 1.0f, a.data(), b.data(), 0.0f, c.data());  // warm: pages, BLAS threads
  std::vector<double> rates;
  for (int64_t block = 0; block < kBlocks; ++block) {
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < kPerBlock; ++i) cpu::gemm(false, false, n, n, n, 1.0f, a.data(), b.data(), 0.0f, c.data());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    rates.push_back(2.0 * double(n * n * n) * double(kPerBlock) / s / 1e9);
  }
  std::nth_element(rates.begin(), rates.begin() + kBlocks / 2, rates.end());
  return rates[size_t(kBlocks / 2)];
}

}  // namespace stepcast::cli
