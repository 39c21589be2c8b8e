// The CUDA backend's mixture-of-experts kernels (cuda_kernels.hpp's moe_*), cpu_kernels_moe.cpp's
// semantics on device memory: softmax routing with top-k (chosen among the probabilities as
// stored, ties to the lower expert, as the CPU does) and capacity dropping in token order, the
// load-balancing loss and its gradient, and the row moves of the permutation. One warp per token
// for the routing, one block per row copy for the reductions, grid-stride loops for the moves.
#include <algorithm>
#include <cmath>

#include "cuda_common.cuh"
#include "errors.hpp"

namespace stepcast::cuda {

namespace {

constexpr int kThreads = 256;

// The expert of a route entry, kept (e) or dropped (−1 − e).
__device__ __forceinline__ int32_t expert_of(int32_t r) { return r >= 0 ? r : -1 - r; }

// One warp per token: softmax over the experts into probs (T), then top_k picks by the stored
// probability (ties to the lower expert) into route_w and route_idx (every pick kept; capacity
// and the counts follow in moe_capacity_kernel or moe_histogram_kernel).
template <class T>
__global__ void moe_route_kernel(const T* logits, T* probs, T* route_w, int32_t* route_idx, int64_t tokens,
                                 int64_t experts, int64_t top_k, bool normalize) {
  const int64_t t = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (t >= tokens) return;
  const T* l = logits + t * experts;
  T* p = probs + t * experts;
  float most = -INFINITY;
  for (int64_t e = lane; e < experts; e += 32) most = fmaxf(most, load(l[e]));
  most = warp_max(most);
  float sum = 0;
  for (int64_t e = lane; e < experts; e += 32) sum += expf(load(l[e]) - most);
  sum = warp_sum(sum);
  for (int64_t e = lane; e < experts; e += 32) p[e] = store<T>(expf(load(l[e]) - most) / sum);
  __syncwarp();
  int32_t* idx = route_idx + t * top_k;
  for (int64_t j = 0; j < top_k; ++j) {
    float best = -INFINITY;
    int best_e = int(experts);
    for (int64_t e = lane; e < experts; e += 32) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i) taken = taken || idx[i] == e;
      float v = load(p[e]);
      if (!taken && (best_e == int(experts) || v > best)) {
        best = v;
        best_e = int(e);
      }
    }
    for (int o = 16; o > 0; o >>= 1) {  // the warp's best: larger probability, then lower expert
      float v = __shfl_xor_sync(0xffffffffu, best, o);
      int e = __shfl_xor_sync(0xffffffffu, best_e, o);
      if (e < int(experts) && (best_e == int(experts) || v > best || (v == best && e < best_e))) {
        best = v;
        best_e = e;
      }
    }
    if (lane == 0) {
      idx[j] = int32_t(best_e);
      route_w[t * top_k + j] = p[best_e];
    }
    __syncwarp();
  }
  if (normalize && lane == 0) {  // the model's norm_topk_prob: the k weights over their sum
    float chosen = 0;
    for (int64_t j = 0; j < top_k; ++j) chosen += load(route_w[t * top_k + j]);
    for (int64_t j = 0; j < top_k; ++j) route_w[t * top_k + j] = store<T>(load(route_w[t * top_k + j]) / chosen);
  }
}

// Capacity: each expert keeps its first `capacity` copies in token order (entry order t·k + j);
// the rest become −1 − e. One thread per expert walks every entry (only its own are rewritten).
__global__ void moe_capacity_kernel(int32_t* route_idx, int32_t* counts, int64_t entries, int64_t experts,
                                    int64_t capacity) {
  for (int64_t e = threadIdx.x; e < experts; e += blockDim.x) {
    int32_t kept = 0;
    for (int64_t i = 0; i < entries; ++i) {
      if (route_idx[i] != e) continue;
      if (kept < capacity)
        ++kept;
      else
        route_idx[i] = int32_t(-1 - e);
    }
    counts[e] = kept;
  }
}

