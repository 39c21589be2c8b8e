// The CUDA backend's FP8 linear layers (cuda_fp8.hpp). In cuBLASLt's column-major terms a
// row-major [r, c] matrix is a c × r one: with TN, op(A) = Aᵀ with A stored K-major and B stored
// K-major, C = op(A) · B.
#include "cuda_fp8.hpp"

#include "errors.hpp"

namespace stepcast::cuda {

namespace {

uint32_t aligned(const void* p) { return alignment_of(p); }

// cuBLASLt's FP8 GEMMs take leading dimensions that are multiples of 16 bytes (one byte a code).
constexpr int64_t kFp8LeadingMultiple = 16;

}  // namespace

const float* Fp8Linear::factors(const Launch& l, const Fp8Codes<float>& a, const Fp8Codes<float>& b,
                                const std::string& during) {
  float* f = factors_.get<float>(2 * kFp8FactorStride, wait_, during);
  fp8_reciprocals(l, a.scale, b.scale, f);
  return f;
}

// yᵀ [out × tokens] = op(W stored [in × out], T) · xᵀ [in × tokens]: both K-major as they lie.
template <class Y>
void Fp8Linear::forward(Gemms& gemms, const Launch& l, const Fp8Codes<float>& x, const Fp8Codes<float>& w, Y* y,
                        int64_t tokens, int64_t in, int64_t out, const std::string& during) {
  if (tokens == 0) return;  // an expert without rows
  const float* f = factors(l, w, x, during);
  GemmKey key{true,
              false,
              out,
              tokens,
              in,
              in,
              in,
              out,
              cuda_type(w.format),
              cuda_type(x.format),
              cuda_type<Y>(),
              aligned(w.codes),
              aligned(x.codes),
              aligned(y)};
  gemms.run(key, w.codes, x.codes, y, 0.f, l.stream, f, f + kFp8FactorStride, l.rank, during);
}

// dxᵀ [in × tokens] = op(Wᵀ's codes stored [out × in], T) · dyᵀ [out × tokens].
template <class Y>
void Fp8Linear::backward_data(Gemms& gemms, const Launch& l, const Fp8Codes<float>& dy, const Fp8Codes<float>& w, Y* dx,
                              int64_t tokens, int64_t in, int64_t out, bool accumulate, bool w_transposed,
                              const std::string& during) {
  if (tokens == 0) return;
  const uint8_t* w_t = w.codes;
  if (!w_transposed) {
    uint8_t* t = a_t_.get<uint8_t>(in * out, wait_, during);
    transpose_bytes(l, w.codes, t, out, in);  // [out, in] → [in, out]
    w_t = t;
  }
  const float* f = factors(l, w, dy, during);
  GemmKey key{true,
              false,
              in,
              tokens,
              out,
              out,
              out,
              in,
              cuda_type(w.format),
              cuda_type(dy.format),
              cuda_type<Y>(),
              aligned(w_t),
              aligned(dy.codes),
              aligned(dx)};
  gemms.run(key, w_t, dy.codes, dx, accumulate ? 1.f : 0.f, l.stream, f, f + kFp8FactorStride, l.rank, during);
}

// dWᵀ [in × out] += op(xᵀ's codes stored [tokens × in], T) · dyᵀ's codes stored [tokens × out].
template <class Gr>
void Fp8Linear::backward_weight(Gemms& gemms, const Launch& l, const Fp8Codes<float>& dy, const Fp8Codes<float>& x,
                                Gr* dw, Gr* dbias, int64_t tokens, int64_t in, int64_t out, const uint8_t* dy_t,
                                const uint8_t* x_t, const std::string& during) {
  if (tokens == 0) return;  // nothing to add
  int64_t k = tokens;  // the GEMM's K: the transposed copies' row length
  if (!x_t || !dy_t) {
    // Rows padded with zero codes to a multiple of 16 (an expert's rows are any count).
    k = (tokens + kFp8LeadingMultiple - 1) / kFp8LeadingMultiple * kFp8LeadingMultiple;
    uint8_t* x_scratch = a_t_.get<uint8_t>(k * in, wait_, during);
    uint8_t* dy_scratch = b_t_.get<uint8_t>(k * out, wait_, during);
    transpose_bytes(l, x.codes, x_scratch, tokens, in, k);
    transpose_bytes(l, dy.codes, dy_scratch, tokens, out, k);
    x_t = x_scratch;
    dy_t = dy_scratch;
  }
  STEPCAST_CHECK(k % kFp8LeadingMultiple == 0, "an FP8 wgrad's transposed operands with rows not a multiple of 16");
  const float* f = factors(l, x, dy, during);
  GemmKey key{true,
              false,
              in,
              out,
              k,
              k,
              k,
              in,
              cuda_type(x.format),
              cuda_type(dy.format),
              cuda_type<Gr>(),
              aligned(x_t),
              aligned(dy_t),
              aligned(dw)};
  gemms.run(key, x_t, dy_t, dw, 1.f, l.stream, f, f + kFp8FactorStride, l.rank, during);
  if (dbias) fp8_bias_grad(l, dy.codes, dy.scale, dbias, tokens, out, dy.format);
}

#define STEPCAST_FP8_LINEAR(X)                                                                                         \
  template void Fp8Linear::forward<X>(Gemms&, const Launch&, const Fp8Codes<float>&, const Fp8Codes<float>&, X*,       \
                                      int64_t, int64_t, int64_t, const std::string&);                                  \
  template void Fp8Linear::backward_data<X>(Gemms&, const Launch&, const Fp8Codes<float>&, const Fp8Codes<float>&, X*, \
                                            int64_t, int64_t, int64_t, bool, bool, const std::string&);                \
  template void Fp8Linear::backward_weight<X>(Gemms&, const Launch&, const Fp8Codes<float>&, const Fp8Codes<float>&,   \
                                              X*, X*, int64_t, int64_t, int64_t, const uint8_t*, const uint8_t*,       \
                                              const std::string&);
STEPCAST_FP8_LINEAR(bf16)
STEPCAST_FP8_LINEAR(float)
#undef STEPCAST_FP8_LINEAR

}  // namespace stepcast::cuda
