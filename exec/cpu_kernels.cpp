// The CPU backend's kernels (see cpu_kernels.hpp for shapes and conventions). GEMMs go through
// OpenBLAS; everything else is plain loops that accumulate reductions in double, so the fp32
// path is a tight reference and the fp64 path reproduces single-rank results across plans.
#include "cpu_kernels.hpp"

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>
#include <vector>

#include "errors.hpp"

namespace stepcast::cpu {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

int blas_int(int64_t v) {
  STEPCAST_CHECK(v >= 0 && v <= INT_MAX, "gemm dimension outside BLAS int range");
  return int(v);
}

void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
               const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, double alpha,
               const double* a, int lda, const double* b, int ldb, double beta, double* c,
               int ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// ---- dropout hash ----

constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ull;

// SplitMix64's finalizer: a bijection on 64-bit words with full avalanche.
inline uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline uint64_t absorb(uint64_t h, int64_t word) { return mix(h + kGamma + uint64_t(word)); }

// The hash state after seed, site, step, layer and sample: shared by a whole batch row.
uint64_t sample_key(uint64_t seed, DropoutSite site, int64_t step, int64_t layer, int64_t sample) {
  uint64_t h = mix(seed);
  h = absorb(h, int64_t(site));
  h = absorb(h, step);
  h = absorb(h, layer);
  return absorb(h, sample);
}

inline bool keep_from(uint64_t h, double p) { return double(h >> 11) * 0x1.0p-53 >= p; }

double keep_scale(double p) {
  STEPCAST_CHECK(p >= 0 && p < 1, "dropout probability must be in [0, 1)");
  return 1.0 / (1.0 - p);
}

void check_attention(const AttentionShape& sh) {
  STEPCAST_CHECK(sh.s > 0 && sh.b > 0 && sh.heads > 0 && sh.kv_heads > 0 && sh.d > 0,
                 "attention shape must be positive");
  STEPCAST_CHECK(sh.heads % sh.kv_heads == 0, "heads must be a multiple of kv_heads");
}

// Offsets of one (batch row, head) inside qkv / ctx; rows of a head are ld apart.
struct HeadView {
  int64_t ld_qkv, ld_ctx, group;
  int64_t q(const AttentionShape& sh, int64_t bi, int64_t hd) const {
    return bi * sh.qkv_width() + hd * sh.d;
  }
  int64_t k(const AttentionShape& sh, int64_t bi, int64_t hd) const {
    return bi * sh.qkv_width() + (sh.heads + hd / group) * sh.d;
  }
  int64_t v(const AttentionShape& sh, int64_t bi, int64_t hd) const {
    return bi * sh.qkv_width() + (sh.heads + sh.kv_heads + hd / group) * sh.d;
  }
  int64_t ctx(const AttentionShape& sh, int64_t bi, int64_t hd) const {
    return bi * sh.heads * sh.d + hd * sh.d;
  }
};

HeadView head_view(const AttentionShape& sh) {
  return {sh.b * sh.qkv_width(), sh.b * sh.heads * sh.d, sh.heads / sh.kv_heads};
}

template <class T>
double dot(const T* x, const T* y, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += double(x[i]) * double(y[i]);
  return sum;
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

// ---- GEMM and linear layers ----

template <class T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
    return;
  }
  blas_gemm(trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, blas_int(m),
            blas_int(n), blas_int(k), alpha, a, blas_int(lda), b, blas_int(ldb), beta, c,
            blas_int(ldc));
}

template <class T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          const T* b, T beta, T* c) {
  gemm(trans_a, trans_b, m, n, k, alpha, a, trans_a ? m : k, b, trans_b ? k : n, beta, c, n);
}

template <class T>
void linear_forward(const T* x, const T* w, const T* bias, T* y, int64_t tokens, int64_t in,
                    int64_t out) {
  gemm<T>(false, true, tokens, out, in, T(1), x, w, T(0), y);
  if (!bias) return;
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t o = 0; o < out; ++o) y[t * out + o] += bias[o];
}

