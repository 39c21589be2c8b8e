// Reference products for the FP8 GEMM kernel tests: a linear layer's three GEMMs summed over
// decoded operand values ([tokens, in] inputs, [out, in] weights, [tokens, out] output gradients),
// and the largest difference relative to the reference's largest magnitude.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace stepcast::test {

// y = x·wᵀ
inline std::vector<double> reference_forward(const std::vector<double>& x, const std::vector<double>& w,
                                             int64_t tokens, int64_t in, int64_t out) {
  std::vector<double> y(size_t(tokens * out));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double s = 0;
      for (int64_t i = 0; i < in; ++i) s += x[size_t(t * in + i)] * w[size_t(o * in + i)];
      y[size_t(t * out + o)] = s;
    }
  return y;
}

// d_x = d_y·w
inline std::vector<double> reference_dgrad(const std::vector<double>& dy, const std::vector<double>& w,
                                           int64_t tokens, int64_t in, int64_t out) {
  std::vector<double> dx(size_t(tokens * in));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t i = 0; i < in; ++i) {
      double s = 0;
      for (int64_t o = 0; o < out; ++o) s += dy[size_t(t * out + o)] * w[size_t(o * in + i)];
      dx[size_t(t * in + i)] = s;
    }
  return dx;
}

// d_w = d_yᵀ·x, and the bias gradient (d_y summed over the tokens) into db.
inline std::vector<double> reference_wgrad(const std::vector<double>& dy, const std::vector<double>& x,
                                           int64_t tokens, int64_t in, int64_t out, std::vector<double>& db) {
  std::vector<double> dw(size_t(out * in));
  db.assign(size_t(out), 0.0);
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t i = 0; i < in; ++i) {
      double s = 0;
      for (int64_t t = 0; t < tokens; ++t) s += dy[size_t(t * out + o)] * x[size_t(t * in + i)];
      dw[size_t(o * in + i)] = s;
    }
    for (int64_t t = 0; t < tokens; ++t) db[size_t(o)] += dy[size_t(t * out + o)];
  }
  return dw;
}

// max |a − b| / max |b|
inline double worst_relative(const std::vector<double>& a, const std::vector<double>& b) {
  double most = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    most = std::max(most, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return most / scale;
}

}  // namespace stepcast::test
