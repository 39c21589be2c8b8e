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

#define STEPCAST_CPU_KERNELS_CP(T)                                                                                    \
  template void cp_kv_pack<T>(const T*, T*, const AttentionShape&);                                                   \
  template void cp_kv_unpack<T>(const T*, T*, const AttentionShape&);                                                 \
  template void cp_flash_forward<T>(const T*, const T*, int64_t, const int64_t*, const int64_t*, T*, T*,              \
                                    const AttentionShape&, double, const Dropout*, int64_t, const int64_t*);          \
  template void cp_flash_backward<T>(const T*, const T*, int64_t, const int64_t*, const int64_t*, const T*,          \
                                     const T*, const T*, T*, bool, T*, const AttentionShape&, double,                 \
                                     const Dropout*, int64_t, const int64_t*);                                        \
  template void cp_merge<T>(T*, T*, const T*, const T*, const AttentionShape&);

STEPCAST_CPU_KERNELS_CP(float)
STEPCAST_CPU_KERNELS_CP(double)

#undef STEPCAST_CPU_KERNELS_CP

}  // namespace stepcast::cpu
