// The CUDA backend's memory-bound kernels (cuda_kernels.hpp): element-wise helpers, dropout,
// embeddings, norms, activations, rotary, cross entropy, AdamW. One thread per element in
// grid-stride loops, one block per row for row reductions; arithmetic in fp32.
#include <algorithm>
#include <cmath>
#include <string>

#include "cuda_common.cuh"
#include "errors.hpp"

namespace stepcast::cuda {

void check_launch(const Launch& l, const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    throw std::runtime_error("rank " + std::to_string(l.rank) + ": CUDA kernel " + what +
                             " failed to launch: " + cudaGetErrorName(e) + " (" +
                             cudaGetErrorString(e) + ")");
  }
}

void check_runtime(const Launch& l, cudaError_t code, const char* call) {
  if (code != cudaSuccess) {
    throw std::runtime_error("rank " + std::to_string(l.rank) + ": " + call + " failed: " +
                             cudaGetErrorName(code) + " (" + cudaGetErrorString(code) + ")");
  }
}

namespace {

constexpr int kThreads = 256;

// Threads for a row of h elements: a multiple of 32, at most 1024.
int row_threads(int64_t h) {
  int64_t t = (h + 31) / 32 * 32;
  return int(t < 32 ? 32 : (t > 1024 ? 1024 : t));
}

// ---- element-wise ----
template <class G>
__global__ void add_kernel(G* y, const G* x, int64_t n) {
  GRID_STRIDE(i, n) y[i] = store<G>(load(y[i]) + load(x[i]));
}
template <class T>
__global__ void add_rows_kernel(T* x, const T* bias, int64_t rows, int64_t h) {
  GRID_STRIDE(i, rows * h) x[i] = store<T>(load(x[i]) + load(bias[i % h]));
}
// Column sums over many rows (bias gradients: rows = tokens): a block is 32 columns × 8 row
// lanes; blockIdx.y strides the rows; one atomic per column and block.
template <class T, class G>
__global__ void sum_rows_kernel(const T* x, G* out, int64_t rows, int64_t h) {
  __shared__ float partial[8][33];
  const int64_t j = int64_t(blockIdx.x) * 32 + threadIdx.x;
  float total = 0;
  if (j < h) {
    for (int64_t r = int64_t(blockIdx.y) * 8 + threadIdx.y; r < rows; r += int64_t(gridDim.y) * 8) {
      total += load(x[r * h + j]);
    }
  }
  partial[threadIdx.y][threadIdx.x] = total;
  __syncthreads();
  if (threadIdx.y == 0 && j < h) {
    for (int y = 1; y < 8; ++y) total += partial[y][threadIdx.x];
    atomic_add(out + j, total);
  }
}
template <class T>
__global__ void fill_columns_kernel(T* x, int64_t rows, int64_t cols, int64_t from, float value) {
  int64_t width = cols - from;
  GRID_STRIDE(i, rows * width) x[(i / width) * cols + from + i % width] = store<T>(value);
}
template <class X>
__global__ void sum_kernel(const X* x, int64_t n, bool squares, double* result) {
  double local = 0;
  GRID_STRIDE(i, n) {
    double v = load(x[i]);
    local += squares ? v * v : v;
  }
  double total = block_sum(local);
  if (threadIdx.x == 0) atomicAdd(result, total);
}
template <class From, class To>
__global__ void convert_kernel(const From* x, To* y, int64_t n) {
  GRID_STRIDE(i, n) y[i] = store<To>(load(x[i]));
}

// ---- dropout ----
template <class T>
__global__ void dropout_add_kernel(const T* x, const T* residual, T* out, uint8_t* mask, int64_t s,
                                   int64_t b, int64_t h, double p, uint64_t seed, uint64_t site,
                                   int64_t step, int64_t layer, int64_t s0,
                                   const int64_t* sample_index) {
  const float scale = float(1.0 / (1.0 - p));
  GRID_STRIDE(i, s * b * h) {
    int64_t j = i % h, row = i / h, bi = row % b, si = row / b;
    bool keep = true;
    if (p > 0) {
      uint64_t key = sample_key(seed, site, step, layer, sample_index[bi]);
      keep = keep_from(absorb(absorb(absorb(key, s0 + si), j), 0), p);
    }
    float base = residual ? load(residual[i]) : 0.f;
    if (mask) mask[i] = keep ? 1 : 0;  // null only with p = 0 (the residual add alone)
    out[i] = store<T>(base + (keep ? load(x[i]) * scale : 0.f));
  }
}
template <class T>
__global__ void dropout_backward_kernel(const T* dy, const uint8_t* mask, T* dx, int64_t n,
                                        float scale) {
  GRID_STRIDE(i, n) dx[i] = store<T>(mask[i] ? load(dy[i]) * scale : 0.f);
}

// ---- embeddings ----
template <class T>
__global__ void embedding_forward_kernel(const int32_t* tokens, const T* w, T* out, int64_t rows,
                                         int64_t h, int64_t v0, int64_t v_local) {
  GRID_STRIDE(i, rows * h) {
    int64_t local = int64_t(tokens[i / h]) - v0;
    out[i] = local >= 0 && local < v_local ? w[local * h + i % h] : store<T>(0.f);
  }
}
template <class T, class G>
__global__ void embedding_backward_kernel(const int32_t* tokens, const T* dout, G* dw, int64_t rows,
                                          int64_t h, int64_t v0, int64_t v_local) {
  GRID_STRIDE(i, rows * h) {
    int64_t local = int64_t(tokens[i / h]) - v0;
    if (local >= 0 && local < v_local) atomic_add(dw + local * h + i % h, load(dout[i]));
  }
}
template <class T>
__global__ void position_add_forward_kernel(T* x, const T* pos, int64_t s, int64_t b, int64_t h,
                                            int64_t s0) {
  GRID_STRIDE(i, s * b * h) {
    int64_t si = i / (b * h), j = i % h;
    x[i] = store<T>(load(x[i]) + load(pos[(s0 + si) * h + j]));
  }
}
template <class T, class G>
__global__ void position_add_backward_kernel(const T* dx, G* dpos, int64_t s, int64_t b, int64_t h,
                                             int64_t s0) {
  GRID_STRIDE(i, s * h) {
    int64_t si = i / h, j = i % h;
    float total = 0;
    for (int64_t bi = 0; bi < b; ++bi) total += load(dx[(si * b + bi) * h + j]);
    G* p = dpos + (s0 + si) * h + j;
    *p = store<G>(load(*p) + total);
  }
}

// ---- norms: one block per row (forward), a block per kNormRows rows (backward) ----
constexpr int64_t kNormRows = 32;

template <class T>
__global__ void layernorm_forward_kernel(const T* x, const T* w, const T* bias, T* y, int64_t h,
                                         float eps) {
  const T* xr = x + int64_t(blockIdx.x) * h;
  T* yr = y + int64_t(blockIdx.x) * h;
  float sum = 0;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) sum += load(xr[j]);
  float mean = block_sum(sum) / float(h);
  float var = 0;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
    float d = load(xr[j]) - mean;
    var += d * d;
  }
  float rstd = rsqrtf(block_sum(var) / float(h) + eps);
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
    float v = (load(xr[j]) - mean) * rstd * load(w[j]);
    yr[j] = store<T>(bias ? v + load(bias[j]) : v);
  }
}
template <class T>
__global__ void rmsnorm_forward_kernel(const T* x, const T* w, T* y, int64_t h, float eps) {
  const T* xr = x + int64_t(blockIdx.x) * h;
  T* yr = y + int64_t(blockIdx.x) * h;
  float ss = 0;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) ss += load(xr[j]) * load(xr[j]);
  float rstd = rsqrtf(block_sum(ss) / float(h) + eps);
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) yr[j] = store<T>(load(xr[j]) * rstd * load(w[j]));
}
// dx += ...; dw (+ db) partial sums of the block's rows in shared memory, then one atomic per
// column and block. `layer` false: RMSNorm (no mean, no db).
template <class T, class G>
__global__ void norm_backward_kernel(const T* x, const T* w, const T* dy, T* dx, G* dw, G* db,
                                     int64_t rows, int64_t h, float eps, bool layer) {
  extern __shared__ float partial[];  // [dw | db], h each
  float* dw_s = partial;
  float* db_s = partial + h;
  for (int64_t j = threadIdx.x; j < 2 * h; j += blockDim.x) partial[j] = 0;
  __syncthreads();
  int64_t r0 = int64_t(blockIdx.x) * kNormRows;
  int64_t r1 = r0 + kNormRows < rows ? r0 + kNormRows : rows;
  for (int64_t r = r0; r < r1; ++r) {
    const T* xr = x + r * h;
    const T* dyr = dy + r * h;
    float mean = 0;
    if (layer) {
      float sum = 0;
      for (int64_t j = threadIdx.x; j < h; j += blockDim.x) sum += load(xr[j]);
      mean = block_sum(sum) / float(h);
    }
    float var = 0;
    for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
      float d = load(xr[j]) - mean;
      var += d * d;
    }
    float rstd = rsqrtf(block_sum(var) / float(h) + eps);
    float g_sum = 0, gx_sum = 0;
    for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
      float xhat = (load(xr[j]) - mean) * rstd;
      float g = load(dyr[j]) * load(w[j]);
      g_sum += g;
      gx_sum += g * xhat;
      dw_s[j] += load(dyr[j]) * xhat;  // column j belongs to this thread: no race
      db_s[j] += load(dyr[j]);
    }
    float mean_g = layer ? block_sum(g_sum) / float(h) : 0.f;
    float mean_gx = block_sum(gx_sum) / float(h);
    for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
      float xhat = (load(xr[j]) - mean) * rstd;
      float g = load(dyr[j]) * load(w[j]);
      T* d = dx + r * h + j;
      *d = store<T>(load(*d) + rstd * (g - mean_g - xhat * mean_gx));
    }
  }
  __syncthreads();
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
    atomic_add(dw + j, dw_s[j]);
    if (layer) atomic_add(db + j, db_s[j]);
  }
}

