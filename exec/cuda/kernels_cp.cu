// The CUDA backend's context-parallel kernels (cuda_kernels.hpp's cp_*, with cpu_kernels_cp.cpp's
// semantics): K/V packed out of qkv and back, flash attention of the local queries over one K/V
// block with the causal mask and the dropout hash taken at global token positions, the log-sum-exp
// merge, the materialized scores over gathered K/V, and Ulysses' head and row shuffles. Straight
// kernels, not a fast path: flash keeps one warp per query (or key) row accumulating in fp32, its
// lanes striding the head dim (any d); the materialized kernels are one thread per output element.
#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "attention_common.cuh"
#include "cuda_common.cuh"
#include "errors.hpp"

namespace stepcast::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = 4;  // rows (one a warp) per block of the flash kernels
constexpr int kMaxSections = 4;

// Offsets inside qkv [s, b, width], a K/V block [n, b, 2·kv_heads·d], ctx [s, b, heads·d], lse
// [b, heads, s] and scores [b, heads, s, n] (cpu_kernels_cp.cpp's CpView).
struct CpGeometry {
  int64_t s, b, heads, kv_heads, d, width, group, n;
  __host__ __device__ int64_t kv_width() const { return 2 * kv_heads * d; }
  __device__ int64_t q(int64_t i, int64_t bi, int64_t hd) const { return (i * b + bi) * width + hd * d; }
  __device__ int64_t k(int64_t j, int64_t bi, int64_t hd) const { return (j * b + bi) * kv_width() + hd / group * d; }
  __device__ int64_t v(int64_t j, int64_t bi, int64_t hd) const {
    return (j * b + bi) * kv_width() + (kv_heads + hd / group) * d;
  }
  __device__ int64_t ctx(int64_t i, int64_t bi, int64_t hd) const { return (i * b + bi) * heads * d + hd * d; }
  __device__ int64_t lse(int64_t i, int64_t bi, int64_t hd) const { return (bi * heads + hd) * s + i; }
  __device__ int64_t score(int64_t bi, int64_t hd, int64_t i, int64_t j) const {
    return ((bi * heads + hd) * s + i) * n + j;
  }
};

CpGeometry cp_geometry(const cpu::AttentionShape& sh, int64_t n) {
  STEPCAST_CHECK(sh.s > 0 && sh.b > 0 && sh.heads > 0 && sh.kv_heads > 0 && sh.d > 0 && n > 0,
                 "context-parallel attention shape must be positive");
  STEPCAST_CHECK(sh.heads % sh.kv_heads == 0, "heads must be a multiple of kv_heads");
  return {sh.s, sh.b, sh.heads, sh.kv_heads, sh.d, sh.qkv_width(), sh.heads / sh.kv_heads, n};
}

__device__ __forceinline__ float drop_scale_of(const DropoutArgs& a) {
  return a.p > 0 ? float(1.0 / (1.0 - a.p)) : 1.f;
}

// ---- K/V packing ----
// pack: from qkv to kv; unpack: from d_kv to d_qkv (its K and V parts only).
template <class T>
__global__ void kv_pack_kernel(const T* from, T* to, CpGeometry g, bool unpack) {
  GRID_STRIDE(e, g.s * g.b * g.kv_width()) {
    const int64_t row = e / g.kv_width(), c = e % g.kv_width();
    const int64_t at = row * g.width + g.heads * g.d + c;  // in qkv's row
    if (unpack)
      to[at] = from[e];
    else
      to[e] = from[at];
  }
}