template <class T>
void linear_backward_data(const T* dy, const T* w, T* dx, int64_t tokens, int64_t in, int64_t out,
                          bool accumulate) {
  gemm<T>(false, false, tokens, in, out, T(1), dy, w, accumulate ? T(1) : T(0), dx);
}

template <class T>
void linear_backward_weight(const T* dy, const T* x, T* dw, T* dbias, int64_t tokens, int64_t in,
                            int64_t out) {
  gemm<T>(true, false, out, in, tokens, T(1), dy, x, T(1), dw);
  if (!dbias) return;
  std::vector<double> sum(out, 0.0);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t o = 0; o < out; ++o) sum[o] += dy[t * out + o];
  for (int64_t o = 0; o < out; ++o) dbias[o] += T(sum[o]);
}

// ---- Dropout ----

bool dropout_keep(uint64_t seed, DropoutSite site, int64_t step, int64_t layer, int64_t sample,
                  int64_t i, int64_t j, int64_t k, double p) {
  uint64_t h = sample_key(seed, site, step, layer, sample);
  return keep_from(absorb(absorb(absorb(h, i), j), k), p);
}

template <class T>
void dropout_add_forward(const T* x, const T* residual, T* out, uint8_t* mask, int64_t s,
                         int64_t b, int64_t h, const Dropout& dropout, int64_t s0,
                         const int64_t* sample_index) {
  if (dropout.p == 0) {
    const int64_t n = s * b * h;
    for (int64_t i = 0; i < n; ++i) out[i] = (residual ? residual[i] : T(0)) + x[i];
    if (mask) std::fill(mask, mask + n, uint8_t(1));
    return;
  }
  STEPCAST_CHECK(mask && sample_index, "dropout_add_forward: dropout needs a mask and sample indices");
  const T scale = T(keep_scale(dropout.p));
  for (int64_t bi = 0; bi < b; ++bi) {
    uint64_t key = sample_key(dropout.seed, dropout.site, dropout.step, dropout.layer,
                              sample_index[bi]);
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

// ---- Embeddings ----

template <class T>
void embedding_forward(const int32_t* tokens, const T* w, T* out, int64_t s, int64_t b, int64_t h,
                       int64_t v0, int64_t v_local) {
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
void embedding_backward(const int32_t* tokens, const T* dout, T* dw, int64_t s, int64_t b,
                        int64_t h, int64_t v0, int64_t v_local) {
  for (int64_t t = 0; t < s * b; ++t) {
    int64_t row = tokens[t] - v0;
    if (row < 0 || row >= v_local) continue;
    for (int64_t j = 0; j < h; ++j) dw[row * h + j] += dout[t * h + j];
  }
}

template <class T>
void position_add_forward(T* x, const T* pos, int64_t s, int64_t b, int64_t h, int64_t s0,
                          int64_t max_positions) {
  STEPCAST_CHECK(s0 >= 0 && s0 + s <= max_positions, "position beyond max_position_embeddings");
  for (int64_t si = 0; si < s; ++si)
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t j = 0; j < h; ++j) x[(si * b + bi) * h + j] += pos[(s0 + si) * h + j];
}

template <class T>
void position_add_backward(const T* dx, T* dpos, int64_t s, int64_t b, int64_t h, int64_t s0,
                           int64_t max_positions) {
  STEPCAST_CHECK(s0 >= 0 && s0 + s <= max_positions, "position beyond max_position_embeddings");
  for (int64_t si = 0; si < s; ++si)
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t j = 0; j < h; ++j) dpos[(s0 + si) * h + j] += dx[(si * b + bi) * h + j];
}

// ---- Norms ----

template <class T>
void layernorm_forward(const T* x, const T* w, const T* bias, T* y, int64_t rows, int64_t h,
                       double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * h;
    double mean = 0, var = 0;
    for (int64_t j = 0; j < h; ++j) mean += xr[j];
    mean /= double(h);
    for (int64_t j = 0; j < h; ++j) var += (xr[j] - mean) * (xr[j] - mean);
    double rstd = 1.0 / std::sqrt(var / double(h) + eps);
    for (int64_t j = 0; j < h; ++j) y[r * h + j] = T((xr[j] - mean) * rstd * w[j] + bias[j]);
  }
}

