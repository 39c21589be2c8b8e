// The CPU backend's kernels: every forward and backward computation of a Megatron-style
// decoder-only transformer step, on host memory, for T = float or double. They work on the LOCAL
// SHARD a rank holds (local heads, local vocabulary, local sequence slice) and take the global
// offsets they need, so that anything position-dependent (rotary angles, learned positions,
// dropout masks) is a function of GLOBAL coordinates only: any tp/pp/dp/sp plan reproduces the
// single-rank step. No communication, no allocation of tensors the caller owns, no I/O.
//
// Shapes (row-major, innermost last): s sequence (s_local under sequence parallelism), b micro
// batch, h hidden, heads / kv_heads local attention / key-value heads, d head dim, f local MLP
// width, v_local local vocabulary shard starting at global id v0. Activations are [s, b, h]
// (sequence-major, as Megatron); a "token" row t = s_index·b + b_index. Masks are uint8 (0/1),
// one byte per element as Megatron counts them. Backward kernels that say "+=" accumulate
// (gradient accumulation, residual gradients); the others overwrite their outputs.
#pragma once

#include <cstdint>
#include <vector>

#include "fp8.hpp"
#include "kernel_args.hpp"

namespace stepcast::cpu {

// ---- GEMM and linear layers ----------------------------------------------------------------

// C[m,n] = alpha·op(A)·op(B) + beta·C through cblas_{s,d}gemm. op(A) is [m,k]: A is stored
// [m,k] (lda ≥ k) or, transposed, [k,m] (lda ≥ m); likewise op(B) [k,n]. ldc ≥ n.
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc);
// Packed operands (leading dimensions are the stored row lengths).
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          const T* b, T beta, T* c);

// y[tokens,out] = x[tokens,in]·W^T (+ bias[out]); W is [out,in] like PyTorch. bias may be null.
template <class T>
void linear_forward(const T* x, const T* w, const T* bias, T* y, int64_t tokens, int64_t in,
                    int64_t out);
// dx[tokens,in] = dy[tokens,out]·W, or += when `accumulate` (a second GEMM feeding the same
// input, e.g. SwiGLU's gate and up projections).
template <class T>
void linear_backward_data(const T* dy, const T* w, T* dx, int64_t tokens, int64_t in, int64_t out,
                          bool accumulate);
// dW[out,in] += dy^T·x; dbias[out] += Σ_tokens dy (dbias may be null).
template <class T>
void linear_backward_weight(const T* dy, const T* x, T* dw, T* dbias, int64_t tokens, int64_t in,
                            int64_t out);


// ---- FP8 (fp8.hpp), emulated exactly: values rounded to the e4m3 / e5m2 grid with a scale,
// stored as their 8-bit codes; GEMMs decode the codes (every FP8 value is exact in fp32) and
// accumulate in T, the operands' scales undone by the GEMM's alpha, as cuBLASLt's FP8 GEMMs take
// A and B scale factors. `scratch` ≥ kFp8Scratch elements holds the decoded blocks.

constexpr int64_t kFp8Block = 64;                          // rows / columns / depth of a block
constexpr int64_t kFp8Scratch = 2 * kFp8Block * kFp8Block;  // an A and a B block

