// The CPU kernels' attention (cpu_kernels.hpp): rotary embedding, the materialized path (score,
// softmax, dropout, value, each its own op, with their backwards) and the flash path (online
// softmax, no s×s buffer). Both draw attention dropout from the same hash, so they agree mask for
// mask; the GEMMs go through cpu_kernels_gemm.cpp.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu_kernels.hpp"
#include "cpu_kernels_detail.hpp"
#include "errors.hpp"

namespace stepcast::cpu {

using namespace detail;

namespace {

void check_attention(const AttentionShape& sh) {
  STEPCAST_CHECK(sh.s > 0 && sh.b > 0 && sh.heads > 0 && sh.kv_heads > 0 && sh.d > 0,
                 "attention shape must be positive");
  STEPCAST_CHECK(sh.heads % sh.kv_heads == 0, "heads must be a multiple of kv_heads");
}

// Offsets of one (batch row, head) inside qkv / ctx; rows of a head are ld apart.
struct HeadView {
  int64_t ld_qkv, ld_ctx, group;
  int64_t q(const AttentionShape& sh, int64_t bi, int64_t hd) const { return bi * sh.qkv_width() + hd * sh.d; }
  int64_t k(const AttentionShape& sh, int64_t bi, int64_t hd) const {
    return bi * sh.qkv_width() + (sh.heads + hd / group) * sh.d;
  }
  int64_t v(const AttentionShape& sh, int64_t bi, int64_t hd) const {
    return bi * sh.qkv_width() + (sh.heads + sh.kv_heads + hd / group) * sh.d;
  }
  int64_t ctx(const AttentionShape& sh, int64_t bi, int64_t hd) const { return bi * sh.heads * sh.d + hd * sh.d; }
};

HeadView head_view(const AttentionShape& sh) {
  return {sh.b * sh.qkv_width(), sh.b * sh.heads * sh.d, sh.heads / sh.kv_heads};
}

// Rotates the q and k heads of every row by +angle (sign = 1) or −angle (sign = −1).
template <class T>
void rotate(T* qkv, const AttentionShape& sh, double theta, int64_t s0, double sign) {
  check_attention(sh);
  STEPCAST_CHECK(sh.d % 2 == 0, "rotary embedding needs an even head dim");
  const int64_t half = sh.d / 2;
  std::vector<double> inv_freq(half), cos_v(half), sin_v(half);
  for (int64_t i = 0; i < half; ++i) inv_freq[i] = 1.0 / std::pow(theta, double(2 * i) / sh.d);
  for (int64_t si = 0; si < sh.s; ++si) {
    for (int64_t i = 0; i < half; ++i) {
      double angle = double(s0 + si) * inv_freq[i];
      cos_v[i] = std::cos(angle);
      sin_v[i] = sign * std::sin(angle);
    }
    for (int64_t bi = 0; bi < sh.b; ++bi) {
      T* row = qkv + (si * sh.b + bi) * sh.qkv_width();
      for (int64_t hd = 0; hd < sh.heads + sh.kv_heads; ++hd) {  // q heads, then k heads
        T* x = row + hd * sh.d;
        for (int64_t i = 0; i < half; ++i) {
          double x1 = x[i], x2 = x[i + half];
          x[i] = T(x1 * cos_v[i] - x2 * sin_v[i]);
          x[i + half] = T(x2 * cos_v[i] + x1 * sin_v[i]);
        }
      }
    }
  }
}

}  // namespace

// ---- Rotary ----

template <class T>
void rotary_forward(T* qkv, const AttentionShape& shape, double theta, int64_t s0) {
  rotate(qkv, shape, theta, s0, 1.0);
}

template <class T>
void rotary_backward(T* d_qkv, const AttentionShape& shape, double theta, int64_t s0) {
  rotate(d_qkv, shape, theta, s0, -1.0);
}

// ---- Materialized attention ----

template <class T>
void attention_score_forward(const T* qkv, T* scores, const AttentionShape& sh, double scale) {
  check_attention(sh);
  const HeadView hv = head_view(sh);
  const T neg_inf = -std::numeric_limits<T>::infinity();
  for (int64_t bi = 0; bi < sh.b; ++bi) {
    for (int64_t hd = 0; hd < sh.heads; ++hd) {
      T* sc = scores + (bi * sh.heads + hd) * sh.s * sh.s;
      gemm<T>(false, true, sh.s, sh.s, sh.d, T(scale), qkv + hv.q(sh, bi, hd), hv.ld_qkv, qkv + hv.k(sh, bi, hd),
              hv.ld_qkv, T(0), sc, sh.s);
      for (int64_t i = 0; i < sh.s; ++i)
        for (int64_t j = i + 1; j < sh.s; ++j) sc[i * sh.s + j] = neg_inf;
    }
  }
}

template <class T>
void softmax_forward(const T* scores, T* probs, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* x = scores + r * cols;
    T* p = probs + r * cols;
    double max = kNegInf;
    for (int64_t j = 0; j < cols; ++j) max = std::max(max, double(x[j]));
    STEPCAST_CHECK(max > kNegInf, "softmax row is entirely masked");
    double sum = 0;
    for (int64_t j = 0; j < cols; ++j) sum += std::exp(double(x[j]) - max);
    for (int64_t j = 0; j < cols; ++j) p[j] = T(std::exp(double(x[j]) - max) / sum);
  }
}