template <class T>
void layernorm_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, T* db, int64_t rows,
                        int64_t h, double eps) {
  std::vector<double> dw_sum(h, 0.0), db_sum(h, 0.0), xhat(h);
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * h;
    const T* dyr = dy + r * h;
    double mean = 0, var = 0;
    for (int64_t j = 0; j < h; ++j) mean += xr[j];
    mean /= double(h);
    for (int64_t j = 0; j < h; ++j) var += (xr[j] - mean) * (xr[j] - mean);
    double rstd = 1.0 / std::sqrt(var / double(h) + eps);
    double mean_g = 0, mean_gx = 0;
    for (int64_t j = 0; j < h; ++j) {
      xhat[j] = (xr[j] - mean) * rstd;
      double g = double(dyr[j]) * w[j];
      mean_g += g;
      mean_gx += g * xhat[j];
      dw_sum[j] += double(dyr[j]) * xhat[j];
      db_sum[j] += dyr[j];
    }
    mean_g /= double(h);
    mean_gx /= double(h);
    for (int64_t j = 0; j < h; ++j) {
      double g = double(dyr[j]) * w[j];
      dx[r * h + j] += T(rstd * (g - mean_g - xhat[j] * mean_gx));
    }
  }
  for (int64_t j = 0; j < h; ++j) {
    dw[j] += T(dw_sum[j]);
    db[j] += T(db_sum[j]);
  }
}

template <class T>
void rmsnorm_forward(const T* x, const T* w, T* y, int64_t rows, int64_t h, double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * h;
    double rstd = 1.0 / std::sqrt(dot(xr, xr, h) / double(h) + eps);
    for (int64_t j = 0; j < h; ++j) y[r * h + j] = T(xr[j] * rstd * w[j]);
  }
}