// ---- flash over one block ----
// Grid (query tiles of kWarps rows, b·heads); a warp per query row i. Shared: each warp's scaled
// q row and its accumulator, [kWarps][2][d] floats; lane c of a row is touched by lane c % 32 only.
template <class T>
__global__ void cp_flash_forward_kernel(const T* qkv, const T* kv, const int64_t* q_pos, const int64_t* kv_pos, T* ctx,
                                        float* lse, CpGeometry g, float scale, DropoutArgs a) {
  extern __shared__ float rows[];
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  const int64_t bi = blockIdx.y / g.heads, hd = blockIdx.y % g.heads;
  const int64_t i = int64_t(blockIdx.x) * kWarps + warp;
  if (i >= g.s) return;  // the whole warp
  float* q = rows + 2 * warp * g.d;
  float* acc = q + g.d;
  for (int64_t c = lane; c < g.d; c += 32) {
    q[c] = load(qkv[g.q(i, bi, hd) + c]) * scale;
    acc[c] = 0;
  }
  const int64_t qp = q_pos[i];
  const uint64_t key_q = a.p > 0 ? query_key(a, bi, hd, qp) : 0;
  const float drop_scale = drop_scale_of(a);
  float m = -INFINITY, l = 0;
  for (int64_t j = 0; j < g.n; ++j) {
    const int64_t kp = kv_pos[j];
    if (kp > qp) continue;  // causal at global positions (uniform over the warp)
    const T* k = kv + g.k(j, bi, hd);
    float part = 0;
    for (int64_t c = lane; c < g.d; c += 32) part += q[c] * load(k[c]);
    const float sc = warp_sum(part);
    if (sc > m) {
      const float rescale = expf(m - sc);  // 0 on the first key
      l *= rescale;
      for (int64_t c = lane; c < g.d; c += 32) acc[c] *= rescale;
      m = sc;
    }
    const float e = expf(sc - m);
    l += e;
    if (a.p > 0 && !keep_from(absorb(key_q, kp), a.p)) continue;
    const T* v = kv + g.v(j, bi, hd);
    for (int64_t c = lane; c < g.d; c += 32) acc[c] += e * drop_scale * load(v[c]);
  }
  for (int64_t c = lane; c < g.d; c += 32) ctx[g.ctx(i, bi, hd) + c] = store<T>(l > 0 ? acc[c] / l : 0.f);
  if (lane == 0) lse[g.lse(i, bi, hd)] = l > 0 ? m + logf(l) : -INFINITY;  // −inf: no key visible
}

// Backward pass 1, a warp per query row: dQ added into d_qkv's query part (zeroed first unless
// accumulating), delta_i = d_ctx_i · ctx_i kept for pass 2. Shared [kWarps][3][d]: q, d_ctx, dq.
template <class T>
__global__ void cp_flash_backward_dq_kernel(const T* qkv, const T* kv, const int64_t* q_pos, const int64_t* kv_pos,
                                            const T* ctx, const float* lse, const T* d_ctx, T* d_qkv, float* delta,
                                            CpGeometry g, float scale, DropoutArgs a) {
  extern __shared__ float rows[];
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  const int64_t bi = blockIdx.y / g.heads, hd = blockIdx.y % g.heads;
  const int64_t i = int64_t(blockIdx.x) * kWarps + warp;
  if (i >= g.s) return;
  float* q = rows + 3 * warp * g.d;
  float* dout = q + g.d;
  float* dq = dout + g.d;
  float part = 0;
  for (int64_t c = lane; c < g.d; c += 32) {
    q[c] = load(qkv[g.q(i, bi, hd) + c]);
    dout[c] = load(d_ctx[g.ctx(i, bi, hd) + c]);
    part += dout[c] * load(ctx[g.ctx(i, bi, hd) + c]);
    dq[c] = 0;
  }
  const float di = warp_sum(part);  // rowsum(dP ⊙ P) = dO·O
  if (lane == 0) delta[g.lse(i, bi, hd)] = di;
  const float lse_i = lse[g.lse(i, bi, hd)];
  const int64_t qp = q_pos[i];
  const uint64_t key_q = a.p > 0 ? query_key(a, bi, hd, qp) : 0;
  const float drop_scale = drop_scale_of(a);
  for (int64_t j = 0; j < g.n; ++j) {
    const int64_t kp = kv_pos[j];
    if (kp > qp) continue;
    const T* k = kv + g.k(j, bi, hd);
    const T* v = kv + g.v(j, bi, hd);
    float s_part = 0, dp_part = 0;
    for (int64_t c = lane; c < g.d; c += 32) {
      s_part += q[c] * load(k[c]);
      dp_part += dout[c] * load(v[c]);
    }
    const float p = expf(scale * warp_sum(s_part) - lse_i);
    const float dp = warp_sum(dp_part);
    const bool keep = a.p <= 0 || keep_from(absorb(key_q, kp), a.p);
    const float ds = scale * p * ((keep ? dp * drop_scale : 0.f) - di);
    for (int64_t c = lane; c < g.d; c += 32) dq[c] += ds * load(k[c]);
  }
  T* out = d_qkv + g.q(i, bi, hd);
  for (int64_t c = lane; c < g.d; c += 32) out[c] = store<T>(load(out[c]) + dq[c]);
}

