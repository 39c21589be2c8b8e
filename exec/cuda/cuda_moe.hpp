// The CUDA backend's mixture-of-experts methods (backend.hpp's moe_* but the aux loss, which reads
// a result back, and expert_linear_*): kernels_moe.cu's launchers, the interpreter's host row maps
// replaced by device copies, and the local experts' GEMMs (cuda_expert_gemm.hpp). A base of the
// CUDA backend (cuda_backend.cpp), which supplies the stream, those copies, the routing scratch and
// the experts' GEMMs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cuda_cp.hpp"
#include "cuda_expert_gemm.hpp"
#include "cuda_kernels.hpp"

namespace stepcast::cuda {

template <class T, class G>
class MoeMethods : public ContextParallelMethods<T, G> {
 public:
  void moe_route_forward(const T* logits, T* probs, T* route_w, int32_t* route_idx, int32_t* counts, int64_t tokens,
                         int64_t experts, int64_t top_k, int64_t capacity, bool normalize, bool drop_by_probs) override {
    cuda::moe_route_forward(this->launch(), logits, probs, route_w, route_idx, counts, tokens, experts, top_k,
                            capacity, normalize, drop_by_probs);
  }
  void moe_route_backward(const T* probs, const int32_t* route_idx, const T* d_route_w, T* d_logits, int64_t tokens,
                          int64_t experts, int64_t top_k, double aux_scale, const double* chosen,
                          bool normalize) override {
    cuda::moe_route_backward(this->launch(), probs, route_idx, d_route_w, d_logits, tokens, experts, top_k, aux_scale,
                             chosen, moe_scratch(experts), normalize);
  }
  void moe_permute(const T* x, T* y, const int64_t* rows, int64_t tokens, int64_t top_k, int64_t h,
                   bool backward) override {
    cuda::moe_permute(this->launch(), x, y, device_rows(rows, tokens * top_k), tokens, top_k, h, backward);
  }
  void moe_unpermute_forward(const T* x, const T* route_w, const int64_t* rows, T* y, int64_t tokens, int64_t top_k,
                             int64_t h) override {
    cuda::moe_unpermute_forward(this->launch(), x, route_w, device_rows(rows, tokens * top_k), y, tokens, top_k, h);
  }
  void moe_unpermute_backward(const T* d_y, const T* x, const T* route_w, const int64_t* rows, T* d_x, T* d_route_w,
                              int64_t tokens, int64_t top_k, int64_t h) override {
    cuda::moe_unpermute_backward(this->launch(), d_y, x, route_w, device_rows(rows, tokens * top_k), d_x, d_route_w,
                                 tokens, top_k, h);
  }
  void moe_add(T* acc, const T* x, int64_t n) override { cuda::add(this->launch(), acc, x, n); }
  void expert_linear_forward(const T* x, const std::vector<const T*>& w, const std::vector<int64_t>& rows, T* y,
                             int64_t in, int64_t out) override {
    expert_gemms().forward(x, w, rows, y, in, out, this->launch().stream, current());
  }
  void expert_linear_backward_data(const T* dy, const std::vector<const T*>& w, const std::vector<int64_t>& rows,
                                   T* dx, int64_t in, int64_t out, bool accumulate) override {
    expert_gemms().backward_data(dy, w, rows, dx, in, out, accumulate, this->launch().stream, current());
  }
  void expert_linear_backward_weight(const T* dy, const T* x, const std::vector<G*>& dw,
                                     const std::vector<int64_t>& rows, int64_t in, int64_t out) override {
    expert_gemms().backward_weight(dy, x, dw, rows, in, out, this->launch().stream, current());
  }

 protected:
  // A device copy of a host row map, valid for work issued next on launch()'s stream.
  virtual const int64_t* device_rows(const int64_t* host, int64_t n) = 0;
  // Scratch of 2·experts doubles for work issued next on launch()'s stream.
  virtual double* moe_scratch(int64_t experts) = 0;
  // The local experts' GEMMs, and the op the backend is in (for their error messages).
  virtual ExpertGemms& expert_gemms() = 0;
  virtual const std::string& current() const = 0;
};

}  // namespace stepcast::cuda
