// The CUDA backend's context-parallel methods (backend.hpp's cp_*): kernels_cp.cu's launchers, the
// interpreter's host position arrays replaced by device copies. A base of the CUDA backend
// (cuda_backend.cpp), which supplies the stream, those copies and the flash scratch.
#pragma once

#include <cstdint>
#include <vector>

#include "backend.hpp"
#include "cuda_kernels.hpp"

namespace stepcast::cuda {

template <class T, class G>
class ContextParallelMethods : public Backend<T, G, float> {
 public:
  void cp_kv_pack(const T* qkv, T* kv, const cpu::AttentionShape& shape) override {
    cuda::cp_kv_pack(launch(), qkv, kv, shape);
  }
  void cp_kv_unpack(const T* d_kv, T* d_qkv, const cpu::AttentionShape& shape) override {
    cuda::cp_kv_unpack(launch(), d_kv, d_qkv, shape);
  }
  void cp_flash_forward(const T* qkv, const T* kv, int64_t n, const int64_t* q_pos, const int64_t* kv_pos, T* ctx,
                        float* lse, const cpu::AttentionShape& shape, double scale, const cpu::Dropout* dropout,
                        int64_t head0, const int64_t* sample_index) override {
    cuda::cp_flash_forward(launch(), qkv, kv, n, on_device(q_pos, shape.s), on_device(kv_pos, n), ctx, lse, shape,
                           scale, dropout, head0, sample_index);
  }
  void cp_flash_backward(const T* qkv, const T* kv, int64_t n, const int64_t* q_pos, const int64_t* kv_pos,
                         const T* ctx, const float* lse, const T* d_ctx, T* d_qkv, bool accumulate, T* d_kv,
                         const cpu::AttentionShape& shape, double scale, const cpu::Dropout* dropout, int64_t head0,
                         const int64_t* sample_index) override {
    const int64_t* q = on_device(q_pos, shape.s);
    const int64_t* k = on_device(kv_pos, n);
    float* delta = delta_scratch(shape.b * shape.heads * shape.s);
    cuda::cp_flash_backward(launch(), qkv, kv, n, q, k, ctx, lse, d_ctx, d_qkv, accumulate, d_kv, delta, shape, scale,
                            dropout, head0, sample_index);
  }
  void cp_merge(T* ctx, float* lse, const T* ctx_part, const float* lse_part,
                const cpu::AttentionShape& shape) override {
    cuda::cp_merge(launch(), ctx, lse, ctx_part, lse_part, shape);
  }
  void cp_accumulate(T* acc, const T* part, int64_t n) override { cuda::add(launch(), acc, part, n); }
  void cp_score_forward(const T* qkv, const T* kv, int64_t n, const int64_t* q_pos, const int64_t* kv_pos, T* scores,
                        const cpu::AttentionShape& shape, double scale) override {
    cuda::cp_score_forward(launch(), qkv, kv, n, on_device(q_pos, shape.s), on_device(kv_pos, n), scores, shape, scale);
  }
  void cp_attention_dropout_forward(const T* probs, T* probs_drop, uint8_t* mask, const cpu::AttentionShape& shape,
                                    int64_t n, const int64_t* q_pos, const int64_t* kv_pos, const cpu::Dropout& dropout,
                                    int64_t head0, const int64_t* sample_index) override {
    cuda::cp_attention_dropout_forward(launch(), probs, probs_drop, mask, shape, n, on_device(q_pos, shape.s),
                                       on_device(kv_pos, n), dropout, head0, sample_index);
  }
  void cp_value_forward(const T* probs_used, const T* kv, int64_t n, T* ctx,
                        const cpu::AttentionShape& shape) override {
    cuda::cp_value_forward(launch(), probs_used, kv, n, ctx, shape);
  }
  void cp_value_backward(const T* d_ctx, const T* probs_used, const T* kv, int64_t n, T* d_probs_used, T* d_kv,
                         const cpu::AttentionShape& shape) override {
    cuda::cp_value_backward(launch(), d_ctx, probs_used, kv, n, d_probs_used, d_kv, shape);
  }
  void cp_score_backward(const T* d_scores, const T* qkv, const T* kv, int64_t n, T* d_qkv, T* d_kv,
                         const cpu::AttentionShape& shape, double scale) override {
    cuda::cp_score_backward(launch(), d_scores, qkv, kv, n, d_qkv, d_kv, shape, scale);
  }
  void cp_a2a_heads(const T* x, T* y, int64_t rows, const std::vector<int64_t>& sections, int64_t parts,
                    bool split) override {
    cuda::a2a_heads(launch(), x, y, rows, sections, parts, split);
  }
  void cp_permute_rows(const T* x, T* y, const int64_t* index, int64_t n, int64_t width, bool gather) override {
    cuda::permute_rows(launch(), x, y, on_device(index, n), n, width, gather);
  }

 protected:
  // The backend's current stream (compute, or communication inside an asynchronous collective).
  virtual Launch launch() const = 0;
  // A device copy of host[0, n) valid for work issued next on launch()'s stream.
  virtual const int64_t* on_device(const int64_t* host, int64_t n) = 0;
  // Scratch of n floats for the work issued next on launch()'s stream (flash backward's delta).
  virtual float* delta_scratch(int64_t n) = 0;
};

}  // namespace stepcast::cuda