// Backward pass 2, a warp per key row j of kv head kvh: the block's dK and dV (overwritten),
// summed over the group's heads and the queries that see the key. Grid (key tiles, b·kv_heads).
// Shared [kWarps][4][d]: k, v, dk, dv.
template <class T>
__global__ void cp_flash_backward_dkv_kernel(const T* qkv, const T* kv, const int64_t* q_pos, const int64_t* kv_pos,
                                             const float* lse, const T* d_ctx, const float* delta, T* d_kv,
                                             CpGeometry g, float scale, DropoutArgs a) {
  extern __shared__ float rows[];
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  const int64_t bi = blockIdx.y / g.kv_heads, head_of_group = (blockIdx.y % g.kv_heads) * g.group;
  const int64_t j = int64_t(blockIdx.x) * kWarps + warp;
  if (j >= g.n) return;
  float* k = rows + 4 * warp * g.d;
  float* v = k + g.d;
  float* dk = v + g.d;
  float* dv = dk + g.d;
  for (int64_t c = lane; c < g.d; c += 32) {
    k[c] = load(kv[g.k(j, bi, head_of_group) + c]);
    v[c] = load(kv[g.v(j, bi, head_of_group) + c]);
    dk[c] = dv[c] = 0;
  }
  const int64_t kp = kv_pos[j];
  const float drop_scale = drop_scale_of(a);
  for (int64_t hd = head_of_group; hd < head_of_group + g.group; ++hd) {
    for (int64_t i = 0; i < g.s; ++i) {
      const int64_t qp = q_pos[i];
      if (kp > qp) continue;  // only queries at or after the key see it
      const T* q = qkv + g.q(i, bi, hd);
      const T* dout = d_ctx + g.ctx(i, bi, hd);
      float s_part = 0, dp_part = 0;
      for (int64_t c = lane; c < g.d; c += 32) {
        s_part += load(q[c]) * k[c];
        dp_part += load(dout[c]) * v[c];
      }
      const float p = expf(scale * warp_sum(s_part) - lse[g.lse(i, bi, hd)]);
      const float dp = warp_sum(dp_part);
      const bool keep = a.p <= 0 || keep_from(absorb(query_key(a, bi, hd, qp), kp), a.p);
      const float p_used = keep ? p * drop_scale : 0.f;
      const float ds = scale * p * ((keep ? dp * drop_scale : 0.f) - delta[g.lse(i, bi, hd)]);
      for (int64_t c = lane; c < g.d; c += 32) {
        dk[c] += ds * load(q[c]);
        dv[c] += p_used * load(dout[c]);
      }
    }
  }
  for (int64_t c = lane; c < g.d; c += 32) {
    d_kv[g.k(j, bi, head_of_group) + c] = store<T>(dk[c]);
    d_kv[g.v(j, bi, head_of_group) + c] = store<T>(dv[c]);
  }
}