// Capacity by probability (Megatron's drop policy "probs"): each expert keeps its `capacity`
// copies of highest weight, ties to the lower entry. A block per expert; each of its threads
// ranks its entries against every entry of the expert (expert_of reads kept and dropped alike,
// so the rewrites do not race with the reads) and counts those it keeps (counts zeroed before).
template <class T>
__global__ void moe_capacity_probs_kernel(int32_t* route_idx, const T* route_w, int32_t* counts, int64_t entries,
                                          int64_t capacity) {
  const int32_t e = int32_t(blockIdx.x);
  for (int64_t i = threadIdx.x; i < entries; i += blockDim.x) {
    if (expert_of(route_idx[i]) != e) continue;
    const float w = load(route_w[i]);
    int64_t above = 0;
    for (int64_t j = 0; j < entries && above < capacity; ++j) {
      if (j == i || expert_of(route_idx[j]) != e) continue;
      const float v = load(route_w[j]);
      above += v > w || (v == w && j < i);
    }
    if (above < capacity)
      atomicAdd(counts + e, 1);
    else
      route_idx[i] = -1 - e;
  }
}

// Copies per expert, dropped ones included (into int or double counters).
template <class C>
__global__ void moe_histogram_kernel(const int32_t* route_idx, int64_t entries, C* counts) {
  GRID_STRIDE(i, entries) atomicAdd(counts + expert_of(route_idx[i]), C(1));
}

// Σ_t probs[t, e] per expert.
template <class T>
__global__ void moe_prob_sums_kernel(const T* probs, int64_t tokens, int64_t experts, double* sums) {
  GRID_STRIDE(i, tokens * experts) atomicAdd(sums + i % experts, double(load(probs[i])));
}

// result = scale · Σ_e P_e · C_e (one block).
__global__ void moe_aux_kernel(const double* p_sum, const double* chosen, int64_t experts, double scale,
                               double* result) {
  double local = 0;
  for (int64_t e = threadIdx.x; e < experts; e += blockDim.x) local += p_sum[e] * chosen[e];
  double total = block_sum(local);
  if (threadIdx.x == 0) *result = scale * total;
}

// One block per token: dp[e] = aux_scale · C_e + Σ_j [idx j → e] d_route_w; d_logits = p ∘ (dp − p·dp).
template <class T>
__global__ void moe_route_backward_kernel(const T* probs, const int32_t* route_idx, const T* d_route_w, T* d_logits,
                                          int64_t experts, int64_t top_k, double aux_scale, const double* chosen,
                                          bool normalize) {
  const int64_t t = blockIdx.x;
  const T* p = probs + t * experts;
  // Normalized weights w_j = p_j / S pass d_w_j on as (d_w_j − Σ_i d_w_i · w_i) / S (every thread
  // sums the k entries itself).
  float sum = 1, mean = 0;
  if (normalize) {
    sum = 0;
    for (int64_t j = 0; j < top_k; ++j) sum += load(p[expert_of(route_idx[t * top_k + j])]);
    for (int64_t j = 0; j < top_k; ++j) {
      mean += load(d_route_w[t * top_k + j]) * load(p[expert_of(route_idx[t * top_k + j])]) / sum;
    }
  }
  auto dp_of = [&](int64_t e) {
    float dp = float(aux_scale * chosen[e]);
    for (int64_t j = 0; j < top_k; ++j) {
      if (expert_of(route_idx[t * top_k + j]) == e) dp += (load(d_route_w[t * top_k + j]) - mean) / sum;
    }
    return dp;
  };
  float dot = 0;
  for (int64_t e = threadIdx.x; e < experts; e += blockDim.x) dot += load(p[e]) * dp_of(e);
  dot = block_sum(dot);
  for (int64_t e = threadIdx.x; e < experts; e += blockDim.x) {
    d_logits[t * experts + e] = store<T>(load(p[e]) * (dp_of(e) - dot));
  }
}

