// The CUDA backend of cuda_backend.hpp: the streams and events that order compute against
// communication, the kernel launches, GEMMs through cached cuBLASLt plans (cuda_gemm.hpp; the MoE
// experts' grouped: cuda_expert_gemm.hpp), the collectives and pipeline transfers on NCCL
// communicators (cuda_nccl.hpp), device memory through cuda_memory.hpp. A failed call stops the
// job (cuda_failure.hpp).
#include "cuda_backend.hpp"

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

#include "cuda_failure.hpp"
#include "cuda_fp8.hpp"
#include "cuda_gemm.hpp"
#include "cuda_kernels.hpp"
#include "cuda_memory.hpp"
#include "cuda_moe.hpp"
#include "cuda_nccl.hpp"
#include "errors.hpp"
#include "mpi_check.hpp"
#include "mpi_collectives.hpp"

namespace stepcast {

namespace {

using cuda::alignment_of;
using cuda::check_cublas;
using cuda::check_cuda;
using cuda::check_nccl;
using cuda::cuda_type;
using cuda::fail_job;
using cuda::GemmKey;
using cuda::nccl_type;

template <class T, class G>
class CudaBackend final : public cuda::MoeMethods<T, G> {
 public:
  CudaBackend(const RankGrid& grid, int64_t rank, int64_t devices_per_node,
              const CudaBackendOptions& options)
      : rank_(int(rank)), options_(options), comms_(grid, rank, devices_per_node), memory_(rank_) {
    check_call(cudaSetDevice(options.device), "cudaSetDevice");
    check_call(cudaFree(nullptr), "cudaFree(0) (context creation)");
    memory_.record_baseline(current_);
    cudaDeviceProp prop{};
    check_call(cudaGetDeviceProperties(&prop, options.device), "cudaGetDeviceProperties");
    device_name_ = prop.name;
    check_call(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_call(cudaStreamCreateWithFlags(&comm_, cudaStreamNonBlocking), "cudaStreamCreate");
    for (auto& s : p2p_streams_) check_call(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    cublas(cublasLtCreate(&lt_), "cublasLtCreate");
    workspace_ = raw_alloc(options.workspace_bytes, "the cuBLASLt workspace");
    gemms_ = std::make_unique<cuda::Gemms>(lt_, workspace_, options.workspace_bytes);
    experts_ = std::make_unique<cuda::ExpertGemms>(*gemms_, memory_, workspace_, options.workspace_bytes,
                                                   options.moe_grouped_gemms, rank_, current_);
    result_ = static_cast<double*>(raw_alloc(sizeof(double), "a reduction result"));
    for (auto& e : event_pool_) check_call(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    nccl_.create(comms_, rank_);
  }

  ~CudaBackend() override {
    cudaDeviceSynchronize();
    experts_.reset();
    gemms_.reset();
    nccl_.destroy();
    for (auto& [key, staging] : send_staging_) {
      cudaFree(staging.data);
      if (staging.done) cudaEventDestroy(staging.done);
    }
    cudaFree(workspace_);
    cudaFree(result_);
    cublasLtDestroy(lt_);
    for (cudaEvent_t e : event_pool_) cudaEventDestroy(e);
    for (auto& [id, e] : op_events_) cudaEventDestroy(e);
    cudaStreamDestroy(compute_);
    cudaStreamDestroy(comm_);
    for (auto& s : p2p_streams_) cudaStreamDestroy(s);
  }

  const char* name() const override { return "cuda"; }

  // ---- memory ----
  char* allocate(int64_t bytes) override { return memory_.allocate(bytes, current_); }
  void release(char* memory) override { memory_.release(memory, current_); }
  void zero(void* memory, int64_t bytes) override {
    check_call(cudaMemsetAsync(memory, 0, size_t(bytes), stream()), "cudaMemsetAsync");
  }
  void upload(void* dst, const void* src, int64_t bytes) override {
    check_call(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyHostToDevice, compute_), "cudaMemcpyAsync (upload)");
    wait_stream(compute_);
  }
  void download(void* dst, const void* src, int64_t bytes) override {
    check_call(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyDeviceToHost, compute_), "cudaMemcpyAsync (download)");
    wait_stream(compute_);
  }

  // ---- element-wise helpers ----
  void copy(void* dst, const void* src, int64_t bytes) override {
    if (bytes <= 0 || dst == src) return;
    check_call(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyDeviceToDevice, stream()), "cudaMemcpyAsync");
  }
  void add(G* y, const G* x, int64_t n) override { cuda::add(l(), y, x, n); }
  void add_rows(T* x, const T* bias, int64_t rows, int64_t h) override { cuda::add_rows(l(), x, bias, rows, h); }
  void sum_rows(const T* x, G* out, int64_t rows, int64_t h) override { cuda::sum_rows(l(), x, out, rows, h); }
  void fill_columns(T* x, int64_t rows, int64_t cols, int64_t from, T value) override {
    cuda::fill_columns(l(), x, rows, cols, from, float(value));
  }
  double sum(const float* x, int64_t n) override {
    cuda::sum(l(), x, n, result_);
    return read_result();
  }

