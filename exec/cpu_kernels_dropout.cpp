// The CPU kernels' dropout (cpu_kernels.hpp): the mask definition dropout_keep, the fused
// dropout + residual add on [s, b, h] sites and the backward from a stored mask. Masks come from
// the counter-based hash of cpu_kernels_detail.hpp, a function of global coordinates only.
#include <algorithm>

#include "cpu_kernels.hpp"
#include "cpu_kernels_detail.hpp"
#include "errors.hpp"

namespace stepcast::cpu {

using namespace detail;

bool dropout_keep(uint64_t seed, DropoutSite site, int64_t step, int64_t layer, int64_t sample, int64_t i, int64_t j,
                  int64_t k, double p) {
  uint64_t h = sample_key(seed, site, step, layer, sample);
  return keep_from(absorb(absorb(absorb(h, i), j), k), p);
}

template <class T>
void dropout_add_forward(const T* x, const T* residual, T* out, uint8_t* mask, int64_t s, int64_t b, int64_t h,
                         const Dropout& dropout, int64_t s0, const int64_t* sample_index) {
  if (dropout.p == 0) {
    const int64_t n = s * b * h;
    for (int64_t i = 0; i < n; ++i) out[i] = (residual ? residual[i] : T(0)) + x[i];
    if (mask) std::fill(mask, mask + n, uint8_t(1));
    return;
  }
  STEPCAST_CHECK(mask && sample_index, "dropout_add_forward: dropout needs a mask and sample indices");
  const T scale = T(keep_scale(dropout.p));
  for (int64_t bi = 0; bi < b; ++bi) {
    uint64_t key = sample_key(&dropout, sample_index, bi);
    for (int64_t si = 0; si < s; ++si) {
      uint64_t key_s = absorb(key, s0 + si);
      int64_t row = (si * b + bi) * h;
      for (int64_t j = 0; j < h; ++j) {
        bool keep = keep_from(absorb(absorb(key_s, j), 0), dropout.p);
        T base = residual ? residual[row + j] : T(0);
        out[row + j] = base + (keep ? x[row + j] * scale : T(0));
        mask[row + j] = keep ? 1 : 0;
      }
    }
  }
}

template <class T>
void dropout_backward(const T* dy, const uint8_t* mask, T* dx, int64_t n, double p) {
  const T scale = T(keep_scale(p));
  for (int64_t i = 0; i < n; ++i) dx[i] = mask[i] ? dy[i] * scale : T(0);
}

// ---- Explicit instantiations ----

#define STEPCAST_CPU_KERNELS_DROPOUT(T)                                                                             \
  template void dropout_add_forward<T>(const T*, const T*, T*, uint8_t*, int64_t, int64_t, int64_t, const Dropout&, \
                                       int64_t, const int64_t*);                                                    \
  template void dropout_backward<T>(const T*, const uint8_t*, T*, int64_t, double);

STEPCAST_CPU_KERNELS_DROPOUT(float)
STEPCAST_CPU_KERNELS_DROPOUT(double)

#undef STEPCAST_CPU_KERNELS_DROPOUT

}  // namespace stepcast::cpu