template <class T>
__global__ void moe_permute_forward_kernel(const T* x, T* y, const int64_t* rows, int64_t tokens, int64_t top_k,
                                           int64_t h) {
  GRID_STRIDE(i, tokens * top_k * h) {
    int64_t c = i % h, copy = i / h, r = rows[copy];
    if (r >= 0) y[r * h + c] = x[(copy / top_k) * h + c];
  }
}
template <class T>
__global__ void moe_permute_backward_kernel(const T* d_y, T* d_x, const int64_t* rows, int64_t tokens, int64_t top_k,
                                            int64_t h) {
  GRID_STRIDE(i, tokens * h) {
    int64_t c = i % h, t = i / h;
    float total = 0;
    for (int64_t j = 0; j < top_k; ++j) {
      int64_t r = rows[t * top_k + j];
      if (r >= 0) total += load(d_y[r * h + c]);
    }
    d_x[i] = store<T>(total);
  }
}
template <class T>
__global__ void moe_unpermute_forward_kernel(const T* x, const T* route_w, const int64_t* rows, T* y, int64_t tokens,
                                             int64_t top_k, int64_t h) {
  GRID_STRIDE(i, tokens * h) {
    int64_t c = i % h, t = i / h;
    float total = 0;
    for (int64_t j = 0; j < top_k; ++j) {
      int64_t r = rows[t * top_k + j];
      if (r >= 0) total += load(route_w[t * top_k + j]) * load(x[r * h + c]);
    }
    y[i] = store<T>(total);
  }
}
// One block per copy (t, j): d_x[r] = w · d_y[t]; d_route_w = d_y[t] · x[r] (0 for a dropped copy).
template <class T>
__global__ void moe_unpermute_backward_kernel(const T* d_y, const T* x, const T* route_w, const int64_t* rows, T* d_x,
                                              T* d_route_w, int64_t top_k, int64_t h) {
  const int64_t copy = blockIdx.x, t = copy / top_k, r = rows[copy];
  if (r < 0) {
    if (threadIdx.x == 0) d_route_w[copy] = store<T>(0.f);
    return;
  }
  const float w = load(route_w[copy]);
  float dot = 0;
  for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
    float g = load(d_y[t * h + c]);
    d_x[r * h + c] = store<T>(w * g);
    dot += g * load(x[r * h + c]);
  }
  dot = block_sum(dot);
  if (threadIdx.x == 0) d_route_w[copy] = store<T>(dot);
}

// The copies routed to each expert into `out` [experts] (zeroed): the host's `chosen` where given
// (the whole sequence's), else route_idx's histogram.
void routed_copies(const Launch& l, const int32_t* route_idx, int64_t copies, int64_t experts, const double* chosen,
                   double* out) {
  if (chosen) {
    check_runtime(l, cudaMemcpyAsync(out, chosen, size_t(experts) * sizeof(double), cudaMemcpyHostToDevice, l.stream),
                  "cudaMemcpyAsync");
    return;
  }
  if (copies == 0) return;
  moe_histogram_kernel<<<blocks_for(copies), kThreads, 0, l.stream>>>(route_idx, copies, out);
  check_launch(l, "moe_histogram");
}

}  // namespace

template <class T>
void moe_route_forward(const Launch& l, const T* logits, T* probs, T* route_w, int32_t* route_idx, int32_t* counts,
                       int64_t tokens, int64_t experts, int64_t top_k, int64_t capacity, bool normalize,
                       bool drop_by_probs) {
  STEPCAST_CHECK(top_k >= 1 && top_k <= experts, "MoE routing needs 1 <= top_k <= experts");
  check_runtime(l, cudaMemsetAsync(counts, 0, size_t(experts) * sizeof(int32_t), l.stream), "cudaMemsetAsync");
  if (tokens == 0) return;
  const int warps = kThreads / 32;
  moe_route_kernel<<<unsigned((tokens + warps - 1) / warps), kThreads, 0, l.stream>>>(logits, probs, route_w, route_idx,
                                                                                      tokens, experts, top_k,
                                                                                      normalize);
  check_launch(l, "moe_route");
  if (capacity > 0 && drop_by_probs) {
    moe_capacity_probs_kernel<<<unsigned(experts), kThreads, 0, l.stream>>>(route_idx, route_w, counts, tokens * top_k,
                                                                             capacity);
    check_launch(l, "moe_capacity_probs");
  } else if (capacity > 0) {
    moe_capacity_kernel<<<1, 1024, 0, l.stream>>>(route_idx, counts, tokens * top_k, experts, capacity);
    check_launch(l, "moe_capacity");
  } else {
    moe_histogram_kernel<<<blocks_for(tokens * top_k), kThreads, 0, l.stream>>>(route_idx, tokens * top_k, counts);
    check_launch(l, "moe_histogram");
  }
}

