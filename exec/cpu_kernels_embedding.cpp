// The CPU kernels' embeddings (cpu_kernels.hpp): the vocab-parallel word embedding lookup and its
// scatter-add backward, learned positions at global offsets. Token ids are global; rows outside
// this rank's shard [v0, v0 + v_local) give zeros (the tp reduction completes them).
#include <algorithm>

#include "cpu_kernels.hpp"
#include "errors.hpp"

namespace stepcast::cpu {

template <class T>
void embedding_forward(const int32_t* tokens, const T* w, T* out, int64_t s, int64_t b, int64_t h, int64_t v0,
                       int64_t v_local) {
  for (int64_t t = 0; t < s * b; ++t) {
    STEPCAST_CHECK(tokens[t] >= 0, "token ids must be non-negative");
    int64_t row = tokens[t] - v0;
    T* o = out + t * h;
    if (row >= 0 && row < v_local) {
      std::copy(w + row * h, w + (row + 1) * h, o);
    } else {
      std::fill(o, o + h, T(0));
    }
  }
}

template <class T>
void embedding_backward(const int32_t* tokens, const T* dout, T* dw, int64_t s, int64_t b, int64_t h, int64_t v0,
                        int64_t v_local) {
  for (int64_t t = 0; t < s * b; ++t) {
    int64_t row = tokens[t] - v0;
    if (row < 0 || row >= v_local) continue;
    for (int64_t j = 0; j < h; ++j) dw[row * h + j] += dout[t * h + j];
  }
}

template <class T>
void position_add_forward(T* x, const T* pos, int64_t s, int64_t b, int64_t h, int64_t s0, int64_t max_positions) {
  STEPCAST_CHECK(s0 >= 0 && s0 + s <= max_positions, "position beyond max_position_embeddings");
  for (int64_t si = 0; si < s; ++si)
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t j = 0; j < h; ++j) x[(si * b + bi) * h + j] += pos[(s0 + si) * h + j];
}

template <class T>
void position_add_backward(const T* dx, T* dpos, int64_t s, int64_t b, int64_t h, int64_t s0, int64_t max_positions) {
  STEPCAST_CHECK(s0 >= 0 && s0 + s <= max_positions, "position beyond max_position_embeddings");
  for (int64_t si = 0; si < s; ++si)
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t j = 0; j < h; ++j) dpos[(s0 + si) * h + j] += dx[(si * b + bi) * h + j];
}

// ---- Explicit instantiations ----

#define STEPCAST_CPU_KERNELS_EMBEDDING(T)                                                                         \
  template void embedding_forward<T>(const int32_t*, const T*, T*, int64_t, int64_t, int64_t, int64_t, int64_t);  \
  template void embedding_backward<T>(const int32_t*, const T*, T*, int64_t, int64_t, int64_t, int64_t, int64_t); \
  template void position_add_forward<T>(T*, const T*, int64_t, int64_t, int64_t, int64_t, int64_t);               \
  template void position_add_backward<T>(const T*, T*, int64_t, int64_t, int64_t, int64_t, int64_t);

STEPCAST_CPU_KERNELS_EMBEDDING(float)
STEPCAST_CPU_KERNELS_EMBEDDING(double)

#undef STEPCAST_CPU_KERNELS_EMBEDDING

}  // namespace stepcast::cpu
