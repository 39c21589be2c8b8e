// Shared by the CUDA backend's attention kernels (kernels_attention.cu: materialized and the
// fp32 flash path; kernels_flash_mma.cu: the bf16 tensor-core flash path): where q, k, v and ctx
// rows of one (sample, head) lie in the [s, b, width] buffers, and the attention-dropout hash.
#pragma once

#include <cstdint>

#include "cpu_kernels.hpp"
#include "cuda_common.cuh"
#include "errors.hpp"

namespace stepcast::cuda {

struct Geometry {
  int64_t s, b, heads, kv_heads, d, width, group;
  __host__ __device__ int64_t q(int64_t si, int64_t bi, int64_t hd) const {
    return (si * b + bi) * width + hd * d;
  }
  __host__ __device__ int64_t k(int64_t si, int64_t bi, int64_t hd) const {
    return (si * b + bi) * width + (heads + hd / group) * d;
  }
  __host__ __device__ int64_t v(int64_t si, int64_t bi, int64_t hd) const {
    return (si * b + bi) * width + (heads + kv_heads + hd / group) * d;
  }
  __host__ __device__ int64_t ctx(int64_t si, int64_t bi, int64_t hd) const {
    return (si * b + bi) * heads * d + hd * d;
  }
  __host__ __device__ int64_t square(int64_t bi, int64_t hd, int64_t i, int64_t j) const {
    return ((bi * heads + hd) * s + i) * s + j;
  }
};

inline Geometry geometry(const cpu::AttentionShape& sh) {
  STEPCAST_CHECK(sh.s > 0 && sh.b > 0 && sh.heads > 0 && sh.kv_heads > 0 && sh.d > 0 &&
                     sh.heads % sh.kv_heads == 0,
                 "attention shape");
  return {sh.s, sh.b, sh.heads, sh.kv_heads, sh.d, sh.qkv_width(), sh.heads / sh.kv_heads};
}

struct DropoutArgs {
  double p = 0;  // 0: no dropout
  uint64_t seed = 0, site = 0;
  int64_t step = 0, layer = 0, head0 = 0;
  const int64_t* sample_index = nullptr;
};
inline DropoutArgs dropout_args(const cpu::Dropout* d, int64_t head0, const int64_t* sample_index) {
  DropoutArgs a;
  if (d && d->p > 0) {
    a = {d->p, d->seed, uint64_t(d->site), d->step, d->layer, head0, sample_index};
  }
  return a;
}
// The hash state of (sample of batch row bi, global head head0 + hd, query i).
__device__ __forceinline__ uint64_t query_key(const DropoutArgs& a, int64_t bi, int64_t hd,
                                              int64_t i) {
  uint64_t key = sample_key(a.seed, a.site, a.step, a.layer, a.sample_index[bi]);
  return absorb(absorb(key, a.head0 + hd), i);
}

// The bf16 flash attention on the tensor cores (kernels_flash_mma.cu), launched on l.stream;
// false, launching nothing, where it does not apply (a head dim outside kFlashHeadDims, or q/k/v
// or d_ctx not 16-byte aligned): the caller then takes the CUDA-core kernels.
bool flash_mma_forward(const Launch& l, const bf16* qkv, bf16* ctx, float* lse, const Geometry& g, float scale,
                       const DropoutArgs& a);
bool flash_mma_backward(const Launch& l, const bf16* qkv, const bf16* ctx, const float* lse, const bf16* d_ctx,
                        bf16* d_qkv, float* delta, const Geometry& g, float scale, const DropoutArgs& a);

}  // namespace stepcast::cuda