// y[i] = the code of fp8_round(x[i]·scale); amax = max(amax, max |x[i]|).
template <class T>
void fp8_cast(const T* x, uint8_t* y, int64_t n, T scale, T* amax, Fp8Storage format);
// Current scaling: *amax = max |x[i]|; *scale = fp8_current_scale(*amax) (fp8.hpp).
template <class T>
void fp8_absmax(const T* x, int64_t n, T* amax, bool accumulate);
template <class T>
void fp8_set_current_scale(const T* amax, T* scale, Fp8Storage format);
// An FP8 operand: codes stored [rows, ld] as gemm's operands are, the scale it was cast with.
// Block-scaled (blocks not none): a tensor [rows, ld] in fp8.hpp's BlockLayout, its blocks' scales
// inside `codes`, row-wise or column-wise; scale 1.
template <class T>
struct Fp8Operand {
  const uint8_t* codes;
  int64_t ld;
  T scale;
  Fp8Storage format;
  Fp8Blocks blocks = Fp8Blocks::none;
  bool columnwise = false;
};
// Block-scaled FP8: x [rows, cols] (multiples of the block length) quantized into y's storage
// (fp8.hpp's BlockLayout), its blocks along the rows (row-wise) or down the columns (columnwise),
// or 128×128 tiles: each block's scale from its largest magnitude (MX: mx_scale_exponent, values
// times mx_quantize_factor; blockwise: values times blockwise_scale, a power of two unless
// power_of_two is false, its fp32 reciprocal stored), rounded to the format's grid.
template <class T>
void block_cast(const T* x, uint8_t* y, int64_t rows, int64_t cols, Fp8Blocks blocks, bool columnwise,
                Fp8Storage format, bool power_of_two = true);
// C[m,n] = op(A)·op(B) / (scale_a·scale_b) + beta·C (gemm's conventions for op and trans).
template <class T>
void fp8_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const Fp8Operand<T>& a,
              const Fp8Operand<T>& b, T beta, T* c, int64_t ldc, T* scratch);
// The linear layers of linear_forward / linear_backward_data / linear_backward_weight on FP8
// x, w and dy (dbias from the decoded dy).
template <class T>
void fp8_linear_forward(const Fp8Operand<T>& x, const Fp8Operand<T>& w, const T* bias, T* y, int64_t tokens,
                        int64_t in, int64_t out, T* scratch);
template <class T>
// w's codes [out, in], or with w_transposed [in, out] (ld out): the same products.
void fp8_linear_backward_data(const Fp8Operand<T>& dy, const Fp8Operand<T>& w, T* dx, int64_t tokens, int64_t in,
                              int64_t out, bool accumulate, T* scratch, bool w_transposed = false);
template <class T>
void fp8_linear_backward_weight(const Fp8Operand<T>& dy, const Fp8Operand<T>& x, T* dw, T* dbias, int64_t tokens,
                                int64_t in, int64_t out, T* scratch, const uint8_t* dy_t = nullptr,
                                const uint8_t* x_t = nullptr);
// Delayed scaling's end of step for `slots` slots (fp8_updated_scale); amax is zeroed.
template <class T>
void fp8_scale_update(T* amax, T* history, T* scale, int64_t slots, const Fp8Recipe& recipe);

// ---- Dropout masks (Dropout, DropoutSite: kernel_args.hpp) -----------------------------------

// THE mask definition. A counter-based hash: SplitMix64's finalizer `mix` absorbs, in order,
// seed, site, step, layer, sample, i, j, k (h ← mix(h + γ + word), γ = 0x9E3779B97F4A7C15,
// starting from h = mix(seed)); u = (h >> 11)·2^-53 ∈ [0,1); keep ⇔ u ≥ p.
// Coordinates are global: `sample` is the sample's index in the global batch of the step;
//   [s, b, h] sites:   i = global sequence position, j = hidden feature, k = 0;
//   attention_probs:   i = global head, j = query position, k = key position.
bool dropout_keep(uint64_t seed, DropoutSite site, int64_t step, int64_t layer, int64_t sample,
                  int64_t i, int64_t j, int64_t k, double p);

// out[s,b,h] = residual + dropout(x), mask[s,b,h] = keep (uint8). residual may be null (plain
// dropout, e.g. after the embedding); out may alias x or residual. s0 is the global position of
// local row 0 (the sequence-parallel offset); sample_index[b] are the global sample indices.
// With p = 0 it is the residual add alone: mask and sample_index may be null (nothing drawn).
template <class T>
void dropout_add_forward(const T* x, const T* residual, T* out, uint8_t* mask, int64_t s,
                         int64_t b, int64_t h, const Dropout& dropout, int64_t s0,
                         const int64_t* sample_index);
