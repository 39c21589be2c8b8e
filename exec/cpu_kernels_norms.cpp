// The CPU kernels' norms over h (cpu_kernels.hpp): LayerNorm and RMSNorm, forward and backward.
// Statistics are recomputed from x in backward (nothing saved) and accumulated in double; the
// backward kernels add into dx, dw and db.
#include <cmath>
#include <vector>

#include "cpu_kernels.hpp"
#include "cpu_kernels_detail.hpp"

namespace stepcast::cpu {

using namespace detail;

template <class T>
void layernorm_forward(const T* x, const T* w, const T* bias, T* y, int64_t rows, int64_t h, double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * h;
    double mean = 0, var = 0;
    for (int64_t j = 0; j < h; ++j) mean += xr[j];
    mean /= double(h);
    for (int64_t j = 0; j < h; ++j) var += (xr[j] - mean) * (xr[j] - mean);
    double rstd = 1.0 / std::sqrt(var / double(h) + eps);
    for (int64_t j = 0; j < h; ++j) y[r * h + j] = T((xr[j] - mean) * rstd * w[j] + bias[j]);
  }
}

template <class T>
void layernorm_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, T* db, int64_t rows, int64_t h, double eps) {
  std::vector<double> dw_sum(h, 0.0), db_sum(h, 0.0), xhat(h);
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * h;
    const T* dyr = dy + r * h;
    double mean = 0, var = 0;
    for (int64_t j = 0; j < h; ++j) mean += xr[j];
    mean /= double(h);
    for (int64_t j = 0; j < h; ++j) var += (xr[j] - mean) * (xr[j] - mean);
    double rstd = 1.0 / std::sqrt(var / double(h) + eps);
    double mean_g = 0, mean_gx = 0;
    for (int64_t j = 0; j < h; ++j) {
      xhat[j] = (xr[j] - mean) * rstd;
      double g = double(dyr[j]) * w[j];
      mean_g += g;
      mean_gx += g * xhat[j];
      dw_sum[j] += double(dyr[j]) * xhat[j];
      db_sum[j] += dyr[j];
    }
    mean_g /= double(h);
    mean_gx /= double(h);
    for (int64_t j = 0; j < h; ++j) {
      double g = double(dyr[j]) * w[j];
      dx[r * h + j] += T(rstd * (g - mean_g - xhat[j] * mean_gx));
    }
  }
  for (int64_t j = 0; j < h; ++j) {
    dw[j] += T(dw_sum[j]);
    db[j] += T(db_sum[j]);
  }
}

template <class T>
void rmsnorm_forward(const T* x, const T* w, T* y, int64_t rows, int64_t h, double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * h;
    double rstd = 1.0 / std::sqrt(dot(xr, xr, h) / double(h) + eps);
    for (int64_t j = 0; j < h; ++j) y[r * h + j] = T(xr[j] * rstd * w[j]);
  }
}

template <class T>
void rmsnorm_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, int64_t rows, int64_t h, double eps) {
  std::vector<double> dw_sum(h, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * h;
    const T* dyr = dy + r * h;
    double rstd = 1.0 / std::sqrt(dot(xr, xr, h) / double(h) + eps);
    double mean_gx = 0;
    for (int64_t j = 0; j < h; ++j) {
      double xhat = xr[j] * rstd;
      mean_gx += double(dyr[j]) * w[j] * xhat;
      dw_sum[j] += double(dyr[j]) * xhat;
    }
    mean_gx /= double(h);
    for (int64_t j = 0; j < h; ++j) {
      double xhat = xr[j] * rstd;
      dx[r * h + j] += T(rstd * (double(dyr[j]) * w[j] - xhat * mean_gx));
    }
  }
  for (int64_t j = 0; j < h; ++j) dw[j] += T(dw_sum[j]);
}

// ---- Explicit instantiations ----

#define STEPCAST_CPU_KERNELS_NORMS(T)                                                                      \
  template void layernorm_forward<T>(const T*, const T*, const T*, T*, int64_t, int64_t, double);          \
  template void layernorm_backward<T>(const T*, const T*, const T*, T*, T*, T*, int64_t, int64_t, double); \
  template void rmsnorm_forward<T>(const T*, const T*, T*, int64_t, int64_t, double);                      \
  template void rmsnorm_backward<T>(const T*, const T*, const T*, T*, T*, int64_t, int64_t, double);

STEPCAST_CPU_KERNELS_NORMS(float)
STEPCAST_CPU_KERNELS_NORMS(double)

#undef STEPCAST_CPU_KERNELS_NORMS

}  // namespace stepcast::cpu