// ---- activations ----
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;

template <class T>
__global__ void gelu_forward_kernel(const T* x, T* y, int64_t n) {
  GRID_STRIDE(i, n) {
    float v = load(x[i]);
    y[i] = store<T>(0.5f * v * (1.f + tanhf(kGeluC * (v + kGeluA * v * v * v))));
  }
}
template <class T>
__global__ void gelu_backward_kernel(const T* x, const T* dy, T* dx, int64_t n) {
  GRID_STRIDE(i, n) {
    float v = load(x[i]);
    float t = tanhf(kGeluC * (v + kGeluA * v * v * v));
    float grad = 0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * kGeluC * (1.f + 3.f * kGeluA * v * v);
    dx[i] = store<T>(load(dy[i]) * grad);
  }
}
__device__ __forceinline__ float sigmoid(float v) { return 1.f / (1.f + expf(-v)); }
template <class T>
__global__ void swiglu_forward_kernel(const T* gate, const T* up, T* act, int64_t n) {
  GRID_STRIDE(i, n) {
    float g = load(gate[i]);
    act[i] = store<T>(g * sigmoid(g) * load(up[i]));
  }
}
template <class T>
__global__ void swiglu_backward_kernel(const T* gate, const T* up, const T* d_act, T* d_gate,
                                       T* d_up, int64_t n) {
  GRID_STRIDE(i, n) {
    float g = load(gate[i]), sg = sigmoid(g), da = load(d_act[i]);
    d_gate[i] = store<T>(da * load(up[i]) * sg * (1.f + g * (1.f - sg)));
    d_up[i] = store<T>(da * g * sg);
  }
}
// One thread per (row, q-or-k head, frequency i < d/2); angles in double as the CPU's.
template <class T>
__global__ void rotary_kernel(T* qkv, int64_t rows, int64_t b, int64_t heads_qk, int64_t d,
                              int64_t width, double theta, int64_t s0, double sign) {
  int64_t half = d / 2;
  GRID_STRIDE(e, rows * heads_qk * half) {
    int64_t i = e % half, hd = (e / half) % heads_qk, row = e / (half * heads_qk);
    int64_t si = row / b;
    double angle = double(s0 + si) / pow(theta, double(2 * i) / double(d));
    double sn, cs;
    sincos(angle, &sn, &cs);
    sn *= sign;
    T* x = qkv + row * width + hd * d;
    double x1 = load(x[i]), x2 = load(x[i + half]);
    x[i] = store<T>(float(x1 * cs - x2 * sn));
    x[i + half] = store<T>(float(x2 * cs + x1 * sn));
  }
}

