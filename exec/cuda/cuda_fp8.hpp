// The CUDA backend's FP8 linear layers: cuBLASLt FP8 GEMMs (e4m3 × e4m3, or e4m3 × e5m2 for the
// gradients of the hybrid format; fp32 accumulation, the output in the plan's dtype). cuBLASLt
// takes FP8 operands in the "TN" layout only (both K-major), so the backward passes read
// transposed copies of their codes, as Transformer Engine's cast-transpose makes them; each
// operand's dequantisation factor (1 / its scale) goes in as cuBLASLt's A or B scale.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "backend.hpp"
#include "cuda_gemm.hpp"
#include "cuda_kernels.hpp"
#include "cuda_memory.hpp"

namespace stepcast::cuda {

class Fp8Linear {
 public:
  // wait: the streams that may still read the scratch, before it grows.
  Fp8Linear(DeviceMemory& memory, std::function<void()> wait)
      : a_t_(memory, "an FP8 operand's transposed codes"),
        b_t_(memory, "an FP8 operand's transposed codes"),
        factors_(memory, "FP8 dequantisation factors"),
        wait_(std::move(wait)) {}

  // y[tokens, out] = x[tokens, in] · w[out, in]ᵀ.
  template <class Y>
  void forward(Gemms& gemms, const Launch& l, const Fp8Codes<float>& x, const Fp8Codes<float>& w, Y* y, int64_t tokens,
               int64_t in, int64_t out, const std::string& during);
  // dx[tokens, in] (+)= dy[tokens, out] · w[out, in]; w_transposed: w's codes are the program's
  // transposed copy [in, out] (fp8_transpose), already as the TN GEMM reads them.
  template <class Y>
  void backward_data(Gemms& gemms, const Launch& l, const Fp8Codes<float>& dy, const Fp8Codes<float>& w, Y* dx,
                     int64_t tokens, int64_t in, int64_t out, bool accumulate, bool w_transposed,
                     const std::string& during);
  // dw[out, in] += dy[tokens, out]ᵀ · x[tokens, in]; dbias[out] += Σ_t dy (dbias may be null).
  // dy_t, x_t: the program's transposed copies of the codes (fp8_cast_transpose, fp8_transpose),
  // as the TN GEMM reads them; without them (null) the codes are transposed into scratch here.
  template <class Gr>
  void backward_weight(Gemms& gemms, const Launch& l, const Fp8Codes<float>& dy, const Fp8Codes<float>& x, Gr* dw,
                       Gr* dbias, int64_t tokens, int64_t in, int64_t out, const uint8_t* dy_t, const uint8_t* x_t,
                       const std::string& during);

 private:
  const float* factors(const Launch& l, const Fp8Codes<float>& a, const Fp8Codes<float>& b, const std::string& during);

  DeviceScratch a_t_, b_t_, factors_;
  std::function<void()> wait_;
};

}  // namespace stepcast::cuda
