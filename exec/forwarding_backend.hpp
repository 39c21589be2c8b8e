// A backend that hands every call to another one: the base of decorators, which override only
// what they watch or change (the tests' fault injection, tests/exec/fault_main.cpp). It owns the
// backend it wraps.
#pragma once

#include <memory>
#include <utility>

#include "backend.hpp"

namespace stepcast {

template <class T, class G = T, class W = T>
class ForwardingBackend : public Backend<T, G, W> {
 public:
  explicit ForwardingBackend(std::unique_ptr<Backend<T, G, W>> inner) : inner_(std::move(inner)) {}

  const char* name() const override { return inner_->name(); }
  char* allocate(int64_t bytes) override { return inner_->allocate(bytes); }
  void release(char* memory) override { inner_->release(memory); }
  void zero(void* memory, int64_t bytes) override { inner_->zero(memory, bytes); }
  void upload(void* backend_dst, const void* host_src, int64_t bytes) override {
    inner_->upload(backend_dst, host_src, bytes);
  }
  void download(void* host_dst, const void* backend_src, int64_t bytes) override {
    inner_->download(host_dst, backend_src, bytes);
  }
  void copy(void* dst, const void* src, int64_t bytes) override { inner_->copy(dst, src, bytes); }
  void add(G* y, const G* x, int64_t n) override { inner_->add(y, x, n); }
  void add_rows(T* x, const T* bias, int64_t rows, int64_t h) override { inner_->add_rows(x, bias, rows, h); }
  void sum_rows(const T* x, G* out, int64_t rows, int64_t h) override { inner_->sum_rows(x, out, rows, h); }
  void fill_columns(T* x, int64_t rows, int64_t cols, int64_t from, T value) override {
    inner_->fill_columns(x, rows, cols, from, value);
  }
  double sum(const W* x, int64_t n) override { return inner_->sum(x, n); }
  void linear_forward(const T* x, const T* w, const T* bias, T* y, int64_t tokens, int64_t in, int64_t out) override {
    inner_->linear_forward(x, w, bias, y, tokens, in, out);
  }
  void linear_backward_data(const T* dy, const T* w, T* dx, int64_t tokens, int64_t in, int64_t out,
                            bool accumulate) override {
    inner_->linear_backward_data(dy, w, dx, tokens, in, out, accumulate);
  }
  void linear_backward_weight(const T* dy, const T* x, G* dw, G* dbias, int64_t tokens, int64_t in,
                              int64_t out) override {
    inner_->linear_backward_weight(dy, x, dw, dbias, tokens, in, out);
  }
  void dropout_add_forward(const T* x, const T* residual, T* out, uint8_t* mask, int64_t s, int64_t b, int64_t h,
                           const cpu::Dropout& dropout, int64_t s0, const int64_t* sample_index) override {
    inner_->dropout_add_forward(x, residual, out, mask, s, b, h, dropout, s0, sample_index);
  }
  void dropout_backward(const T* dy, const uint8_t* mask, T* dx, int64_t n, double p) override {
    inner_->dropout_backward(dy, mask, dx, n, p);
  }
  void embedding_forward(const int32_t* tokens, const T* w, T* out, int64_t s, int64_t b, int64_t h, int64_t v0,
                         int64_t v_local) override {
    inner_->embedding_forward(tokens, w, out, s, b, h, v0, v_local);
  }
  void embedding_backward(const int32_t* tokens, const T* dout, G* dw, int64_t s, int64_t b, int64_t h, int64_t v0,
                          int64_t v_local) override {
    inner_->embedding_backward(tokens, dout, dw, s, b, h, v0, v_local);
  }
  void position_add_forward(T* x, const T* pos, int64_t s, int64_t b, int64_t h, int64_t s0,
                            int64_t max_positions) override {
    inner_->position_add_forward(x, pos, s, b, h, s0, max_positions);
  }
  void position_add_backward(const T* dx, G* dpos, int64_t s, int64_t b, int64_t h, int64_t s0,
                             int64_t max_positions) override {
    inner_->position_add_backward(dx, dpos, s, b, h, s0, max_positions);
  }
  void layernorm_forward(const T* x, const T* w, const T* bias, T* y, int64_t rows, int64_t h, double eps) override {
    inner_->layernorm_forward(x, w, bias, y, rows, h, eps);
  }
  void layernorm_backward(const T* x, const T* w, const T* dy, T* dx, G* dw, G* db, int64_t rows, int64_t h,
                          double eps) override {
    inner_->layernorm_backward(x, w, dy, dx, dw, db, rows, h, eps);
  }
  void rmsnorm_forward(const T* x, const T* w, T* y, int64_t rows, int64_t h, double eps) override {
    inner_->rmsnorm_forward(x, w, y, rows, h, eps);
  }
  void rmsnorm_backward(const T* x, const T* w, const T* dy, T* dx, G* dw, int64_t rows, int64_t h,
                        double eps) override {
    inner_->rmsnorm_backward(x, w, dy, dx, dw, rows, h, eps);
  }
  void rotary_forward(T* qkv, const cpu::AttentionShape& shape, double theta, int64_t s0) override {
    inner_->rotary_forward(qkv, shape, theta, s0);
  }
  void rotary_backward(T* d_qkv, const cpu::AttentionShape& shape, double theta, int64_t s0) override {
    inner_->rotary_backward(d_qkv, shape, theta, s0);
  }
  void attention_score_forward(const T* qkv, T* scores, const cpu::AttentionShape& shape, double scale) override {
    inner_->attention_score_forward(qkv, scores, shape, scale);
  }
  void softmax_forward(const T* scores, T* probs, int64_t rows, int64_t cols) override {
    inner_->softmax_forward(scores, probs, rows, cols);
  }
  void attention_dropout_forward(const T* probs, T* probs_drop, uint8_t* mask, const cpu::AttentionShape& shape,
                                 const cpu::Dropout& dropout, int64_t head0, const int64_t* sample_index) override {
    inner_->attention_dropout_forward(probs, probs_drop, mask, shape, dropout, head0, sample_index);
  }
  void attention_value_forward(const T* probs_used, const T* qkv, T* ctx, const cpu::AttentionShape& shape) override {
    inner_->attention_value_forward(probs_used, qkv, ctx, shape);
  }
  void attention_value_backward(const T* d_ctx, const T* probs_used, const T* qkv, T* d_probs_used, T* d_qkv,
                                const cpu::AttentionShape& shape) override {
    inner_->attention_value_backward(d_ctx, probs_used, qkv, d_probs_used, d_qkv, shape);
  }
  void softmax_backward(const T* d_probs, const T* probs, T* d_scores, int64_t rows, int64_t cols) override {
    inner_->softmax_backward(d_probs, probs, d_scores, rows, cols);
  }
  void attention_score_backward(const T* d_scores, const T* qkv, T* d_qkv, const cpu::AttentionShape& shape,
                                double scale) override {
    inner_->attention_score_backward(d_scores, qkv, d_qkv, shape, scale);
  }
  void flash_attention_forward(const T* qkv, T* ctx, W* lse, const cpu::AttentionShape& shape, double scale,
                               const cpu::Dropout* dropout, int64_t head0, const int64_t* sample_index) override {
    inner_->flash_attention_forward(qkv, ctx, lse, shape, scale, dropout, head0, sample_index);
  }
  void flash_attention_backward(const T* qkv, const T* ctx, const W* lse, const T* d_ctx, T* d_qkv,
                                const cpu::AttentionShape& shape, double scale, const cpu::Dropout* dropout,
                                int64_t head0, const int64_t* sample_index) override {
    inner_->flash_attention_backward(qkv, ctx, lse, d_ctx, d_qkv, shape, scale, dropout, head0, sample_index);
  }
  void cp_kv_pack(const T* qkv, T* kv, const cpu::AttentionShape& shape) override { inner_->cp_kv_pack(qkv, kv, shape); }
  void cp_kv_unpack(const T* d_kv, T* d_qkv, const cpu::AttentionShape& shape) override {
    inner_->cp_kv_unpack(d_kv, d_qkv, shape);
  }
  void cp_flash_forward(const T* qkv, const T* kv, int64_t n, const int64_t* q_pos, const int64_t* kv_pos, T* ctx,
                        W* lse, const cpu::AttentionShape& shape, double scale, const cpu::Dropout* dropout,
                        int64_t head0, const int64_t* sample_index) override {
    inner_->cp_flash_forward(qkv, kv, n, q_pos, kv_pos, ctx, lse, shape, scale, dropout, head0, sample_index);
  }
  void cp_flash_backward(const T* qkv, const T* kv, int64_t n, const int64_t* q_pos, const int64_t* kv_pos,
                         const T* ctx, const W* lse, const T* d_ctx, T* d_qkv, bool accumulate, T* d_kv,
                         const cpu::AttentionShape& shape, double scale, const cpu::Dropout* dropout, int64_t head0,
                         const int64_t* sample_index) override {
    inner_->cp_flash_backward(qkv, kv, n, q_pos, kv_pos, ctx, lse, d_ctx, d_qkv, accumulate, d_kv, shape, scale,
                              dropout, head0, sample_index);
  }
  void cp_merge(T* ctx, W* lse, const T* ctx_part, const W* lse_part, const cpu::AttentionShape& shape) override {
    inner_->cp_merge(ctx, lse, ctx_part, lse_part, shape);
  }
  void fp8_cast(const T* x, uint8_t* y, int64_t n, const W* scale, W* amax, Fp8Storage format) override {
    inner_->fp8_cast(x, y, n, scale, amax, format);
  }
  void fp8_linear_forward(const Fp8Codes<W>& x, const Fp8Codes<W>& w, const T* bias, T* y, int64_t tokens, int64_t in,
                          int64_t out) override {
    inner_->fp8_linear_forward(x, w, bias, y, tokens, in, out);
  }
  void fp8_linear_backward_data(const Fp8Codes<W>& dy, const Fp8Codes<W>& w, T* dx, int64_t tokens, int64_t in,
                                int64_t out, bool accumulate, bool w_transposed) override {
    inner_->fp8_linear_backward_data(dy, w, dx, tokens, in, out, accumulate, w_transposed);
  }
  void fp8_transpose(const uint8_t* x, uint8_t* y, int64_t rows, int64_t cols) override {
    inner_->fp8_transpose(x, y, rows, cols);
  }
  void fp8_linear_backward_weight(const Fp8Codes<W>& dy, const Fp8Codes<W>& x, G* dw, G* dbias, int64_t tokens,
                                  int64_t in, int64_t out, const uint8_t* dy_t, const uint8_t* x_t) override {
    inner_->fp8_linear_backward_weight(dy, x, dw, dbias, tokens, in, out, dy_t, x_t);
  }
  void fp8_scale_update(W* amax, W* history, W* scale, int64_t slots, const Fp8Recipe& recipe) override {
    inner_->fp8_scale_update(amax, history, scale, slots, recipe);
  }
  void all_reduce_max(GroupKind group, W* x, int64_t n) override { inner_->all_reduce_max(group, x, n); }
  void fp8_absmax(const T* x, int64_t n, W* amax, bool accumulate) override {
    inner_->fp8_absmax(x, n, amax, accumulate);
  }
  void fp8_set_current_scale(const W* amax, W* scale, Fp8Storage format) override {
    inner_->fp8_set_current_scale(amax, scale, format);
  }
  void cp_accumulate(T* acc, const T* part, int64_t n) override { inner_->cp_accumulate(acc, part, n); }
  void moe_route_forward(const T* logits, T* probs, T* route_w, int32_t* route_idx, int32_t* counts, int64_t tokens,
                         int64_t experts, int64_t top_k, int64_t capacity, bool normalize, bool drop_by_probs) override {
    inner_->moe_route_forward(logits, probs, route_w, route_idx, counts, tokens, experts, top_k, capacity, normalize,
                              drop_by_probs);
  }
  double moe_aux_loss(const T* probs, const int32_t* route_idx, int64_t tokens, int64_t experts, int64_t top_k,
                      double scale, const double* chosen) override {
    return inner_->moe_aux_loss(probs, route_idx, tokens, experts, top_k, scale, chosen);
  }
  void moe_route_backward(const T* probs, const int32_t* route_idx, const T* d_route_w, T* d_logits, int64_t tokens,
                          int64_t experts, int64_t top_k, double aux_scale, const double* chosen,
                          bool normalize) override {
    inner_->moe_route_backward(probs, route_idx, d_route_w, d_logits, tokens, experts, top_k, aux_scale, chosen,
                               normalize);
  }
  void moe_permute(const T* x, T* y, const int64_t* rows, int64_t tokens, int64_t top_k, int64_t h,
                   bool backward) override {
    inner_->moe_permute(x, y, rows, tokens, top_k, h, backward);
  }
  void moe_unpermute_forward(const T* x, const T* route_w, const int64_t* rows, T* y, int64_t tokens, int64_t top_k,
                             int64_t h) override {
    inner_->moe_unpermute_forward(x, route_w, rows, y, tokens, top_k, h);
  }
  void moe_unpermute_backward(const T* d_y, const T* x, const T* route_w, const int64_t* rows, T* d_x, T* d_route_w,
                              int64_t tokens, int64_t top_k, int64_t h) override {
    inner_->moe_unpermute_backward(d_y, x, route_w, rows, d_x, d_route_w, tokens, top_k, h);
  }
  void moe_add(T* acc, const T* x, int64_t n) override { inner_->moe_add(acc, x, n); }
  void expert_linear_forward(const T* x, const std::vector<const T*>& w, const std::vector<int64_t>& rows, T* y,
                             int64_t in, int64_t out) override {
    inner_->expert_linear_forward(x, w, rows, y, in, out);
  }
  void expert_linear_backward_data(const T* dy, const std::vector<const T*>& w, const std::vector<int64_t>& rows,
                                   T* dx, int64_t in, int64_t out, bool accumulate) override {
    inner_->expert_linear_backward_data(dy, w, rows, dx, in, out, accumulate);
  }
  void expert_linear_backward_weight(const T* dy, const T* x, const std::vector<G*>& dw,
                                     const std::vector<int64_t>& rows, int64_t in, int64_t out) override {
    inner_->expert_linear_backward_weight(dy, x, dw, rows, in, out);
  }
  void all_to_allv(GroupKind group, const char* send, const std::vector<int64_t>& send_bytes,
                   const std::vector<int64_t>& send_offsets, char* recv, const std::vector<int64_t>& recv_bytes,
                   const std::vector<int64_t>& recv_offsets) override {
    inner_->all_to_allv(group, send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets);
  }
  void cp_a2a_heads(const T* x, T* y, int64_t rows, const std::vector<int64_t>& sections, int64_t parts,
                    bool split) override {
    inner_->cp_a2a_heads(x, y, rows, sections, parts, split);
  }
  void cp_permute_rows(const T* x, T* y, const int64_t* index, int64_t n, int64_t width, bool gather) override {
    inner_->cp_permute_rows(x, y, index, n, width, gather);
  }
  void cp_score_forward(const T* qkv, const T* kv, int64_t n, const int64_t* q_pos, const int64_t* kv_pos, T* scores,
                        const cpu::AttentionShape& shape, double scale) override {
    inner_->cp_score_forward(qkv, kv, n, q_pos, kv_pos, scores, shape, scale);
  }
  void cp_attention_dropout_forward(const T* probs, T* probs_drop, uint8_t* mask, const cpu::AttentionShape& shape,
                                    int64_t n, const int64_t* q_pos, const int64_t* kv_pos,
                                    const cpu::Dropout& dropout, int64_t head0,
                                    const int64_t* sample_index) override {
    inner_->cp_attention_dropout_forward(probs, probs_drop, mask, shape, n, q_pos, kv_pos, dropout, head0,
                                         sample_index);
  }
  void cp_value_forward(const T* probs_used, const T* kv, int64_t n, T* ctx,
                        const cpu::AttentionShape& shape) override {
    inner_->cp_value_forward(probs_used, kv, n, ctx, shape);
  }
  void cp_value_backward(const T* d_ctx, const T* probs_used, const T* kv, int64_t n, T* d_probs_used, T* d_kv,
                         const cpu::AttentionShape& shape) override {
    inner_->cp_value_backward(d_ctx, probs_used, kv, n, d_probs_used, d_kv, shape);
  }
  void cp_score_backward(const T* d_scores, const T* qkv, const T* kv, int64_t n, T* d_qkv, T* d_kv,
                         const cpu::AttentionShape& shape, double scale) override {
    inner_->cp_score_backward(d_scores, qkv, kv, n, d_qkv, d_kv, shape, scale);
  }