// A warp per query row: (ctx, lse) ← the log-sum-exp merge with a block's (ctx_part, lse_part).
template <class T>
__global__ void cp_merge_kernel(T* ctx, float* lse, const T* ctx_part, const float* lse_part, CpGeometry g) {
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  const int64_t bi = blockIdx.y / g.heads, hd = blockIdx.y % g.heads;
  const int64_t i = int64_t(blockIdx.x) * kWarps + warp;
  if (i >= g.s) return;
  const float a = lse[g.lse(i, bi, hd)], b = lse_part[g.lse(i, bi, hd)];
  if (b == -INFINITY) return;  // the block held no key this query sees
  const float top = fmaxf(a, b);
  const float merged = top + logf(expf(a - top) + expf(b - top));
  const float wa = expf(a - merged), wb = expf(b - merged);
  for (int64_t c = lane; c < g.d; c += 32) {
    T* out = ctx + g.ctx(i, bi, hd) + c;
    *out = store<T>(wa * load(*out) + wb * load(ctx_part[g.ctx(i, bi, hd) + c]));
  }
  __syncwarp();  // every lane has read lse before lane 0 rewrites it
  if (lane == 0) lse[g.lse(i, bi, hd)] = merged;
}

// ---- materialized attention over n gathered K/V rows ----
template <class T>
__global__ void cp_score_forward_kernel(const T* qkv, const T* kv, const int64_t* q_pos, const int64_t* kv_pos,
                                        T* scores, CpGeometry g, float scale) {
  GRID_STRIDE(e, g.b * g.heads * g.s * g.n) {
    const int64_t j = e % g.n, i = (e / g.n) % g.s, hd = (e / (g.n * g.s)) % g.heads, bi = e / (g.n * g.s * g.heads);
    if (kv_pos[j] > q_pos[i]) {
      scores[e] = store<T>(-INFINITY);
      continue;
    }
    const T* q = qkv + g.q(i, bi, hd);
    const T* k = kv + g.k(j, bi, hd);
    float dot = 0;
    for (int64_t c = 0; c < g.d; ++c) dot += load(q[c]) * load(k[c]);
    scores[e] = store<T>(scale * dot);
  }
}
template <class T>
__global__ void cp_dropout_kernel(const T* probs, T* probs_drop, uint8_t* mask, const int64_t* q_pos,
                                  const int64_t* kv_pos, CpGeometry g, DropoutArgs a) {
  const float scale = drop_scale_of(a);
  GRID_STRIDE(e, g.b * g.heads * g.s * g.n) {
    const int64_t j = e % g.n, i = (e / g.n) % g.s, hd = (e / (g.n * g.s)) % g.heads, bi = e / (g.n * g.s * g.heads);
    bool keep = kv_pos[j] <= q_pos[i];
    if (keep && a.p > 0) keep = keep_from(absorb(query_key(a, bi, hd, q_pos[i]), kv_pos[j]), a.p);
    mask[e] = keep ? 1 : 0;
    probs_drop[e] = store<T>(keep ? load(probs[e]) * scale : 0.f);
  }
}
// ctx_i = Σ_j probs_used[i, j]·v_j.
template <class T>
__global__ void cp_value_forward_kernel(const T* probs, const T* kv, T* ctx, CpGeometry g) {
  GRID_STRIDE(e, g.b * g.heads * g.s * g.d) {
    const int64_t c = e % g.d, i = (e / g.d) % g.s, hd = (e / (g.d * g.s)) % g.heads, bi = e / (g.d * g.s * g.heads);
    float acc = 0;
    for (int64_t j = 0; j < g.n; ++j) {
      const float p = load(probs[g.score(bi, hd, i, j)]);
      if (p != 0) acc += p * load(kv[g.v(j, bi, hd) + c]);
    }
    ctx[g.ctx(i, bi, hd) + c] = store<T>(acc);
  }
}
// d_probs_used[i, j] = d_ctx_i · v_j (every j, as the CPU's).
template <class T>
__global__ void cp_value_backward_probs_kernel(const T* d_ctx, const T* kv, T* d_probs, CpGeometry g) {
  GRID_STRIDE(e, g.b * g.heads * g.s * g.n) {
    const int64_t j = e % g.n, i = (e / g.n) % g.s, hd = (e / (g.n * g.s)) % g.heads, bi = e / (g.n * g.s * g.heads);
    const T* dc = d_ctx + g.ctx(i, bi, hd);
    const T* v = kv + g.v(j, bi, hd);
    float dot = 0;
    for (int64_t c = 0; c < g.d; ++c) dot += load(dc[c]) * load(v[c]);
    d_probs[e] = store<T>(dot);
  }
}
// d_kv of kv head kvh, key j: dV = Σ over the group's heads and all queries of probs_used·d_ctx,
// dK = 0 (the score backward adds it).
template <class T>
__global__ void cp_value_backward_kv_kernel(const T* d_ctx, const T* probs, T* d_kv, CpGeometry g) {
  GRID_STRIDE(e, g.b * g.kv_heads * g.n * g.d) {
    const int64_t c = e % g.d, j = (e / g.d) % g.n, kvh = (e / (g.d * g.n)) % g.kv_heads,
                  bi = e / (g.d * g.n * g.kv_heads);
    float acc = 0;
    for (int64_t hd = kvh * g.group; hd < (kvh + 1) * g.group; ++hd) {
      for (int64_t i = 0; i < g.s; ++i) {
        const float p = load(probs[g.score(bi, hd, i, j)]);
        if (p != 0) acc += p * load(d_ctx[g.ctx(i, bi, hd) + c]);
      }
    }
    d_kv[g.k(j, bi, kvh * g.group) + c] = store<T>(0.f);
    d_kv[g.v(j, bi, kvh * g.group) + c] = store<T>(acc);
  }
}
// dQ_i = scale·Σ_j dS[i, j]·k_j, overwriting d_qkv's query part.
template <class T>
__global__ void cp_score_backward_q_kernel(const T* d_scores, const T* kv, T* d_qkv, CpGeometry g, float scale) {
  GRID_STRIDE(e, g.b * g.heads * g.s * g.d) {
    const int64_t c = e % g.d, i = (e / g.d) % g.s, hd = (e / (g.d * g.s)) % g.heads, bi = e / (g.d * g.s * g.heads);
    float acc = 0;
    for (int64_t j = 0; j < g.n; ++j) acc += load(d_scores[g.score(bi, hd, i, j)]) * load(kv[g.k(j, bi, hd) + c]);
    d_qkv[g.q(i, bi, hd) + c] = store<T>(scale * acc);
  }
}
// dK_j += scale·Σ over the group's heads and all queries of dS[i, j]·q_i.
template <class T>
__global__ void cp_score_backward_k_kernel(const T* d_scores, const T* qkv, T* d_kv, CpGeometry g, float scale) {
  GRID_STRIDE(e, g.b * g.kv_heads * g.n * g.d) {
    const int64_t c = e % g.d, j = (e / g.d) % g.n, kvh = (e / (g.d * g.n)) % g.kv_heads,
                  bi = e / (g.d * g.n * g.kv_heads);
    float acc = 0;
    for (int64_t hd = kvh * g.group; hd < (kvh + 1) * g.group; ++hd) {
      for (int64_t i = 0; i < g.s; ++i) acc += load(d_scores[g.score(bi, hd, i, j)]) * load(qkv[g.q(i, bi, hd) + c]);
    }
    T* out = d_kv + g.k(j, bi, kvh * g.group) + c;
    *out = store<T>(load(*out) + scale * acc);
  }
}

