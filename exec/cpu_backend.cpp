// The CPU backend of cpu_backend.hpp: forwards kernels to cpu_kernels.hpp, collectives to
// mpi_collectives.hpp (packing chunks in the scratch the program gives each collective), and
// posts pipeline sends from the buffer it is given — the program's staging copy, live until
// finish_sends completes the step's sends — so it allocates no memory of its own during a step.
#include "cpu_backend.hpp"

#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <cstring>

#include "cpu_kernels.hpp"
#include "errors.hpp"
#include "mpi_check.hpp"
#include "mpi_collectives.hpp"

namespace stepcast {

namespace {

template <class T>
class CpuBackend final : public Backend<T> {
 public:
  CpuBackend(const RankGrid& grid, int64_t rank, int64_t devices_per_node, bool use_mpi,
             double watchdog_s)
      : rank_(int(rank)), comms_(grid, rank, devices_per_node), watchdog_(watchdog_s),
        collectives_(comms_, use_mpi, watchdog_), fp8_scratch_(size_t(cpu::kFp8Scratch)) {}
  const char* name() const override { return "cpu"; }

  char* allocate(int64_t bytes) override {
    size_t size = size_t((std::max<int64_t>(64, bytes) + 63) / 64 * 64);
    char* p = static_cast<char*>(std::aligned_alloc(64, size));
    STEPCAST_CHECK(p != nullptr, "cannot allocate " + std::to_string(size) + " bytes");
    std::memset(p, 0, size);
    return p;
  }
  void release(char* memory) override { std::free(memory); }
  void zero(void* memory, int64_t bytes) override { std::memset(memory, 0, size_t(bytes)); }
  void upload(void* dst, const void* src, int64_t bytes) override { std::memcpy(dst, src, size_t(bytes)); }
  void download(void* dst, const void* src, int64_t bytes) override { std::memcpy(dst, src, size_t(bytes)); }

