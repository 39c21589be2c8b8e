// machine_canary.hpp's fixed kernels.
#include "machine_canary.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "cpu_kernels.hpp"

namespace stepcast::cli {

namespace {

// The median over 9 blocks of `per_block` calls of `body` of units per second.
double median_rate(const std::function<void()>& body, int64_t per_block, double units_per_call) {
  constexpr int64_t kBlocks = 9;
  body();  // warm: pages, BLAS threads, caches
  std::vector<double> rates;
  for (int64_t block = 0; block < kBlocks; ++block) {
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < per_block; ++i) body();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    rates.push_back(units_per_call * double(per_block) / s);
  }
  std::nth_element(rates.begin(), rates.begin() + kBlocks / 2, rates.end());
  return rates[size_t(kBlocks / 2)];
}

}  // namespace

CanaryRates machine_canary() {
  CanaryRates r;
  constexpr int64_t n = 256;
  std::vector<float> a(static_cast<size_t>(n * n), 0.5f), b(static_cast<size_t>(n * n), 0.25f),
      c(static_cast<size_t>(n * n), 0.0f);
  r.gemm_gflops =
      median_rate([&] { cpu::gemm(false, false, n, n, n, 1.0f, a.data(), b.data(), 0.0f, c.data()); }, 12,
                  2.0 * double(n * n * n) / 1e9);
  constexpr int64_t rows = 128, cols = 256;  // 128 KiB of fp32 scores
  std::vector<float> scores(static_cast<size_t>(rows * cols)), probs(scores.size());
  for (size_t i = 0; i < scores.size(); ++i) scores[i] = float(i % 97) * 0.01f;
  r.softmax_gbps = median_rate([&] { cpu::softmax_forward(scores.data(), probs.data(), rows, cols); }, 40,
                              2.0 * double(scores.size() * sizeof(float)) / 1e9);
  return r;
}

}  // namespace stepcast::cli
