// The CUDA backend's causal attention (cuda_kernels.hpp). bf16 flash runs on the tensor cores
// (kernels_flash_mma.cu) where its head dim and alignment allow. The flash kernels here (fp32,
// and bf16 otherwise): one thread group of L = d/16 lanes per query (or key) row holds 16 elements of the row in registers; key (or query) tiles of
// 32 rows are staged in shared memory; online softmax in fp32; the s×s matrix never exists.
// Backward recomputes probabilities from lse in two passes — dQ over query rows, dK and dV over
// key rows (all heads of a GQA group) — so nothing is accumulated with atomics. Materialized: one
// thread per output element, the straightforward reference-shaped kernels (not the fast path).
#include <string>
#include <type_traits>

#include "attention_common.cuh"
#include "cuda_common.cuh"
#include "errors.hpp"

namespace stepcast::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kFlashThreads = 128;
constexpr int kTile = 32;  // keys (forward, dQ) or queries (dK dV) per shared-memory tile

// ---- materialized ----
template <class T>
__global__ void score_forward_kernel(const T* qkv, T* scores, Geometry g, float scale) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < g.b * g.heads * g.s * g.s;
       e += int64_t(gridDim.x) * blockDim.x) {
    int64_t j = e % g.s, i = (e / g.s) % g.s, hd = (e / (g.s * g.s)) % g.heads,
            bi = e / (g.s * g.s * g.heads);
    if (j > i) {
      scores[e] = store<T>(-INFINITY);
      continue;
    }
    const T* q = qkv + g.q(i, bi, hd);
    const T* k = qkv + g.k(j, bi, hd);
    float dot = 0;
    for (int64_t c = 0; c < g.d; ++c) dot += load(q[c]) * load(k[c]);
    scores[e] = store<T>(scale * dot);
  }
}
template <class T>
__global__ void softmax_forward_kernel(const T* scores, T* probs, int64_t cols) {
  const T* row = scores + int64_t(blockIdx.x) * cols;
  T* out = probs + int64_t(blockIdx.x) * cols;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, load(row[j]));
  m = block_max(m);
  float sum = 0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) sum += expf(load(row[j]) - m);
  float inv = 1.f / block_sum(sum);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) out[j] = store<T>(expf(load(row[j]) - m) * inv);
}
template <class T>
__global__ void softmax_backward_kernel(const T* d_probs, const T* probs, T* d_scores, int64_t cols) {
  int64_t base = int64_t(blockIdx.x) * cols;
  float dot = 0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) dot += load(d_probs[base + j]) * load(probs[base + j]);
  dot = block_sum(dot);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    d_scores[base + j] = store<T>(load(probs[base + j]) * (load(d_probs[base + j]) - dot));
  }
}
template <class T>
__global__ void attention_dropout_kernel(const T* probs, T* probs_drop, uint8_t* mask, Geometry g,
                                         DropoutArgs a) {
  const float scale = float(1.0 / (1.0 - a.p));
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < g.b * g.heads * g.s * g.s;
       e += int64_t(gridDim.x) * blockDim.x) {
    int64_t j = e % g.s, i = (e / g.s) % g.s, hd = (e / (g.s * g.s)) % g.heads,
            bi = e / (g.s * g.s * g.heads);
    bool keep = j <= i && keep_from(absorb(query_key(a, bi, hd, i), j), a.p);
    mask[e] = keep ? 1 : 0;
    probs_drop[e] = store<T>(keep ? load(probs[e]) * scale : 0.f);
  }
}
template <class T>
__global__ void value_forward_kernel(const T* probs, const T* qkv, T* ctx, Geometry g) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < g.b * g.heads * g.s * g.d;
       e += int64_t(gridDim.x) * blockDim.x) {
    int64_t c = e % g.d, i = (e / g.d) % g.s, hd = (e / (g.d * g.s)) % g.heads,
            bi = e / (g.d * g.s * g.heads);
    float acc = 0;
    for (int64_t j = 0; j <= i; ++j) acc += load(probs[g.square(bi, hd, i, j)]) * load(qkv[g.v(j, bi, hd) + c]);
    ctx[g.ctx(i, bi, hd) + c] = store<T>(acc);
  }
}
// d_probs_used[i, j] = d_ctx_i · v_j (every j, as the CPU's).
template <class T>
__global__ void value_backward_probs_kernel(const T* d_ctx, const T* qkv, T* d_probs, Geometry g) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < g.b * g.heads * g.s * g.s;
       e += int64_t(gridDim.x) * blockDim.x) {
    int64_t j = e % g.s, i = (e / g.s) % g.s, hd = (e / (g.s * g.s)) % g.heads,
            bi = e / (g.s * g.s * g.heads);
    const T* dc = d_ctx + g.ctx(i, bi, hd);
    const T* v = qkv + g.v(j, bi, hd);
    float dot = 0;
    for (int64_t c = 0; c < g.d; ++c) dot += load(dc[c]) * load(v[c]);
    d_probs[e] = store<T>(dot);
  }
}
// dV of kv head kvh, key j: Σ over the group's heads and queries i ≥ j of probs_used[i, j]·d_ctx_i.
template <class T>
__global__ void value_backward_v_kernel(const T* d_ctx, const T* probs, T* d_qkv, Geometry g) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < g.b * g.kv_heads * g.s * g.d;
       e += int64_t(gridDim.x) * blockDim.x) {
    int64_t c = e % g.d, j = (e / g.d) % g.s, kvh = (e / (g.d * g.s)) % g.kv_heads,
            bi = e / (g.d * g.s * g.kv_heads);
    float acc = 0;
    for (int64_t hd = kvh * g.group; hd < (kvh + 1) * g.group; ++hd) {
      for (int64_t i = j; i < g.s; ++i) acc += load(probs[g.square(bi, hd, i, j)]) * load(d_ctx[g.ctx(i, bi, hd) + c]);
    }
    d_qkv[g.v(j, bi, kvh * g.group) + c] = store<T>(acc);
  }
}
template <class T>
__global__ void score_backward_q_kernel(const T* d_scores, const T* qkv, T* d_qkv, Geometry g,
                                        float scale) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < g.b * g.heads * g.s * g.d;
       e += int64_t(gridDim.x) * blockDim.x) {
    int64_t c = e % g.d, i = (e / g.d) % g.s, hd = (e / (g.d * g.s)) % g.heads,
            bi = e / (g.d * g.s * g.heads);
    float acc = 0;
    for (int64_t j = 0; j <= i; ++j) acc += load(d_scores[g.square(bi, hd, i, j)]) * load(qkv[g.k(j, bi, hd) + c]);
    d_qkv[g.q(i, bi, hd) + c] = store<T>(scale * acc);
  }
}
template <class T>
__global__ void score_backward_k_kernel(const T* d_scores, const T* qkv, T* d_qkv, Geometry g,
                                        float scale) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < g.b * g.kv_heads * g.s * g.d;
       e += int64_t(gridDim.x) * blockDim.x) {
    int64_t c = e % g.d, j = (e / g.d) % g.s, kvh = (e / (g.d * g.s)) % g.kv_heads,
            bi = e / (g.d * g.s * g.kv_heads);
    float acc = 0;
    for (int64_t hd = kvh * g.group; hd < (kvh + 1) * g.group; ++hd) {
      for (int64_t i = j; i < g.s; ++i) acc += load(d_scores[g.square(bi, hd, i, j)]) * load(qkv[g.q(i, bi, hd) + c]);
    }
    d_qkv[g.k(j, bi, kvh * g.group) + c] = store<T>(scale * acc);
  }
}

