// The CPU kernels of context parallelism (cpu_kernels.hpp): K/V packed out of qkv and their
// gradients put back, flash attention of the local queries over one K/V block with the causal
// mask and the dropout hash taken at global token positions (so a context-parallel run draws
// the masks a single rank draws), and the log-sum-exp merge of partial outputs.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu_kernels.hpp"
#include "cpu_kernels_detail.hpp"
#include "errors.hpp"

namespace stepcast::cpu {

using namespace detail;

namespace {

// Offsets inside qkv [s, b, qkv_width], a K/V block [n, b, 2·kv_heads·d], ctx [s, b, heads·d].
struct CpView {
  const AttentionShape& sh;
  int64_t kv_width() const { return 2 * sh.kv_heads * sh.d; }
  int64_t group() const { return sh.heads / sh.kv_heads; }
  int64_t q(int64_t i, int64_t bi, int64_t hd) const { return (i * sh.b + bi) * sh.qkv_width() + hd * sh.d; }
  int64_t k(int64_t j, int64_t bi, int64_t hd) const { return (j * sh.b + bi) * kv_width() + hd / group() * sh.d; }
  int64_t v(int64_t j, int64_t bi, int64_t hd) const {
    return (j * sh.b + bi) * kv_width() + (sh.kv_heads + hd / group()) * sh.d;
  }
  int64_t ctx(int64_t i, int64_t bi, int64_t hd) const { return (i * sh.b + bi) * sh.heads * sh.d + hd * sh.d; }
  int64_t lse(int64_t i, int64_t bi, int64_t hd) const { return (bi * sh.heads + hd) * sh.s + i; }
};

void check_cp(const AttentionShape& sh, int64_t n) {
  STEPCAST_CHECK(sh.s > 0 && sh.b > 0 && sh.heads > 0 && sh.kv_heads > 0 && sh.d > 0 && n > 0,
                 "context-parallel attention shape must be positive");
  STEPCAST_CHECK(sh.heads % sh.kv_heads == 0, "heads must be a multiple of kv_heads");
}

}  // namespace

template <class T>
void a2a_heads(const T* x, T* y, int64_t rows, const std::vector<int64_t>& sections, int64_t parts, bool split) {
  int64_t width = 0;
  for (int64_t w : sections) {
    STEPCAST_CHECK(w % parts == 0, "a2a: a section of " + std::to_string(w) + " not split in " + std::to_string(parts));
    width += w;
  }
  const int64_t piece_width = width / parts;
  for (int64_t j = 0; j < parts; ++j) {
    for (int64_t row = 0; row < rows; ++row) {
      int64_t at = row * width, piece_at = (j * rows + row) * piece_width;
      for (int64_t w : sections) {
        const int64_t p = w / parts;
        if (split) std::copy(x + at + j * p, x + at + (j + 1) * p, y + piece_at);
        else std::copy(x + piece_at, x + piece_at + p, y + at + j * p);
        at += w;
        piece_at += p;
      }
    }
  }
}

template <class T>
void permute_rows(const T* x, T* y, const int64_t* index, int64_t n, int64_t width, bool gather) {
  for (int64_t i = 0; i < n; ++i) {
    if (gather) std::copy(x + index[i] * width, x + (index[i] + 1) * width, y + i * width);
    else std::copy(x + i * width, x + (i + 1) * width, y + index[i] * width);
  }
}

template <class T>
void cp_kv_pack(const T* qkv, T* kv, const AttentionShape& sh) {
  const int64_t width = 2 * sh.kv_heads * sh.d;
  for (int64_t row = 0; row < sh.s * sh.b; ++row) {
    std::copy(qkv + row * sh.qkv_width() + sh.heads * sh.d, qkv + (row + 1) * sh.qkv_width(), kv + row * width);
  }
}

template <class T>
void cp_kv_unpack(const T* d_kv, T* d_qkv, const AttentionShape& sh) {
  const int64_t width = 2 * sh.kv_heads * sh.d;
  for (int64_t row = 0; row < sh.s * sh.b; ++row) {
    std::copy(d_kv + row * width, d_kv + (row + 1) * width, d_qkv + row * sh.qkv_width() + sh.heads * sh.d);
  }
}

template <class T>
void cp_flash_forward(const T* qkv, const T* kv, int64_t n, const int64_t* q_pos, const int64_t* kv_pos, T* ctx,
                      T* lse, const AttentionShape& sh, double scale, const Dropout* dropout, int64_t head0,
                      const int64_t* sample_index) {
  check_cp(sh, n);
  const CpView at{sh};
  const double drop_scale = dropout ? keep_scale(dropout->p) : 1.0;
  std::vector<double> score(size_t(n), 0.0), acc(size_t(sh.d));
  for (int64_t bi = 0; bi < sh.b; ++bi) {
    uint64_t key = sample_key(dropout, sample_index, bi);
    for (int64_t hd = 0; hd < sh.heads; ++hd) {
      uint64_t key_h = absorb(key, head0 + hd);
      for (int64_t i = 0; i < sh.s; ++i) {
        uint64_t key_q = absorb(key_h, q_pos[i]);
        const T* qi = qkv + at.q(i, bi, hd);
        double m = kNegInf;
        for (int64_t j = 0; j < n; ++j) {
          if (kv_pos[j] > q_pos[i]) continue;
          score[size_t(j)] = scale * dot(qi, kv + at.k(j, bi, hd), sh.d);
          m = std::max(m, score[size_t(j)]);
        }
        std::fill(acc.begin(), acc.end(), 0.0);
        double l = 0;
        for (int64_t j = 0; j < n && m > kNegInf; ++j) {
          if (kv_pos[j] > q_pos[i]) continue;
          double e = std::exp(score[size_t(j)] - m);
          l += e;
          if (dropout && !keep_from(absorb(key_q, kv_pos[j]), dropout->p)) continue;
          const T* vj = kv + at.v(j, bi, hd);
          for (int64_t c = 0; c < sh.d; ++c) acc[size_t(c)] += e * drop_scale * double(vj[c]);
        }
        T* out = ctx + at.ctx(i, bi, hd);
        for (int64_t c = 0; c < sh.d; ++c) out[c] = l > 0 ? T(acc[size_t(c)] / l) : T(0);
        lse[at.lse(i, bi, hd)] = l > 0 ? T(m + std::log(l)) : T(kNegInf);  // −inf: no key visible
      }
    }
  }
}

template <class T>
void cp_flash_backward(const T* qkv, const T* kv, int64_t n, const int64_t* q_pos, const int64_t* kv_pos,
                       const T* ctx, const T* lse, const T* d_ctx, T* d_qkv, bool accumulate, T* d_kv,
                       const AttentionShape& sh, double scale, const Dropout* dropout, int64_t head0,
                       const int64_t* sample_index) {
  check_cp(sh, n);
  const CpView at{sh};
  const double drop_scale = dropout ? keep_scale(dropout->p) : 1.0;
  if (!accumulate) std::fill(d_qkv, d_qkv + sh.s * sh.b * sh.qkv_width(), T(0));
  std::fill(d_kv, d_kv + n * sh.b * at.kv_width(), T(0));
  std::vector<double> dq(size_t(sh.d));
  for (int64_t bi = 0; bi < sh.b; ++bi) {
    uint64_t key = sample_key(dropout, sample_index, bi);
    for (int64_t hd = 0; hd < sh.heads; ++hd) {
      uint64_t key_h = absorb(key, head0 + hd);
      for (int64_t i = 0; i < sh.s; ++i) {
        uint64_t key_q = absorb(key_h, q_pos[i]);
        const T* qi = qkv + at.q(i, bi, hd);
        const T* doi = d_ctx + at.ctx(i, bi, hd);
        const double delta = dot(doi, ctx + at.ctx(i, bi, hd), sh.d);  // rowsum(dP ⊙ P) = dO·O
        const double row_lse = lse[at.lse(i, bi, hd)];
        std::fill(dq.begin(), dq.end(), 0.0);
        for (int64_t j = 0; j < n; ++j) {
          if (kv_pos[j] > q_pos[i]) continue;
          const T* kj = kv + at.k(j, bi, hd);
          const T* vj = kv + at.v(j, bi, hd);
          double p = std::exp(scale * dot(qi, kj, sh.d) - row_lse);
          bool keep = !dropout || keep_from(absorb(key_q, kv_pos[j]), dropout->p);
          double p_used = keep ? p * drop_scale : 0.0;
          double dp = keep ? dot(doi, vj, sh.d) * drop_scale : 0.0;
          double ds = scale * p * (dp - delta);
          T* dkj = d_kv + at.k(j, bi, hd);
          T* dvj = d_kv + at.v(j, bi, hd);
          for (int64_t c = 0; c < sh.d; ++c) {
            dq[size_t(c)] += ds * double(kj[c]);
            dkj[c] += T(ds * double(qi[c]));
            dvj[c] += T(p_used * double(doi[c]));
          }
        }
        T* dqi = d_qkv + at.q(i, bi, hd);
        for (int64_t c = 0; c < sh.d; ++c) dqi[c] = T(double(dqi[c]) + dq[size_t(c)]);
      }
    }
  }
}

template <class T>
void cp_merge(T* ctx, T* lse, const T* ctx_part, const T* lse_part, const AttentionShape& sh) {
  const CpView at{sh};
  for (int64_t bi = 0; bi < sh.b; ++bi) {
    for (int64_t hd = 0; hd < sh.heads; ++hd) {
      for (int64_t i = 0; i < sh.s; ++i) {
        const double a = lse[at.lse(i, bi, hd)], b = lse_part[at.lse(i, bi, hd)];
        if (b == kNegInf) continue;  // the block held no key this query sees
        const double top = std::max(a, b);
        const double merged = top + std::log(std::exp(a - top) + std::exp(b - top));
        const double wa = std::exp(a - merged), wb = std::exp(b - merged);
        T* out = ctx + at.ctx(i, bi, hd);
        const T* part = ctx_part + at.ctx(i, bi, hd);
        for (int64_t c = 0; c < sh.d; ++c) out[c] = T(wa * double(out[c]) + wb * double(part[c]));
        lse[at.lse(i, bi, hd)] = T(merged);
      }
    }
  }
}


// ---- Materialized attention over the gathered K/V (scores [b, heads, s, n]) ----

template <class T>
void cp_score_forward(const T* qkv, const T* kv, int64_t n, const int64_t* q_pos, const int64_t* kv_pos, T* scores,
                      const AttentionShape& sh, double scale) {
  check_cp(sh, n);
  const CpView at{sh};
  for (int64_t bi = 0; bi < sh.b; ++bi)
    for (int64_t hd = 0; hd < sh.heads; ++hd)
      for (int64_t i = 0; i < sh.s; ++i) {
        T* row = scores + ((bi * sh.heads + hd) * sh.s + i) * n;
        for (int64_t j = 0; j < n; ++j) {
          row[j] = kv_pos[j] > q_pos[i] ? T(kNegInf) : T(scale * dot(qkv + at.q(i, bi, hd), kv + at.k(j, bi, hd), sh.d));
        }
      }
}

template <class T>
void cp_attention_dropout_forward(const T* probs, T* probs_drop, uint8_t* mask, const AttentionShape& sh, int64_t n,
                                  const int64_t* q_pos, const int64_t* kv_pos, const Dropout& dropout, int64_t head0,
                                  const int64_t* sample_index) {
  check_cp(sh, n);
  const T scale = T(keep_scale(dropout.p));
  for (int64_t bi = 0; bi < sh.b; ++bi) {
    uint64_t key = sample_key(&dropout, sample_index, bi);
    for (int64_t hd = 0; hd < sh.heads; ++hd) {
      uint64_t key_h = absorb(key, head0 + hd);
      for (int64_t i = 0; i < sh.s; ++i) {
        uint64_t key_q = absorb(key_h, q_pos[i]);
        const int64_t base = ((bi * sh.heads + hd) * sh.s + i) * n;
        for (int64_t j = 0; j < n; ++j) {
          bool keep = kv_pos[j] <= q_pos[i] && keep_from(absorb(key_q, kv_pos[j]), dropout.p);
          mask[base + j] = keep ? 1 : 0;
          probs_drop[base + j] = keep ? probs[base + j] * scale : T(0);
        }
      }
    }
  }
}

template <class T>
void cp_value_forward(const T* probs_used, const T* kv, int64_t n, T* ctx, const AttentionShape& sh) {
  check_cp(sh, n);
  const CpView at{sh};
  std::vector<double> acc(size_t(sh.d));
  for (int64_t bi = 0; bi < sh.b; ++bi)
    for (int64_t hd = 0; hd < sh.heads; ++hd)
      for (int64_t i = 0; i < sh.s; ++i) {
        const T* p = probs_used + ((bi * sh.heads + hd) * sh.s + i) * n;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j < n; ++j) {
          if (p[j] == T(0)) continue;
          const T* vj = kv + at.v(j, bi, hd);
          for (int64_t c = 0; c < sh.d; ++c) acc[size_t(c)] += double(p[j]) * double(vj[c]);
        }
        T* out = ctx + at.ctx(i, bi, hd);
        for (int64_t c = 0; c < sh.d; ++c) out[c] = T(acc[size_t(c)]);
      }
}