template <class T>
void attention_dropout_forward(const T* probs, T* probs_drop, uint8_t* mask, const AttentionShape& sh,
                               const Dropout& dropout, int64_t head0, const int64_t* sample_index) {
  check_attention(sh);
  const T scale = T(keep_scale(dropout.p));
  for (int64_t bi = 0; bi < sh.b; ++bi) {
    uint64_t key = sample_key(&dropout, sample_index, bi);
    for (int64_t hd = 0; hd < sh.heads; ++hd) {
      uint64_t key_h = absorb(key, head0 + hd);
      int64_t base = (bi * sh.heads + hd) * sh.s * sh.s;
      for (int64_t i = 0; i < sh.s; ++i) {
        uint64_t key_q = absorb(key_h, i);
        for (int64_t j = 0; j < sh.s; ++j) {
          int64_t at = base + i * sh.s + j;
          bool keep = j <= i && keep_from(absorb(key_q, j), dropout.p);
          mask[at] = keep ? 1 : 0;
          probs_drop[at] = keep ? probs[at] * scale : T(0);
        }
      }
    }
  }
}

template <class T>
void attention_value_forward(const T* probs_used, const T* qkv, T* ctx, const AttentionShape& sh) {
  check_attention(sh);
  const HeadView hv = head_view(sh);
  for (int64_t bi = 0; bi < sh.b; ++bi)
    for (int64_t hd = 0; hd < sh.heads; ++hd)
      gemm<T>(false, false, sh.s, sh.d, sh.s, T(1), probs_used + (bi * sh.heads + hd) * sh.s * sh.s, sh.s,
              qkv + hv.v(sh, bi, hd), hv.ld_qkv, T(0), ctx + hv.ctx(sh, bi, hd), hv.ld_ctx);
}

template <class T>
void attention_value_backward(const T* d_ctx, const T* probs_used, const T* qkv, T* d_probs_used, T* d_qkv,
                              const AttentionShape& sh) {
  check_attention(sh);
  const HeadView hv = head_view(sh);
  for (int64_t bi = 0; bi < sh.b; ++bi) {
    for (int64_t hd = 0; hd < sh.heads; ++hd) {
      const int64_t sq = (bi * sh.heads + hd) * sh.s * sh.s;
      const T* dc = d_ctx + hv.ctx(sh, bi, hd);
      gemm<T>(false, true, sh.s, sh.s, sh.d, T(1), dc, hv.ld_ctx, qkv + hv.v(sh, bi, hd), hv.ld_qkv, T(0),
              d_probs_used + sq, sh.s);
      T beta = hd % hv.group == 0 ? T(0) : T(1);  // first head of its kv group overwrites
      gemm<T>(true, false, sh.s, sh.d, sh.s, T(1), probs_used + sq, sh.s, dc, hv.ld_ctx, beta, d_qkv + hv.v(sh, bi, hd),
              hv.ld_qkv);
    }
  }
}

