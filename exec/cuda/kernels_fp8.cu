// The CUDA backend's FP8 kernels (cuda_kernels.hpp's fp8_*), cpu_kernels_fp8.cpp's semantics on
// device memory: casts to the e4m3 / e5m2 grids with the slot's scale (cuda_fp8.h's conversion,
// round to nearest even, saturated to the largest finite value: fp8.hpp's fp8_round), the amax
// of a tensor, current scaling's scale, the byte transposes cuBLASLt's FP8 GEMMs need (both
// operands K-major), the dequantisation factors, and a bias gradient from FP8 codes.
#include <cuda_fp8.h>

#include <algorithm>

#include "cuda_common.cuh"
#include "errors.hpp"

namespace stepcast::cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ __nv_fp8_interpretation_t interpretation(Fp8Storage format) {
  return format == Fp8Storage::e4m3 ? __NV_E4M3 : __NV_E5M2;
}

__device__ __forceinline__ float decode(uint8_t code, Fp8Storage format) {
  __half_raw h = __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(code), interpretation(format));
  return __half2float(__half(h));
}

// The largest magnitude so far as int bits (non-negative floats order as their bits).
__device__ __forceinline__ void atomic_max_abs(float* amax, float value) {
  atomicMax(reinterpret_cast<int*>(amax), __float_as_int(fabsf(value)));
}

template <class T>
__global__ void fp8_cast_kernel(const T* x, uint8_t* y, int64_t n, const float* scale, float* amax, Fp8Storage format) {
  const float s = *scale;
  float most = 0;
  GRID_STRIDE(i, n) {
    const float v = load(x[i]);
    most = fmaxf(most, fabsf(v));
    y[i] = uint8_t(__nv_cvt_float_to_fp8(v * s, __NV_SATFINITE, interpretation(format)));
  }
  most = block_max(most);
  if (threadIdx.x == 0 && amax) atomic_max_abs(amax, most);
}

template <class T>
__global__ void fp8_absmax_kernel(const T* x, int64_t n, float* amax) {
  float most = 0;
  GRID_STRIDE(i, n) most = fmaxf(most, fabsf(load(x[i])));
  most = block_max(most);
  if (threadIdx.x == 0) atomic_max_abs(amax, most);
}

// fp8.hpp's fp8_current_scale: fp8_max / amax, 1 where amax is 0 or not finite.
__global__ void fp8_current_scale_kernel(const float* amax, float* scale, float fp8_max) {
  const float a = *amax;
  float s = (a > 0 && isfinite(a)) ? fp8_max / a : 1.f;
  *scale = isfinite(s) ? s : 1.f;
}

// y[c, r] = x[r, c] (bytes), 32×32 tiles through shared memory.
// The tiles cover ld ≥ rows rows of x; those from rows on read as zeros.
__global__ void transpose_bytes_kernel(const uint8_t* x, uint8_t* y, int64_t rows, int64_t cols, int64_t ld) {
  __shared__ uint8_t tile[32][33];
  const int64_t r0 = int64_t(blockIdx.y) * 32, c0 = int64_t(blockIdx.x) * 32;
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < ld && c < cols) tile[i][threadIdx.x] = r < rows ? x[r * cols + c] : uint8_t(0);
  }
  __syncthreads();
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;
    if (r < ld && c < cols) y[c * ld + r] = tile[threadIdx.x][i];
  }
}

__global__ void reciprocals_kernel(const float* a, const float* b, float* out) {
  out[0] = 1.f / *a;
  out[kFp8FactorStride] = 1.f / *b;
}

// dbias[o] += Σ_t decode(dy[t, o]) / scale: a block per 32 columns, 8 row lanes.
template <class G>
__global__ void fp8_bias_grad_kernel(const uint8_t* dy, const float* scale, G* dbias, int64_t tokens, int64_t out,
                                     Fp8Storage format) {
  __shared__ float partial[8][33];
  const int64_t o = int64_t(blockIdx.x) * 32 + threadIdx.x;
  float total = 0;
  if (o < out) {
    for (int64_t t = threadIdx.y; t < tokens; t += 8) total += decode(dy[t * out + o], format);
  }
  partial[threadIdx.y][threadIdx.x] = total;
  __syncthreads();
  if (threadIdx.y == 0 && o < out) {
    for (int y = 1; y < 8; ++y) total += partial[y][threadIdx.x];
    dbias[o] = store<G>(load(dbias[o]) + total / *scale);
  }
}

}  // namespace

template <class T>
void fp8_cast(const Launch& l, const T* x, uint8_t* y, int64_t n, const float* scale, float* amax, Fp8Storage format) {
  if (n == 0) return;
  fp8_cast_kernel<<<blocks_for(n), kThreads, 0, l.stream>>>(x, y, n, scale, amax, format);
  check_launch(l, "fp8_cast");
}

template <class T>
void fp8_absmax(const Launch& l, const T* x, int64_t n, float* amax, bool accumulate) {
  if (!accumulate) check_runtime(l, cudaMemsetAsync(amax, 0, sizeof(float), l.stream), "cudaMemsetAsync");
  if (n == 0) return;
  fp8_absmax_kernel<<<blocks_for(n), kThreads, 0, l.stream>>>(x, n, amax);
  check_launch(l, "fp8_absmax");
}

void fp8_set_current_scale(const Launch& l, const float* amax, float* scale, Fp8Storage format) {
  fp8_current_scale_kernel<<<1, 1, 0, l.stream>>>(amax, scale, float(fp8_max(format)));
  check_launch(l, "fp8_set_current_scale");
}

void transpose_bytes(const Launch& l, const uint8_t* x, uint8_t* y, int64_t rows, int64_t cols, int64_t ld) {
  if (ld == 0) ld = rows;
  STEPCAST_CHECK(ld >= rows, "transpose_bytes: a destination row shorter than the rows");
  if (ld == 0 || cols == 0) return;
  dim3 grid(unsigned((cols + 31) / 32), unsigned((ld + 31) / 32));
  transpose_bytes_kernel<<<grid, dim3(32, 8), 0, l.stream>>>(x, y, rows, cols, ld);
  check_launch(l, "transpose_bytes");
}

void fp8_reciprocals(const Launch& l, const float* a, const float* b, float* out) {
  reciprocals_kernel<<<1, 1, 0, l.stream>>>(a, b, out);
  check_launch(l, "fp8_reciprocals");
}

template <class G>
void fp8_bias_grad(const Launch& l, const uint8_t* dy, const float* scale, G* dbias, int64_t tokens, int64_t out,
                   Fp8Storage format) {
  if (out == 0) return;
  fp8_bias_grad_kernel<<<unsigned((out + 31) / 32), dim3(32, 8), 0, l.stream>>>(dy, scale, dbias, tokens, out, format);
  check_launch(l, "fp8_bias_grad");
}

#define STEPCAST_FP8_T(T)                                                                                  \
  template void fp8_cast<T>(const Launch&, const T*, uint8_t*, int64_t, const float*, float*, Fp8Storage); \
  template void fp8_absmax<T>(const Launch&, const T*, int64_t, float*, bool);                             \
  template void fp8_bias_grad<T>(const Launch&, const uint8_t*, const float*, T*, int64_t, int64_t, Fp8Storage);
STEPCAST_FP8_T(bf16)
STEPCAST_FP8_T(float)
#undef STEPCAST_FP8_T

}  // namespace stepcast::cuda