  // ---- GEMMs (row-major y = x·Wᵀ etc. as column-major products; see linear_forward) ----
  // y[tokens,out] = x[tokens,in]·Wᵀ: column-major yᵀ (out×tokens) = op_T(Wᵀ stored in×out)·xᵀ.
  void linear_forward(const T* x, const T* w, const T* bias, T* y, int64_t tokens, int64_t in,
                      int64_t out) override {
    matmul<T>(true, false, out, tokens, in, w, in, x, in, y, out, 0.f);
    if (bias) cuda::add_rows(l(), y, bias, tokens, out);
  }
  // dx[tokens,in] (+)= dy·W: dxᵀ (in×tokens) = Wᵀ (in×out) · dyᵀ (out×tokens).
  void linear_backward_data(const T* dy, const T* w, T* dx, int64_t tokens, int64_t in,
                            int64_t out, bool accumulate) override {
    matmul<T>(false, false, in, tokens, out, w, in, dy, out, dx, in, accumulate ? 1.f : 0.f);
  }
  // dW[out,in] += dyᵀ·x: dWᵀ (in×out) += xᵀ (in×tokens) · op_T(dyᵀ stored out×tokens).
  void linear_backward_weight(const T* dy, const T* x, G* dw, G* dbias, int64_t tokens,
                              int64_t in, int64_t out) override {
    matmul<G>(false, true, in, out, tokens, x, in, dy, out, dw, in, 1.f);
    if (dbias) cuda::sum_rows(l(), dy, dbias, tokens, out);
  }