template <class T>
void cp_value_backward(const T* d_ctx, const T* probs_used, const T* kv, int64_t n, T* d_probs_used, T* d_kv,
                       const AttentionShape& sh) {
  check_cp(sh, n);
  const CpView at{sh};
  std::fill(d_kv, d_kv + n * sh.b * at.kv_width(), T(0));
  for (int64_t bi = 0; bi < sh.b; ++bi)
    for (int64_t hd = 0; hd < sh.heads; ++hd)
      for (int64_t i = 0; i < sh.s; ++i) {
        const int64_t row = ((bi * sh.heads + hd) * sh.s + i) * n;
        const T* doi = d_ctx + at.ctx(i, bi, hd);
        for (int64_t j = 0; j < n; ++j) {
          d_probs_used[row + j] = T(dot(doi, kv + at.v(j, bi, hd), sh.d));
          const double p = double(probs_used[row + j]);
          if (p == 0) continue;
          T* dvj = d_kv + at.v(j, bi, hd);
          for (int64_t c = 0; c < sh.d; ++c) dvj[c] += T(p * double(doi[c]));
        }
      }
}

template <class T>
void cp_score_backward(const T* d_scores, const T* qkv, const T* kv, int64_t n, T* d_qkv, T* d_kv,
                       const AttentionShape& sh, double scale) {
  check_cp(sh, n);
  const CpView at{sh};
  std::vector<double> dq(size_t(sh.d));
  for (int64_t bi = 0; bi < sh.b; ++bi)
    for (int64_t hd = 0; hd < sh.heads; ++hd)
      for (int64_t i = 0; i < sh.s; ++i) {
        const T* ds = d_scores + ((bi * sh.heads + hd) * sh.s + i) * n;
        const T* qi = qkv + at.q(i, bi, hd);
        std::fill(dq.begin(), dq.end(), 0.0);
        for (int64_t j = 0; j < n; ++j) {
          const double g = scale * double(ds[j]);
          if (g == 0) continue;
          const T* kj = kv + at.k(j, bi, hd);
          T* dkj = d_kv + at.k(j, bi, hd);
          for (int64_t c = 0; c < sh.d; ++c) {
            dq[size_t(c)] += g * double(kj[c]);
            dkj[c] += T(g * double(qi[c]));
          }
        }
        T* dqi = d_qkv + at.q(i, bi, hd);
        for (int64_t c = 0; c < sh.d; ++c) dqi[c] = T(dq[size_t(c)]);
      }
}

