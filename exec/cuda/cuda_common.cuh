// Device helpers of the CUDA kernels: fp32 loads and stores of the storage types (bf16 rounds to
// nearest even, as __float2bfloat16_rn), atomics, block reductions, the dropout hash (the same
// words as cpu_kernels.cpp, so masks are identical on both backends), and launch geometry.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "bf16.hpp"
#include "cuda_kernels.hpp"

namespace stepcast::cuda {

__device__ __forceinline__ float load(float v) { return v; }
__device__ __forceinline__ float load(bf16 v) { return __uint_as_float(uint32_t(v.bits) << 16); }
__device__ __forceinline__ double load(double v) { return v; }

template <class X>
__device__ __forceinline__ X store(float v);
template <>
__device__ __forceinline__ float store<float>(float v) { return v; }
template <>
__device__ __forceinline__ bf16 store<bf16>(float v) {
  __nv_bfloat16 b = __float2bfloat16_rn(v);
  bf16 out;
  out.bits = __bfloat16_as_ushort(b);
  return out;
}

__device__ __forceinline__ void atomic_add(float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(bf16* p, float v) {
  atomicAdd(reinterpret_cast<__nv_bfloat16*>(p), __float2bfloat16_rn(v));
}

// ---- the dropout hash (cpu_kernels.cpp) ----
constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ull;
__host__ __device__ __forceinline__ uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
__host__ __device__ __forceinline__ uint64_t absorb(uint64_t h, int64_t word) {
  return mix(h + kGamma + uint64_t(word));
}
__host__ __device__ __forceinline__ uint64_t sample_key(uint64_t seed, uint64_t site, int64_t step,
                                                        int64_t layer, int64_t sample) {
  uint64_t h = mix(seed);
  h = absorb(h, int64_t(site));
  h = absorb(h, step);
  h = absorb(h, layer);
  return absorb(h, sample);
}
__host__ __device__ __forceinline__ bool keep_from(uint64_t h, double p) {
  return double(h >> 11) * 0x1.0p-53 >= p;
}

// ---- reductions ----
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum over the block (blockDim.x a multiple of 32, ≤ 1024); every thread gets the result.
template <class V>
__device__ V block_sum(V v) {
  __shared__ V partial[32];
  __syncthreads();  // partial may still be read from a previous call
  v = warp_sum(v);
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  V total = 0;
  for (int w = 0; w < int(blockDim.x / 32); ++w) total += partial[w];
  return total;
}
__device__ __forceinline__ float block_max(float v) {
  __shared__ float partial[32];
  __syncthreads();
  v = warp_max(v);
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float total = -INFINITY;
  for (int w = 0; w < int(blockDim.x / 32); ++w) total = fmaxf(total, partial[w]);
  return total;
}

// i over [0, n), every thread of the grid in turn.
#define GRID_STRIDE(i, n) \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

// Grid-stride geometry for n elements.
inline unsigned blocks_for(int64_t n, int threads = 256) {
  int64_t b = (n + threads - 1) / threads;
  return unsigned(b < 1 ? 1 : (b > 65535 * 16 ? 65535 * 16 : b));
}

}  // namespace stepcast::cuda