  // ---- kernels ----
  void dropout_add_forward(const T* x, const T* residual, T* out, uint8_t* mask, int64_t s,
                           int64_t b, int64_t h, const cpu::Dropout& dropout, int64_t s0,
                           const int64_t* sample_index) override {
    cuda::dropout_add_forward(l(), x, residual, out, mask, s, b, h, dropout, s0, sample_index);
  }
  void dropout_backward(const T* dy, const uint8_t* mask, T* dx, int64_t n, double p) override {
    cuda::dropout_backward(l(), dy, mask, dx, n, p);
  }
  void embedding_forward(const int32_t* tokens, const T* w, T* out, int64_t s, int64_t b,
                         int64_t h, int64_t v0, int64_t v_local) override {
    cuda::embedding_forward(l(), tokens, w, out, s, b, h, v0, v_local);
  }
  void embedding_backward(const int32_t* tokens, const T* dout, G* dw, int64_t s, int64_t b,
                          int64_t h, int64_t v0, int64_t v_local) override {
    cuda::embedding_backward(l(), tokens, dout, dw, s, b, h, v0, v_local);
  }
  void position_add_forward(T* x, const T* pos, int64_t s, int64_t b, int64_t h, int64_t s0,
                            int64_t max_positions) override {
    cuda::position_add_forward(l(), x, pos, s, b, h, s0, max_positions);
  }
  void position_add_backward(const T* dx, G* dpos, int64_t s, int64_t b, int64_t h, int64_t s0,
                             int64_t max_positions) override {
    cuda::position_add_backward(l(), dx, dpos, s, b, h, s0, max_positions);
  }
  void layernorm_forward(const T* x, const T* w, const T* bias, T* y, int64_t rows, int64_t h,
                         double eps) override {
    cuda::layernorm_forward(l(), x, w, bias, y, rows, h, eps);
  }
  void layernorm_backward(const T* x, const T* w, const T* dy, T* dx, G* dw, G* db, int64_t rows,
                          int64_t h, double eps) override {
    cuda::layernorm_backward(l(), x, w, dy, dx, dw, db, rows, h, eps);
  }
  void rmsnorm_forward(const T* x, const T* w, T* y, int64_t rows, int64_t h, double eps) override {
    cuda::rmsnorm_forward(l(), x, w, y, rows, h, eps);
  }
  void rmsnorm_backward(const T* x, const T* w, const T* dy, T* dx, G* dw, int64_t rows, int64_t h,
                        double eps) override {
    cuda::rmsnorm_backward(l(), x, w, dy, dx, dw, rows, h, eps);
  }
  void rotary_forward(T* qkv, const cpu::AttentionShape& shape, double theta, int64_t s0) override {
    cuda::rotary(l(), qkv, shape, theta, s0, 1.0);
  }
  void rotary_backward(T* d_qkv, const cpu::AttentionShape& shape, double theta, int64_t s0) override {
    cuda::rotary(l(), d_qkv, shape, theta, s0, -1.0);
  }
  void attention_score_forward(const T* qkv, T* scores, const cpu::AttentionShape& shape,
                               double scale) override {
    cuda::attention_score_forward(l(), qkv, scores, shape, scale);
  }
  void softmax_forward(const T* scores, T* probs, int64_t rows, int64_t cols) override {
    cuda::softmax_forward(l(), scores, probs, rows, cols);
  }
  void attention_dropout_forward(const T* probs, T* probs_drop, uint8_t* mask,
                                 const cpu::AttentionShape& shape, const cpu::Dropout& dropout,
                                 int64_t head0, const int64_t* sample_index) override {
    cuda::attention_dropout_forward(l(), probs, probs_drop, mask, shape, dropout, head0, sample_index);
  }
  void attention_value_forward(const T* probs_used, const T* qkv, T* ctx,
                               const cpu::AttentionShape& shape) override {
    cuda::attention_value_forward(l(), probs_used, qkv, ctx, shape);
  }
  void attention_value_backward(const T* d_ctx, const T* probs_used, const T* qkv,
                                T* d_probs_used, T* d_qkv, const cpu::AttentionShape& shape) override {
    cuda::attention_value_backward(l(), d_ctx, probs_used, qkv, d_probs_used, d_qkv, shape);
  }
  void softmax_backward(const T* d_probs, const T* probs, T* d_scores, int64_t rows,
                        int64_t cols) override {
    cuda::softmax_backward(l(), d_probs, probs, d_scores, rows, cols);
  }
  void attention_score_backward(const T* d_scores, const T* qkv, T* d_qkv,
                                const cpu::AttentionShape& shape, double scale) override {
    cuda::attention_score_backward(l(), d_scores, qkv, d_qkv, shape, scale);
  }
  void flash_attention_forward(const T* qkv, T* ctx, float* lse, const cpu::AttentionShape& shape,
                               double scale, const cpu::Dropout* dropout, int64_t head0,
                               const int64_t* sample_index) override {
    cuda::flash_attention_forward(l(), qkv, ctx, lse, shape, scale, dropout, head0, sample_index);
  }
  void flash_attention_backward(const T* qkv, const T* ctx, const float* lse, const T* d_ctx,
                                T* d_qkv, const cpu::AttentionShape& shape, double scale,
                                const cpu::Dropout* dropout, int64_t head0,
                                const int64_t* sample_index) override {
    float* delta = delta_scratch(shape.b * shape.heads * shape.s);
    cuda::flash_attention_backward(l(), qkv, ctx, lse, d_ctx, d_qkv, delta, shape, scale, dropout,
                                   head0, sample_index);
  }
  void gelu_forward(const T* x, T* y, int64_t n) override { cuda::gelu_forward(l(), x, y, n); }
  void gelu_backward(const T* x, const T* dy, T* dx, int64_t n) override {
    cuda::gelu_backward(l(), x, dy, dx, n);
  }
  void swiglu_forward(const T* gate, const T* up, T* act, int64_t n) override {
    cuda::swiglu_forward(l(), gate, up, act, n);
  }
  void swiglu_backward(const T* gate, const T* up, const T* d_act, T* d_gate, T* d_up,
                       int64_t n) override {
    cuda::swiglu_backward(l(), gate, up, d_act, d_gate, d_up, n);
  }
  void cross_entropy_stats(const T* logits, const int32_t* targets, float* stats, int64_t tokens,
                           int64_t v0, int64_t v_local) override {
    cuda::cross_entropy_stats(l(), logits, targets, stats, tokens, v0, v_local);
  }
  void cross_entropy_forward(const T* logits, const float* stats_all, int64_t tp, float* softmax,
                             float* loss, int64_t tokens, int64_t v_local) override {
    cuda::cross_entropy_forward(l(), logits, stats_all, tp, softmax, loss, tokens, v_local);
  }
  void cross_entropy_backward(const float* softmax, const int32_t* targets, T* dlogits,
                              int64_t tokens, int64_t v0, int64_t v_local, double scale) override {
    cuda::cross_entropy_backward(l(), softmax, targets, dlogits, tokens, v0, v_local, scale);
  }
  double grad_norm_sq(const G* g, int64_t n) override {
    cuda::sum_squares(l(), g, n, result_);
    return read_result();
  }
  double grad_norm_sq(const std::vector<std::pair<const G*, int64_t>>& ranges) override {
    check_call(cudaMemsetAsync(result_, 0, sizeof(double), stream()), "cudaMemsetAsync");
    for (const auto& [g, n] : ranges) cuda::sum_squares(l(), g, n, result_, /*accumulate=*/true);
    return read_result();
  }
  void adamw_step(T* param, float* master, const G* grad, float* exp_avg, float* exp_avg_sq,
                  int64_t n, const cpu::AdamW& config, int64_t step, double clip_coef) override {
    cuda::adamw_step(l(), param, master, grad, exp_avg, exp_avg_sq, n, config, step, clip_coef);
  }

