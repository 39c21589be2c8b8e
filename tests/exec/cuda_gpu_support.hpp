// Helpers of the [gpu] kernel tests (test_cuda_gpu_*.cpp): device buffers filled from doubles
// (rounded to the storage type) and read back, raw int and mask buffers, fresh random inputs, the
// relative error against the CPU reference and its tolerance per storage type.
#pragma once

#include <cuda_runtime_api.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <type_traits>
#include <vector>

#include "bf16.hpp"
#include "cuda_kernels.hpp"

namespace stepcast::test {

template <class T>
double tolerance() {
  return std::is_same_v<T, bf16> ? 1e-2 : 1e-5;
}

// Device memory holding n elements of X, uploaded from doubles (rounded to X) and read back.
template <class X>
struct Device {
  X* p = nullptr;
  size_t n = 0;
  explicit Device(size_t count) : n(count) {
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(1, n) * sizeof(X)) == cudaSuccess);
    REQUIRE(cudaMemset(p, 0, std::max<size_t>(1, n) * sizeof(X)) == cudaSuccess);
  }
  Device(const Device&) = delete;
  ~Device() { cudaFree(p); }
  void set(const std::vector<double>& values) {
    REQUIRE(values.size() == n);
    std::vector<X> host(n);
    for (size_t i = 0; i < n; ++i) host[i] = X(values[i]);
    REQUIRE(cudaMemcpy(p, host.data(), n * sizeof(X), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  std::vector<double> get() const {
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    std::vector<X> host(n);
    REQUIRE(cudaMemcpy(host.data(), p, n * sizeof(X), cudaMemcpyDeviceToHost) == cudaSuccess);
    std::vector<double> out(n);
    for (size_t i = 0; i < n; ++i) out[i] = double(host[i]);
    return out;
  }
};
template <class Raw>
struct DeviceRaw {  // ints and masks, copied as they are
  Raw* p = nullptr;
  size_t n = 0;
  explicit DeviceRaw(const std::vector<Raw>& host) : n(host.size()) {
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(1, n) * sizeof(Raw)) == cudaSuccess);
    REQUIRE(cudaMemcpy(p, host.data(), n * sizeof(Raw), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  DeviceRaw(const DeviceRaw&) = delete;
  ~DeviceRaw() { cudaFree(p); }
  std::vector<Raw> get() const {
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    std::vector<Raw> host(n);
    REQUIRE(cudaMemcpy(host.data(), p, n * sizeof(Raw), cudaMemcpyDeviceToHost) == cudaSuccess);
    return host;
  }
};

// Fresh random values in [lo, hi), rounded to X so both sides see the same numbers.
template <class X>
std::vector<double> random_values(size_t n, double lo = -1, double hi = 1) {
  static std::mt19937_64 rng(20261130);  // one stream per storage type
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = double(X(u(rng)));
  return v;
}

inline double relative_error(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i])) {
      if (got[i] != want[i]) return INFINITY;
      continue;
    }
    diff = std::max(diff, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return diff / std::max(scale, 1e-30);
}

inline const cuda::Launch kLaunch{nullptr, 0};

#define CHECK_CLOSE(T, got, want)                \
  do {                                           \
    double err_ = relative_error((got), (want)); \
    INFO(#got << " relative error " << err_);    \
    CHECK(err_ < tolerance<T>());                \
  } while (0)

}  // namespace stepcast::test
