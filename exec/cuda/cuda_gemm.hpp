// cuBLASLt GEMMs for the CUDA backend: the key of one GEMM (shape in column-major terms, operand
// types, pointer alignments), its plan (descriptors, layouts, the heuristic's algorithm), and the
// backend's cache of plans that launches them; fp32 accumulates everywhere. FP8 operands (e4m3,
// e5m2) carry their dequantisation factors as cuBLASLt's A and B scale pointers.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "bf16.hpp"
#include "fp8.hpp"

namespace stepcast::cuda {

template <class X>
cudaDataType_t cuda_type() {
  return std::is_same_v<X, bf16> ? CUDA_R_16BF : CUDA_R_32F;
}
inline cudaDataType_t cuda_type(Fp8Storage format) {
  return format == Fp8Storage::e4m3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}
inline bool is_fp8(cudaDataType_t type) { return type == CUDA_R_8F_E4M3 || type == CUDA_R_8F_E5M2; }

// One cuBLASLt GEMM shape in column-major terms, with the pointers' alignments (a parameter
// slice of the arena may be aligned to its element size only; the heuristic must know), and its
// chosen algorithm.
struct GemmKey {
  bool trans_a, trans_b;
  int64_t m, n, k, lda, ldb, ldc;
  cudaDataType_t a, b, c;
  uint32_t align_a, align_b, align_c;
  bool operator<(const GemmKey& o) const {
    return std::tie(trans_a, trans_b, m, n, k, lda, ldb, ldc, a, b, c, align_a, align_b, align_c) <
           std::tie(o.trans_a, o.trans_b, o.m, o.n, o.k, o.lda, o.ldb, o.ldc, o.a, o.b, o.c, o.align_a, o.align_b,
                    o.align_c);
  }
};
// The largest power of two (at most 256) dividing the address.
uint32_t alignment_of(const void* p);
struct GemmPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  // The heuristic's choices, best first; `chosen` moves on when a launch answers NOT_SUPPORTED
  // (cuBLASLt says a heuristic's algorithm is not guaranteed to run).
  std::vector<cublasLtMatmulAlgo_t> algos;
  size_t chosen = 0;
};

// The plan of `key` with cuBLASLt's heuristic choices for a workspace of workspace_bytes; FP8
// operands' scale pointers are set before the heuristic runs (as cuBLASLt's FP8 sample does), so
// it chooses among the scaled kernels. A failed call, or no algorithm, stops the job
// (cuda_failure.hpp) naming `rank` and `during`.
GemmPlan plan_gemm(cublasLtHandle_t lt, const GemmKey& key, int64_t workspace_bytes, const float* scale_a,
                   const float* scale_b, int rank, const std::string& during);
// Releases the descriptors of a plan (unchecked: called on the way out).
void destroy_gemm_plan(const GemmPlan& plan);

// The backend's GEMMs: C = op(A)·op(B)·scale_a·scale_b + beta·C, with plans cached by key (the
// cache starts over past 4,096 shapes: expert GEMMs take a shape per routed row count). scale_a
// and scale_b: device floats (FP8 operands' dequantisation), or null for 1.
class Gemms {
 public:
  Gemms(cublasLtHandle_t lt, void* workspace, int64_t workspace_bytes)
      : lt_(lt), workspace_(workspace), workspace_bytes_(workspace_bytes) {}
  Gemms(const Gemms&) = delete;
  Gemms& operator=(const Gemms&) = delete;
  ~Gemms();
  void run(const GemmKey& key, const void* a, const void* b, void* c, float beta, cudaStream_t stream,
           const float* scale_a, const float* scale_b, int rank, const std::string& during);

 private:
  cublasLtHandle_t lt_;
  void* workspace_;
  int64_t workspace_bytes_;
  std::map<GemmKey, GemmPlan> plans_;
};

}  // namespace stepcast::cuda
