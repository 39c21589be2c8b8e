// The CUDA backend's bf16 causal flash attention on the tensor cores (attention_common.cuh):
// FlashAttention-2's schedule with WMMA 16×16×16 bf16 products accumulating in fp32. A block is
// 4 warps over 64 query (or key) rows, 16 rows a warp; key (or query) tiles of 64 rows are staged
// in shared memory. Scores and their softmax stay fp32 in shared memory; probabilities (and dS in
// the backward) are rounded to bf16 for their products, as FlashAttention does. The output
// accumulator of the forward lives in shared memory (WMMA does not say which fragment element is
// which row, and the online softmax rescales rows); the backward's dQ, dK and dV accumulate in
// fragments. Backward: dQ over query blocks, then dK and dV over key blocks (all heads of a GQA
// group), so nothing is accumulated with atomics. Dropout keeps exactly the CPU's elements.
#include <mma.h>

#include "attention_common.cuh"

namespace stepcast::cuda {

namespace {

using namespace nvcuda;
using Bf = __nv_bfloat16;

constexpr int kRows = 64;  // query (forward, dQ) or key (dK dV) rows per block
constexpr int kCols = 64;  // key (forward, dQ) or query (dK dV) rows per tile
constexpr int kMmaThreads = 128;

// Padded row lengths (elements) of the shared-memory tiles: bf16 [rows][D + 8], fp32 scores
// [rows][kCols + 4], bf16 probabilities [rows][kCols + 8], fp32 accumulators [rows][D + 4]. Each
// keeps WMMA's 32-byte pointer alignment at 16-row and 16-column steps.
template <int D>
struct Pitch {
  static constexpr int kTile = D + 8, kScore = kCols + 4, kProb = kCols + 8, kAcc = D + 4;
  static constexpr int kTileBytes = kRows * kTile * 2, kScoreBytes = kRows * kScore * 4;
  static constexpr int kProbBytes = kRows * kProb * 2, kAccBytes = kRows * kAcc * 4;
};

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, Bf, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, Bf, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, Bf, wmma::col_major>;
using FragAcc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Rows r0 .. r0 + 63 of one head into a [64][D + 8] tile, 16 bytes a load; rows past s are 0.
template <int D, class Offset>
__device__ __forceinline__ void load_tile(Bf* tile, const bf16* src, Offset offset, int64_t r0, int64_t s) {
  constexpr int kChunks = D / 8;
  for (int e = threadIdx.x; e < kRows * kChunks; e += blockDim.x) {
    const int r = e / kChunks, c = e % kChunks;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r0 + r < s) v = *reinterpret_cast<const uint4*>(src + offset(r0 + r) + c * 8);
    *reinterpret_cast<uint4*>(tile + r * Pitch<D>::kTile + c * 8) = v;
  }
}

// out[16 × 64] (fp32, pitch kScore) = A rows [16 × D] · Bᵀ where B is [64 × D] (both tiles).
template <int D>
__device__ __forceinline__ void product_abt(const Bf* a, const Bf* b, float* out) {
  for (int n = 0; n < kCols / 16; ++n) {
    FragAcc acc;
    wmma::fill_fragment(acc, 0.f);
    for (int k = 0; k < D / 16; ++k) {
      FragA fa;
      FragBCol fb;
      wmma::load_matrix_sync(fa, a + k * 16, Pitch<D>::kTile);
      wmma::load_matrix_sync(fb, b + n * 16 * Pitch<D>::kTile + k * 16, Pitch<D>::kTile);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + n * 16, acc, Pitch<D>::kScore, wmma::mem_row_major);
  }
}

// acc[n] (16 × 16 column block n of a 16 × D result) += P [16 × 64] (pitch kProb) · B [64 × D].
template <int D>
__device__ __forceinline__ void accumulate_pb(FragAcc* acc, const Bf* p, const Bf* b) {
  for (int n = 0; n < D / 16; ++n) {
    for (int k = 0; k < kCols / 16; ++k) {
      FragA fa;
      FragBRow fb;
      wmma::load_matrix_sync(fa, p + k * 16, Pitch<D>::kProb);
      wmma::load_matrix_sync(fb, b + k * 16 * Pitch<D>::kTile + n * 16, Pitch<D>::kTile);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// Forward: grid (query blocks, b·heads).
template <int D>
__global__ void __launch_bounds__(kMmaThreads) flash_mma_forward_kernel(const bf16* qkv, bf16* ctx, float* lse,
                                                                        Geometry g, float scale, DropoutArgs a) {
  using P = Pitch<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  Bf* qs = reinterpret_cast<Bf*>(smem);
  Bf* ks = reinterpret_cast<Bf*>(smem + P::kTileBytes);
  Bf* vs = reinterpret_cast<Bf*>(smem + 2 * P::kTileBytes);
  Bf* ps = reinterpret_cast<Bf*>(smem + 3 * P::kTileBytes);
  float* ss = reinterpret_cast<float*>(smem + 3 * P::kTileBytes + P::kProbBytes);
  float* os = reinterpret_cast<float*>(smem + 3 * P::kTileBytes + P::kProbBytes + P::kScoreBytes);
  float* ms = os + kRows * P::kAcc;
  float* ls = ms + kRows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, w0 = warp * 16;
  const int64_t bh = blockIdx.y, bi = bh / g.heads, hd = bh % g.heads;
  const int64_t i0 = int64_t(blockIdx.x) * kRows;
  load_tile<D>(qs, qkv, [&](int64_t r) { return g.q(r, bi, hd); }, i0, g.s);
  for (int e = threadIdx.x; e < kRows * P::kAcc; e += blockDim.x) os[e] = 0.f;
  for (int r = threadIdx.x; r < kRows; r += blockDim.x) {
    ms[r] = -INFINITY;
    ls[r] = 0.f;
  }
  const float drop_scale = a.p > 0 ? float(1.0 / (1.0 - a.p)) : 1.f;
  const int64_t last = (i0 + kRows < g.s ? i0 + kRows : g.s) - 1;  // the block's last query
  for (int64_t j0 = 0; j0 <= last; j0 += kCols) {
    __syncthreads();  // the previous tile's readers are done
    load_tile<D>(ks, qkv, [&](int64_t r) { return g.k(r, bi, hd); }, j0, g.s);
    load_tile<D>(vs, qkv, [&](int64_t r) { return g.v(r, bi, hd); }, j0, g.s);
    __syncthreads();
    product_abt<D>(qs + w0 * P::kTile, ks, ss + w0 * P::kScore);
    __syncwarp();
    // Online softmax of the warp's 16 rows, two columns a lane. Every row's first tile holds key
    // 0 (allowed), so its running maximum is finite from then on; rows past s see only keys < s.
    for (int rr = 0; rr < 16; ++rr) {
      const int r = w0 + rr;
      const int64_t i = i0 + r;
      float sc[2], mx = -INFINITY;
      for (int t = 0; t < 2; ++t) {
        const int c = lane + 32 * t;
        const int64_t j = j0 + c;
        sc[t] = j < g.s && j <= i ? ss[r * P::kScore + c] * scale : -INFINITY;
        mx = fmaxf(mx, sc[t]);
      }
      mx = warp_max(mx);
      const float m_old = ms[r], m_new = fmaxf(m_old, mx);
      const float rescale = __expf(m_old - m_new);  // 0 on the first tile
      const uint64_t key_q = a.p > 0 ? query_key(a, bi, hd, i) : 0;
      float sum = 0.f;
      for (int t = 0; t < 2; ++t) {
        const int c = lane + 32 * t;
        const float e = __expf(sc[t] - m_new);  // 0 where masked
        sum += e;
        float used = e;
        if (a.p > 0) used = keep_from(absorb(key_q, j0 + c), a.p) ? e * drop_scale : 0.f;
        ps[r * P::kProb + c] = __float2bfloat16(used);
      }
      sum = warp_sum(sum);
      __syncwarp();  // every lane has read ms[r]
      if (lane == 0) {
        ms[r] = m_new;
        ls[r] = ls[r] * rescale + sum;
      }
      for (int c = lane; c < D; c += 32) os[r * P::kAcc + c] *= rescale;
    }
    __syncwarp();
    FragAcc acc[D / 16];
    for (int n = 0; n < D / 16; ++n) {
      wmma::load_matrix_sync(acc[n], os + w0 * P::kAcc + n * 16, P::kAcc, wmma::mem_row_major);
    }
    accumulate_pb<D>(acc, ps + w0 * P::kProb, vs);
    for (int n = 0; n < D / 16; ++n) {
      wmma::store_matrix_sync(os + w0 * P::kAcc + n * 16, acc[n], P::kAcc, wmma::mem_row_major);
    }
    __syncwarp();
  }
  for (int rr = 0; rr < 16; ++rr) {
    const int r = w0 + rr;
    const int64_t i = i0 + r;
    if (i >= g.s) break;
    const float inv = 1.f / ls[r];
    for (int c = lane; c < D; c += 32) ctx[g.ctx(i, bi, hd) + c] = store<bf16>(os[r * P::kAcc + c] * inv);
    if (lane == 0) lse[(bi * g.heads + hd) * g.s + i] = ms[r] + logf(ls[r]);
  }
}

// Backward pass 1: dQ (overwrites the Q part of d_qkv) and delta_i = d_ctx_i · ctx_i.
template <int D>
__global__ void __launch_bounds__(kMmaThreads) flash_mma_backward_dq_kernel(const bf16* qkv, const bf16* ctx,
                                                                            const float* lse, const bf16* d_ctx,
                                                                            bf16* d_qkv, float* delta, Geometry g,
                                                                            float scale, DropoutArgs a) {
  using P = Pitch<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  Bf* qs = reinterpret_cast<Bf*>(smem);
  Bf* dos = reinterpret_cast<Bf*>(smem + P::kTileBytes);
  Bf* ks = reinterpret_cast<Bf*>(smem + 2 * P::kTileBytes);
  Bf* vs = reinterpret_cast<Bf*>(smem + 3 * P::kTileBytes);
  Bf* dss = reinterpret_cast<Bf*>(smem + 4 * P::kTileBytes);
  float* ss = reinterpret_cast<float*>(smem + 4 * P::kTileBytes + P::kProbBytes);
  float* dps = ss + kRows * P::kScore;
  float* out = dps + kRows * P::kScore;  // [kRows][kAcc]
  float* lse_s = out + kRows * P::kAcc;
  float* delta_s = lse_s + kRows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, w0 = warp * 16;
  const int64_t bh = blockIdx.y, bi = bh / g.heads, hd = bh % g.heads;
  const int64_t i0 = int64_t(blockIdx.x) * kRows;
  load_tile<D>(qs, qkv, [&](int64_t r) { return g.q(r, bi, hd); }, i0, g.s);
  load_tile<D>(dos, d_ctx, [&](int64_t r) { return g.ctx(r, bi, hd); }, i0, g.s);
  for (int rr = 0; rr < 16; ++rr) {  // the warp's rows: delta and lse
    const int r = w0 + rr;
    const int64_t i = i0 + r;
    float part = 0.f;
    if (i < g.s) {
      for (int c = lane; c < D; c += 32) part += load(d_ctx[g.ctx(i, bi, hd) + c]) * load(ctx[g.ctx(i, bi, hd) + c]);
    }
    const float di = warp_sum(part);
    if (lane == 0) {
      delta_s[r] = di;
      lse_s[r] = i < g.s ? lse[(bi * g.heads + hd) * g.s + i] : 0.f;
      if (i < g.s) delta[(bi * g.heads + hd) * g.s + i] = di;
    }
  }
  FragAcc dq[D / 16];
  for (int n = 0; n < D / 16; ++n) wmma::fill_fragment(dq[n], 0.f);
  const float drop_scale = a.p > 0 ? float(1.0 / (1.0 - a.p)) : 1.f;
  const int64_t last = (i0 + kRows < g.s ? i0 + kRows : g.s) - 1;
  for (int64_t j0 = 0; j0 <= last; j0 += kCols) {
    __syncthreads();
    load_tile<D>(ks, qkv, [&](int64_t r) { return g.k(r, bi, hd); }, j0, g.s);
    load_tile<D>(vs, qkv, [&](int64_t r) { return g.v(r, bi, hd); }, j0, g.s);
    __syncthreads();
    product_abt<D>(qs + w0 * P::kTile, ks, ss + w0 * P::kScore);
    product_abt<D>(dos + w0 * P::kTile, vs, dps + w0 * P::kScore);
    __syncwarp();
    for (int rr = 0; rr < 16; ++rr) {
      const int r = w0 + rr;
      const int64_t i = i0 + r;
      const uint64_t key_q = a.p > 0 ? query_key(a, bi, hd, i) : 0;
      for (int t = 0; t < 2; ++t) {
        const int c = lane + 32 * t;
        const int64_t j = j0 + c;
        float ds = 0.f;
        if (i < g.s && j < g.s && j <= i) {
          const float p = __expf(ss[r * P::kScore + c] * scale - lse_s[r]);
          const bool keep = a.p <= 0 || keep_from(absorb(key_q, j), a.p);
          ds = p * ((keep ? dps[r * P::kScore + c] * drop_scale : 0.f) - delta_s[r]);
        }
        dss[r * P::kProb + c] = __float2bfloat16(ds);
      }
    }
    __syncwarp();
    accumulate_pb<D>(dq, dss + w0 * P::kProb, ks);
  }
  for (int n = 0; n < D / 16; ++n) {
    wmma::store_matrix_sync(out + w0 * P::kAcc + n * 16, dq[n], P::kAcc, wmma::mem_row_major);
  }
  __syncwarp();
  for (int rr = 0; rr < 16; ++rr) {
    const int r = w0 + rr;
    const int64_t i = i0 + r;
    if (i >= g.s) break;
    for (int c = lane; c < D; c += 32) d_qkv[g.q(i, bi, hd) + c] = store<bf16>(scale * out[r * P::kAcc + c]);
  }
}

// Backward pass 2: dK and dV of kv head kvh for key rows j (overwrite), summed over the group's
// heads and the queries i ≥ j. Grid (key blocks, b·kv_heads). Scores are held transposed
// (key rows × query columns), so the warp's rows are its keys.
template <int D>
__global__ void __launch_bounds__(kMmaThreads) flash_mma_backward_dkv_kernel(const bf16* qkv, const float* lse,
                                                                             const bf16* d_ctx, const float* delta,
                                                                             bf16* d_qkv, Geometry g, float scale,
                                                                             DropoutArgs a) {
  using P = Pitch<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  Bf* ks = reinterpret_cast<Bf*>(smem);
  Bf* vs = reinterpret_cast<Bf*>(smem + P::kTileBytes);
  Bf* qs = reinterpret_cast<Bf*>(smem + 2 * P::kTileBytes);
  Bf* dos = reinterpret_cast<Bf*>(smem + 3 * P::kTileBytes);
  Bf* pts = reinterpret_cast<Bf*>(smem + 4 * P::kTileBytes);
  Bf* dsts = reinterpret_cast<Bf*>(smem + 4 * P::kTileBytes + P::kProbBytes);
  float* sts = reinterpret_cast<float*>(smem + 4 * P::kTileBytes + 2 * P::kProbBytes);
  float* dpts = sts + kRows * P::kScore;
  float* out = dpts + kRows * P::kScore;  // [kRows][kAcc]
  float* lse_s = out + kRows * P::kAcc;
  float* delta_s = lse_s + kCols;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, w0 = warp * 16;
  const int64_t bk = blockIdx.y, bi = bk / g.kv_heads, kvh = bk % g.kv_heads;
  const int64_t j0 = int64_t(blockIdx.x) * kRows, head_of_group = kvh * g.group;
  load_tile<D>(ks, qkv, [&](int64_t r) { return g.k(r, bi, head_of_group); }, j0, g.s);
  load_tile<D>(vs, qkv, [&](int64_t r) { return g.v(r, bi, head_of_group); }, j0, g.s);
  FragAcc dk[D / 16], dv[D / 16];
  for (int n = 0; n < D / 16; ++n) {
    wmma::fill_fragment(dk[n], 0.f);
    wmma::fill_fragment(dv[n], 0.f);
  }
  const float drop_scale = a.p > 0 ? float(1.0 / (1.0 - a.p)) : 1.f;
  for (int64_t hd = head_of_group; hd < head_of_group + g.group; ++hd) {
    uint64_t key_h = 0;
    if (a.p > 0) key_h = absorb(sample_key(a.seed, a.site, a.step, a.layer, a.sample_index[bi]), a.head0 + hd);
    for (int64_t t0 = j0; t0 < g.s; t0 += kCols) {  // queries i ≥ j0
      __syncthreads();
      load_tile<D>(qs, qkv, [&](int64_t r) { return g.q(r, bi, hd); }, t0, g.s);
      load_tile<D>(dos, d_ctx, [&](int64_t r) { return g.ctx(r, bi, hd); }, t0, g.s);
      for (int c = threadIdx.x; c < kCols; c += blockDim.x) {
        const int64_t i = t0 + c;
        lse_s[c] = i < g.s ? lse[(bi * g.heads + hd) * g.s + i] : 0.f;
        delta_s[c] = i < g.s ? delta[(bi * g.heads + hd) * g.s + i] : 0.f;
      }
      __syncthreads();
      product_abt<D>(ks + w0 * P::kTile, qs, sts + w0 * P::kScore);
      product_abt<D>(vs + w0 * P::kTile, dos, dpts + w0 * P::kScore);
      __syncwarp();
      for (int rr = 0; rr < 16; ++rr) {
        const int r = w0 + rr;
        const int64_t j = j0 + r;
        for (int t = 0; t < 2; ++t) {
          const int c = lane + 32 * t;
          const int64_t i = t0 + c;
          float used = 0.f, ds = 0.f;
          if (j < g.s && i < g.s && i >= j) {  // causal: queries at or after the key
            const float p = __expf(sts[r * P::kScore + c] * scale - lse_s[c]);
            const bool keep = a.p <= 0 || keep_from(absorb(absorb(key_h, i), j), a.p);
            used = keep ? p * drop_scale : 0.f;
            ds = p * ((keep ? dpts[r * P::kScore + c] * drop_scale : 0.f) - delta_s[c]);
          }
          pts[r * P::kProb + c] = __float2bfloat16(used);
          dsts[r * P::kProb + c] = __float2bfloat16(ds);
        }
      }
      __syncwarp();
      accumulate_pb<D>(dv, pts + w0 * P::kProb, dos);
      accumulate_pb<D>(dk, dsts + w0 * P::kProb, qs);  // q without the scale: applied at the end
    }
  }
  for (int pass = 0; pass < 2; ++pass) {
    FragAcc* acc = pass == 0 ? dk : dv;
    for (int n = 0; n < D / 16; ++n) {
      wmma::store_matrix_sync(out + w0 * P::kAcc + n * 16, acc[n], P::kAcc, wmma::mem_row_major);
    }
    __syncwarp();
    for (int rr = 0; rr < 16; ++rr) {
      const int r = w0 + rr;
      const int64_t j = j0 + r;
      if (j >= g.s) break;
      const int64_t at = pass == 0 ? g.k(j, bi, head_of_group) : g.v(j, bi, head_of_group);
      const float factor = pass == 0 ? scale : 1.f;
      for (int c = lane; c < D; c += 32) d_qkv[at + c] = store<bf16>(factor * out[r * P::kAcc + c]);
    }
    __syncwarp();
  }
}

template <int D>
constexpr int forward_smem() {
  return 3 * Pitch<D>::kTileBytes + Pitch<D>::kProbBytes + Pitch<D>::kScoreBytes + Pitch<D>::kAccBytes +
         2 * kRows * 4;
}
template <int D>
constexpr int backward_dq_smem() {
  return 4 * Pitch<D>::kTileBytes + Pitch<D>::kProbBytes + 2 * Pitch<D>::kScoreBytes + Pitch<D>::kAccBytes +
         2 * kRows * 4;
}
template <int D>
constexpr int backward_dkv_smem() {
  return 4 * Pitch<D>::kTileBytes + 2 * Pitch<D>::kProbBytes + 2 * Pitch<D>::kScoreBytes + Pitch<D>::kAccBytes +
         2 * kCols * 4;
}

// Raises a kernel's dynamic shared-memory limit once (past 48 KiB it must be asked for).
template <class Kernel>
void allow_smem(Kernel kernel, int bytes, const Launch& l) {
  check_runtime(l, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
                "cudaFuncSetAttribute (flash attention shared memory)");
}

template <int D>
void forward_d(const Launch& l, const bf16* qkv, bf16* ctx, float* lse, const Geometry& g, float scale,
               const DropoutArgs& a) {
  static bool ready = false;
  if (!ready) allow_smem(flash_mma_forward_kernel<D>, forward_smem<D>(), l), ready = true;
  dim3 grid(unsigned((g.s + kRows - 1) / kRows), unsigned(g.b * g.heads));
  flash_mma_forward_kernel<D><<<grid, kMmaThreads, forward_smem<D>(), l.stream>>>(qkv, ctx, lse, g, scale, a);
}

template <int D>
void backward_d(const Launch& l, const bf16* qkv, const bf16* ctx, const float* lse, const bf16* d_ctx, bf16* d_qkv,
                float* delta, const Geometry& g, float scale, const DropoutArgs& a) {
  static bool ready = false;
  if (!ready) {
    allow_smem(flash_mma_backward_dq_kernel<D>, backward_dq_smem<D>(), l);
    allow_smem(flash_mma_backward_dkv_kernel<D>, backward_dkv_smem<D>(), l);
    ready = true;
  }
  const unsigned blocks = unsigned((g.s + kRows - 1) / kRows);
  flash_mma_backward_dq_kernel<D><<<dim3(blocks, unsigned(g.b * g.heads)), kMmaThreads, backward_dq_smem<D>(),
                                    l.stream>>>(qkv, ctx, lse, d_ctx, d_qkv, delta, g, scale, a);
  flash_mma_backward_dkv_kernel<D><<<dim3(blocks, unsigned(g.b * g.kv_heads)), kMmaThreads, backward_dkv_smem<D>(),
                                     l.stream>>>(qkv, lse, d_ctx, delta, d_qkv, g, scale, a);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool flash_mma_forward(const Launch& l, const bf16* qkv, bf16* ctx, float* lse, const Geometry& g, float scale,
                       const DropoutArgs& a) {
  if (!aligned16(qkv)) return false;
  switch (g.d) {
    case 16: forward_d<16>(l, qkv, ctx, lse, g, scale, a); return true;
    case 32: forward_d<32>(l, qkv, ctx, lse, g, scale, a); return true;
    case 64: forward_d<64>(l, qkv, ctx, lse, g, scale, a); return true;
    case 128: forward_d<128>(l, qkv, ctx, lse, g, scale, a); return true;
    default: return false;
  }
}

bool flash_mma_backward(const Launch& l, const bf16* qkv, const bf16* ctx, const float* lse, const bf16* d_ctx,
                        bf16* d_qkv, float* delta, const Geometry& g, float scale, const DropoutArgs& a) {
  if (!aligned16(qkv) || !aligned16(d_ctx)) return false;
  switch (g.d) {
    case 16: backward_d<16>(l, qkv, ctx, lse, d_ctx, d_qkv, delta, g, scale, a); return true;
    case 32: backward_d<32>(l, qkv, ctx, lse, d_ctx, d_qkv, delta, g, scale, a); return true;
    case 64: backward_d<64>(l, qkv, ctx, lse, d_ctx, d_qkv, delta, g, scale, a); return true;
    case 128: backward_d<128>(l, qkv, ctx, lse, d_ctx, d_qkv, delta, g, scale, a); return true;
    default: return false;
  }
}

}  // namespace stepcast::cuda