// ---- cross entropy: one block per token ----
template <class T>
__global__ void ce_stats_kernel(const T* logits, const int32_t* targets, float* stats,
                                int64_t tokens, int64_t v0, int64_t v_local) {
  int64_t t = blockIdx.x;
  const T* row = logits + t * v_local;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < v_local; j += blockDim.x) m = fmaxf(m, load(row[j]));
  m = block_max(m);
  float sum = 0;
  for (int64_t j = threadIdx.x; j < v_local; j += blockDim.x) sum += expf(load(row[j]) - m);
  sum = block_sum(sum);
  if (threadIdx.x == 0) {
    int64_t local = int64_t(targets[t]) - v0;
    stats[t] = m;
    stats[tokens + t] = sum;
    stats[2 * tokens + t] = local >= 0 && local < v_local ? load(row[local]) : 0.f;
  }
}
template <class T>
__global__ void ce_forward_kernel(const T* logits, const float* stats_all, int64_t tp,
                                  float* softmax, float* loss, int64_t tokens, int64_t v_local) {
  int64_t t = blockIdx.x;
  float m = -INFINITY;
  for (int64_t r = 0; r < tp; ++r) m = fmaxf(m, stats_all[r * 3 * tokens + t]);
  float sum = 0, target = 0;
  for (int64_t r = 0; r < tp; ++r) {
    const float* st = stats_all + r * 3 * tokens;
    sum += st[tokens + t] * expf(st[t] - m);
    target += st[2 * tokens + t];
  }
  if (threadIdx.x == 0) loss[t] = logf(sum) + m - target;
  const T* row = logits + t * v_local;
  float inv = 1.f / sum;
  for (int64_t j = threadIdx.x; j < v_local; j += blockDim.x) {
    softmax[t * v_local + j] = expf(load(row[j]) - m) * inv;
  }
}
template <class T>
__global__ void ce_backward_kernel(const float* softmax, const int32_t* targets, T* dlogits,
                                   int64_t tokens, int64_t v0, int64_t v_local, float scale) {
  GRID_STRIDE(i, tokens * v_local) {
    int64_t t = i / v_local, j = i % v_local;
    float onehot = int64_t(targets[t]) - v0 == j ? 1.f : 0.f;
    dlogits[i] = store<T>((softmax[i] - onehot) * scale);
  }
}

