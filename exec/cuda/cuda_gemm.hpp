// cuBLASLt GEMM plans for the CUDA backend: the key of one GEMM (shape in column-major terms,
// operand types, pointer alignments) and its plan (descriptors, layouts, the heuristic's
// algorithm). The backend caches plans by key and launches them; fp32 accumulates everywhere.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>

#include "bf16.hpp"

namespace stepcast::cuda {

template <class X>
cudaDataType_t cuda_type() {
  return std::is_same_v<X, bf16> ? CUDA_R_16BF : CUDA_R_32F;
}

// One cuBLASLt GEMM shape in column-major terms, with the pointers' alignments (a parameter
// slice of the arena may be aligned to its element size only; the heuristic must know), and its
// chosen algorithm.
struct GemmKey {
  bool trans_a, trans_b;
  int64_t m, n, k, lda, ldb, ldc;
  cudaDataType_t ab, c;
  uint32_t align_a, align_b, align_c;
  bool operator<(const GemmKey& o) const {
    return std::tie(trans_a, trans_b, m, n, k, lda, ldb, ldc, ab, c, align_a, align_b, align_c) <
           std::tie(o.trans_a, o.trans_b, o.m, o.n, o.k, o.lda, o.ldb, o.ldc, o.ab, o.c, o.align_a, o.align_b,
                    o.align_c);
  }
};
// The largest power of two (at most 256) dividing the address.
uint32_t alignment_of(const void* p);
struct GemmPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

// The plan of `key` with cuBLASLt's first heuristic choice for a workspace of workspace_bytes; a
// failed call, or no algorithm, stops the job (cuda_failure.hpp) naming `rank` and `during`.
GemmPlan plan_gemm(cublasLtHandle_t lt, const GemmKey& key, int64_t workspace_bytes, int rank,
                   const std::string& during);
// Releases the descriptors of a plan (unchecked: called on the way out).
void destroy_gemm_plan(const GemmPlan& plan);

}  // namespace stepcast::cuda