template <class T>
void rmsnorm_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, int64_t rows, int64_t h,
                      double eps) {
  std::vector<double> dw_sum(h, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * h;
    const T* dyr = dy + r * h;
    double rstd = 1.0 / std::sqrt(dot(xr, xr, h) / double(h) + eps);
    double mean_gx = 0;
    for (int64_t j = 0; j < h; ++j) {
      double xhat = xr[j] * rstd;
      mean_gx += double(dyr[j]) * w[j] * xhat;
      dw_sum[j] += double(dyr[j]) * xhat;
    }
    mean_gx /= double(h);
    for (int64_t j = 0; j < h; ++j) {
      double xhat = xr[j] * rstd;
      dx[r * h + j] += T(rstd * (double(dyr[j]) * w[j] - xhat * mean_gx));
    }
  }
  for (int64_t j = 0; j < h; ++j) dw[j] += T(dw_sum[j]);
}

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
      gemm<T>(false, true, sh.s, sh.s, sh.d, T(scale), qkv + hv.q(sh, bi, hd), hv.ld_qkv,
              qkv + hv.k(sh, bi, hd), hv.ld_qkv, T(0), sc, sh.s);
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
void attention_dropout_forward(const T* probs, T* probs_drop, uint8_t* mask,
                               const AttentionShape& sh, const Dropout& dropout, int64_t head0,
                               const int64_t* sample_index) {
  check_attention(sh);
  const T scale = T(keep_scale(dropout.p));
  for (int64_t bi = 0; bi < sh.b; ++bi) {
    uint64_t key = sample_key(dropout.seed, dropout.site, dropout.step, dropout.layer,
                              sample_index[bi]);
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
      gemm<T>(false, false, sh.s, sh.d, sh.s, T(1), probs_used + (bi * sh.heads + hd) * sh.s * sh.s,
              sh.s, qkv + hv.v(sh, bi, hd), hv.ld_qkv, T(0), ctx + hv.ctx(sh, bi, hd), hv.ld_ctx);
}

template <class T>
void attention_value_backward(const T* d_ctx, const T* probs_used, const T* qkv, T* d_probs_used,
                              T* d_qkv, const AttentionShape& sh) {
  check_attention(sh);
  const HeadView hv = head_view(sh);
  for (int64_t bi = 0; bi < sh.b; ++bi) {
    for (int64_t hd = 0; hd < sh.heads; ++hd) {
      const int64_t sq = (bi * sh.heads + hd) * sh.s * sh.s;
      const T* dc = d_ctx + hv.ctx(sh, bi, hd);
      gemm<T>(false, true, sh.s, sh.s, sh.d, T(1), dc, hv.ld_ctx, qkv + hv.v(sh, bi, hd), hv.ld_qkv,
              T(0), d_probs_used + sq, sh.s);
      T beta = hd % hv.group == 0 ? T(0) : T(1);  // first head of its kv group overwrites
      gemm<T>(true, false, sh.s, sh.d, sh.s, T(1), probs_used + sq, sh.s, dc, hv.ld_ctx, beta,
              d_qkv + hv.v(sh, bi, hd), hv.ld_qkv);
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
void attention_score_backward(const T* d_scores, const T* qkv, T* d_qkv, const AttentionShape& sh,
                              double scale) {
  check_attention(sh);
  const HeadView hv = head_view(sh);
  for (int64_t bi = 0; bi < sh.b; ++bi) {
    for (int64_t hd = 0; hd < sh.heads; ++hd) {
      const T* ds = d_scores + (bi * sh.heads + hd) * sh.s * sh.s;
      gemm<T>(false, false, sh.s, sh.d, sh.s, T(scale), ds, sh.s, qkv + hv.k(sh, bi, hd),
              hv.ld_qkv, T(0), d_qkv + hv.q(sh, bi, hd), hv.ld_qkv);
      T beta = hd % hv.group == 0 ? T(0) : T(1);
      gemm<T>(true, false, sh.s, sh.d, sh.s, T(scale), ds, sh.s, qkv + hv.q(sh, bi, hd), hv.ld_qkv,
              beta, d_qkv + hv.k(sh, bi, hd), hv.ld_qkv);
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
    uint64_t key = dropout ? sample_key(dropout->seed, dropout->site, dropout->step,
                                        dropout->layer, sample_index[bi])
                           : 0;
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
                              const AttentionShape& sh, double scale, const Dropout* dropout,
                              int64_t head0, const int64_t* sample_index) {
  check_attention(sh);
  const HeadView hv = head_view(sh);
  const double drop_scale = dropout ? keep_scale(dropout->p) : 1.0;
  std::fill(d_qkv, d_qkv + sh.s * sh.b * sh.qkv_width(), T(0));
  std::vector<double> dq(sh.d);
  for (int64_t bi = 0; bi < sh.b; ++bi) {
    uint64_t key = dropout ? sample_key(dropout->seed, dropout->site, dropout->step,
                                        dropout->layer, sample_index[bi])
                           : 0;
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

// ---- MLP activations ----

namespace {
constexpr double kGeluC = 0.7978845608028654;  // √(2/π)
constexpr double kGeluA = 0.044715;
double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
}  // namespace

template <class T>
void gelu_forward(const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    double v = x[i];
    y[i] = T(0.5 * v * (1.0 + std::tanh(kGeluC * (v + kGeluA * v * v * v))));
  }
}

template <class T>
void gelu_backward(const T* x, const T* dy, T* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    double v = x[i];
    double t = std::tanh(kGeluC * (v + kGeluA * v * v * v));
    double grad = 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * kGeluC * (1.0 + 3.0 * kGeluA * v * v);
    dx[i] = T(dy[i] * grad);
  }
}

template <class T>
void swiglu_forward(const T* gate, const T* up, T* act, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    double g = gate[i];
    act[i] = T(g * sigmoid(g) * up[i]);
  }
}

template <class T>
void swiglu_backward(const T* gate, const T* up, const T* d_act, T* d_gate, T* d_up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    double g = gate[i], sg = sigmoid(g);
    d_gate[i] = T(double(d_act[i]) * up[i] * sg * (1.0 + g * (1.0 - sg)));
    d_up[i] = T(double(d_act[i]) * g * sg);
  }
}

// ---- Cross entropy ----

template <class T>
void cross_entropy_stats(const T* logits, const int32_t* targets, T* stats, int64_t tokens,
                         int64_t v0, int64_t v_local) {
  for (int64_t t = 0; t < tokens; ++t) {
    const T* row = logits + t * v_local;
    double max = kNegInf;
    for (int64_t j = 0; j < v_local; ++j) max = std::max(max, double(row[j]));
    double sum = 0;
    for (int64_t j = 0; j < v_local; ++j) sum += std::exp(double(row[j]) - max);
    STEPCAST_CHECK(targets[t] >= 0, "target ids must be non-negative");
    int64_t local = targets[t] - v0;
    stats[t] = T(max);
    stats[tokens + t] = T(sum);
    stats[2 * tokens + t] = local >= 0 && local < v_local ? row[local] : T(0);
  }
}

template <class T>
void cross_entropy_forward(const T* logits, const T* stats_all, int64_t tp, T* softmax, T* loss,
                           int64_t tokens, int64_t v_local) {
  for (int64_t t = 0; t < tokens; ++t) {
    double max = kNegInf, target_logit = 0, sum = 0;
    for (int64_t r = 0; r < tp; ++r) max = std::max(max, double(stats_all[r * 3 * tokens + t]));
    for (int64_t r = 0; r < tp; ++r) {
      const T* st = stats_all + r * 3 * tokens;
      sum += double(st[tokens + t]) * std::exp(double(st[t]) - max);
      target_logit += st[2 * tokens + t];
    }
    loss[t] = T(std::log(sum) + max - target_logit);
    const T* row = logits + t * v_local;
    for (int64_t j = 0; j < v_local; ++j)
      softmax[t * v_local + j] = T(std::exp(double(row[j]) - max) / sum);
  }
}

template <class T>
void cross_entropy_backward(const T* softmax, const int32_t* targets, T* dlogits, int64_t tokens,
                            int64_t v0, int64_t v_local, double scale) {
  for (int64_t t = 0; t < tokens; ++t) {
    int64_t local = targets[t] - v0;
    for (int64_t j = 0; j < v_local; ++j) {
      double onehot = j == local ? 1.0 : 0.0;
      dlogits[t * v_local + j] = T((double(softmax[t * v_local + j]) - onehot) * scale);
    }
  }
}

// ---- Optimizer ----

template <class T>
double grad_norm_sq(const T* g, int64_t n) {
  return dot(g, g, n);
}

double clip_coefficient(double total_norm, double max_norm) {
  return std::min(1.0, max_norm / (total_norm + 1e-6));
}

template <class T>
void adamw_step(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, int64_t n,
                const AdamW& config, int64_t step, double clip_coef) {
  STEPCAST_CHECK(step >= 1, "AdamW steps count from 1");
  const double bias1 = 1.0 - std::pow(config.beta1, double(step));
  const double bias2 = 1.0 - std::pow(config.beta2, double(step));
  for (int64_t i = 0; i < n; ++i) {
    double g = double(grad[i]) * clip_coef;
    double m = config.beta1 * exp_avg[i] + (1.0 - config.beta1) * g;
    double v = config.beta2 * exp_avg_sq[i] + (1.0 - config.beta2) * g * g;
    double update = (m / bias1) / (std::sqrt(v / bias2) + config.eps);
    double p = param[i];
    param[i] = T(p - config.lr * (update + config.weight_decay * p));
    exp_avg[i] = T(m);
    exp_avg_sq[i] = T(v);
  }
}

// ---- Explicit instantiations ----

#define STEPCAST_CPU_KERNELS(T)                                                                   \
  template void gemm<T>(bool, bool, int64_t, int64_t, int64_t, T, const T*, int64_t, const T*,   \
                        int64_t, T, T*, int64_t);                                                 \
  template void gemm<T>(bool, bool, int64_t, int64_t, int64_t, T, const T*, const T*, T, T*);    \
  template void linear_forward<T>(const T*, const T*, const T*, T*, int64_t, int64_t, int64_t);  \
  template void linear_backward_data<T>(const T*, const T*, T*, int64_t, int64_t, int64_t, bool); \
  template void linear_backward_weight<T>(const T*, const T*, T*, T*, int64_t, int64_t, int64_t); \
  template void dropout_add_forward<T>(const T*, const T*, T*, uint8_t*, int64_t, int64_t,       \
                                       int64_t, const Dropout&, int64_t, const int64_t*);        \
  template void dropout_backward<T>(const T*, const uint8_t*, T*, int64_t, double);              \
  template void embedding_forward<T>(const int32_t*, const T*, T*, int64_t, int64_t, int64_t,    \
                                     int64_t, int64_t);                                           \
  template void embedding_backward<T>(const int32_t*, const T*, T*, int64_t, int64_t, int64_t,   \
                                      int64_t, int64_t);                                          \
  template void position_add_forward<T>(T*, const T*, int64_t, int64_t, int64_t, int64_t,       \
                                        int64_t);                                                 \
  template void position_add_backward<T>(const T*, T*, int64_t, int64_t, int64_t, int64_t,      \
                                         int64_t);                                                \
  template void layernorm_forward<T>(const T*, const T*, const T*, T*, int64_t, int64_t, double); \
  template void layernorm_backward<T>(const T*, const T*, const T*, T*, T*, T*, int64_t, int64_t, \
                                      double);                                                    \
  template void rmsnorm_forward<T>(const T*, const T*, T*, int64_t, int64_t, double);            \
  template void rmsnorm_backward<T>(const T*, const T*, const T*, T*, T*, int64_t, int64_t,      \
                                    double);                                                      \
  template void rotary_forward<T>(T*, const AttentionShape&, double, int64_t);                   \
  template void rotary_backward<T>(T*, const AttentionShape&, double, int64_t);                  \
  template void attention_score_forward<T>(const T*, T*, const AttentionShape&, double);         \
  template void softmax_forward<T>(const T*, T*, int64_t, int64_t);                              \
  template void attention_dropout_forward<T>(const T*, T*, uint8_t*, const AttentionShape&,      \
                                             const Dropout&, int64_t, const int64_t*);           \
  template void attention_value_forward<T>(const T*, const T*, T*, const AttentionShape&);       \
  template void attention_value_backward<T>(const T*, const T*, const T*, T*, T*,                \
                                            const AttentionShape&);                              \
  template void softmax_backward<T>(const T*, const T*, T*, int64_t, int64_t);                   \
  template void attention_score_backward<T>(const T*, const T*, T*, const AttentionShape&,       \
                                            double);                                              \
  template void flash_attention_forward<T>(const T*, T*, T*, const AttentionShape&, double,      \
                                           const Dropout*, int64_t, const int64_t*);             \
  template void flash_attention_backward<T>(const T*, const T*, const T*, const T*, T*,          \
                                            const AttentionShape&, double, const Dropout*,       \
                                            int64_t, const int64_t*);                            \
  template void gelu_forward<T>(const T*, T*, int64_t);                                          \
  template void gelu_backward<T>(const T*, const T*, T*, int64_t);                               \
  template void swiglu_forward<T>(const T*, const T*, T*, int64_t);                              \
  template void swiglu_backward<T>(const T*, const T*, const T*, T*, T*, int64_t);               \
  template void cross_entropy_stats<T>(const T*, const int32_t*, T*, int64_t, int64_t, int64_t); \
  template void cross_entropy_forward<T>(const T*, const T*, int64_t, T*, T*, int64_t, int64_t); \
  template void cross_entropy_backward<T>(const T*, const int32_t*, T*, int64_t, int64_t,        \
                                          int64_t, double);                                       \
  template double grad_norm_sq<T>(const T*, int64_t);                                            \
  template void adamw_step<T>(T*, const T*, T*, T*, int64_t, const AdamW&, int64_t, double);

STEPCAST_CPU_KERNELS(float)
STEPCAST_CPU_KERNELS(double)

#undef STEPCAST_CPU_KERNELS

}  // namespace stepcast::cpu