// ---- AdamW ----
template <class T, class G>
__global__ void adamw_kernel(T* param, float* master, const G* grad, float* m_state,
                             float* v_state, int64_t n, float lr, float beta1, float beta2,
                             float eps, float weight_decay, float bias1, float bias2, float clip) {
  GRID_STRIDE(i, n) {
    float g = load(grad[i]) * clip;
    float m = beta1 * m_state[i] + (1.f - beta1) * g;
    float v = beta2 * v_state[i] + (1.f - beta2) * g * g;
    float update = (m / bias1) / (sqrtf(v / bias2) + eps);
    float p = master ? master[i] : load(param[i]);
    p -= lr * (update + weight_decay * p);
    if (master) master[i] = p;
    param[i] = store<T>(p);
    m_state[i] = m;
    v_state[i] = v;
  }
}

}  // namespace

// ---- launchers ----
template <class G>
void add(const Launch& l, G* y, const G* x, int64_t n) {
  if (n <= 0) return;
  add_kernel<<<blocks_for(n), kThreads, 0, l.stream>>>(y, x, n);
  check_launch(l, "add");
}
template <class T>
void add_rows(const Launch& l, T* x, const T* bias, int64_t rows, int64_t h) {
  add_rows_kernel<<<blocks_for(rows * h), kThreads, 0, l.stream>>>(x, bias, rows, h);
  check_launch(l, "add_rows");
}
template <class T, class G>
void sum_rows(const Launch& l, const T* x, G* out, int64_t rows, int64_t h) {
  const int64_t row_blocks = std::min<int64_t>(64, std::max<int64_t>(1, rows / 256));
  dim3 grid(unsigned((h + 31) / 32), unsigned(row_blocks));
  sum_rows_kernel<<<grid, dim3(32, 8), 0, l.stream>>>(x, out, rows, h);
  check_launch(l, "sum_rows");
}
template <class T>
void fill_columns(const Launch& l, T* x, int64_t rows, int64_t cols, int64_t from, float value) {
  if (from >= cols) return;
  fill_columns_kernel<<<blocks_for(rows * (cols - from)), kThreads, 0, l.stream>>>(x, rows, cols, from, value);
  check_launch(l, "fill_columns");
}
void sum(const Launch& l, const float* x, int64_t n, double* result) {
  check_runtime(l, cudaMemsetAsync(result, 0, sizeof(double), l.stream), "cudaMemsetAsync");
  sum_kernel<<<blocks_for(n) > 1024 ? 1024 : blocks_for(n), kThreads, 0, l.stream>>>(x, n, false, result);
  check_launch(l, "sum");
}
template <class G>
void sum_squares(const Launch& l, const G* g, int64_t n, double* result, bool accumulate) {
  if (!accumulate) check_runtime(l, cudaMemsetAsync(result, 0, sizeof(double), l.stream), "cudaMemsetAsync");
  if (n <= 0) return;
  sum_kernel<<<blocks_for(n) > 1024 ? 1024 : blocks_for(n), kThreads, 0, l.stream>>>(g, n, true, result);
  check_launch(l, "sum_squares");
}
template <class From, class To>
void convert(const Launch& l, const From* x, To* y, int64_t n) {
  convert_kernel<<<blocks_for(n), kThreads, 0, l.stream>>>(x, y, n);
  check_launch(l, "convert");
}
template <class T>
void dropout_add_forward(const Launch& l, const T* x, const T* residual, T* out, uint8_t* mask,
                         int64_t s, int64_t b, int64_t h, const cpu::Dropout& d, int64_t s0,
                         const int64_t* sample_index) {
  dropout_add_kernel<<<blocks_for(s * b * h), kThreads, 0, l.stream>>>(
      x, residual, out, mask, s, b, h, d.p, d.seed, uint64_t(d.site), d.step, d.layer, s0,
      sample_index);
  check_launch(l, "dropout_add_forward");
}
template <class T>
void dropout_backward(const Launch& l, const T* dy, const uint8_t* mask, T* dx, int64_t n, double p) {
  dropout_backward_kernel<<<blocks_for(n), kThreads, 0, l.stream>>>(dy, mask, dx, n, float(1.0 / (1.0 - p)));
  check_launch(l, "dropout_backward");
}
template <class T>
void embedding_forward(const Launch& l, const int32_t* tokens, const T* w, T* out, int64_t s,
                       int64_t b, int64_t h, int64_t v0, int64_t v_local) {
  embedding_forward_kernel<<<blocks_for(s * b * h), kThreads, 0, l.stream>>>(tokens, w, out, s * b, h, v0, v_local);
  check_launch(l, "embedding_forward");
}
template <class T, class G>
void embedding_backward(const Launch& l, const int32_t* tokens, const T* dout, G* dw, int64_t s,
                        int64_t b, int64_t h, int64_t v0, int64_t v_local) {
  embedding_backward_kernel<<<blocks_for(s * b * h), kThreads, 0, l.stream>>>(tokens, dout, dw, s * b, h, v0, v_local);
  check_launch(l, "embedding_backward");
}
template <class T>
void position_add_forward(const Launch& l, T* x, const T* pos, int64_t s, int64_t b, int64_t h,
                          int64_t s0, int64_t max_positions) {
  STEPCAST_CHECK(s0 + s <= max_positions, "positions beyond max_position_embeddings");
  position_add_forward_kernel<<<blocks_for(s * b * h), kThreads, 0, l.stream>>>(x, pos, s, b, h, s0);
  check_launch(l, "position_add_forward");
}
template <class T, class G>
void position_add_backward(const Launch& l, const T* dx, G* dpos, int64_t s, int64_t b, int64_t h,
                           int64_t s0, int64_t max_positions) {
  STEPCAST_CHECK(s0 + s <= max_positions, "positions beyond max_position_embeddings");
  position_add_backward_kernel<<<blocks_for(s * h), kThreads, 0, l.stream>>>(dx, dpos, s, b, h, s0);
  check_launch(l, "position_add_backward");
}
template <class T>
void layernorm_forward(const Launch& l, const T* x, const T* w, const T* bias, T* y, int64_t rows,
                       int64_t h, double eps) {
  layernorm_forward_kernel<<<unsigned(rows), row_threads(h) > 512 ? 512 : row_threads(h), 0, l.stream>>>(x, w, bias, y, h, float(eps));
  check_launch(l, "layernorm_forward");
}
template <class T>
void rmsnorm_forward(const Launch& l, const T* x, const T* w, T* y, int64_t rows, int64_t h, double eps) {
  rmsnorm_forward_kernel<<<unsigned(rows), row_threads(h) > 512 ? 512 : row_threads(h), 0, l.stream>>>(x, w, y, h, float(eps));
  check_launch(l, "rmsnorm_forward");
}
template <class T, class G>
void norm_backward(const Launch& l, const T* x, const T* w, const T* dy, T* dx, G* dw, G* db,
                   int64_t rows, int64_t h, double eps, bool layer) {
  size_t shared = size_t(2 * h) * sizeof(float);
  if (shared > 48 * 1024) {
    check_runtime(l, cudaFuncSetAttribute(norm_backward_kernel<T, G>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared)),
                  "cudaFuncSetAttribute");
  }
  unsigned blocks = unsigned((rows + kNormRows - 1) / kNormRows);
  norm_backward_kernel<<<blocks, row_threads(h) > 512 ? 512 : row_threads(h), shared, l.stream>>>(
      x, w, dy, dx, dw, db, rows, h, float(eps), layer);
  check_launch(l, "norm_backward");
}
template <class T, class G>
void layernorm_backward(const Launch& l, const T* x, const T* w, const T* dy, T* dx, G* dw, G* db,
                        int64_t rows, int64_t h, double eps) {
  norm_backward(l, x, w, dy, dx, dw, db, rows, h, eps, true);
}
template <class T, class G>
void rmsnorm_backward(const Launch& l, const T* x, const T* w, const T* dy, T* dx, G* dw,
                      int64_t rows, int64_t h, double eps) {
  norm_backward<T, G>(l, x, w, dy, dx, dw, nullptr, rows, h, eps, false);
}
template <class T>
void gelu_forward(const Launch& l, const T* x, T* y, int64_t n) {
  gelu_forward_kernel<<<blocks_for(n), kThreads, 0, l.stream>>>(x, y, n);
  check_launch(l, "gelu_forward");
}
template <class T>
void gelu_backward(const Launch& l, const T* x, const T* dy, T* dx, int64_t n) {
  gelu_backward_kernel<<<blocks_for(n), kThreads, 0, l.stream>>>(x, dy, dx, n);
  check_launch(l, "gelu_backward");
}
template <class T>
void swiglu_forward(const Launch& l, const T* gate, const T* up, T* act, int64_t n) {
  swiglu_forward_kernel<<<blocks_for(n), kThreads, 0, l.stream>>>(gate, up, act, n);
  check_launch(l, "swiglu_forward");
}
template <class T>
void swiglu_backward(const Launch& l, const T* gate, const T* up, const T* d_act, T* d_gate,
                     T* d_up, int64_t n) {
  swiglu_backward_kernel<<<blocks_for(n), kThreads, 0, l.stream>>>(gate, up, d_act, d_gate, d_up, n);
  check_launch(l, "swiglu_backward");
}
template <class T>
void rotary(const Launch& l, T* qkv, const cpu::AttentionShape& sh, double theta, int64_t s0,
            double sign) {
  STEPCAST_CHECK(sh.d % 2 == 0, "rotary embedding needs an even head dim");
  int64_t heads_qk = sh.heads + sh.kv_heads;
  int64_t n = sh.s * sh.b * heads_qk * (sh.d / 2);
  rotary_kernel<<<blocks_for(n), kThreads, 0, l.stream>>>(qkv, sh.s * sh.b, sh.b, heads_qk, sh.d,
                                                           sh.qkv_width(), theta, s0, sign);
  check_launch(l, "rotary");
}
template <class T>
void cross_entropy_stats(const Launch& l, const T* logits, const int32_t* targets, float* stats,
                         int64_t tokens, int64_t v0, int64_t v_local) {
  ce_stats_kernel<<<unsigned(tokens), 512, 0, l.stream>>>(logits, targets, stats, tokens, v0, v_local);
  check_launch(l, "cross_entropy_stats");
}
template <class T>
void cross_entropy_forward(const Launch& l, const T* logits, const float* stats_all, int64_t tp,
                           float* softmax, float* loss, int64_t tokens, int64_t v_local) {
  ce_forward_kernel<<<unsigned(tokens), 512, 0, l.stream>>>(logits, stats_all, tp, softmax, loss, tokens, v_local);
  check_launch(l, "cross_entropy_forward");
}
template <class T>
void cross_entropy_backward(const Launch& l, const float* softmax, const int32_t* targets,
                            T* dlogits, int64_t tokens, int64_t v0, int64_t v_local, double scale) {
  ce_backward_kernel<<<blocks_for(tokens * v_local), kThreads, 0, l.stream>>>(
      softmax, targets, dlogits, tokens, v0, v_local, float(scale));
  check_launch(l, "cross_entropy_backward");
}
template <class T, class G>
void adamw_step(const Launch& l, T* param, float* master, const G* grad, float* exp_avg,
                float* exp_avg_sq, int64_t n, const cpu::AdamW& c, int64_t step, double clip) {
  STEPCAST_CHECK(step >= 1, "AdamW steps count from 1");
  STEPCAST_CHECK(master != nullptr || sizeof(T) == sizeof(float), "16-bit weights need a master copy");
  double bias1 = 1.0 - std::pow(c.beta1, double(step));
  double bias2 = 1.0 - std::pow(c.beta2, double(step));
  adamw_kernel<<<blocks_for(n), kThreads, 0, l.stream>>>(
      param, master, grad, exp_avg, exp_avg_sq, n, float(c.lr), float(c.beta1), float(c.beta2),
      float(c.eps), float(c.weight_decay), float(bias1), float(bias2), float(clip));
  check_launch(l, "adamw_step");
}

