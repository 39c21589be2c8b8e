// The CPU kernels' optimizer (cpu_kernels.hpp): the squared gradient norm of a shard, Megatron's
// clip coefficient and the AdamW step (apex/Megatron adam_w_mode). Moments and updates are
// computed in double and stored as T.
#include <algorithm>
#include <cmath>

#include "cpu_kernels.hpp"
#include "cpu_kernels_detail.hpp"
#include "errors.hpp"

namespace stepcast::cpu {

using namespace detail;

template <class T>
double grad_norm_sq(const T* g, int64_t n) {
  return dot(g, g, n);
}

double clip_coefficient(double total_norm, double max_norm) { return std::min(1.0, max_norm / (total_norm + 1e-6)); }

template <class T>
void adamw_step(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, int64_t n, const AdamW& config, int64_t step,
                double clip_coef) {
  STEPCAST_CHECK(step >= 1, "AdamW steps count from 1");
  const double bias1 = 1.0 - std::pow(config.beta1, double(step));
  const double bias2 = 1.0 - std::pow(config.beta2, double(step));
  for (int64_t i = 0; i < n; ++i) {
    double g = double(grad[i]) * clip_coef;
    double m = config.beta1 * exp_avg[i] + (1.0 - config.beta1) * g;
    double v = config.beta2 * exp_avg_sq[i] + (1.0 - config.beta2) * g * g;
    double update = (m / bias1) / (std::sqrt(v / bias2) + config.eps);
    double p = param[i];
    param[i] = T(p - config.lr * (update + config.weight_decay * p));
    exp_avg[i] = T(m);
    exp_avg_sq[i] = T(v);
  }
}

// ---- Explicit instantiations ----

#define STEPCAST_CPU_KERNELS_OPTIMIZER(T)             \
  template double grad_norm_sq<T>(const T*, int64_t); \
  template void adamw_step<T>(T*, const T*, T*, T*, int64_t, const AdamW&, int64_t, double);

STEPCAST_CPU_KERNELS_OPTIMIZER(float)
STEPCAST_CPU_KERNELS_OPTIMIZER(double)

#undef STEPCAST_CPU_KERNELS_OPTIMIZER

}  // namespace stepcast::cpu
