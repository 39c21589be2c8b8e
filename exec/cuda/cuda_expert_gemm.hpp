// The local experts' GEMMs of one MoE op (the interpreter's moe_gemm): segment i of the op's
// activations (rows[i] rows, after segments 0…i−1) through expert weights w[i] [out, in], as
// linear_forward, linear_backward_data and linear_backward_weight's GEMMs, bias-free. Grouped: one
// cublasGemmGroupedBatchedEx launch (cuBLAS 12.5+) for every segment with rows; per expert: one
// cuBLASLt GEMM per segment (cuda_gemm.hpp, the backend's plans). Not here: routing, permutation.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda_gemm.hpp"
#include "cuda_memory.hpp"

namespace stepcast::cuda {

// One column-major GEMM of a grouped launch, in GemmKey's terms: C (m×n) = op(A)·op(B) + beta·C.
struct GroupedProblem {
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  void* c = nullptr;
  int64_t ldc = 0;
};
// What every problem of one op shares: the transposes, A and B's type, C's type, beta.
struct GroupedOp {
  bool trans_a = false, trans_b = false;
  cudaDataType_t ab = CUDA_R_32F, c = CUDA_R_32F;
  float beta = 0;
};

// Whether cublasGemmGroupedBatchedEx takes these types with fp32 compute. cuBLAS's table:
// bf16 → bf16, fp16 → fp16, fp32 → fp32; not bf16 operands into an fp32 output.
bool grouped_gemm_supported(cudaDataType_t ab, cudaDataType_t c);

// Runs an op's problems grouped where it can, else one cuBLASLt GEMM each (the path before issue
// 15, same plans): grouping off, a type pair the grouped API lacks (bf16 plans' wgrad into fp32
// gradients), a pointer below 16-byte alignment (cuBLAS's rule for bf16 grouped operands, kept for
// every type), or cuBLAS answering NOT_SUPPORTED. Problems writing the same C (an expert's wgrad
// from several source segments) must not share a launch (cuBLAS: outputs must not overlap), so
// the j-th of them goes to launch j, in order. Dimensions, leading dimensions and scales are host
// arrays; the A, B, C pointer arrays a device buffer uploaded on the op's stream once per op and
// never rewritten before the last launch reading it has run (the next upload's stream waits for
// an event recorded after that launch; a growth waits for it on the host before freeing).
class ExpertGemms {
 public:
  // workspace: the backend's GEMM workspace, shared with `gemms` (its GEMMs run in issue order on
  // one stream). grouped: false runs every segment as its own cuBLASLt GEMM.
  ExpertGemms(Gemms& gemms, DeviceMemory& memory, void* workspace, int64_t workspace_bytes, bool grouped, int rank,
              const std::string& during);
  ExpertGemms(const ExpertGemms&) = delete;
  ExpertGemms& operator=(const ExpertGemms&) = delete;
  ~ExpertGemms();

  // y[rows, out] = x[rows, in] · w_iᵀ per segment.
  template <class T>
  void forward(const T* x, const std::vector<const T*>& w, const std::vector<int64_t>& rows, T* y, int64_t in,
               int64_t out, cudaStream_t stream, const std::string& during);
  // dx[rows, in] (+)= dy[rows, out] · w_i per segment.
  template <class T>
  void backward_data(const T* dy, const std::vector<const T*>& w, const std::vector<int64_t>& rows, T* dx, int64_t in,
                     int64_t out, bool accumulate, cudaStream_t stream, const std::string& during);
  // dw_i[out, in] += dy[rows, out]ᵀ · x[rows, in] per segment (dw may repeat: an expert's segments).
  template <class T, class G>
  void backward_weight(const T* dy, const T* x, const std::vector<G*>& dw, const std::vector<int64_t>& rows, int64_t in,
                       int64_t out, cudaStream_t stream, const std::string& during);

  // The problems of one op (those with m, n or k zero skipped).
  void run(const GroupedOp& op, const std::vector<GroupedProblem>& problems, cudaStream_t stream,
           const std::string& during);

  // Launches so far, by kind (which path ran: the tests' evidence).
  int64_t grouped_launches() const { return grouped_launches_; }
  int64_t single_launches() const { return single_launches_; }

 private:
  bool groupable(const GroupedOp& op, const std::vector<GroupedProblem>& problems) const;
  // False where cuBLAS refused the first launch (NOT_SUPPORTED: nothing ran).
  bool run_grouped(const GroupedOp& op, const std::vector<GroupedProblem>& problems, cudaStream_t stream,
                   const std::string& during);

  Gemms& gemms_;
  void* workspace_;
  int64_t workspace_bytes_;
  bool grouped_;
  int rank_;
  cublasHandle_t handle_ = nullptr;
  DeviceScratch pointers_;
  cudaEvent_t pointers_read_ = nullptr;  // after the last launch reading pointers_
  std::vector<void*> host_pointers_;     // the upload's source: A, B, C per problem in launch order
  int64_t grouped_launches_ = 0, single_launches_ = 0;
};

}  // namespace stepcast::cuda