// ---- instantiations: T, G ∈ {bf16, float} ----
#define STEPCAST_T(T)                                                                              \
  template void add_rows<T>(const Launch&, T*, const T*, int64_t, int64_t);                        \
  template void fill_columns<T>(const Launch&, T*, int64_t, int64_t, int64_t, float);              \
  template void dropout_add_forward<T>(const Launch&, const T*, const T*, T*, uint8_t*, int64_t,   \
                                       int64_t, int64_t, const cpu::Dropout&, int64_t,             \
                                       const int64_t*);                                            \
  template void dropout_backward<T>(const Launch&, const T*, const uint8_t*, T*, int64_t, double); \
  template void embedding_forward<T>(const Launch&, const int32_t*, const T*, T*, int64_t,         \
                                     int64_t, int64_t, int64_t, int64_t);                          \
  template void position_add_forward<T>(const Launch&, T*, const T*, int64_t, int64_t, int64_t,    \
                                        int64_t, int64_t);                                         \
  template void layernorm_forward<T>(const Launch&, const T*, const T*, const T*, T*, int64_t,     \
                                     int64_t, double);                                             \
  template void rmsnorm_forward<T>(const Launch&, const T*, const T*, T*, int64_t, int64_t,        \
                                   double);                                                        \
  template void gelu_forward<T>(const Launch&, const T*, T*, int64_t);                             \
  template void gelu_backward<T>(const Launch&, const T*, const T*, T*, int64_t);                  \
  template void swiglu_forward<T>(const Launch&, const T*, const T*, T*, int64_t);                 \
  template void swiglu_backward<T>(const Launch&, const T*, const T*, const T*, T*, T*, int64_t);  \
  template void rotary<T>(const Launch&, T*, const cpu::AttentionShape&, double, int64_t, double); \
  template void cross_entropy_stats<T>(const Launch&, const T*, const int32_t*, float*, int64_t,   \
                                       int64_t, int64_t);                                          \
  template void cross_entropy_forward<T>(const Launch&, const T*, const float*, int64_t, float*,   \
                                         float*, int64_t, int64_t);                                \
  template void cross_entropy_backward<T>(const Launch&, const float*, const int32_t*, T*,         \
                                          int64_t, int64_t, int64_t, double);                      \
  template void add<T>(const Launch&, T*, const T*, int64_t);                                      \
  template void sum_squares<T>(const Launch&, const T*, int64_t, double*, bool);