// dx[n] = dy·mask/(1−p): the backward of any dropout from its stored mask (the residual's own
// gradient is dy unchanged). Used for [s,b,h] sites and for attention probabilities alike.
template <class T>
void dropout_backward(const T* dy, const uint8_t* mask, T* dx, int64_t n, double p);

// ---- Embeddings -----------------------------------------------------------------------------

// Vocab-parallel lookup: out[s,b,h] = W[tokens[s,b] − v0] for ids in [v0, v0+v_local), zeros
// otherwise (the tp reduction completes it). tokens are [s, b] global ids (full sequence).
template <class T>
void embedding_forward(const int32_t* tokens, const T* w, T* out, int64_t s, int64_t b, int64_t h,
                       int64_t v0, int64_t v_local);
// dW[v_local,h] += scatter of dout[s,b,h] over this shard's tokens.
template <class T>
void embedding_backward(const int32_t* tokens, const T* dout, T* dw, int64_t s, int64_t b,
                        int64_t h, int64_t v0, int64_t v_local);

// Learned positions: x[s,b,h] += P[s0 + s_index, :], P is [max_positions, h].
template <class T>
void position_add_forward(T* x, const T* pos, int64_t s, int64_t b, int64_t h, int64_t s0,
                          int64_t max_positions);
// dP[s0 + s_index, :] += Σ_b dx[s_index, b, :].
template <class T>
void position_add_backward(const T* dx, T* dpos, int64_t s, int64_t b, int64_t h, int64_t s0,
                           int64_t max_positions);

// ---- Norms over h (rows = tokens) -----------------------------------------------------------

template <class T>
void layernorm_forward(const T* x, const T* w, const T* bias, T* y, int64_t rows, int64_t h,
                       double eps);
// Recomputes mean and rstd from x (nothing saved). dx += (the residual gradient), dw += , db += .
template <class T>
void layernorm_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, T* db, int64_t rows,
                        int64_t h, double eps);
template <class T>
void rmsnorm_forward(const T* x, const T* w, T* y, int64_t rows, int64_t h, double eps);
template <class T>
void rmsnorm_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, int64_t rows, int64_t h,
                      double eps);

// ---- Attention ------------------------------------------------------------------------------

// The local attention problem. qkv is [s, b, (heads + 2·kv_heads)·d] laid out as
// [q heads…, k heads…, v heads…]; ctx is [s, b, heads·d]; scores/probs are [b, heads, s, s];
// lse is [b, heads, s]. GQA: local head i reads kv head i / (heads / kv_heads).
// head0 is the global index of local head 0 (tp_rank·heads); it keys attention dropout.

// Rotary embedding (GPT-NeoX / Llama rotate_half over the whole head dim), in place on the q and
// k heads of qkv; position of row s_index is s0 + s_index; frequency i: theta^(−2i/d).
template <class T>
void rotary_forward(T* qkv, const AttentionShape& shape, double theta, int64_t s0);
// The inverse rotation, in place on the q and k parts of d_qkv (v untouched).
template <class T>
void rotary_backward(T* d_qkv, const AttentionShape& shape, double theta, int64_t s0);

// Materialized path: score → softmax → dropout → value, each its own op.
// scores = scale·Q·K^T, −inf above the diagonal (causal).
template <class T>
void attention_score_forward(const T* qkv, T* scores, const AttentionShape& shape, double scale);
// Row softmax of [rows, cols] (−inf entries give exactly 0).
template <class T>
void softmax_forward(const T* scores, T* probs, int64_t rows, int64_t cols);
// probs_drop = probs·mask/(1−p), mask[b,heads,s,s] (0 above the diagonal).
template <class T>
void attention_dropout_forward(const T* probs, T* probs_drop, uint8_t* mask,
                               const AttentionShape& shape, const Dropout& dropout,
                               int64_t head0, const int64_t* sample_index);