// ---- Ulysses ----
// The sections of a row (q, k, v widths, or a ctx width): each cut into `parts` pieces.
struct Sections {
  int count;
  int64_t width[kMaxSections];
};
// One thread per element of the row layout [rows, Σ widths]; its place in the blocks
// [parts][rows, Σ widths / parts]. split: rows → blocks; else blocks → rows.
template <class T>
__global__ void a2a_heads_kernel(const T* x, T* y, int64_t rows, Sections sections, int64_t parts, bool split) {
  int64_t width = 0;
  for (int k = 0; k < sections.count; ++k) width += sections.width[k];
  const int64_t piece_width = width / parts;
  GRID_STRIDE(e, rows * width) {
    const int64_t row = e / width;
    int64_t col = e % width, piece_col = 0;  // col within its section; the section's place in a piece
    int k = 0;
    for (; k + 1 < sections.count && col >= sections.width[k]; ++k) {
      col -= sections.width[k];
      piece_col += sections.width[k] / parts;
    }
    const int64_t p = sections.width[k] / parts, j = col / p;
    const int64_t piece = (j * rows + row) * piece_width + piece_col + col % p;
    if (split)
      y[piece] = x[e];
    else
      y[e] = x[piece];
  }
}
template <class T>
__global__ void permute_rows_kernel(const T* x, T* y, const int64_t* index, int64_t n, int64_t width, bool gather) {
  GRID_STRIDE(e, n * width) {
    const int64_t i = e / width, c = e % width;
    if (gather)
      y[e] = x[index[i] * width + c];
    else
      y[index[i] * width + c] = x[e];
  }
}

