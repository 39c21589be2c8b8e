// The CPU kernels' GEMMs and linear layers (cpu_kernels.hpp): cblas_{s,d}gemm on row-major
// operands, the linear layers' forward and backward as GEMMs. Dimensions are checked against
// BLAS's int range; bias gradients accumulate in double.
#include "cpu_kernels.hpp"

#include <cblas.h>

#include <climits>
#include <vector>

#include "errors.hpp"

namespace stepcast::cpu {

namespace {

int blas_int(int64_t v) {
  STEPCAST_CHECK(v >= 0 && v <= INT_MAX, "gemm dimension outside BLAS int range");
  return int(v);
}

void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha, const float* a, int lda,
               const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, double alpha, const double* a, int lda,
               const double* b, int ldb, double beta, double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace

template <class T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
          int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
    return;
  }
  blas_gemm(trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, blas_int(m), blas_int(n),
            blas_int(k), alpha, a, blas_int(lda), b, blas_int(ldb), beta, c, blas_int(ldc));
}

template <class T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, const T* b, T beta, T* c) {
  gemm(trans_a, trans_b, m, n, k, alpha, a, trans_a ? m : k, b, trans_b ? k : n, beta, c, n);
}

template <class T>
void linear_forward(const T* x, const T* w, const T* bias, T* y, int64_t tokens, int64_t in, int64_t out) {
  gemm<T>(false, true, tokens, out, in, T(1), x, w, T(0), y);
  if (!bias) return;
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t o = 0; o < out; ++o) y[t * out + o] += bias[o];
}

template <class T>
void linear_backward_data(const T* dy, const T* w, T* dx, int64_t tokens, int64_t in, int64_t out, bool accumulate) {
  gemm<T>(false, false, tokens, in, out, T(1), dy, w, accumulate ? T(1) : T(0), dx);
}

template <class T>
void linear_backward_weight(const T* dy, const T* x, T* dw, T* dbias, int64_t tokens, int64_t in, int64_t out) {
  gemm<T>(true, false, out, in, tokens, T(1), dy, x, T(1), dw);
  if (!dbias) return;
  std::vector<double> sum(out, 0.0);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t o = 0; o < out; ++o) sum[o] += dy[t * out + o];
  for (int64_t o = 0; o < out; ++o) dbias[o] += T(sum[o]);
}

// ---- Explicit instantiations ----

#define STEPCAST_CPU_KERNELS_GEMM(T)                                                                           \
  template void gemm<T>(bool, bool, int64_t, int64_t, int64_t, T, const T*, int64_t, const T*, int64_t, T, T*, \
                        int64_t);                                                                              \
  template void gemm<T>(bool, bool, int64_t, int64_t, int64_t, T, const T*, const T*, T, T*);                  \
  template void linear_forward<T>(const T*, const T*, const T*, T*, int64_t, int64_t, int64_t);                \
  template void linear_backward_data<T>(const T*, const T*, T*, int64_t, int64_t, int64_t, bool);              \
  template void linear_backward_weight<T>(const T*, const T*, T*, T*, int64_t, int64_t, int64_t);

STEPCAST_CPU_KERNELS_GEMM(float)
STEPCAST_CPU_KERNELS_GEMM(double)

#undef STEPCAST_CPU_KERNELS_GEMM

}  // namespace stepcast::cpu
