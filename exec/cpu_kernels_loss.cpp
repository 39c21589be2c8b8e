// The CPU kernels' vocab-parallel cross entropy (cpu_kernels.hpp): per-shard statistics, the loss
// and softmax from every tp rank's statistics, and dlogits scaled by 1/(tokens in the global
// batch). Reductions in double.
#include <algorithm>
#include <cmath>

#include "cpu_kernels.hpp"
#include "cpu_kernels_detail.hpp"
#include "errors.hpp"

namespace stepcast::cpu {

using namespace detail;

template <class T>
void cross_entropy_stats(const T* logits, const int32_t* targets, T* stats, int64_t tokens, int64_t v0,
                         int64_t v_local) {
  for (int64_t t = 0; t < tokens; ++t) {
    const T* row = logits + t * v_local;
    double max = kNegInf;
    for (int64_t j = 0; j < v_local; ++j) max = std::max(max, double(row[j]));
    double sum = 0;
    for (int64_t j = 0; j < v_local; ++j) sum += std::exp(double(row[j]) - max);
    STEPCAST_CHECK(targets[t] >= 0, "target ids must be non-negative");
    int64_t local = targets[t] - v0;
    stats[t] = T(max);
    stats[tokens + t] = T(sum);
    stats[2 * tokens + t] = local >= 0 && local < v_local ? row[local] : T(0);
  }
}

template <class T>
void cross_entropy_forward(const T* logits, const T* stats_all, int64_t tp, T* softmax, T* loss, int64_t tokens,
                           int64_t v_local) {
  for (int64_t t = 0; t < tokens; ++t) {
    double max = kNegInf, target_logit = 0, sum = 0;
    for (int64_t r = 0; r < tp; ++r) max = std::max(max, double(stats_all[r * 3 * tokens + t]));
    for (int64_t r = 0; r < tp; ++r) {
      const T* st = stats_all + r * 3 * tokens;
      sum += double(st[tokens + t]) * std::exp(double(st[t]) - max);
      target_logit += st[2 * tokens + t];
    }
    loss[t] = T(std::log(sum) + max - target_logit);
    const T* row = logits + t * v_local;
    for (int64_t j = 0; j < v_local; ++j) softmax[t * v_local + j] = T(std::exp(double(row[j]) - max) / sum);
  }
}

template <class T>
void cross_entropy_backward(const T* softmax, const int32_t* targets, T* dlogits, int64_t tokens, int64_t v0,
                            int64_t v_local, double scale) {
  for (int64_t t = 0; t < tokens; ++t) {
    int64_t local = targets[t] - v0;
    for (int64_t j = 0; j < v_local; ++j) {
      double onehot = j == local ? 1.0 : 0.0;
      dlogits[t * v_local + j] = T((double(softmax[t * v_local + j]) - onehot) * scale);
    }
  }
}

// ---- Explicit instantiations ----

#define STEPCAST_CPU_KERNELS_LOSS(T)                                                             \
  template void cross_entropy_stats<T>(const T*, const int32_t*, T*, int64_t, int64_t, int64_t); \
  template void cross_entropy_forward<T>(const T*, const T*, int64_t, T*, T*, int64_t, int64_t); \
  template void cross_entropy_backward<T>(const T*, const int32_t*, T*, int64_t, int64_t, int64_t, double);

STEPCAST_CPU_KERNELS_LOSS(float)
STEPCAST_CPU_KERNELS_LOSS(double)

#undef STEPCAST_CPU_KERNELS_LOSS

}  // namespace stepcast::cpu
