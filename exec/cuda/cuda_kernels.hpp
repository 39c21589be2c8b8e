// The CUDA backend's own kernels (everything but the GEMMs, which go through cuBLASLt): host
// launchers with cpu_kernels.hpp's semantics on device memory, enqueued on `stream`. T is the
// activation type (bf16 or float), G the weight-gradient type (bf16 or float); everything wide
// (statistics, softmax, lse, master weights, moments) is float. Arithmetic is in fp32 (fp64 for
// the rotary angles and the norm sums of squares); each launch is checked (errors name `rank`).
// The dropout masks are cpu_kernels.hpp's global-coordinate hash, bit for bit.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "bf16.hpp"
#include "cpu_kernels.hpp"

namespace stepcast::cuda {

// Launch configuration and error context shared by every launcher.
struct Launch {
  cudaStream_t stream = nullptr;
  int rank = 0;
};

// ---- element-wise helpers ----
template <class G>
void add(const Launch& l, G* y, const G* x, int64_t n);
template <class T>
void add_rows(const Launch& l, T* x, const T* bias, int64_t rows, int64_t h);
template <class T, class G>
void sum_rows(const Launch& l, const T* x, G* out, int64_t rows, int64_t h);
template <class T>
void fill_columns(const Launch& l, T* x, int64_t rows, int64_t cols, int64_t from, float value);
// Σ x (and Σ x² below) into *result (device double, overwritten).
void sum(const Launch& l, const float* x, int64_t n, double* result);
// accumulate: add to *result instead of overwriting it.
template <class G>
void sum_squares(const Launch& l, const G* g, int64_t n, double* result, bool accumulate = false);
// Converts n elements (the float/bf16 views a test or the profiler needs).
template <class From, class To>
void convert(const Launch& l, const From* x, To* y, int64_t n);

// ---- dropout, embeddings, norms ----
template <class T>
void dropout_add_forward(const Launch& l, const T* x, const T* residual, T* out, uint8_t* mask,
                         int64_t s, int64_t b, int64_t h, const cpu::Dropout& dropout, int64_t s0,
                         const int64_t* sample_index);
template <class T>
void dropout_backward(const Launch& l, const T* dy, const uint8_t* mask, T* dx, int64_t n,
                      double p);
template <class T>
void embedding_forward(const Launch& l, const int32_t* tokens, const T* w, T* out, int64_t s,
                       int64_t b, int64_t h, int64_t v0, int64_t v_local);
template <class T, class G>
void embedding_backward(const Launch& l, const int32_t* tokens, const T* dout, G* dw, int64_t s,
                        int64_t b, int64_t h, int64_t v0, int64_t v_local);
template <class T>
void position_add_forward(const Launch& l, T* x, const T* pos, int64_t s, int64_t b, int64_t h,
                          int64_t s0, int64_t max_positions);
template <class T, class G>
void position_add_backward(const Launch& l, const T* dx, G* dpos, int64_t s, int64_t b, int64_t h,
                           int64_t s0, int64_t max_positions);
template <class T>
void layernorm_forward(const Launch& l, const T* x, const T* w, const T* bias, T* y, int64_t rows,
                       int64_t h, double eps);
template <class T, class G>
void layernorm_backward(const Launch& l, const T* x, const T* w, const T* dy, T* dx, G* dw, G* db,
                        int64_t rows, int64_t h, double eps);
template <class T>
void rmsnorm_forward(const Launch& l, const T* x, const T* w, T* y, int64_t rows, int64_t h,
                     double eps);
template <class T, class G>
void rmsnorm_backward(const Launch& l, const T* x, const T* w, const T* dy, T* dx, G* dw,
                      int64_t rows, int64_t h, double eps);

// ---- activations, rotary ----
template <class T>
void gelu_forward(const Launch& l, const T* x, T* y, int64_t n);
template <class T>
void gelu_backward(const Launch& l, const T* x, const T* dy, T* dx, int64_t n);
template <class T>
void swiglu_forward(const Launch& l, const T* gate, const T* up, T* act, int64_t n);
template <class T>
void swiglu_backward(const Launch& l, const T* gate, const T* up, const T* d_act, T* d_gate,
                     T* d_up, int64_t n);
// sign +1: forward rotation; −1: the backward (inverse) rotation.
template <class T>
void rotary(const Launch& l, T* qkv, const cpu::AttentionShape& shape, double theta, int64_t s0,
            double sign);

// ---- attention ----
template <class T>
void attention_score_forward(const Launch& l, const T* qkv, T* scores,
                             const cpu::AttentionShape& shape, double scale);
template <class T>
void softmax_forward(const Launch& l, const T* scores, T* probs, int64_t rows, int64_t cols);
template <class T>
void attention_dropout_forward(const Launch& l, const T* probs, T* probs_drop, uint8_t* mask,
                               const cpu::AttentionShape& shape, const cpu::Dropout& dropout,
                               int64_t head0, const int64_t* sample_index);
template <class T>
void attention_value_forward(const Launch& l, const T* probs_used, const T* qkv, T* ctx,
                             const cpu::AttentionShape& shape);
template <class T>
void attention_value_backward(const Launch& l, const T* d_ctx, const T* probs_used, const T* qkv,
                              T* d_probs_used, T* d_qkv, const cpu::AttentionShape& shape);
template <class T>
void softmax_backward(const Launch& l, const T* d_probs, const T* probs, T* d_scores, int64_t rows,
                      int64_t cols);
template <class T>
void attention_score_backward(const Launch& l, const T* d_scores, const T* qkv, T* d_qkv,
                              const cpu::AttentionShape& shape, double scale);
// Fused, memory-efficient causal attention: no s×s buffer; the head dim must be one of
// kFlashHeadDims. dropout may be null.
inline constexpr int kFlashHeadDims[] = {16, 32, 64, 128};
bool flash_supports_head_dim(int64_t d);
template <class T>
void flash_attention_forward(const Launch& l, const T* qkv, T* ctx, float* lse,
                             const cpu::AttentionShape& shape, double scale,
                             const cpu::Dropout* dropout, int64_t head0,
                             const int64_t* sample_index);
// `delta` is scratch of b·heads·s floats (d_ctx·ctx per query row).
template <class T>
void flash_attention_backward(const Launch& l, const T* qkv, const T* ctx, const float* lse,
                              const T* d_ctx, T* d_qkv, float* delta,
                              const cpu::AttentionShape& shape,
                              double scale, const cpu::Dropout* dropout, int64_t head0,
                              const int64_t* sample_index);

// ---- context parallelism (cpu_kernels.hpp's cp_*, kernels_cp.cu) ----
// Positions (q_pos [shape.s], kv_pos [n]) and permute_rows' index are device int64 arrays here;
// lse is float. Flash takes any head dim. `delta` is scratch of b·heads·s floats.
template <class T>
void cp_kv_pack(const Launch& l, const T* qkv, T* kv, const cpu::AttentionShape& shape);
template <class T>
void cp_kv_unpack(const Launch& l, const T* d_kv, T* d_qkv, const cpu::AttentionShape& shape);
template <class T>
void cp_flash_forward(const Launch& l, const T* qkv, const T* kv, int64_t n, const int64_t* q_pos,
                      const int64_t* kv_pos, T* ctx, float* lse, const cpu::AttentionShape& shape, double scale,
                      const cpu::Dropout* dropout, int64_t head0, const int64_t* sample_index);
template <class T>
void cp_flash_backward(const Launch& l, const T* qkv, const T* kv, int64_t n, const int64_t* q_pos,
                       const int64_t* kv_pos, const T* ctx, const float* lse, const T* d_ctx, T* d_qkv,
                       bool accumulate, T* d_kv, float* delta, const cpu::AttentionShape& shape, double scale,
                       const cpu::Dropout* dropout, int64_t head0, const int64_t* sample_index);
template <class T>
void cp_merge(const Launch& l, T* ctx, float* lse, const T* ctx_part, const float* lse_part,
              const cpu::AttentionShape& shape);
template <class T>
void cp_score_forward(const Launch& l, const T* qkv, const T* kv, int64_t n, const int64_t* q_pos,
                      const int64_t* kv_pos, T* scores, const cpu::AttentionShape& shape, double scale);
template <class T>
void cp_attention_dropout_forward(const Launch& l, const T* probs, T* probs_drop, uint8_t* mask,
                                  const cpu::AttentionShape& shape, int64_t n, const int64_t* q_pos,
                                  const int64_t* kv_pos, const cpu::Dropout& dropout, int64_t head0,
                                  const int64_t* sample_index);
template <class T>
void cp_value_forward(const Launch& l, const T* probs_used, const T* kv, int64_t n, T* ctx,
                      const cpu::AttentionShape& shape);
template <class T>
void cp_value_backward(const Launch& l, const T* d_ctx, const T* probs_used, const T* kv, int64_t n,
                       T* d_probs_used, T* d_kv, const cpu::AttentionShape& shape);
template <class T>
void cp_score_backward(const Launch& l, const T* d_scores, const T* qkv, const T* kv, int64_t n, T* d_qkv, T* d_kv,
                       const cpu::AttentionShape& shape, double scale);
// Ulysses (cpu::a2a_heads, cpu::permute_rows); at most 4 sections.
template <class T>
void a2a_heads(const Launch& l, const T* x, T* y, int64_t rows, const std::vector<int64_t>& sections, int64_t parts,
               bool split);
template <class T>
void permute_rows(const Launch& l, const T* x, T* y, const int64_t* index, int64_t n, int64_t width, bool gather);

// ---- loss, optimizer ----
template <class T>
void cross_entropy_stats(const Launch& l, const T* logits, const int32_t* targets, float* stats,
                         int64_t tokens, int64_t v0, int64_t v_local);
template <class T>
void cross_entropy_forward(const Launch& l, const T* logits, const float* stats_all, int64_t tp,
                           float* softmax, float* loss, int64_t tokens, int64_t v_local);
template <class T>
void cross_entropy_backward(const Launch& l, const float* softmax, const int32_t* targets,
                            T* dlogits, int64_t tokens, int64_t v0, int64_t v_local, double scale);
// master null: param (float) is the master. Else master is updated and param = T(master).
template <class T, class G>
void adamw_step(const Launch& l, T* param, float* master, const G* grad, float* exp_avg,
                float* exp_avg_sq, int64_t n, const cpu::AdamW& config, int64_t step,
                double clip_coef);

// ---- mixture of experts (cpu_kernels.hpp's moe_*) ----
// Row maps `rows` (t·k + j → row, −1 dropped) are device int64 arrays here; route_idx and counts
// are device int32. `scratch`: 2·experts device doubles; `result`: one device double.
template <class T>
void moe_route_forward(const Launch& l, const T* logits, T* probs, T* route_w, int32_t* route_idx, int32_t* counts,
                       int64_t tokens, int64_t experts, int64_t top_k, int64_t capacity, bool normalize,
                       bool drop_by_probs);
template <class T>
void moe_aux_loss(const Launch& l, const T* probs, const int32_t* route_idx, int64_t tokens, int64_t experts,
                  int64_t top_k, double scale, const double* chosen, double* scratch, double* result);
// `chosen` (host, [experts], or nullptr: route_idx's histogram): the copies routed to each expert.
template <class T>
void moe_route_backward(const Launch& l, const T* probs, const int32_t* route_idx, const T* d_route_w, T* d_logits,
                        int64_t tokens, int64_t experts, int64_t top_k, double aux_scale, const double* chosen,
                        double* scratch, bool normalize);
// backward: x is d_y, y is d_x (cpu::moe_permute_backward).
template <class T>
void moe_permute(const Launch& l, const T* x, T* y, const int64_t* rows, int64_t tokens, int64_t top_k, int64_t h,
                 bool backward);
template <class T>
void moe_unpermute_forward(const Launch& l, const T* x, const T* route_w, const int64_t* rows, T* y, int64_t tokens,
                           int64_t top_k, int64_t h);
template <class T>
void moe_unpermute_backward(const Launch& l, const T* d_y, const T* x, const T* route_w, const int64_t* rows, T* d_x,
                            T* d_route_w, int64_t tokens, int64_t top_k, int64_t h);

// ---- FP8 (cpu_kernels.hpp's fp8_*; scales and amaxes are device floats) ----
// y = the codes of x·*scale; *amax = max(*amax, max |x|).
template <class T>
void fp8_cast(const Launch& l, const T* x, uint8_t* y, int64_t n, const float* scale, float* amax,
              Fp8Storage format);
template <class T>
// *amax = max |x| (accumulate: the larger of *amax and max |x|)
void fp8_absmax(const Launch& l, const T* x, int64_t n, float* amax, bool accumulate);
void fp8_set_current_scale(const Launch& l, const float* amax, float* scale, Fp8Storage format);
// y[c, r] = x[r, c]: the K-major copy of an FP8 operand cuBLASLt's FP8 GEMMs need. y's rows are
// ld ≥ rows bytes long (0: rows); the bytes rows…ld−1 of each are zeros (code 0 is +0 in both
// formats), so a GEMM over K = ld adds nothing for them.
void transpose_bytes(const Launch& l, const uint8_t* x, uint8_t* y, int64_t rows, int64_t cols, int64_t ld = 0);
// out[0] = 1 / *a, out[kFp8FactorStride] = 1 / *b: two operands' dequantisation factors, each
// at a 256-byte boundary of a 256-byte aligned out (cuBLASLt's scale pointers: with the two 4
// bytes apart its FP8 GEMMs answered NOT_SUPPORTED on the H200; whether alignment is the cause
// is not known yet — cuBLASLt does not document one).
inline constexpr int64_t kFp8FactorStride = 64;
void fp8_reciprocals(const Launch& l, const float* a, const float* b, float* out);
// dbias[o] += Σ_t decode(dy[t, o]) / *scale.
template <class G>
void fp8_bias_grad(const Launch& l, const uint8_t* dy, const float* scale, G* dbias, int64_t tokens, int64_t out,
                   Fp8Storage format);

// Throws InternalError naming the rank and `what` when the last launch failed.
void check_launch(const Launch& l, const char* what);
// A runtime call of a launcher (not a launch): its error, named with the rank.
void check_runtime(const Launch& l, cudaError_t code, const char* call);

}  // namespace stepcast::cuda
