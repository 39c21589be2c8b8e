// The CUDA backend's FP8 linear layers (cuda_fp8.hpp). In cuBLASLt's column-major terms a
// row-major [r, c] matrix is a c × r one: with TN, op(A) = Aᵀ with A stored K-major and B stored
// K-major, C = op(A) · B.
#include "cuda_fp8.hpp"

namespace stepcast::cuda {

namespace {

uint32_t aligned(const void* p) { return alignment_of(p); }

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
  if (!x_t || !dy_t) {
    uint8_t* x_scratch = a_t_.get<uint8_t>(tokens * in, wait_, during);
    uint8_t* dy_scratch = b_t_.get<uint8_t>(tokens * out, wait_, during);
    transpose_bytes(l, x.codes, x_scratch, tokens, in);
    transpose_bytes(l, dy.codes, dy_scratch, tokens, out);
    x_t = x_scratch;
    dy_t = dy_scratch;
  }
  const float* f = factors(l, x, dy, during);
  GemmKey key{true,
              false,
              in,
              out,
              tokens,
              tokens,
              tokens,
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