  // ---- mixture of experts (the rest: cuda_moe.hpp) ----
  double moe_aux_loss(const T* probs, const int32_t* route_idx, int64_t tokens, int64_t experts, int64_t top_k,
                      double scale, const double* chosen) override {
    cuda::moe_aux_loss(l(), probs, route_idx, tokens, experts, top_k, scale, chosen, moe_scratch(experts), result_);
    return read_result();
  }

  // ---- FP8 (cuda_fp8.hpp; scales and amaxes are the program's fp8 buffers, device floats) ----
  void fp8_cast(const T* x, uint8_t* y, int64_t n, const float* scale, float* amax, Fp8Storage format) override {
    cuda::fp8_cast(l(), x, y, n, scale, amax, format);
  }
  void fp8_absmax(const T* x, int64_t n, float* amax, bool accumulate) override {
    cuda::fp8_absmax(l(), x, n, amax, accumulate);
  }
  void fp8_set_current_scale(const float* amax, float* scale, Fp8Storage format) override {
    cuda::fp8_set_current_scale(l(), amax, scale, format);
  }
  void fp8_linear_forward(const Fp8Codes<float>& x, const Fp8Codes<float>& w, const T* bias, T* y, int64_t tokens,
                          int64_t in, int64_t out) override {
    fp8_.forward(*gemms_, l(), x, w, y, tokens, in, out, current_);
    if (bias) cuda::add_rows(l(), y, bias, tokens, out);
  }
  void fp8_linear_backward_data(const Fp8Codes<float>& dy, const Fp8Codes<float>& w, T* dx, int64_t tokens,
                                int64_t in, int64_t out, bool accumulate, bool w_transposed) override {
    fp8_.backward_data(*gemms_, l(), dy, w, dx, tokens, in, out, accumulate, w_transposed, current_);
  }
  void fp8_transpose(const uint8_t* x, uint8_t* y, int64_t rows, int64_t cols) override {
    cuda::transpose_bytes(l(), x, y, rows, cols);
  }
  void fp8_linear_backward_weight(const Fp8Codes<float>& dy, const Fp8Codes<float>& x, G* dw, G* dbias,
                                  int64_t tokens, int64_t in, int64_t out, const uint8_t* dy_t,
                                  const uint8_t* x_t) override {
    fp8_.backward_weight(*gemms_, l(), dy, x, dw, dbias, tokens, in, out, dy_t, x_t, current_);
  }
  // Delayed scaling's end of step, once a step on the host with the CPU's own update (a few
  // floats per slot).
  void fp8_scale_update(float* amax, float* history, float* scale, int64_t slots, const Fp8Recipe& recipe) override {
    std::vector<float> a(static_cast<size_t>(slots)), h(static_cast<size_t>(slots * recipe.amax_history_len)),
        s(static_cast<size_t>(slots));
    const std::pair<float*, std::vector<float>*> parts[] = {{amax, &a}, {history, &h}, {scale, &s}};
    for (auto [device, host] : parts) download(host->data(), device, int64_t(host->size() * sizeof(float)));
    cpu::fp8_scale_update(a.data(), h.data(), s.data(), slots, recipe);
    for (auto [device, host] : parts) upload(device, host->data(), int64_t(host->size() * sizeof(float)));
  }