// ctx = probs_used·V (probs_used: probs_drop with dropout, probs without).
template <class T>
void attention_value_forward(const T* probs_used, const T* qkv, T* ctx,
                             const AttentionShape& shape);
// d_probs_used = d_ctx·V^T; writes the V part of d_qkv (dV = Σ_group probs_used^T·d_ctx).
template <class T>
void attention_value_backward(const T* d_ctx, const T* probs_used, const T* qkv, T* d_probs_used,
                              T* d_qkv, const AttentionShape& shape);
// (dropout backward: dropout_backward(d_probs_used, mask, d_probs, b·heads·s·s, p).)
// d_scores = probs ⊙ (d_probs − rowsum(d_probs ⊙ probs)).
template <class T>
void softmax_backward(const T* d_probs, const T* probs, T* d_scores, int64_t rows, int64_t cols);
// Writes the Q and K parts of d_qkv: dQ = scale·dS·K, dK = scale·Σ_group dS^T·Q.
template <class T>
void attention_score_backward(const T* d_scores, const T* qkv, T* d_qkv,
                              const AttentionShape& shape, double scale);

// Flash path: the same function (and the same dropout masks, drawn from dropout_keep on the fly)
// without any s×s buffer: online softmax over key blocks, per query row. Writes ctx and
// lse = log Σ_j exp(score_ij) (before dropout). dropout may be null (no dropout).
template <class T>
void flash_attention_forward(const T* qkv, T* ctx, T* lse, const AttentionShape& shape,
                             double scale, const Dropout* dropout, int64_t head0,
                             const int64_t* sample_index);
// Recomputes probabilities from lse; reads qkv, ctx, lse and d_ctx; overwrites all of d_qkv.
template <class T>
void flash_attention_backward(const T* qkv, const T* ctx, const T* lse, const T* d_ctx, T* d_qkv,
                              const AttentionShape& shape, double scale, const Dropout* dropout,
                              int64_t head0, const int64_t* sample_index);

// ---- Context parallelism (cpu_kernels_cp.cpp) -----------------------------------------------
// A K/V block is [n, b, 2·kv_heads·d]: each row's K heads, then its V heads. Positions are the
// global token positions of the local query rows (q_pos[shape.s]) and of the block's rows
// (kv_pos[n]); the causal mask and the dropout hash are taken at them.

// cp_comm_type a2a (Ulysses). a2a_heads: every row of x [rows, Σ sections] cut section by section
// into `parts` equal pieces, piece j of each into y's block j [parts][rows, Σ/parts] (split), or the
// reverse (join: x the blocks, y the rows). permute_rows: rows of `width` elements, y[i] =
// x[index[i]] (gather) or y[index[i]] = x[i] (scatter), i < n.
template <class T>
void a2a_heads(const T* x, T* y, int64_t rows, const std::vector<int64_t>& sections, int64_t parts, bool split);
template <class T>
void permute_rows(const T* x, T* y, const int64_t* index, int64_t n, int64_t width, bool gather);

// K and V of qkv's shape.s rows into kv; unpack writes a block's gradient into d_qkv's K and V.
template <class T>
void cp_kv_pack(const T* qkv, T* kv, const AttentionShape& shape);
template <class T>
void cp_kv_unpack(const T* d_kv, T* d_qkv, const AttentionShape& shape);
// Flash attention of qkv's queries over one K/V block: ctx and lse of that block alone (a query
// that sees no key of it gets ctx 0 and lse −inf).
template <class T>
void cp_flash_forward(const T* qkv, const T* kv, int64_t n, const int64_t* q_pos, const int64_t* kv_pos,
                      T* ctx, T* lse, const AttentionShape& shape, double scale, const Dropout* dropout,
                      int64_t head0, const int64_t* sample_index);