// ---- flash ----
// Lanes per row and elements per lane for head dim D.
template <int D>
struct Lanes {
  static constexpr int L = D >= 16 ? D / 16 : 1;
  static constexpr int E = D / L;
  static constexpr int kRows = kFlashThreads / L;
};
// Sum over the L lanes of a row (adjacent lanes of one warp).
template <int L>
__device__ __forceinline__ float lane_sum(float v) {
  for (int o = L / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Forward: grid (query tiles, b·heads); block kRows query rows × L lanes.
template <class T, int D>
__global__ void __launch_bounds__(kFlashThreads) flash_forward_kernel(const T* qkv, T* ctx, float* lse,
                                                                      Geometry g, float scale,
                                                                      DropoutArgs a) {
  using LN = Lanes<D>;
  __shared__ float k_tile[kTile][D];
  __shared__ float v_tile[kTile][D];
  const int64_t bh = blockIdx.y, bi = bh / g.heads, hd = bh % g.heads;
  const int lane = threadIdx.x % LN::L;
  const int64_t i0 = int64_t(blockIdx.x) * LN::kRows;
  const int64_t i = i0 + threadIdx.x / LN::L;
  const bool active = i < g.s;
  float q[LN::E], acc[LN::E];
  for (int c = 0; c < LN::E; ++c) {
    q[c] = active ? load(qkv[g.q(i, bi, hd) + lane * LN::E + c]) * scale : 0.f;
    acc[c] = 0;
  }
  const float drop_scale = a.p > 0 ? float(1.0 / (1.0 - a.p)) : 1.f;
  const uint64_t key_q = a.p > 0 && active ? query_key(a, bi, hd, i) : 0;
  float m = -INFINITY, l = 0;
  int64_t last = i0 + LN::kRows - 1 < g.s - 1 ? i0 + LN::kRows - 1 : g.s - 1;
  for (int64_t j0 = 0; j0 <= last; j0 += kTile) {
    __syncthreads();
    for (int e = threadIdx.x; e < kTile * D; e += blockDim.x) {
      int r = e / D, c = e % D;
      int64_t j = j0 + r;
      k_tile[r][c] = j < g.s ? load(qkv[g.k(j, bi, hd) + c]) : 0.f;
      v_tile[r][c] = j < g.s ? load(qkv[g.v(j, bi, hd) + c]) : 0.f;
    }
    __syncthreads();
    // The bound is the block's (uniform: the lanes of a warp shuffle together); keys after the
    // row's query are skipped after the shuffle.
    int64_t j_end = j0 + kTile - 1 < last ? j0 + kTile - 1 : last;  // inclusive
    for (int64_t j = j0; j <= j_end; ++j) {
      const int r = int(j - j0);
      float part = 0;
      for (int c = 0; c < LN::E; ++c) part += q[c] * k_tile[r][lane * LN::E + c];
      float sc = lane_sum<LN::L>(part);  // identical on the row's lanes
      if (!active || j > i) continue;  // causal
      if (sc > m) {
        float rescale = __expf(m - sc);  // 0 on the first key
        l *= rescale;
        for (int c = 0; c < LN::E; ++c) acc[c] *= rescale;
        m = sc;
      }
      float e = __expf(sc - m);
      l += e;
      if (a.p > 0 && !keep_from(absorb(key_q, j), a.p)) continue;
      float w = e * drop_scale;
      for (int c = 0; c < LN::E; ++c) acc[c] += w * v_tile[r][lane * LN::E + c];
    }
  }
  if (!active) return;
  for (int c = 0; c < LN::E; ++c) ctx[g.ctx(i, bi, hd) + lane * LN::E + c] = store<T>(acc[c] / l);
  if (lane == 0) lse[(bi * g.heads + hd) * g.s + i] = m + logf(l);
}

// Backward pass 1: dQ (overwrites the Q part of d_qkv) and delta_i = d_ctx_i · ctx_i.
template <class T, int D>
__global__ void __launch_bounds__(kFlashThreads) flash_backward_dq_kernel(
    const T* qkv, const T* ctx, const float* lse, const T* d_ctx, T* d_qkv, float* delta,
    Geometry g, float scale, DropoutArgs a) {
  using LN = Lanes<D>;
  __shared__ float k_tile[kTile][D];
  __shared__ float v_tile[kTile][D];
  const int64_t bh = blockIdx.y, bi = bh / g.heads, hd = bh % g.heads;
  const int lane = threadIdx.x % LN::L;
  const int64_t i0 = int64_t(blockIdx.x) * LN::kRows;
  const int64_t i = i0 + threadIdx.x / LN::L;
  const bool active = i < g.s;
  float q[LN::E], dout[LN::E], dq[LN::E];
  float part = 0;
  for (int c = 0; c < LN::E; ++c) {
    int off = lane * LN::E + c;
    q[c] = active ? load(qkv[g.q(i, bi, hd) + off]) * scale : 0.f;
    dout[c] = active ? load(d_ctx[g.ctx(i, bi, hd) + off]) : 0.f;
    part += active ? dout[c] * load(ctx[g.ctx(i, bi, hd) + off]) : 0.f;
    dq[c] = 0;
  }
  const float di = lane_sum<LN::L>(part);
  const float lse_i = active ? lse[(bi * g.heads + hd) * g.s + i] : 0.f;
  if (active && lane == 0) delta[(bi * g.heads + hd) * g.s + i] = di;
  const float drop_scale = a.p > 0 ? float(1.0 / (1.0 - a.p)) : 1.f;
  const uint64_t key_q = a.p > 0 && active ? query_key(a, bi, hd, i) : 0;
  int64_t last = i0 + LN::kRows - 1 < g.s - 1 ? i0 + LN::kRows - 1 : g.s - 1;
  for (int64_t j0 = 0; j0 <= last; j0 += kTile) {
    __syncthreads();
    for (int e = threadIdx.x; e < kTile * D; e += blockDim.x) {
      int r = e / D, c = e % D;
      int64_t j = j0 + r;
      k_tile[r][c] = j < g.s ? load(qkv[g.k(j, bi, hd) + c]) : 0.f;
      v_tile[r][c] = j < g.s ? load(qkv[g.v(j, bi, hd) + c]) : 0.f;
    }
    __syncthreads();
    int64_t j_end = j0 + kTile - 1 < last ? j0 + kTile - 1 : last;  // uniform bound, as forward
    for (int64_t j = j0; j <= j_end; ++j) {
      const int r = int(j - j0);
      float s_part = 0, dp_part = 0;
      for (int c = 0; c < LN::E; ++c) {
        s_part += q[c] * k_tile[r][lane * LN::E + c];
        dp_part += dout[c] * v_tile[r][lane * LN::E + c];
      }
      float sc = lane_sum<LN::L>(s_part);
      float dp = lane_sum<LN::L>(dp_part);
      if (!active || j > i) continue;
      float p = __expf(sc - lse_i);
      bool keep = a.p <= 0 || keep_from(absorb(key_q, j), a.p);
      float ds = p * ((keep ? dp * drop_scale : 0.f) - di);
      for (int c = 0; c < LN::E; ++c) dq[c] += ds * k_tile[r][lane * LN::E + c];
    }
  }
  if (!active) return;
  for (int c = 0; c < LN::E; ++c) d_qkv[g.q(i, bi, hd) + lane * LN::E + c] = store<T>(scale * dq[c]);
}

// Backward pass 2: dK and dV of kv head kvh for key rows j (overwrite), summed over the group's
// heads and the queries i ≥ j. Grid (key tiles, b·kv_heads).
template <class T, int D>
__global__ void __launch_bounds__(kFlashThreads) flash_backward_dkv_kernel(
    const T* qkv, const float* lse, const T* d_ctx, const float* delta, T* d_qkv, Geometry g,
    float scale, DropoutArgs a) {
  using LN = Lanes<D>;
  __shared__ float q_tile[kTile][D];
  __shared__ float do_tile[kTile][D];
  __shared__ float lse_tile[kTile], delta_tile[kTile];
  const int64_t bk = blockIdx.y, bi = bk / g.kv_heads, kvh = bk % g.kv_heads;
  const int lane = threadIdx.x % LN::L;
  const int64_t j0 = int64_t(blockIdx.x) * LN::kRows;
  const int64_t j = j0 + threadIdx.x / LN::L;
  const bool active = j < g.s;
  const int64_t head_of_group = kvh * g.group;
  float k[LN::E], v[LN::E], dk[LN::E], dv[LN::E];
  for (int c = 0; c < LN::E; ++c) {
    int off = lane * LN::E + c;
    k[c] = active ? load(qkv[g.k(j, bi, head_of_group) + off]) : 0.f;
    v[c] = active ? load(qkv[g.v(j, bi, head_of_group) + off]) : 0.f;
    dk[c] = dv[c] = 0;
  }
  const float drop_scale = a.p > 0 ? float(1.0 / (1.0 - a.p)) : 1.f;
  for (int64_t hd = head_of_group; hd < head_of_group + g.group; ++hd) {
    uint64_t key_h = 0;
    if (a.p > 0) {
      key_h = absorb(sample_key(a.seed, a.site, a.step, a.layer, a.sample_index[bi]), a.head0 + hd);
    }
    for (int64_t t0 = j0; t0 < g.s; t0 += kTile) {  // queries i ≥ j0
      __syncthreads();
      for (int e = threadIdx.x; e < kTile * D; e += blockDim.x) {
        int r = e / D, c = e % D;
        int64_t i = t0 + r;
        q_tile[r][c] = i < g.s ? load(qkv[g.q(i, bi, hd) + c]) * scale : 0.f;
        do_tile[r][c] = i < g.s ? load(d_ctx[g.ctx(i, bi, hd) + c]) : 0.f;
      }
      for (int r = threadIdx.x; r < kTile; r += blockDim.x) {
        int64_t i = t0 + r;
        lse_tile[r] = i < g.s ? lse[(bi * g.heads + hd) * g.s + i] : 0.f;
        delta_tile[r] = i < g.s ? delta[(bi * g.heads + hd) * g.s + i] : 0.f;
      }
      __syncthreads();
      int64_t i_end = t0 + kTile < g.s ? t0 + kTile : g.s;  // exclusive; uniform in the block
      for (int64_t i = t0; i < i_end; ++i) {
        const int r = int(i - t0);
        float s_part = 0, dp_part = 0;
        for (int c = 0; c < LN::E; ++c) {
          s_part += q_tile[r][lane * LN::E + c] * k[c];
          dp_part += do_tile[r][lane * LN::E + c] * v[c];
        }
        float sc = lane_sum<LN::L>(s_part);
        float dp = lane_sum<LN::L>(dp_part);
        if (!active || i < j) continue;  // causal: queries at or after the key
        float p = __expf(sc - lse_tile[r]);
        bool keep = a.p <= 0 || keep_from(absorb(absorb(key_h, i), j), a.p);
        float p_used = keep ? p * drop_scale : 0.f;
        float ds = p * ((keep ? dp * drop_scale : 0.f) - delta_tile[r]);
        for (int c = 0; c < LN::E; ++c) {
          dv[c] += p_used * do_tile[r][lane * LN::E + c];
          dk[c] += ds * q_tile[r][lane * LN::E + c];  // q already carries the scale
        }
      }
    }
  }
  if (!active) return;
  for (int c = 0; c < LN::E; ++c) {
    int off = lane * LN::E + c;
    d_qkv[g.k(j, bi, head_of_group) + off] = store<T>(dk[c]);
    d_qkv[g.v(j, bi, head_of_group) + off] = store<T>(dv[c]);
  }
}

unsigned elementwise_blocks(int64_t n) { return blocks_for(n, kThreads); }

template <class T, int D>
void flash_forward_d(const Launch& l, const T* qkv, T* ctx, float* lse, const Geometry& g,
                     float scale, const DropoutArgs& a) {
  dim3 grid(unsigned((g.s + Lanes<D>::kRows - 1) / Lanes<D>::kRows), unsigned(g.b * g.heads));
  flash_forward_kernel<T, D><<<grid, kFlashThreads, 0, l.stream>>>(qkv, ctx, lse, g, scale, a);
}
template <class T, int D>
void flash_backward_d(const Launch& l, const T* qkv, const T* ctx, const float* lse,
                      const T* d_ctx, T* d_qkv, float* delta, const Geometry& g, float scale,
                      const DropoutArgs& a) {
  const unsigned tiles = unsigned((g.s + Lanes<D>::kRows - 1) / Lanes<D>::kRows);
  flash_backward_dq_kernel<T, D><<<dim3(tiles, unsigned(g.b * g.heads)), kFlashThreads, 0, l.stream>>>(
      qkv, ctx, lse, d_ctx, d_qkv, delta, g, scale, a);
  flash_backward_dkv_kernel<T, D><<<dim3(tiles, unsigned(g.b * g.kv_heads)), kFlashThreads, 0, l.stream>>>(
      qkv, lse, d_ctx, delta, d_qkv, g, scale, a);
}

}  // namespace

bool flash_supports_head_dim(int64_t d) {
  for (int supported : kFlashHeadDims) {
    if (d == supported) return true;
  }
  return false;
}

template <class T>
void attention_score_forward(const Launch& l, const T* qkv, T* scores,
                             const cpu::AttentionShape& sh, double scale) {
  Geometry g = geometry(sh);
  score_forward_kernel<<<elementwise_blocks(g.b * g.heads * g.s * g.s), kThreads, 0, l.stream>>>(qkv, scores, g, float(scale));
  check_launch(l, "attention_score_forward");
}
template <class T>
void softmax_forward(const Launch& l, const T* scores, T* probs, int64_t rows, int64_t cols) {
  softmax_forward_kernel<<<unsigned(rows), 256, 0, l.stream>>>(scores, probs, cols);
  check_launch(l, "softmax_forward");
}
template <class T>
void attention_dropout_forward(const Launch& l, const T* probs, T* probs_drop, uint8_t* mask,
                               const cpu::AttentionShape& sh, const cpu::Dropout& dropout,
                               int64_t head0, const int64_t* sample_index) {
  Geometry g = geometry(sh);
  // p = 0 still writes the mask (1 on and below the diagonal), as the CPU's.
  attention_dropout_kernel<<<elementwise_blocks(g.b * g.heads * g.s * g.s), kThreads, 0, l.stream>>>(
      probs, probs_drop, mask, g, DropoutArgs{dropout.p, dropout.seed, uint64_t(dropout.site),
                                              dropout.step, dropout.layer, head0, sample_index});
  check_launch(l, "attention_dropout_forward");
}
template <class T>
void attention_value_forward(const Launch& l, const T* probs_used, const T* qkv, T* ctx,
                             const cpu::AttentionShape& sh) {
  Geometry g = geometry(sh);
  value_forward_kernel<<<elementwise_blocks(g.b * g.heads * g.s * g.d), kThreads, 0, l.stream>>>(probs_used, qkv, ctx, g);
  check_launch(l, "attention_value_forward");
}
template <class T>
void attention_value_backward(const Launch& l, const T* d_ctx, const T* probs_used, const T* qkv,
                              T* d_probs_used, T* d_qkv, const cpu::AttentionShape& sh) {
  Geometry g = geometry(sh);
  value_backward_probs_kernel<<<elementwise_blocks(g.b * g.heads * g.s * g.s), kThreads, 0, l.stream>>>(d_ctx, qkv, d_probs_used, g);
  value_backward_v_kernel<<<elementwise_blocks(g.b * g.kv_heads * g.s * g.d), kThreads, 0, l.stream>>>(d_ctx, probs_used, d_qkv, g);
  check_launch(l, "attention_value_backward");
}
template <class T>
void softmax_backward(const Launch& l, const T* d_probs, const T* probs, T* d_scores, int64_t rows,
                      int64_t cols) {
  softmax_backward_kernel<<<unsigned(rows), 256, 0, l.stream>>>(d_probs, probs, d_scores, cols);
  check_launch(l, "softmax_backward");
}
template <class T>
void attention_score_backward(const Launch& l, const T* d_scores, const T* qkv, T* d_qkv,
                              const cpu::AttentionShape& sh, double scale) {
  Geometry g = geometry(sh);
  score_backward_q_kernel<<<elementwise_blocks(g.b * g.heads * g.s * g.d), kThreads, 0, l.stream>>>(d_scores, qkv, d_qkv, g, float(scale));
  score_backward_k_kernel<<<elementwise_blocks(g.b * g.kv_heads * g.s * g.d), kThreads, 0, l.stream>>>(d_scores, qkv, d_qkv, g, float(scale));
  check_launch(l, "attention_score_backward");
}

template <class T>
void flash_attention_forward(const Launch& l, const T* qkv, T* ctx, float* lse,
                             const cpu::AttentionShape& sh, double scale,
                             const cpu::Dropout* dropout, int64_t head0,
                             const int64_t* sample_index) {
  Geometry g = geometry(sh);
  DropoutArgs a = dropout_args(dropout, head0, sample_index);
  if constexpr (std::is_same_v<T, bf16>) {  // the tensor cores; fp32 keeps fp32 products
    if (flash_mma_forward(l, qkv, ctx, lse, g, float(scale), a)) {
      check_launch(l, "flash_attention_forward (tensor cores)");
      return;
    }
  }
  switch (sh.d) {
    case 16: flash_forward_d<T, 16>(l, qkv, ctx, lse, g, float(scale), a); break;
    case 32: flash_forward_d<T, 32>(l, qkv, ctx, lse, g, float(scale), a); break;
    case 64: flash_forward_d<T, 64>(l, qkv, ctx, lse, g, float(scale), a); break;
    case 128: flash_forward_d<T, 128>(l, qkv, ctx, lse, g, float(scale), a); break;
    default: STEPCAST_CHECK(false, "flash attention: head dim " + std::to_string(sh.d));
  }
  check_launch(l, "flash_attention_forward");
}
// `delta` is scratch of b·heads·s floats (the backend's).
template <class T>
void flash_attention_backward(const Launch& l, const T* qkv, const T* ctx, const float* lse,
                              const T* d_ctx, T* d_qkv, float* delta,
                              const cpu::AttentionShape& sh, double scale,
                              const cpu::Dropout* dropout, int64_t head0,
                              const int64_t* sample_index) {
  Geometry g = geometry(sh);
  DropoutArgs a = dropout_args(dropout, head0, sample_index);
  if constexpr (std::is_same_v<T, bf16>) {
    if (flash_mma_backward(l, qkv, ctx, lse, d_ctx, d_qkv, delta, g, float(scale), a)) {
      check_launch(l, "flash_attention_backward (tensor cores)");
      return;
    }
  }
  switch (sh.d) {
    case 16: flash_backward_d<T, 16>(l, qkv, ctx, lse, d_ctx, d_qkv, delta, g, float(scale), a); break;
    case 32: flash_backward_d<T, 32>(l, qkv, ctx, lse, d_ctx, d_qkv, delta, g, float(scale), a); break;
    case 64: flash_backward_d<T, 64>(l, qkv, ctx, lse, d_ctx, d_qkv, delta, g, float(scale), a); break;
    case 128: flash_backward_d<T, 128>(l, qkv, ctx, lse, d_ctx, d_qkv, delta, g, float(scale), a); break;
    default: STEPCAST_CHECK(false, "flash attention: head dim " + std::to_string(sh.d));
  }
  check_launch(l, "flash_attention_backward");
}

#define STEPCAST_ATTENTION(T)                                                                      \
  template void attention_score_forward<T>(const Launch&, const T*, T*,                            \
                                           const cpu::AttentionShape&, double);                    \
  template void softmax_forward<T>(const Launch&, const T*, T*, int64_t, int64_t);                 \
  template void attention_dropout_forward<T>(const Launch&, const T*, T*, uint8_t*,                \
                                             const cpu::AttentionShape&, const cpu::Dropout&,      \
                                             int64_t, const int64_t*);                             \
  template void attention_value_forward<T>(const Launch&, const T*, const T*, T*,                  \
                                           const cpu::AttentionShape&);                            \
  template void attention_value_backward<T>(const Launch&, const T*, const T*, const T*, T*, T*,   \
                                            const cpu::AttentionShape&);                           \
  template void softmax_backward<T>(const Launch&, const T*, const T*, T*, int64_t, int64_t);      \
  template void attention_score_backward<T>(const Launch&, const T*, const T*, T*,                 \
                                            const cpu::AttentionShape&, double);                   \
  template void flash_attention_forward<T>(const Launch&, const T*, T*, float*,                    \
                                           const cpu::AttentionShape&, double,                     \
                                           const cpu::Dropout*, int64_t, const int64_t*);          \
  template void flash_attention_backward<T>(const Launch&, const T*, const T*, const float*,       \
                                            const T*, T*, float*, const cpu::AttentionShape&,      \
                                            double, const cpu::Dropout*, int64_t, const int64_t*);

STEPCAST_ATTENTION(bf16)
STEPCAST_ATTENTION(float)

}  // namespace stepcast::cuda
