// Mixture-of-experts kernels (cpu_kernels.hpp's moe_*): softmax routing with top-k and capacity
// dropping, the load-balancing loss and its gradient, and the row moves of the permutation. Rows of
// a permuted buffer are given by a host map rows[t·k + j] (−1: the copy was dropped), which the
// interpreter derives from route_idx and the counts; the kernels never decide the layout.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu_kernels.hpp"
#include "errors.hpp"
#include "moe.hpp"

namespace stepcast::cpu {

template <class T>
void moe_route_forward(const T* logits, T* probs, T* route_w, int32_t* route_idx, int32_t* counts, int64_t tokens,
                       int64_t experts, int64_t top_k, int64_t capacity, bool normalize, bool drop_by_probs) {
  std::fill(counts, counts + experts, 0);
  // Under a capacity, by position the copies drop as they come; by probability after every token.
  const bool by_probs = drop_by_probs && capacity > 0, in_order = capacity > 0 && !by_probs;
  for (int64_t t = 0; t < tokens; ++t) {
    const T* l = logits + t * experts;
    T* p = probs + t * experts;
    double most = -std::numeric_limits<double>::infinity(), sum = 0;
    for (int64_t e = 0; e < experts; ++e) most = std::max(most, double(l[e]));
    for (int64_t e = 0; e < experts; ++e) sum += std::exp(double(l[e]) - most);
    for (int64_t e = 0; e < experts; ++e) p[e] = T(std::exp(double(l[e]) - most) / sum);
    // Top-k by probability, ties to the lower expert; by position, in token order each expert
    // keeps its first `capacity` copies (0: all), the rest are dropped (stored as −1 − e).
    for (int64_t j = 0; j < top_k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < experts; ++e) {
        bool taken = false;
        for (int64_t i = 0; i < j; ++i) {
          int32_t r = route_idx[t * top_k + i];
          taken = taken || (r >= 0 ? r : -1 - r) == e;
        }
        if (!taken && (best < 0 || double(p[e]) > double(p[best]))) best = e;
      }
      route_w[t * top_k + j] = p[best];
      bool kept = !in_order || counts[best] < capacity;
      if (kept && !by_probs) ++counts[best];
      route_idx[t * top_k + j] = kept ? int32_t(best) : int32_t(-1 - best);
    }
    if (normalize) {
      double chosen = 0;
      for (int64_t j = 0; j < top_k; ++j) chosen += double(route_w[t * top_k + j]);
      for (int64_t j = 0; j < top_k; ++j) route_w[t * top_k + j] = T(double(route_w[t * top_k + j]) / chosen);
    }
  }
  if (!by_probs) return;
  // By probability: each expert keeps its `capacity` copies of highest weight.
  std::vector<std::vector<int64_t>> copies(static_cast<size_t>(experts));
  for (int64_t i = 0; i < tokens * top_k; ++i) copies[size_t(route_idx[i])].push_back(i);
  for (int64_t e = 0; e < experts; ++e) {
    std::vector<int64_t>& mine = copies[size_t(e)];
    std::stable_sort(mine.begin(), mine.end(),
                     [&](int64_t a, int64_t b) { return double(route_w[a]) > double(route_w[b]); });
    for (size_t n = 0; n < mine.size(); ++n) {
      const bool kept = int64_t(n) < capacity;
      if (kept) ++counts[e];
      else route_idx[mine[n]] = int32_t(-1 - e);
    }
  }
}

namespace {

// The expert of a route entry, kept (e) or dropped (−1 − e).
int64_t expert_of(int32_t r) { return r >= 0 ? r : -1 - r; }

// Copies routed to each expert: `given` where the caller has them, else route_idx's.
std::vector<double> chosen_copies(const int32_t* route_idx, int64_t copies, int64_t experts, const double* given) {
  if (given) return std::vector<double>(given, given + experts);
  return routed_copies(route_idx, copies, experts);
}

}  // namespace

template <class T>
double moe_aux_loss(const T* probs, const int32_t* route_idx, int64_t tokens, int64_t experts, int64_t top_k,
                    double scale, const double* given) {
  std::vector<double> p_sum(size_t(experts), 0.0);
  const std::vector<double> chosen = chosen_copies(route_idx, tokens * top_k, experts, given);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t e = 0; e < experts; ++e) p_sum[size_t(e)] += double(probs[t * experts + e]);
  }
  double loss = 0;
  for (int64_t e = 0; e < experts; ++e) loss += p_sum[size_t(e)] * chosen[size_t(e)];
  return scale * loss;
}