  // ---- collectives: NCCL on the communication stream, after compute, before compute ----
  void all_reduce(GroupKind group, Algorithm, Dtype dtype, std::vector<Span<void>> buffers) override {
    ncclComm_t comm = nccl_.communicator(group);
    begin_comm(comm_);
    check_nccl(ncclGroupStart(), "ncclGroupStart", rank_, current_);
    for (const auto& b : buffers) {
      if (b.count == 0) continue;
      check_nccl(ncclAllReduce(b.data, b.data, size_t(b.count), nccl_type(dtype), ncclSum, comm, comm_),
                 "ncclAllReduce", rank_, current_);
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd", rank_, current_);
    end_comm(comm_);
    count_algorithm("all_reduce");
  }
  // Chunk index(group) of every buffer (cuda_nccl.hpp's chunked collectives).
  void reduce_scatter(GroupKind group, Dtype dtype, std::vector<Span<void>> buffers) override {
    chunked(group, dtype, buffers, true);
    count_algorithm("reduce_scatter");
  }
  void all_gather(GroupKind group, Dtype dtype, std::vector<Span<void>> buffers) override {
    chunked(group, dtype, buffers, false);
    count_algorithm("all_gather");
  }
  // x[i] = its maximum over the group (the FP8 amax reduction).
  void all_reduce_max(GroupKind group, float* x, int64_t n) override {
    begin_comm(comm_);
    check_nccl(ncclAllReduce(x, x, size_t(n), ncclFloat32, ncclMax, nccl_.communicator(group), comm_),
               "ncclAllReduce (max)", rank_, current_);
    end_comm(comm_);
    count_algorithm("all_reduce_max");
  }
  // Block i of send (equal blocks) to member i, as NCCL's own all_to_all.
  void all_to_all(GroupKind group, Dtype dtype, Span<void> send, Span<void> recv) override {
    const int64_t n = comms_.size(group), block = send.count / std::max<int64_t>(1, n) * dtype_bytes(dtype);
    std::vector<int64_t> bytes(static_cast<size_t>(n), block), offsets(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) offsets[size_t(i)] = i * block;
    exchange(group, static_cast<const char*>(send.data), bytes, offsets, static_cast<char*>(recv.data), bytes, offsets);
    count_algorithm("all_to_all");
  }
  void all_to_allv(GroupKind group, const char* send, const std::vector<int64_t>& send_bytes,
                   const std::vector<int64_t>& send_offsets, char* recv, const std::vector<int64_t>& recv_bytes,
                   const std::vector<int64_t>& recv_offsets) override {
    exchange(group, send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets);
    count_algorithm("all_to_allv");
  }
  int group_size(GroupKind group) const override { return comms_.size(group); }
  int group_index(GroupKind group) const override { return comms_.index(group); }

  // Pipeline transfers. Traffic to a higher rank travels on one communicator and stream, to a
  // lower rank on the other, so the two directions never queue behind each other. A send goes
  // from a staging copy (as the CPU backend's), so the arena may reuse the tensor at once; NCCL
  // matches a pair's transfers in issue order (the program's order; the tag is not needed).
  void send(const T* data, int64_t n, int peer, int64_t tag) override {
    const int dir = peer > rank_ ? 0 : 1;
    Staging& staging = send_staging_[{peer, tag}];
    int64_t bytes = n * int64_t(sizeof(T));
    if (staging.bytes < bytes) {
      if (staging.data) {
        check_call(cudaStreamSynchronize(p2p_streams_[dir]), "cudaStreamSynchronize");
        cudaFree(staging.data);
      }
      staging.data = static_cast<char*>(raw_alloc(bytes, "a pipeline send staging buffer"));
      staging.bytes = bytes;
      staging_bytes_ += double(bytes);
    }
    if (!staging.done) {
      check_call(cudaEventCreateWithFlags(&staging.done, cudaEventDisableTiming), "cudaEventCreate");
    } else {
      // The previous send from this buffer must have left it before the copy overwrites it.
      check_call(cudaStreamWaitEvent(compute_, staging.done, 0), "cudaStreamWaitEvent");
    }
    copy(staging.data, data, bytes);
    begin_comm(p2p_streams_[dir]);
    check_nccl(ncclSend(staging.data, size_t(n), nccl_type(dtype_of<T>()), peer, nccl_.p2p(dir),
                        p2p_streams_[dir]),
               "ncclSend", rank_, current_);
    check_call(cudaEventRecord(staging.done, p2p_streams_[dir]), "cudaEventRecord");
  }
  void recv(T* data, int64_t n, int peer, int64_t) override {
    const int dir = peer < rank_ ? 0 : 1;
    begin_comm(p2p_streams_[dir]);
    check_nccl(ncclRecv(data, size_t(n), nccl_type(dtype_of<T>()), peer, nccl_.p2p(dir), p2p_streams_[dir]),
               "ncclRecv", rank_, current_);
    end_comm(p2p_streams_[dir]);
  }
  void finish_sends() override {
    for (cudaStream_t s : p2p_streams_) wait_stream(s);
  }
  std::map<std::string, int64_t> algorithms_used() const override { return algorithms_; }

  // ---- streams: a collective of the program's communication stream runs on comm_ ----
  void begin_async(int32_t) override {
    check_call(cudaStreamWaitEvent(comm_, record(compute_), 0), "cudaStreamWaitEvent");
    async_ = true;
  }
  void end_async(int32_t op_id) override {
    async_ = false;
    cudaEvent_t& done = op_events_[op_id];
    if (!done) check_call(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
    check_call(cudaEventRecord(done, comm_), "cudaEventRecord");
  }
  void wait_async(int32_t op_id) override {
    auto it = op_events_.find(op_id);
    STEPCAST_CHECK(it != op_events_.end(), "wait for an op that never ran asynchronously");
    check_call(cudaStreamWaitEvent(compute_, it->second, 0), "cudaStreamWaitEvent");
  }

  // ---- synchronisation ----
  void synchronize() override {
    wait_stream(compute_);
    wait_stream(comm_);
    for (cudaStream_t s : p2p_streams_) wait_stream(s);
    memory_.sample_free();
  }
  double now_s() override { return MPI_Wtime(); }
  void set_current(const std::string& what) override { current_ = what; }

  Json device_memory() const override {
    return memory_.report(device_name_, options_.device, double(options_.workspace_bytes),
                          double(staging_.capacity_bytes()) + staging_bytes_);
  }
  double device_peak_bytes() const override { return memory_.allocator_high_water_bytes(); }

 private:
  // Kernels and copies go to the compute stream, or to the communication stream inside an
  // asynchronous collective (its element-wise work must follow its communication).
  cudaStream_t stream() const { return async_ ? comm_ : compute_; }
  cuda::Launch l() const { return {stream(), rank_}; }
  void check_call(cudaError_t code, const char* call) const { check_cuda(code, call, rank_, current_); }
  void cublas(cublasStatus_t code, const char* call) const { check_cublas(code, call, rank_, current_); }

  void* raw_alloc(int64_t bytes, const char* what) { return memory_.raw_alloc(bytes, what, current_); }

  // Waits for a stream, polling so that an NCCL error (on any communicator) or a hang longer
  // than the watchdog stops the job with a message instead of blocking forever.
  void wait_stream(cudaStream_t stream) {
    auto start = std::chrono::steady_clock::now();
    for (int spins = 0;; ++spins) {
      cudaError_t state = cudaStreamQuery(stream);
      if (state == cudaSuccess) return;
      if (state != cudaErrorNotReady) check_call(state, "cudaStreamQuery");
      nccl_.check_async_errors(rank_, current_);
      double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > options_.watchdog_s) {
        nccl_.abort_communicators();
        fail_job("rank " + std::to_string(rank_) + ": waited " + std::to_string(int(waited)) +
                 " s for the GPU in " + (current_.empty() ? "the step" : current_) +
                 " (a peer that stopped, or a hang in NCCL); aborting the job");
      }
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  double read_result() {
    double value = 0;
    check_call(cudaMemcpyAsync(&value, result_, sizeof value, cudaMemcpyDeviceToHost, compute_), "cudaMemcpyAsync");
    wait_stream(compute_);
    return value;
  }

  cuda::Launch launch() const override { return l(); }  // this and the next two: cuda_cp.hpp's hooks
  const int64_t* on_device(const int64_t* x, int64_t n) override { return positions_.get(x, n, stream(), current_); }
  float* delta_scratch(int64_t n) override { return delta_.get<float>(n, [&] { wait_stream(compute_); }, current_); }
  char* staging_buffer(int64_t bytes) { return staging_.get(bytes, [&] { wait_stream(comm_); }, current_); }
  void chunked(GroupKind group, Dtype dtype, const std::vector<Span<void>>& buffers, bool reduce) {
    begin_comm(comm_);
    for (const auto& b : buffers) {
      cuda::chunked_collective(reduce, nccl_.communicator(group), comm_, comms_.size(group), comms_.index(group),
                               dtype, static_cast<char*>(b.data), b.count,
                               [&](int64_t bytes) { return staging_buffer(bytes); }, rank_, current_);
    }
    end_comm(comm_);
  }
  // Grouped sends and receives of byte blocks on the communication stream (exchange_blocks).
  void exchange(GroupKind group, const char* send, const std::vector<int64_t>& send_bytes,
                const std::vector<int64_t>& send_offsets, char* recv, const std::vector<int64_t>& recv_bytes,
                const std::vector<int64_t>& recv_offsets) {
    begin_comm(comm_);
    cuda::exchange_blocks(nccl_.communicator(group), comm_, comms_.index(group), send, send_bytes, send_offsets, recv,
                          recv_bytes, recv_offsets, rank_, current_);
    end_comm(comm_);
  }
  // A device copy of a host row map (the upload returns once the host array is read). This and
  // the next three: cuda_moe.hpp's hooks.
  const int64_t* device_rows(const int64_t* host, int64_t n) override {
    int64_t* rows = rows_.get<int64_t>(n, [&] { wait_stream(compute_); }, current_);
    check_call(cudaMemcpyAsync(rows, host, size_t(n) * sizeof(int64_t), cudaMemcpyHostToDevice, stream()),
               "cudaMemcpyAsync (MoE row map)");
    return rows;
  }
  double* moe_scratch(int64_t experts) override {
    return moe_sums_.get<double>(2 * experts, [&] { wait_stream(compute_); }, current_);
  }
  cuda::ExpertGemms& expert_gemms() override { return *experts_; }
  const std::string& current() const override { return current_; }

  cudaEvent_t record(cudaStream_t stream) {
    cudaEvent_t e = event_pool_[event_next_++ % event_pool_.size()];
    check_call(cudaEventRecord(e, stream), "cudaEventRecord");
    return e;
  }
  // The communication stream starts after the compute work issued so far; compute continues
  // after the communication (the interpreter runs ops in program order: no op reads a buffer
  // before the collective that writes it).
  // (Inside an asynchronous collective comm_ already follows compute, and compute waits later.)
  void begin_comm(cudaStream_t s) {
    if (async_ && s == comm_) return;
    check_call(cudaStreamWaitEvent(s, record(compute_), 0), "cudaStreamWaitEvent");
  }
  void end_comm(cudaStream_t s) {
    if (async_ && s == comm_) return;
    check_call(cudaStreamWaitEvent(compute_, record(s), 0), "cudaStreamWaitEvent");
  }
  void count_algorithm(const std::string& kind) {
    const char* algo = std::getenv("NCCL_ALGO");
    ++algorithms_[kind + "/nccl:" + (algo && *algo ? algo : "auto")];
  }

  template <class C>
  void matmul(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
              const T* b, int64_t ldb, C* c, int64_t ldc, float beta) {
    GemmKey key{trans_a, trans_b, m, n, k, lda, ldb, ldc, cuda_type<T>(), cuda_type<T>(), cuda_type<C>(),
                alignment_of(a), alignment_of(b), alignment_of(c)};
    gemms_->run(key, a, b, c, beta, stream(), nullptr, nullptr, rank_, current_);
  }

  struct Staging {
    char* data = nullptr;
    int64_t bytes = 0;
    cudaEvent_t done = nullptr;  // the last send from it
  };

  int rank_;
  CudaBackendOptions options_;
  GroupComms comms_;
  cuda::DeviceMemory memory_;
  std::string current_;
  std::string device_name_;
  cudaStream_t compute_ = nullptr, comm_ = nullptr;
  cudaStream_t p2p_streams_[2] = {nullptr, nullptr};
  std::vector<cudaEvent_t> event_pool_ = std::vector<cudaEvent_t>(256, nullptr);
  size_t event_next_ = 0;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  double* result_ = nullptr;
  cuda::DeviceScratch delta_{memory_, "flash attention scratch"};
  cuda::DeviceScratch staging_{memory_, "an NCCL staging buffer"};
  cuda::DeviceScratch rows_{memory_, "a MoE row map"};
  cuda::DeviceScratch moe_sums_{memory_, "MoE expert sums"};
  cuda::DeviceConstants positions_{memory_, rank_};
  double staging_bytes_ = 0;
  std::map<std::pair<int, int64_t>, Staging> send_staging_;
  cuda::NcclCommunicators nccl_;
  std::unique_ptr<cuda::Gemms> gemms_;
  std::unique_ptr<cuda::ExpertGemms> experts_;  // on gemms_ and workspace_
  cuda::Fp8Linear fp8_{memory_, [this] { wait_stream(compute_); }};
  bool async_ = false;                          // inside begin_async … end_async
  std::map<int32_t, cudaEvent_t> op_events_;    // the end of each asynchronous collective
  std::map<std::string, int64_t> algorithms_;
};

}  // namespace

template <class T, class G>
std::unique_ptr<Backend<T, G, float>> make_cuda_backend(const RankGrid& grid, int64_t rank,
                                                        int64_t devices_per_node,
                                                        const CudaBackendOptions& options) {
  return std::make_unique<CudaBackend<T, G>>(grid, rank, devices_per_node, options);
}

template std::unique_ptr<Backend<bf16, float, float>> make_cuda_backend<bf16, float>(
    const RankGrid&, int64_t, int64_t, const CudaBackendOptions&);
template std::unique_ptr<Backend<bf16, bf16, float>> make_cuda_backend<bf16, bf16>(
    const RankGrid&, int64_t, int64_t, const CudaBackendOptions&);
template std::unique_ptr<Backend<float, float, float>> make_cuda_backend<float, float>(
    const RankGrid&, int64_t, int64_t, const CudaBackendOptions&);

}  // namespace stepcast