template <class T>
void softmax_backward(const T* d_probs, const T* probs, T* d_scores, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* dp = d_probs + r * cols;
    const T* p = probs + r * cols;
    double inner = dot(dp, p, cols);
    for (int64_t j = 0; j < cols; ++j) d_scores[r * cols + j] = T(p[j] * (dp[j] - inner));
  }
}

template <class T>
void attention_score_backward(const T* d_scores, const T* qkv, T* d_qkv, const AttentionShape& sh, double scale) {
  check_attention(sh);
  const HeadView hv = head_view(sh);
  for (int64_t bi = 0; bi < sh.b; ++bi) {
    for (int64_t hd = 0; hd < sh.heads; ++hd) {
      const T* ds = d_scores + (bi * sh.heads + hd) * sh.s * sh.s;
      gemm<T>(false, false, sh.s, sh.d, sh.s, T(scale), ds, sh.s, qkv + hv.k(sh, bi, hd), hv.ld_qkv, T(0),
              d_qkv + hv.q(sh, bi, hd), hv.ld_qkv);
      T beta = hd % hv.group == 0 ? T(0) : T(1);
      gemm<T>(true, false, sh.s, sh.d, sh.s, T(scale), ds, sh.s, qkv + hv.q(sh, bi, hd), hv.ld_qkv, beta,
              d_qkv + hv.k(sh, bi, hd), hv.ld_qkv);
    }
  }
}

// ---- Flash attention ----

template <class T>
void flash_attention_forward(const T* qkv, T* ctx, T* lse, const AttentionShape& sh, double scale,
                             const Dropout* dropout, int64_t head0, const int64_t* sample_index) {
  check_attention(sh);
  constexpr int64_t kBlock = 64;  // keys per online-softmax block
  const HeadView hv = head_view(sh);
  const double drop_scale = dropout ? keep_scale(dropout->p) : 1.0;
  std::vector<double> acc(sh.d), block(kBlock);
  for (int64_t bi = 0; bi < sh.b; ++bi) {
    uint64_t key = sample_key(dropout, sample_index, bi);
    for (int64_t hd = 0; hd < sh.heads; ++hd) {
      uint64_t key_h = absorb(key, head0 + hd);
      const T* q = qkv + hv.q(sh, bi, hd);
      const T* k = qkv + hv.k(sh, bi, hd);
      const T* v = qkv + hv.v(sh, bi, hd);
      for (int64_t i = 0; i < sh.s; ++i) {
        uint64_t key_q = absorb(key_h, i);
        const T* qi = q + i * hv.ld_qkv;
        double m = kNegInf, l = 0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j0 = 0; j0 <= i; j0 += kBlock) {
          const int64_t j1 = std::min(i + 1, j0 + kBlock);
          double block_max = kNegInf;
          for (int64_t j = j0; j < j1; ++j) {
            block[j - j0] = scale * dot(qi, k + j * hv.ld_qkv, sh.d);
            block_max = std::max(block_max, block[j - j0]);
          }
          const double m_new = std::max(m, block_max);
          const double rescale = std::exp(m - m_new);  // 0 on the first block (m = −inf)
          l *= rescale;
          for (double& a : acc) a *= rescale;
          for (int64_t j = j0; j < j1; ++j) {
            double e = std::exp(block[j - j0] - m_new);
            l += e;
            if (dropout && !keep_from(absorb(key_q, j), dropout->p)) continue;
            const T* vj = v + j * hv.ld_qkv;
            for (int64_t c = 0; c < sh.d; ++c) acc[c] += e * drop_scale * vj[c];
          }
          m = m_new;
        }
        T* out = ctx + hv.ctx(sh, bi, hd) + i * hv.ld_ctx;
        for (int64_t c = 0; c < sh.d; ++c) out[c] = T(acc[c] / l);
        lse[(bi * sh.heads + hd) * sh.s + i] = T(m + std::log(l));
      }
    }
  }
}

