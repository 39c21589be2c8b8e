// Oracles the CPU kernel tests share (test_cpu_kernels.cpp, test_cpu_kernels_attention.cpp): fp64
// vectors, errors, central finite differences, and the tensor-parallel column shard.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

namespace stepcast::cpu::test {

using Vec = std::vector<double>;
using Mask = std::vector<uint8_t>;

// Uniform in ±[0.1, 1]: never zero, never tiny.
inline Vec random_vec(size_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> mag(0.1, 1.0);
  Vec v(n);
  for (double& x : v) x = (gen() & 1 ? 1 : -1) * mag(gen);
  return v;
}

inline double norm(const Vec& a) {
  double s = 0;
  for (double x : a) s += x * x;
  return std::sqrt(s);
}

// ‖a − b‖ / ‖b‖.
inline double rel_err(const Vec& a, const Vec& b) {
  REQUIRE(a.size() == b.size());
  Vec d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return norm(d) / std::max(norm(b), 1e-300);
}

inline double max_abs_diff(const Vec& a, const Vec& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

inline double weighted_sum(const Vec& y, const Vec& r) {
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i) s += y[i] * r[i];
  return s;
}

// Central differences of f at x.
inline Vec fd_grad(const std::function<double(const Vec&)>& f, Vec x, double step = 1e-5) {
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double keep = x[i];
    x[i] = keep + step;
    double up = f(x);
    x[i] = keep - step;
    double down = f(x);
    x[i] = keep;
    g[i] = (up - down) / (2 * step);
  }
  return g;
}

// A "+=" kernel run on a pre-filled buffer, minus the fill: what it added.
inline Vec added(const Vec& after, const Vec& before) {
  Vec d(after.size());
  for (size_t i = 0; i < d.size(); ++i) d[i] = after[i] - before[i];
  return d;
}

constexpr double kFdTol = 1e-6;

// Rank r's slice of a [rows, width] tensor whose width is `parts` (in columns) per section:
// picks section-local columns [r·part/tp, (r+1)·part/tp) of every part.
inline Vec column_shard(const Vec& full, int64_t rows, const std::vector<int64_t>& parts, int64_t tp, int64_t r) {
  int64_t width = 0;
  for (int64_t p : parts) width += p;
  Vec out;
  for (int64_t row = 0; row < rows; ++row) {
    int64_t start = row * width;
    for (int64_t p : parts) {
      int64_t piece = p / tp;
      out.insert(out.end(), full.begin() + start + r * piece, full.begin() + start + (r + 1) * piece);
      start += p;
    }
  }
  return out;
}

}  // namespace stepcast::cpu::test