unsigned blocks(int64_t n) { return blocks_for(n, kThreads); }
dim3 row_grid(int64_t rows, int64_t heads) { return dim3(unsigned((rows + kWarps - 1) / kWarps), unsigned(heads)); }
// Dynamic shared memory of the flash kernels: per_row fp32 rows of d for each warp.
size_t row_shared(const CpGeometry& g, int per_row) {
  const size_t bytes = size_t(kWarps) * size_t(per_row) * size_t(g.d) * sizeof(float);
  STEPCAST_CHECK(bytes <= 48 * 1024, "context-parallel flash attention: head dim " + std::to_string(g.d) +
                                         " needs more than 48 KiB of shared memory (at most 768)");
  return bytes;
}

}  // namespace

template <class T>
void cp_kv_pack(const Launch& l, const T* qkv, T* kv, const cpu::AttentionShape& sh) {
  const CpGeometry g = cp_geometry(sh, 1);
  kv_pack_kernel<<<blocks(g.s * g.b * g.kv_width()), kThreads, 0, l.stream>>>(qkv, kv, g, false);
  check_launch(l, "cp_kv_pack");
}
template <class T>
void cp_kv_unpack(const Launch& l, const T* d_kv, T* d_qkv, const cpu::AttentionShape& sh) {
  const CpGeometry g = cp_geometry(sh, 1);
  kv_pack_kernel<<<blocks(g.s * g.b * g.kv_width()), kThreads, 0, l.stream>>>(d_kv, d_qkv, g, true);
  check_launch(l, "cp_kv_unpack");
}

template <class T>
void cp_flash_forward(const Launch& l, const T* qkv, const T* kv, int64_t n, const int64_t* q_pos,
                      const int64_t* kv_pos, T* ctx, float* lse, const cpu::AttentionShape& sh, double scale,
                      const cpu::Dropout* dropout, int64_t head0, const int64_t* sample_index) {
  const CpGeometry g = cp_geometry(sh, n);
  cp_flash_forward_kernel<<<row_grid(g.s, g.b * g.heads), kWarps * 32, row_shared(g, 2), l.stream>>>(
      qkv, kv, q_pos, kv_pos, ctx, lse, g, float(scale), dropout_args(dropout, head0, sample_index));
  check_launch(l, "cp_flash_forward");
}
template <class T>
void cp_flash_backward(const Launch& l, const T* qkv, const T* kv, int64_t n, const int64_t* q_pos,
                       const int64_t* kv_pos, const T* ctx, const float* lse, const T* d_ctx, T* d_qkv, bool accumulate,
                       T* d_kv, float* delta, const cpu::AttentionShape& sh, double scale, const cpu::Dropout* dropout,
                       int64_t head0, const int64_t* sample_index) {
  const CpGeometry g = cp_geometry(sh, n);
  const DropoutArgs a = dropout_args(dropout, head0, sample_index);
  if (!accumulate) {
    check_runtime(l, cudaMemsetAsync(d_qkv, 0, size_t(g.s * g.b * g.width) * sizeof(T), l.stream), "cudaMemsetAsync");
  }
  cp_flash_backward_dq_kernel<<<row_grid(g.s, g.b * g.heads), kWarps * 32, row_shared(g, 3), l.stream>>>(
      qkv, kv, q_pos, kv_pos, ctx, lse, d_ctx, d_qkv, delta, g, float(scale), a);
  cp_flash_backward_dkv_kernel<<<row_grid(g.n, g.b * g.kv_heads), kWarps * 32, row_shared(g, 4), l.stream>>>(
      qkv, kv, q_pos, kv_pos, lse, d_ctx, delta, d_kv, g, float(scale), a);
  check_launch(l, "cp_flash_backward");
}
template <class T>
void cp_merge(const Launch& l, T* ctx, float* lse, const T* ctx_part, const float* lse_part,
              const cpu::AttentionShape& sh) {
  const CpGeometry g = cp_geometry(sh, 1);
  cp_merge_kernel<<<row_grid(g.s, g.b * g.heads), kWarps * 32, 0, l.stream>>>(ctx, lse, ctx_part, lse_part, g);
  check_launch(l, "cp_merge");
}