  void gelu_forward(const T* x, T* y, int64_t n) override { inner_->gelu_forward(x, y, n); }
  void gelu_backward(const T* x, const T* dy, T* dx, int64_t n) override { inner_->gelu_backward(x, dy, dx, n); }
  void swiglu_forward(const T* gate, const T* up, T* act, int64_t n) override {
    inner_->swiglu_forward(gate, up, act, n);
  }
  void swiglu_backward(const T* gate, const T* up, const T* d_act, T* d_gate, T* d_up, int64_t n) override {
    inner_->swiglu_backward(gate, up, d_act, d_gate, d_up, n);
  }
  void cross_entropy_stats(const T* logits, const int32_t* targets, W* stats, int64_t tokens, int64_t v0,
                           int64_t v_local) override {
    inner_->cross_entropy_stats(logits, targets, stats, tokens, v0, v_local);
  }
  void cross_entropy_forward(const T* logits, const W* stats_all, int64_t tp, W* softmax, W* loss, int64_t tokens,
                             int64_t v_local) override {
    inner_->cross_entropy_forward(logits, stats_all, tp, softmax, loss, tokens, v_local);
  }
  void cross_entropy_backward(const W* softmax, const int32_t* targets, T* dlogits, int64_t tokens, int64_t v0,
                              int64_t v_local, double scale) override {
    inner_->cross_entropy_backward(softmax, targets, dlogits, tokens, v0, v_local, scale);
  }
  double grad_norm_sq(const G* g, int64_t n) override { return inner_->grad_norm_sq(g, n); }
  double grad_norm_sq(const std::vector<std::pair<const G*, int64_t>>& ranges) override {
    return inner_->grad_norm_sq(ranges);
  }
  void adamw_step(T* param, W* master, const G* grad, W* exp_avg, W* exp_avg_sq, int64_t n, const cpu::AdamW& config,
                  int64_t step, double clip_coef) override {
    inner_->adamw_step(param, master, grad, exp_avg, exp_avg_sq, n, config, step, clip_coef);
  }
  void all_reduce(GroupKind group, Algorithm algorithm, Dtype dtype, std::vector<Span<void>> buffers) override {
    inner_->all_reduce(group, algorithm, dtype, std::move(buffers));
  }
  void reduce_scatter(GroupKind group, Dtype dtype, std::vector<Span<void>> buffers) override {
    inner_->reduce_scatter(group, dtype, std::move(buffers));
  }
  void all_to_all(GroupKind group, Dtype dtype, Span<void> send, Span<void> recv) override {
    inner_->all_to_all(group, dtype, send, recv);
  }
  void all_gather(GroupKind group, Dtype dtype, std::vector<Span<void>> buffers) override {
    inner_->all_gather(group, dtype, std::move(buffers));
  }
  int group_size(GroupKind group) const override { return inner_->group_size(group); }
  int group_index(GroupKind group) const override { return inner_->group_index(group); }
  void send(const T* data, int64_t n, int peer, int64_t tag) override { inner_->send(data, n, peer, tag); }
  void recv(T* data, int64_t n, int peer, int64_t tag) override { inner_->recv(data, n, peer, tag); }
  void finish_sends() override { inner_->finish_sends(); }
  void set_collective_scratch(void* scratch, int64_t bytes) override { inner_->set_collective_scratch(scratch, bytes); }
  std::map<std::string, int64_t> algorithms_used() const override { return inner_->algorithms_used(); }
  void synchronize() override { inner_->synchronize(); }
  double now_s() override { return inner_->now_s(); }
  void set_current(const std::string& what) override { inner_->set_current(what); }
  void begin_async(int32_t op_id) override { inner_->begin_async(op_id); }
  void end_async(int32_t op_id) override { inner_->end_async(op_id); }
  void wait_async(int32_t op_id) override { inner_->wait_async(op_id); }
  void begin_step(int64_t step_index) override { inner_->begin_step(step_index); }
  void begin_op(const Op& op) override { inner_->begin_op(op); }
  void reached(RunPoint point) override { inner_->reached(point); }
  Json device_memory() const override { return inner_->device_memory(); }
  double device_peak_bytes() const override { return inner_->device_peak_bytes(); }

 protected:
  Backend<T, G, W>& inner() { return *inner_; }

 private:
  std::unique_ptr<Backend<T, G, W>> inner_;
};

}  // namespace stepcast