template <class T>
void moe_aux_loss(const Launch& l, const T* probs, const int32_t* route_idx, int64_t tokens, int64_t experts,
                  int64_t top_k, double scale, const double* chosen, double* scratch, double* result) {
  check_runtime(l, cudaMemsetAsync(scratch, 0, size_t(2 * experts) * sizeof(double), l.stream), "cudaMemsetAsync");
  moe_prob_sums_kernel<<<blocks_for(tokens * experts), kThreads, 0, l.stream>>>(probs, tokens, experts, scratch);
  check_launch(l, "moe_prob_sums");
  routed_copies(l, route_idx, tokens * top_k, experts, chosen, scratch + experts);
  moe_aux_kernel<<<1, kThreads, 0, l.stream>>>(scratch, scratch + experts, experts, scale, result);
  check_launch(l, "moe_aux");
}

template <class T>
void moe_route_backward(const Launch& l, const T* probs, const int32_t* route_idx, const T* d_route_w, T* d_logits,
                        int64_t tokens, int64_t experts, int64_t top_k, double aux_scale, const double* chosen,
                        double* scratch, bool normalize) {
  check_runtime(l, cudaMemsetAsync(scratch, 0, size_t(experts) * sizeof(double), l.stream), "cudaMemsetAsync");
  if (tokens == 0) return;
  routed_copies(l, route_idx, tokens * top_k, experts, chosen, scratch);
  int threads = int(std::min<int64_t>(1024, std::max<int64_t>(32, (experts + 31) / 32 * 32)));
  moe_route_backward_kernel<<<unsigned(tokens), threads, 0, l.stream>>>(probs, route_idx, d_route_w, d_logits, experts,
                                                                        top_k, aux_scale, scratch, normalize);
  check_launch(l, "moe_route_backward");
}

template <class T>
void moe_permute(const Launch& l, const T* x, T* y, const int64_t* rows, int64_t tokens, int64_t top_k, int64_t h,
                 bool backward) {
  if (tokens == 0) return;
  if (backward) {
    moe_permute_backward_kernel<<<blocks_for(tokens * h), kThreads, 0, l.stream>>>(x, y, rows, tokens, top_k, h);
  } else {
    moe_permute_forward_kernel<<<blocks_for(tokens * top_k * h), kThreads, 0, l.stream>>>(x, y, rows, tokens, top_k, h);
  }
  check_launch(l, "moe_permute");
}

template <class T>
void moe_unpermute_forward(const Launch& l, const T* x, const T* route_w, const int64_t* rows, T* y, int64_t tokens,
                           int64_t top_k, int64_t h) {
  if (tokens == 0) return;
  moe_unpermute_forward_kernel<<<blocks_for(tokens * h), kThreads, 0, l.stream>>>(x, route_w, rows, y, tokens, top_k,
                                                                                  h);
  check_launch(l, "moe_unpermute_forward");
}

template <class T>
void moe_unpermute_backward(const Launch& l, const T* d_y, const T* x, const T* route_w, const int64_t* rows, T* d_x,
                            T* d_route_w, int64_t tokens, int64_t top_k, int64_t h) {
  if (tokens == 0) return;
  int threads = int(std::min<int64_t>(1024, std::max<int64_t>(32, (h + 31) / 32 * 32)));
  moe_unpermute_backward_kernel<<<unsigned(tokens * top_k), threads, 0, l.stream>>>(d_y, x, route_w, rows, d_x,
                                                                                    d_route_w, top_k, h);
  check_launch(l, "moe_unpermute_backward");
}

#define STEPCAST_MOE(T)                                                                                              \
  template void moe_route_forward<T>(const Launch&, const T*, T*, T*, int32_t*, int32_t*, int64_t, int64_t, int64_t, \
                                     int64_t, bool, bool);                                                                 \
  template void moe_aux_loss<T>(const Launch&, const T*, const int32_t*, int64_t, int64_t, int64_t, double,         \
                                const double*, double*, double*);                                                    \
  template void moe_route_backward<T>(const Launch&, const T*, const int32_t*, const T*, T*, int64_t, int64_t,       \
                                      int64_t, double, const double*, double*, bool);                                      \
  template void moe_permute<T>(const Launch&, const T*, T*, const int64_t*, int64_t, int64_t, int64_t, bool);        \
  template void moe_unpermute_forward<T>(const Launch&, const T*, const T*, const int64_t*, T*, int64_t, int64_t,    \
                                         int64_t);                                                                   \
  template void moe_unpermute_backward<T>(const Launch&, const T*, const T*, const T*, const int64_t*, T*, T*,       \
                                          int64_t, int64_t, int64_t);
STEPCAST_MOE(bf16)
STEPCAST_MOE(float)
#undef STEPCAST_MOE

}  // namespace stepcast::cuda