// Backward over one block from the merged ctx and lse: dQ overwrites d_qkv (all of it zeroed
// first) or, with `accumulate`, is added into its query part; the block's dK/dV overwrite d_kv.
template <class T>
void cp_flash_backward(const T* qkv, const T* kv, int64_t n, const int64_t* q_pos, const int64_t* kv_pos,
                       const T* ctx, const T* lse, const T* d_ctx, T* d_qkv, bool accumulate, T* d_kv,
                       const AttentionShape& shape, double scale, const Dropout* dropout, int64_t head0,
                       const int64_t* sample_index);
// (ctx, lse) ← the log-sum-exp merge of (ctx, lse) and a block's (ctx_part, lse_part).
template <class T>
void cp_merge(T* ctx, T* lse, const T* ctx_part, const T* lse_part, const AttentionShape& shape);
// Materialized attention over n gathered K/V rows, scores [b, heads, s, n]: the scores (−inf
// where a key is after its query), dropout at global positions, the values, and their backward
// (value backward zeroes d_kv and writes dV; score backward overwrites d_qkv's queries and adds dK).
template <class T>
void cp_score_forward(const T* qkv, const T* kv, int64_t n, const int64_t* q_pos, const int64_t* kv_pos, T* scores,
                      const AttentionShape& shape, double scale);
template <class T>
void cp_attention_dropout_forward(const T* probs, T* probs_drop, uint8_t* mask, const AttentionShape& shape, int64_t n,
                                  const int64_t* q_pos, const int64_t* kv_pos, const Dropout& dropout, int64_t head0,
                                  const int64_t* sample_index);
template <class T>
void cp_value_forward(const T* probs_used, const T* kv, int64_t n, T* ctx, const AttentionShape& shape);
template <class T>
void cp_value_backward(const T* d_ctx, const T* probs_used, const T* kv, int64_t n, T* d_probs_used, T* d_kv,
                       const AttentionShape& shape);
template <class T>
void cp_score_backward(const T* d_scores, const T* qkv, const T* kv, int64_t n, T* d_qkv, T* d_kv,
                       const AttentionShape& shape, double scale);

// ---- MLP activations ------------------------------------------------------------------------

// GPT-2 "gelu_new": 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
template <class T>
void gelu_forward(const T* x, T* y, int64_t n);
template <class T>
void gelu_backward(const T* x, const T* dy, T* dx, int64_t n);
// act = silu(gate)·up.
template <class T>
void swiglu_forward(const T* gate, const T* up, T* act, int64_t n);
template <class T>
void swiglu_backward(const T* gate, const T* up, const T* d_act, T* d_gate, T* d_up, int64_t n);

// ---- Vocab-parallel cross entropy -----------------------------------------------------------

// (a) Per token of logits[tokens, v_local]: stats[3, tokens] = (local max, Σ exp(logit − local
// max), target logit if targets[t] ∈ [v0, v0+v_local) else 0). targets are global ids.
template <class T>
void cross_entropy_stats(const T* logits, const int32_t* targets, T* stats, int64_t tokens,
                         int64_t v0, int64_t v_local);
// (b) From the stats of all tp ranks, stats_all[tp, 3, tokens] (rank order; tp = 1 for a single
// rank): loss[tokens] = log Σ_r sum_r·exp(max_r − M) + M − target logit, and the local softmax
// [tokens, v_local] kept for backward. Exactly one rank holds each target, so the target logit
// is the sum of the gathered ones (the others are exact zeros).
template <class T>
void cross_entropy_forward(const T* logits, const T* stats_all, int64_t tp, T* softmax, T* loss,
                           int64_t tokens, int64_t v_local);
// (c) dlogits = (softmax − onehot_local(target))·scale; scale = 1/(tokens in the global batch),
// so summing over microbatches and dp ranks gives the gradient of the mean loss.
template <class T>
void cross_entropy_backward(const T* softmax, const int32_t* targets, T* dlogits, int64_t tokens,
                            int64_t v0, int64_t v_local, double scale);

// ---- Optimizer ------------------------------------------------------------------------------