template <class T>
void cp_score_forward(const Launch& l, const T* qkv, const T* kv, int64_t n, const int64_t* q_pos,
                      const int64_t* kv_pos, T* scores, const cpu::AttentionShape& sh, double scale) {
  const CpGeometry g = cp_geometry(sh, n);
  cp_score_forward_kernel<<<blocks(g.b * g.heads * g.s * n), kThreads, 0, l.stream>>>(qkv, kv, q_pos, kv_pos, scores, g,
                                                                                      float(scale));
  check_launch(l, "cp_score_forward");
}
template <class T>
void cp_attention_dropout_forward(const Launch& l, const T* probs, T* probs_drop, uint8_t* mask,
                                  const cpu::AttentionShape& sh, int64_t n, const int64_t* q_pos, const int64_t* kv_pos,
                                  const cpu::Dropout& dropout, int64_t head0, const int64_t* sample_index) {
  const CpGeometry g = cp_geometry(sh, n);
  // p = 0 still writes the mask (1 where the key is visible), as the CPU's.
  cp_dropout_kernel<<<blocks(g.b * g.heads * g.s * n), kThreads, 0, l.stream>>>(
      probs, probs_drop, mask, q_pos, kv_pos, g, dropout_args(&dropout, head0, sample_index));
  check_launch(l, "cp_attention_dropout_forward");
}
template <class T>
void cp_value_forward(const Launch& l, const T* probs_used, const T* kv, int64_t n, T* ctx,
                      const cpu::AttentionShape& sh) {
  const CpGeometry g = cp_geometry(sh, n);
  cp_value_forward_kernel<<<blocks(g.b * g.heads * g.s * g.d), kThreads, 0, l.stream>>>(probs_used, kv, ctx, g);
  check_launch(l, "cp_value_forward");
}
template <class T>
void cp_value_backward(const Launch& l, const T* d_ctx, const T* probs_used, const T* kv, int64_t n, T* d_probs_used,
                       T* d_kv, const cpu::AttentionShape& sh) {
  const CpGeometry g = cp_geometry(sh, n);
  cp_value_backward_probs_kernel<<<blocks(g.b * g.heads * g.s * n), kThreads, 0, l.stream>>>(d_ctx, kv, d_probs_used,
                                                                                             g);
  cp_value_backward_kv_kernel<<<blocks(g.b * g.kv_heads * n * g.d), kThreads, 0, l.stream>>>(d_ctx, probs_used, d_kv,
                                                                                             g);
  check_launch(l, "cp_value_backward");
}
template <class T>
void cp_score_backward(const Launch& l, const T* d_scores, const T* qkv, const T* kv, int64_t n, T* d_qkv, T* d_kv,
                       const cpu::AttentionShape& sh, double scale) {
  const CpGeometry g = cp_geometry(sh, n);
  cp_score_backward_q_kernel<<<blocks(g.b * g.heads * g.s * g.d), kThreads, 0, l.stream>>>(d_scores, kv, d_qkv, g,
                                                                                           float(scale));
  cp_score_backward_k_kernel<<<blocks(g.b * g.kv_heads * n * g.d), kThreads, 0, l.stream>>>(d_scores, qkv, d_kv, g,
                                                                                            float(scale));
  check_launch(l, "cp_score_backward");
}