  void copy(void* dst, const void* src, int64_t bytes) override {
    std::memmove(dst, src, size_t(bytes));
  }
  void add(T* y, const T* x, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) y[i] += x[i];
  }
  void add_rows(T* x, const T* bias, int64_t rows, int64_t h) override {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < h; ++j) x[r * h + j] += bias[j];
    }
  }
  void sum_rows(const T* x, T* out, int64_t rows, int64_t h) override {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < h; ++j) out[j] += x[r * h + j];
    }
  }
  void fill_columns(T* x, int64_t rows, int64_t cols, int64_t from, T value) override {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = from; c < cols; ++c) x[r * cols + c] = value;
    }
  }
  double sum(const T* x, int64_t n) override {
    double total = 0;
    for (int64_t i = 0; i < n; ++i) total += double(x[i]);
    return total;
  }

  void linear_forward(const T* x, const T* w, const T* bias, T* y, int64_t tokens, int64_t in,
                      int64_t out) override {
    cpu::linear_forward(x, w, bias, y, tokens, in, out);
  }
  void linear_backward_data(const T* dy, const T* w, T* dx, int64_t tokens, int64_t in,
                            int64_t out, bool accumulate) override {
    cpu::linear_backward_data(dy, w, dx, tokens, in, out, accumulate);
  }
  void linear_backward_weight(const T* dy, const T* x, T* dw, T* dbias, int64_t tokens,
                              int64_t in, int64_t out) override {
    cpu::linear_backward_weight(dy, x, dw, dbias, tokens, in, out);
  }
  void dropout_add_forward(const T* x, const T* residual, T* out, uint8_t* mask, int64_t s,
                           int64_t b, int64_t h, const cpu::Dropout& dropout, int64_t s0,
                           const int64_t* sample_index) override {
    cpu::dropout_add_forward(x, residual, out, mask, s, b, h, dropout, s0, sample_index);
  }
  void dropout_backward(const T* dy, const uint8_t* mask, T* dx, int64_t n, double p) override {
    cpu::dropout_backward(dy, mask, dx, n, p);
  }
  void embedding_forward(const int32_t* tokens, const T* w, T* out, int64_t s, int64_t b,
                         int64_t h, int64_t v0, int64_t v_local) override {
    cpu::embedding_forward(tokens, w, out, s, b, h, v0, v_local);
  }
  void embedding_backward(const int32_t* tokens, const T* dout, T* dw, int64_t s, int64_t b,
                          int64_t h, int64_t v0, int64_t v_local) override {
    cpu::embedding_backward(tokens, dout, dw, s, b, h, v0, v_local);
  }
  void position_add_forward(T* x, const T* pos, int64_t s, int64_t b, int64_t h, int64_t s0,
                            int64_t max_positions) override {
    cpu::position_add_forward(x, pos, s, b, h, s0, max_positions);
  }
  void position_add_backward(const T* dx, T* dpos, int64_t s, int64_t b, int64_t h, int64_t s0,
                             int64_t max_positions) override {
    cpu::position_add_backward(dx, dpos, s, b, h, s0, max_positions);
  }
  void layernorm_forward(const T* x, const T* w, const T* bias, T* y, int64_t rows, int64_t h,
                         double eps) override {
    cpu::layernorm_forward(x, w, bias, y, rows, h, eps);
  }
  void layernorm_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, T* db, int64_t rows,
                          int64_t h, double eps) override {
    cpu::layernorm_backward(x, w, dy, dx, dw, db, rows, h, eps);
  }
  void rmsnorm_forward(const T* x, const T* w, T* y, int64_t rows, int64_t h, double eps) override {
    cpu::rmsnorm_forward(x, w, y, rows, h, eps);
  }
  void rmsnorm_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, int64_t rows, int64_t h,
                        double eps) override {
    cpu::rmsnorm_backward(x, w, dy, dx, dw, rows, h, eps);
  }
  void rotary_forward(T* qkv, const cpu::AttentionShape& shape, double theta, int64_t s0) override {
    cpu::rotary_forward(qkv, shape, theta, s0);
  }
  void rotary_backward(T* d_qkv, const cpu::AttentionShape& shape, double theta,
                       int64_t s0) override {
    cpu::rotary_backward(d_qkv, shape, theta, s0);
  }
  void attention_score_forward(const T* qkv, T* scores, const cpu::AttentionShape& shape,
                               double scale) override {
    cpu::attention_score_forward(qkv, scores, shape, scale);
  }
  void softmax_forward(const T* scores, T* probs, int64_t rows, int64_t cols) override {
    cpu::softmax_forward(scores, probs, rows, cols);
  }
  void attention_dropout_forward(const T* probs, T* probs_drop, uint8_t* mask,
                                 const cpu::AttentionShape& shape, const cpu::Dropout& dropout,
                                 int64_t head0, const int64_t* sample_index) override {
    cpu::attention_dropout_forward(probs, probs_drop, mask, shape, dropout, head0, sample_index);
  }
  void attention_value_forward(const T* probs_used, const T* qkv, T* ctx,
                               const cpu::AttentionShape& shape) override {
    cpu::attention_value_forward(probs_used, qkv, ctx, shape);
  }
  void attention_value_backward(const T* d_ctx, const T* probs_used, const T* qkv,
                                T* d_probs_used, T* d_qkv,
                                const cpu::AttentionShape& shape) override {
    cpu::attention_value_backward(d_ctx, probs_used, qkv, d_probs_used, d_qkv, shape);
  }
  void softmax_backward(const T* d_probs, const T* probs, T* d_scores, int64_t rows,
                        int64_t cols) override {
    cpu::softmax_backward(d_probs, probs, d_scores, rows, cols);
  }
  void attention_score_backward(const T* d_scores, const T* qkv, T* d_qkv,
                                const cpu::AttentionShape& shape, double scale) override {
    cpu::attention_score_backward(d_scores, qkv, d_qkv, shape, scale);
  }
  void flash_attention_forward(const T* qkv, T* ctx, T* lse, const cpu::AttentionShape& shape,
                               double scale, const cpu::Dropout* dropout, int64_t head0,
                               const int64_t* sample_index) override {
    cpu::flash_attention_forward(qkv, ctx, lse, shape, scale, dropout, head0, sample_index);
  }
  void flash_attention_backward(const T* qkv, const T* ctx, const T* lse, const T* d_ctx,
                                T* d_qkv, const cpu::AttentionShape& shape, double scale,
                                const cpu::Dropout* dropout, int64_t head0,
                                const int64_t* sample_index) override {
    cpu::flash_attention_backward(qkv, ctx, lse, d_ctx, d_qkv, shape, scale, dropout, head0,
                                  sample_index);
  }
  void cp_kv_pack(const T* qkv, T* kv, const cpu::AttentionShape& shape) override { cpu::cp_kv_pack(qkv, kv, shape); }
  void cp_kv_unpack(const T* d_kv, T* d_qkv, const cpu::AttentionShape& shape) override {
    cpu::cp_kv_unpack(d_kv, d_qkv, shape);
  }
  void cp_flash_forward(const T* qkv, const T* kv, int64_t n, const int64_t* q_pos, const int64_t* kv_pos, T* ctx,
                        T* lse, const cpu::AttentionShape& shape, double scale, const cpu::Dropout* dropout,
                        int64_t head0, const int64_t* sample_index) override {
    cpu::cp_flash_forward(qkv, kv, n, q_pos, kv_pos, ctx, lse, shape, scale, dropout, head0, sample_index);
  }
  void cp_flash_backward(const T* qkv, const T* kv, int64_t n, const int64_t* q_pos, const int64_t* kv_pos,
                         const T* ctx, const T* lse, const T* d_ctx, T* d_qkv, bool accumulate, T* d_kv,
                         const cpu::AttentionShape& shape, double scale, const cpu::Dropout* dropout, int64_t head0,
                         const int64_t* sample_index) override {
    cpu::cp_flash_backward(qkv, kv, n, q_pos, kv_pos, ctx, lse, d_ctx, d_qkv, accumulate, d_kv, shape, scale,
                           dropout, head0, sample_index);
  }
  void cp_merge(T* ctx, T* lse, const T* ctx_part, const T* lse_part, const cpu::AttentionShape& shape) override {
    cpu::cp_merge(ctx, lse, ctx_part, lse_part, shape);
  }
  void cp_a2a_heads(const T* x, T* y, int64_t rows, const std::vector<int64_t>& sections, int64_t parts,
                    bool split) override {
    cpu::a2a_heads(x, y, rows, sections, parts, split);
  }
  void cp_permute_rows(const T* x, T* y, const int64_t* index, int64_t n, int64_t width, bool gather) override {
    cpu::permute_rows(x, y, index, n, width, gather);
  }
  void cp_accumulate(T* acc, const T* part, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) acc[i] += part[i];
  }
  void moe_route_forward(const T* logits, T* probs, T* route_w, int32_t* route_idx, int32_t* counts, int64_t tokens,
                         int64_t experts, int64_t top_k, int64_t capacity, bool normalize, bool drop_by_probs) override {
    cpu::moe_route_forward(logits, probs, route_w, route_idx, counts, tokens, experts, top_k, capacity, normalize,
                           drop_by_probs);
  }
  double moe_aux_loss(const T* probs, const int32_t* route_idx, int64_t tokens, int64_t experts, int64_t top_k,
                      double scale, const double* chosen) override {
    return cpu::moe_aux_loss(probs, route_idx, tokens, experts, top_k, scale, chosen);
  }
  void moe_route_backward(const T* probs, const int32_t* route_idx, const T* d_route_w, T* d_logits, int64_t tokens,
                          int64_t experts, int64_t top_k, double aux_scale, const double* chosen,
                          bool normalize) override {
    cpu::moe_route_backward(probs, route_idx, d_route_w, d_logits, tokens, experts, top_k, aux_scale, chosen,
                            normalize);
  }
  void moe_permute(const T* x, T* y, const int64_t* rows, int64_t tokens, int64_t top_k, int64_t h,
                   bool backward) override {
    if (backward)
      cpu::moe_permute_backward(x, y, rows, tokens, top_k, h);
    else
      cpu::moe_permute_forward(x, y, rows, tokens, top_k, h);
  }
  void moe_unpermute_forward(const T* x, const T* route_w, const int64_t* rows, T* y, int64_t tokens, int64_t top_k,
                             int64_t h) override {
    cpu::moe_unpermute_forward(x, route_w, rows, y, tokens, top_k, h);
  }
  void moe_unpermute_backward(const T* d_y, const T* x, const T* route_w, const int64_t* rows, T* d_x, T* d_route_w,
                              int64_t tokens, int64_t top_k, int64_t h) override {
    cpu::moe_unpermute_backward(d_y, x, route_w, rows, d_x, d_route_w, tokens, top_k, h);
  }
  void moe_add(T* acc, const T* x, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) acc[i] += x[i];
  }
  void all_to_allv(GroupKind group, const char* send, const std::vector<int64_t>& send_bytes,
                   const std::vector<int64_t>& send_offsets, char* recv, const std::vector<int64_t>& recv_bytes,
                   const std::vector<int64_t>& recv_offsets) override {
    collectives_.all_to_allv(group, send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets);
  }
  void cp_score_forward(const T* qkv, const T* kv, int64_t n, const int64_t* q_pos, const int64_t* kv_pos, T* scores,
                        const cpu::AttentionShape& shape, double scale) override {
    cpu::cp_score_forward(qkv, kv, n, q_pos, kv_pos, scores, shape, scale);
  }
  void cp_attention_dropout_forward(const T* probs, T* probs_drop, uint8_t* mask, const cpu::AttentionShape& shape,
                                    int64_t n, const int64_t* q_pos, const int64_t* kv_pos,
                                    const cpu::Dropout& dropout, int64_t head0,
                                    const int64_t* sample_index) override {
    cpu::cp_attention_dropout_forward(probs, probs_drop, mask, shape, n, q_pos, kv_pos, dropout, head0, sample_index);
  }
  void cp_value_forward(const T* probs_used, const T* kv, int64_t n, T* ctx,
                        const cpu::AttentionShape& shape) override {
    cpu::cp_value_forward(probs_used, kv, n, ctx, shape);
  }
  void cp_value_backward(const T* d_ctx, const T* probs_used, const T* kv, int64_t n, T* d_probs_used, T* d_kv,
                         const cpu::AttentionShape& shape) override {
    cpu::cp_value_backward(d_ctx, probs_used, kv, n, d_probs_used, d_kv, shape);
  }
  void cp_score_backward(const T* d_scores, const T* qkv, const T* kv, int64_t n, T* d_qkv, T* d_kv,
                         const cpu::AttentionShape& shape, double scale) override {
    cpu::cp_score_backward(d_scores, qkv, kv, n, d_qkv, d_kv, shape, scale);
  }
  void gelu_forward(const T* x, T* y, int64_t n) override { cpu::gelu_forward(x, y, n); }
  void gelu_backward(const T* x, const T* dy, T* dx, int64_t n) override {
    cpu::gelu_backward(x, dy, dx, n);
  }
  void swiglu_forward(const T* gate, const T* up, T* act, int64_t n) override {
    cpu::swiglu_forward(gate, up, act, n);
  }
  void swiglu_backward(const T* gate, const T* up, const T* d_act, T* d_gate, T* d_up,
                       int64_t n) override {
    cpu::swiglu_backward(gate, up, d_act, d_gate, d_up, n);
  }
  void cross_entropy_stats(const T* logits, const int32_t* targets, T* stats, int64_t tokens,
                           int64_t v0, int64_t v_local) override {
    cpu::cross_entropy_stats(logits, targets, stats, tokens, v0, v_local);
  }
  void cross_entropy_forward(const T* logits, const T* stats_all, int64_t tp, T* softmax, T* loss,
                             int64_t tokens, int64_t v_local) override {
    cpu::cross_entropy_forward(logits, stats_all, tp, softmax, loss, tokens, v_local);
  }
  void cross_entropy_backward(const T* softmax, const int32_t* targets, T* dlogits,
                              int64_t tokens, int64_t v0, int64_t v_local, double scale) override {
    cpu::cross_entropy_backward(softmax, targets, dlogits, tokens, v0, v_local, scale);
  }
  double grad_norm_sq(const T* g, int64_t n) override { return cpu::grad_norm_sq(g, n); }
  void adamw_step(T* param, T* master, const T* grad, T* exp_avg, T* exp_avg_sq, int64_t n,
                  const cpu::AdamW& config, int64_t step, double clip_coef) override {
    // A master copy (fp8_param_gather's FP8 weights: theirs only, param null; or the weights kept
    // beside it) is updated in place, in the weights' own precision, and copied to param.
    if (master == nullptr) return cpu::adamw_step(param, grad, exp_avg, exp_avg_sq, n, config, step, clip_coef);
    cpu::adamw_step(master, grad, exp_avg, exp_avg_sq, n, config, step, clip_coef);
    if (param != nullptr) std::memcpy(param, master, size_t(n) * sizeof(T));
  }

  void block_cast(const T* x, uint8_t* y, int64_t rows, int64_t cols, Fp8Blocks blocks, bool columnwise,
                  Fp8Storage format, bool power_of_two) override {
    cpu::block_cast(x, y, rows, cols, blocks, columnwise, format, power_of_two);
  }
  void fp8_cast(const T* x, uint8_t* y, int64_t n, const T* scale, T* amax, Fp8Storage format) override {
    cpu::fp8_cast(x, y, n, *scale, amax, format);
  }
  void fp8_linear_forward(const Fp8Codes<T>& x, const Fp8Codes<T>& w, const T* bias, T* y, int64_t tokens, int64_t in,
                          int64_t out) override {
    cpu::fp8_linear_forward(operand(x, in), operand(w, in), bias, y, tokens, in, out, fp8_scratch_.data());
  }
  void fp8_linear_backward_data(const Fp8Codes<T>& dy, const Fp8Codes<T>& w, T* dx, int64_t tokens, int64_t in,
                                int64_t out, bool accumulate, bool w_transposed) override {
    cpu::fp8_linear_backward_data(operand(dy, out), operand(w, w_transposed ? out : in), dx, tokens, in, out,
                                  accumulate, fp8_scratch_.data(), w_transposed);
  }
  void fp8_transpose(const uint8_t* x, uint8_t* y, int64_t rows, int64_t cols) override {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) y[c * rows + r] = x[r * cols + c];
  }
  void fp8_linear_backward_weight(const Fp8Codes<T>& dy, const Fp8Codes<T>& x, T* dw, T* dbias, int64_t tokens,
                                  int64_t in, int64_t out, const uint8_t* dy_t, const uint8_t* x_t) override {
    cpu::fp8_linear_backward_weight(operand(dy, out), operand(x, in), dw, dbias, tokens, in, out, fp8_scratch_.data(),
                                    dy_t, x_t);
  }
  void fp8_scale_update(T* amax, T* history, T* scale, int64_t slots, const Fp8Recipe& recipe) override {
    cpu::fp8_scale_update(amax, history, scale, slots, recipe);
  }
  void fp8_absmax(const T* x, int64_t n, T* amax, bool accumulate) override {
    cpu::fp8_absmax(x, n, amax, accumulate);
  }
  void fp8_set_current_scale(const T* amax, T* scale, Fp8Storage format) override {
    cpu::fp8_set_current_scale(amax, scale, format);
  }
  void all_reduce_max(GroupKind group, T* x, int64_t n) override {
    if (comms_.size(group) == 1) return;
    watchdog_.set_current("the FP8 amax reduction");
    STEPCAST_MPI(MPI_Allreduce(MPI_IN_PLACE, x, int(n), mpi_type<T>(), MPI_MAX, comms_.comm(group)));
  }

  void all_reduce(GroupKind group, Algorithm algorithm, Dtype dtype,
                  std::vector<Span<void>> buffers) override {
    collectives_.all_reduce(group, algorithm, typed(dtype, buffers));
  }
  void reduce_scatter(GroupKind group, Dtype dtype, std::vector<Span<void>> buffers) override {
    collectives_.reduce_scatter(group, typed(dtype, buffers));
  }
  void all_gather(GroupKind group, Dtype dtype, std::vector<Span<void>> buffers) override {
    if (is_fp8_storage(dtype)) return all_gather_bytes(group, buffers);
    collectives_.all_gather(group, typed(dtype, buffers));
  }
  void all_to_all(GroupKind group, Dtype dtype, Span<void> send, Span<void> recv) override {
    std::vector<Span<T>> s = typed(dtype, {send}), r = typed(dtype, {recv});
    collectives_.all_to_all(group, s.front(), r.front());
  }
  int group_size(GroupKind group) const override { return comms_.size(group); }
  int group_index(GroupKind group) const override { return comms_.index(group); }

  void set_collective_scratch(void* scratch, int64_t bytes) override {
    collectives_.use_scratch(static_cast<T*>(scratch), bytes / int64_t(sizeof(T)));
  }
  // `data` must stay untouched until finish_sends (the executor sends from a staging copy).
  void send(const T* data, int64_t n, int peer, int64_t tag) override {
    MPI_Request request;
    STEPCAST_MPI(MPI_Isend(data, int(n), mpi_type<T>(), peer, int(tag), MPI_COMM_WORLD, &request));
    pending_.push_back(request);
    pending_peers_.push_back(peer);
  }
  void recv(T* data, int64_t n, int peer, int64_t tag) override {
    std::vector<MPI_Request> request(1);
    STEPCAST_MPI(MPI_Irecv(data, int(n), mpi_type<T>(), peer, int(tag), MPI_COMM_WORLD, &request[0]));
    watchdog_.wait_all(request, {peer});
  }
  void finish_sends() override {
    if (pending_.empty()) return;
    watchdog_.set_current("the posted pipeline sends");
    watchdog_.wait_all(pending_, pending_peers_);
    pending_.clear();
    pending_peers_.clear();
  }
  std::map<std::string, int64_t> algorithms_used() const override {
    return collectives_.algorithms_used;
  }

  void synchronize() override {}
  double now_s() override { return MPI_Wtime(); }
  void set_current(const std::string& what) override { watchdog_.set_current(what); }

  // Every buffer of the program is in T (lowering's dtypes for an fp32 or fp64 plan).
  static std::vector<Span<T>> typed(Dtype dtype, const std::vector<Span<void>>& buffers) {
    STEPCAST_CHECK(dtype_bytes(dtype) == int(sizeof(T)), "a collective on " +
                   std::string(to_string(dtype)) + " buffers in a " + std::to_string(sizeof(T)) +
                   "-byte CPU backend");
    std::vector<Span<T>> out;
    out.reserve(buffers.size());
    for (const auto& b : buffers) out.push_back({static_cast<T*>(b.data), b.count});
    return out;
  }

 private:
  // FP8 codes gathered in place as bytes, each member's chunk where chunk_range puts it (as the
  // ZeRO shards of a layer's FP8 parameters: any length, not whole words of T).
  void all_gather_bytes(GroupKind group, const std::vector<Span<void>>& buffers) {
    const int n = comms_.size(group);
    if (n <= 1) return;
    std::vector<int> counts(static_cast<size_t>(n)), displacements(static_cast<size_t>(n));
    for (const auto& b : buffers) {
      STEPCAST_CHECK(b.count < (int64_t(1) << 31), "an FP8 all_gather of " + std::to_string(b.count) + " bytes");
      for (int i = 0; i < n; ++i) {
        auto [first, last] = chunk_range(b.count, n, i);
        counts[size_t(i)] = int(last - first);
        displacements[size_t(i)] = int(first);
      }
      STEPCAST_MPI(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, b.data, counts.data(), displacements.data(),
                                  MPI_BYTE, comms_.comm(group)));
    }
  }

  int rank_;
  GroupComms comms_;
  Watchdog watchdog_;
  Collectives<T> collectives_;
  std::vector<T> fp8_scratch_;  // decoded FP8 blocks (cpu::kFp8Scratch), allocated before any step
  static cpu::Fp8Operand<T> operand(const Fp8Codes<T>& x, int64_t ld) {
    return {x.codes, ld, x.blocks != Fp8Blocks::none ? T(1) : *x.scale, x.format, x.blocks, x.columnwise};
  }
  std::vector<MPI_Request> pending_;
  std::vector<int> pending_peers_;
};

}  // namespace

template <class T>
std::unique_ptr<Backend<T>> make_cpu_backend(const RankGrid& grid, int64_t rank,
                                             int64_t devices_per_node, bool use_mpi_collectives,
                                             double watchdog_s) {
  return std::make_unique<CpuBackend<T>>(grid, rank, devices_per_node, use_mpi_collectives,
                                         watchdog_s);
}

template std::unique_ptr<Backend<float>> make_cpu_backend<float>(const RankGrid&, int64_t, int64_t,
                                                                 bool, double);
template std::unique_ptr<Backend<double>> make_cpu_backend<double>(const RankGrid&, int64_t,
                                                                   int64_t, bool, double);

}  // namespace stepcast