#define STEPCAST_TG(T, G)                                                                          \
  template void sum_rows<T, G>(const Launch&, const T*, G*, int64_t, int64_t);                     \
  template void embedding_backward<T, G>(const Launch&, const int32_t*, const T*, G*, int64_t,     \
                                         int64_t, int64_t, int64_t, int64_t);                      \
  template void position_add_backward<T, G>(const Launch&, const T*, G*, int64_t, int64_t,         \
                                            int64_t, int64_t, int64_t);                            \
  template void layernorm_backward<T, G>(const Launch&, const T*, const T*, const T*, T*, G*, G*,  \
                                         int64_t, int64_t, double);                                \
  template void rmsnorm_backward<T, G>(const Launch&, const T*, const T*, const T*, T*, G*,        \
                                       int64_t, int64_t, double);                                  \
  template void adamw_step<T, G>(const Launch&, T*, float*, const G*, float*, float*, int64_t,     \
                                 const cpu::AdamW&, int64_t, double);                              \
  template void convert<T, G>(const Launch&, const T*, G*, int64_t);

STEPCAST_T(bf16)
STEPCAST_T(float)
STEPCAST_TG(bf16, float)
STEPCAST_TG(bf16, bf16)
STEPCAST_TG(float, float)
STEPCAST_TG(float, bf16)

}  // namespace stepcast::cuda