#define STEPCAST_CPU_KERNELS_CP(T)                                                                                    \
  template void a2a_heads<T>(const T*, T*, int64_t, const std::vector<int64_t>&, int64_t, bool);                    \
  template void permute_rows<T>(const T*, T*, const int64_t*, int64_t, int64_t, bool);                               \
  template void cp_kv_pack<T>(const T*, T*, const AttentionShape&);                                                   \
  template void cp_kv_unpack<T>(const T*, T*, const AttentionShape&);                                                 \
  template void cp_flash_forward<T>(const T*, const T*, int64_t, const int64_t*, const int64_t*, T*, T*,              \
                                    const AttentionShape&, double, const Dropout*, int64_t, const int64_t*);          \
  template void cp_flash_backward<T>(const T*, const T*, int64_t, const int64_t*, const int64_t*, const T*,          \
                                     const T*, const T*, T*, bool, T*, const AttentionShape&, double,                 \
                                     const Dropout*, int64_t, const int64_t*);                                        \
  template void cp_merge<T>(T*, T*, const T*, const T*, const AttentionShape&);                                      \
  template void cp_score_forward<T>(const T*, const T*, int64_t, const int64_t*, const int64_t*, T*,                  \
                                    const AttentionShape&, double);                                                   \
  template void cp_attention_dropout_forward<T>(const T*, T*, uint8_t*, const AttentionShape&, int64_t,               \
                                                const int64_t*, const int64_t*, const Dropout&, int64_t,              \
                                                const int64_t*);                                                      \
  template void cp_value_forward<T>(const T*, const T*, int64_t, T*, const AttentionShape&);                          \
  template void cp_value_backward<T>(const T*, const T*, const T*, int64_t, T*, T*, const AttentionShape&);           \
  template void cp_score_backward<T>(const T*, const T*, const T*, int64_t, T*, T*, const AttentionShape&, double);

STEPCAST_CPU_KERNELS_CP(float)
STEPCAST_CPU_KERNELS_CP(double)

#undef STEPCAST_CPU_KERNELS_CP

}  // namespace stepcast::cpu