template <class T>
void a2a_heads(const Launch& l, const T* x, T* y, int64_t rows, const std::vector<int64_t>& sections, int64_t parts,
               bool split) {
  STEPCAST_CHECK(!sections.empty() && sections.size() <= size_t(kMaxSections) && parts > 0,
                 "a2a: " + std::to_string(sections.size()) + " sections in " + std::to_string(parts) + " parts");
  Sections s{int(sections.size()), {}};
  int64_t width = 0;
  for (size_t k = 0; k < sections.size(); ++k) {
    STEPCAST_CHECK(sections[k] % parts == 0,
                   "a2a: a section of " + std::to_string(sections[k]) + " not split in " + std::to_string(parts));
    s.width[k] = sections[k];
    width += sections[k];
  }
  a2a_heads_kernel<<<blocks(rows * width), kThreads, 0, l.stream>>>(x, y, rows, s, parts, split);
  check_launch(l, "cp_a2a_heads");
}
template <class T>
void permute_rows(const Launch& l, const T* x, T* y, const int64_t* index, int64_t n, int64_t width, bool gather) {
  permute_rows_kernel<<<blocks(n * width), kThreads, 0, l.stream>>>(x, y, index, n, width, gather);
  check_launch(l, "cp_permute_rows");
}

#define STEPCAST_CP(T)                                                                                                 \
  template void cp_kv_pack<T>(const Launch&, const T*, T*, const cpu::AttentionShape&);                                \
  template void cp_kv_unpack<T>(const Launch&, const T*, T*, const cpu::AttentionShape&);                              \
  template void cp_flash_forward<T>(const Launch&, const T*, const T*, int64_t, const int64_t*, const int64_t*, T*,    \
                                    float*, const cpu::AttentionShape&, double, const cpu::Dropout*, int64_t,          \
                                    const int64_t*);                                                                   \
  template void cp_flash_backward<T>(                                                                                  \
      const Launch&, const T*, const T*, int64_t, const int64_t*, const int64_t*, const T*, const float*, const T*,    \
      T*, bool, T*, float*, const cpu::AttentionShape&, double, const cpu::Dropout*, int64_t, const int64_t*);         \
  template void cp_merge<T>(const Launch&, T*, float*, const T*, const float*, const cpu::AttentionShape&);            \
  template void cp_score_forward<T>(const Launch&, const T*, const T*, int64_t, const int64_t*, const int64_t*, T*,    \
                                    const cpu::AttentionShape&, double);                                               \
  template void cp_attention_dropout_forward<T>(const Launch&, const T*, T*, uint8_t*, const cpu::AttentionShape&,     \
                                                int64_t, const int64_t*, const int64_t*, const cpu::Dropout&, int64_t, \
                                                const int64_t*);                                                       \
  template void cp_value_forward<T>(const Launch&, const T*, const T*, int64_t, T*, const cpu::AttentionShape&);       \
  template void cp_value_backward<T>(const Launch&, const T*, const T*, const T*, int64_t, T*, T*,                     \
                                     const cpu::AttentionShape&);                                                      \
  template void cp_score_backward<T>(const Launch&, const T*, const T*, const T*, int64_t, T*, T*,                     \
                                     const cpu::AttentionShape&, double);                                              \
  template void a2a_heads<T>(const Launch&, const T*, T*, int64_t, const std::vector<int64_t>&, int64_t, bool);        \
  template void permute_rows<T>(const Launch&, const T*, T*, const int64_t*, int64_t, int64_t, bool);

STEPCAST_CP(bf16)
STEPCAST_CP(float)

#undef STEPCAST_CP

}  // namespace stepcast::cuda