// Σ g² (in double), for the global gradient norm (sum over shards, then sqrt).
template <class T>
double grad_norm_sq(const T* g, int64_t n);
// Megatron's clip: min(1, max_norm / (total_norm + 1e-6)).
double clip_coefficient(double total_norm, double max_norm);

// One AdamW step (apex/Megatron adam_w_mode) for step = 1, 2, …, with g = grad·clip_coef:
// m = β1·m + (1−β1)·g; v = β2·v + (1−β2)·g²; u = (m/(1−β1^step)) / (√(v/(1−β2^step)) + eps);
// param −= lr·(u + weight_decay·param). Master weights and moments are T (the CPU keeps no
// separate low-precision copy).
template <class T>
void adamw_step(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, int64_t n,
                const AdamW& config, int64_t step, double clip_coef);

// ---- mixture of experts (cpu_kernels_moe.cpp) --------------------------------------------------
// Routing of `tokens` rows of logits [tokens, experts]: probs = softmax; the top_k experts by
// probability (ties to the lower id) with their probabilities as weights route_w [tokens, top_k];
// route_idx the expert, or −1 − expert for a copy the expert's `capacity` drops (capacity 0: none
// dropped): it keeps its first `capacity` copies in token order, or with `drop_by_probs`
// (Megatron's drop policy "probs") the `capacity` of highest weight (ties to the lower token,
// then the lower slot); counts[experts] the copies kept. `normalize` (the model's
// norm_topk_prob): each token's k weights divided by their sum (dropped copies' included), the
// softmax over the chosen experts only; the weights compared are those.
template <class T>
void moe_route_forward(const T* logits, T* probs, T* route_w, int32_t* route_idx, int32_t* counts, int64_t tokens,
                       int64_t experts, int64_t top_k, int64_t capacity, bool normalize = false,
                       bool drop_by_probs = false);
// The load-balancing loss scale · Σ_e (Σ_t probs[t, e]) · C_e, C_e the copies routed to e
// (dropped included): chosen[e] where given (the whole sequence's), else counted in route_idx.
template <class T>
double moe_aux_loss(const T* probs, const int32_t* route_idx, int64_t tokens, int64_t experts, int64_t top_k,
                    double scale, const double* chosen = nullptr);
// d_logits (overwritten) from the weights' gradient d_route_w and the loss above's (aux_scale);
// `normalize` as the forward's (w_j = p_j / S: dp_j = (d_w_j − Σ_i d_w_i · w_i) / S).
template <class T>
void moe_route_backward(const T* probs, const int32_t* route_idx, const T* d_route_w, T* d_logits, int64_t tokens,
                        int64_t experts, int64_t top_k, double aux_scale, const double* chosen = nullptr,
                        bool normalize = false);
// Row moves: rows[t·top_k + j] is the permuted row of copy j of token t (−1: dropped). Forward
// y[rows] = x[t]; backward d_x[t] = Σ_j d_y[rows] (overwritten).
template <class T>
void moe_permute_forward(const T* x, T* y, const int64_t* rows, int64_t tokens, int64_t top_k, int64_t h);
template <class T>
void moe_permute_backward(const T* d_y, T* d_x, const int64_t* rows, int64_t tokens, int64_t top_k, int64_t h);
// y[t] = Σ_j route_w[t, j] · x[rows] (overwritten); backward d_x[rows] = route_w · d_y[t] and
// d_route_w[t, j] = d_y[t] · x[rows] (0 for dropped copies).
template <class T>
void moe_unpermute_forward(const T* x, const T* route_w, const int64_t* rows, T* y, int64_t tokens, int64_t top_k,
                           int64_t h);
template <class T>
void moe_unpermute_backward(const T* d_y, const T* x, const T* route_w, const int64_t* rows, T* d_x, T* d_route_w,
                            int64_t tokens, int64_t top_k, int64_t h);

}  // namespace stepcast::cpu