template <class T>
void moe_route_backward(const T* probs, const int32_t* route_idx, const T* d_route_w, T* d_logits, int64_t tokens,
                        int64_t experts, int64_t top_k, double aux_scale, const double* given, bool normalize) {
  // d aux / d p[t, e] = aux_scale · (copies routed to e, dropped ones too); then the softmax's
  // backward d_logits = p ∘ (dp − Σ p·dp). Normalized weights w_j = p_j / S (S the chosen
  // probabilities' sum) pass d_w_j on as (d_w_j − Σ_i d_w_i · w_i) / S.
  const std::vector<double> chosen = chosen_copies(route_idx, tokens * top_k, experts, given);
  std::vector<double> dp(size_t(experts), 0.0);
  for (int64_t t = 0; t < tokens; ++t) {
    const T* p = probs + t * experts;
    for (int64_t e = 0; e < experts; ++e) dp[size_t(e)] = aux_scale * chosen[size_t(e)];
    double sum = 1, mean = 0;  // S, and Σ_i d_w_i · w_i
    if (normalize) {
      sum = 0;
      for (int64_t j = 0; j < top_k; ++j) sum += double(p[expert_of(route_idx[t * top_k + j])]);
      for (int64_t j = 0; j < top_k; ++j) {
        mean += double(d_route_w[t * top_k + j]) * double(p[expert_of(route_idx[t * top_k + j])]) / sum;
      }
    }
    for (int64_t j = 0; j < top_k; ++j) {
      dp[size_t(expert_of(route_idx[t * top_k + j]))] += (double(d_route_w[t * top_k + j]) - mean) / sum;
    }
    double dot = 0;
    for (int64_t e = 0; e < experts; ++e) dot += double(p[e]) * dp[size_t(e)];
    for (int64_t e = 0; e < experts; ++e) d_logits[t * experts + e] = T(double(p[e]) * (dp[size_t(e)] - dot));
  }
}

template <class T>
void moe_permute_forward(const T* x, T* y, const int64_t* rows, int64_t tokens, int64_t top_k, int64_t h) {
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t j = 0; j < top_k; ++j) {
      int64_t r = rows[t * top_k + j];
      if (r >= 0) std::copy(x + t * h, x + (t + 1) * h, y + r * h);
    }
  }
}

template <class T>
void moe_permute_backward(const T* d_y, T* d_x, const int64_t* rows, int64_t tokens, int64_t top_k, int64_t h) {
  for (int64_t t = 0; t < tokens; ++t) {
    T* d = d_x + t * h;
    std::fill(d, d + h, T(0));
    for (int64_t j = 0; j < top_k; ++j) {
      int64_t r = rows[t * top_k + j];
      if (r < 0) continue;
      for (int64_t c = 0; c < h; ++c) d[c] += d_y[r * h + c];
    }
  }
}

template <class T>
void moe_unpermute_forward(const T* x, const T* route_w, const int64_t* rows, T* y, int64_t tokens, int64_t top_k,
                           int64_t h) {
  for (int64_t t = 0; t < tokens; ++t) {
    T* out = y + t * h;
    std::fill(out, out + h, T(0));
    for (int64_t j = 0; j < top_k; ++j) {
      int64_t r = rows[t * top_k + j];
      if (r < 0) continue;  // a dropped copy adds nothing
      const T w = route_w[t * top_k + j];
      for (int64_t c = 0; c < h; ++c) out[c] += w * x[r * h + c];
    }
  }
}

template <class T>
void moe_unpermute_backward(const T* d_y, const T* x, const T* route_w, const int64_t* rows, T* d_x, T* d_route_w,
                            int64_t tokens, int64_t top_k, int64_t h) {
  for (int64_t t = 0; t < tokens; ++t) {
    const T* g = d_y + t * h;
    for (int64_t j = 0; j < top_k; ++j) {
      int64_t r = rows[t * top_k + j];
      if (r < 0) {
        d_route_w[t * top_k + j] = T(0);
        continue;
      }
      const T w = route_w[t * top_k + j];
      double dot = 0;
      for (int64_t c = 0; c < h; ++c) {
        d_x[r * h + c] = w * g[c];
        dot += double(g[c]) * double(x[r * h + c]);
      }
      d_route_w[t * top_k + j] = T(dot);
    }
  }
}

#define STEPCAST_CPU_KERNELS_MOE(T)                                                                                    \
  template void moe_route_forward<T>(const T*, T*, T*, int32_t*, int32_t*, int64_t, int64_t, int64_t, int64_t, bool,  \
                                     bool);                                                                           \
  template double moe_aux_loss<T>(const T*, const int32_t*, int64_t, int64_t, int64_t, double, const double*);       \
  template void moe_route_backward<T>(const T*, const int32_t*, const T*, T*, int64_t, int64_t, int64_t, double,      \
                                      const double*, bool);                                                                 \
  template void moe_permute_forward<T>(const T*, T*, const int64_t*, int64_t, int64_t, int64_t);                      \
  template void moe_permute_backward<T>(const T*, T*, const int64_t*, int64_t, int64_t, int64_t);                     \
  template void moe_unpermute_forward<T>(const T*, const T*, const int64_t*, T*, int64_t, int64_t, int64_t);          \
  template void moe_unpermute_backward<T>(const T*, const T*, const T*, const int64_t*, T*, T*, int64_t, int64_t,     \
                                          int64_t);
STEPCAST_CPU_KERNELS_MOE(float)
STEPCAST_CPU_KERNELS_MOE(double)
#undef STEPCAST_CPU_KERNELS_MOE

}  // namespace stepcast::cpu