template <class T>
void flash_attention_backward(const T* qkv, const T* ctx, const T* lse, const T* d_ctx, T* d_qkv,
                              const AttentionShape& sh, double scale, const Dropout* dropout, int64_t head0,
                              const int64_t* sample_index) {
  check_attention(sh);
  const HeadView hv = head_view(sh);
  const double drop_scale = dropout ? keep_scale(dropout->p) : 1.0;
  std::fill(d_qkv, d_qkv + sh.s * sh.b * sh.qkv_width(), T(0));
  std::vector<double> dq(sh.d);
  for (int64_t bi = 0; bi < sh.b; ++bi) {
    uint64_t key = sample_key(dropout, sample_index, bi);
    for (int64_t hd = 0; hd < sh.heads; ++hd) {
      uint64_t key_h = absorb(key, head0 + hd);
      const T* q = qkv + hv.q(sh, bi, hd);
      const T* k = qkv + hv.k(sh, bi, hd);
      const T* v = qkv + hv.v(sh, bi, hd);
      T* dk = d_qkv + hv.k(sh, bi, hd);
      T* dv = d_qkv + hv.v(sh, bi, hd);
      for (int64_t i = 0; i < sh.s; ++i) {
        uint64_t key_q = absorb(key_h, i);
        const T* qi = q + i * hv.ld_qkv;
        const T* oi = ctx + hv.ctx(sh, bi, hd) + i * hv.ld_ctx;
        const T* doi = d_ctx + hv.ctx(sh, bi, hd) + i * hv.ld_ctx;
        // rowsum(dP ⊙ P) = dO_i·O_i, with or without dropout.
        const double delta = dot(doi, oi, sh.d);
        const double row_lse = lse[(bi * sh.heads + hd) * sh.s + i];
        std::fill(dq.begin(), dq.end(), 0.0);
        for (int64_t j = 0; j <= i; ++j) {
          const T* kj = k + j * hv.ld_qkv;
          const T* vj = v + j * hv.ld_qkv;
          double p = std::exp(scale * dot(qi, kj, sh.d) - row_lse);
          bool keep = !dropout || keep_from(absorb(key_q, j), dropout->p);
          double p_used = keep ? p * drop_scale : 0.0;
          double dp = keep ? dot(doi, vj, sh.d) * drop_scale : 0.0;
          double ds = scale * p * (dp - delta);
          T* dkj = dk + j * hv.ld_qkv;
          T* dvj = dv + j * hv.ld_qkv;
          for (int64_t c = 0; c < sh.d; ++c) {
            dq[c] += ds * kj[c];
            dkj[c] += T(ds * qi[c]);
            dvj[c] += T(p_used * doi[c]);
          }
        }
        T* dqi = d_qkv + hv.q(sh, bi, hd) + i * hv.ld_qkv;
        for (int64_t c = 0; c < sh.d; ++c) dqi[c] = T(dq[c]);
      }
    }
  }
}

// ---- Explicit instantiations ----

#define STEPCAST_CPU_KERNELS_ATTENTION(T)                                                                              \
  template void rotary_forward<T>(T*, const AttentionShape&, double, int64_t);                                         \
  template void rotary_backward<T>(T*, const AttentionShape&, double, int64_t);                                        \
  template void attention_score_forward<T>(const T*, T*, const AttentionShape&, double);                               \
  template void softmax_forward<T>(const T*, T*, int64_t, int64_t);                                                    \
  template void attention_dropout_forward<T>(const T*, T*, uint8_t*, const AttentionShape&, const Dropout&, int64_t,   \
                                             const int64_t*);                                                          \
  template void attention_value_forward<T>(const T*, const T*, T*, const AttentionShape&);                             \
  template void attention_value_backward<T>(const T*, const T*, const T*, T*, T*, const AttentionShape&);              \
  template void softmax_backward<T>(const T*, const T*, T*, int64_t, int64_t);                                         \
  template void attention_score_backward<T>(const T*, const T*, T*, const AttentionShape&, double);                    \
  template void flash_attention_forward<T>(const T*, T*, T*, const AttentionShape&, double, const Dropout*, int64_t,   \
                                           const int64_t*);                                                            \
  template void flash_attention_backward<T>(const T*, const T*, const T*, const T*, T*, const AttentionShape&, double, \
                                            const Dropout*, int64_t, const int64_t*);

STEPCAST_CPU_KERNELS_ATTENTION(float)
STEPCAST_CPU_KERNELS_ATTENTION(double)

#undef STEPCAST_CPU_KERNELS_ATTENTION

}  // namespace stepcast::cpu
