// cuBLASLt GEMM plans (cuda_gemm.hpp).
#include "cuda_gemm.hpp"

#include <utility>

#include "cuda_failure.hpp"
#include "device_checks.hpp"

namespace stepcast::cuda {

uint32_t alignment_of(const void* p) {
  auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && address % a != 0) a /= 2;
  return a;
}

namespace {

std::string describe(const GemmKey& key) {
  auto type = [](cudaDataType_t t) {
    switch (t) {
      case CUDA_R_8F_E4M3: return "e4m3";
      case CUDA_R_8F_E5M2: return "e5m2";
      case CUDA_R_16BF: return "bf16";
      case CUDA_R_32F: return "fp32";
      default: return "other";
    }
  };
  return std::string(key.trans_a ? "T" : "N") + (key.trans_b ? "T" : "N") + " m " + std::to_string(key.m) + " n " +
         std::to_string(key.n) + " k " + std::to_string(key.k) + " lda " + std::to_string(key.lda) + " ldb " +
         std::to_string(key.ldb) + " ldc " + std::to_string(key.ldc) + ", A " + type(key.a) + " B " + type(key.b) +
         " C " + type(key.c) + ", alignments " + std::to_string(key.align_a) + "/" + std::to_string(key.align_b) + "/" +
         std::to_string(key.align_c);
}

void set_scales(const GemmPlan& p, const float* scale_a, const float* scale_b, int rank, const std::string& during) {
  check_cublas(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale_a, sizeof scale_a),
               "cublasLtMatmulDescSetAttribute (A scale)", rank, during);
  check_cublas(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale_b, sizeof scale_b),
               "cublasLtMatmulDescSetAttribute (B scale)", rank, during);
}

}  // namespace

GemmPlan plan_gemm(cublasLtHandle_t lt, const GemmKey& key, int64_t workspace_bytes, const float* scale_a,
                   const float* scale_b, int rank, const std::string& during) {
  auto cublas = [&](cublasStatus_t code, const char* call) { check_cublas(code, call, rank, during); };
  GemmPlan p;
  // fp32 operands: strict fp32 (no TF32) so the fp32 path matches the CPU to 1e-5.
  cublas(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  cublasOperation_t ta = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t tb = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublas(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta),
         "cublasLtMatmulDescSetAttribute");
  cublas(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb),
         "cublasLtMatmulDescSetAttribute");
  // Stored shapes (column-major): A is m×k (k×m transposed), B k×n (n×k transposed), C m×n.
  cublas(cublasLtMatrixLayoutCreate(&p.a, key.a, uint64_t(key.trans_a ? key.k : key.m),
                                    uint64_t(key.trans_a ? key.m : key.k), key.lda),
         "cublasLtMatrixLayoutCreate");
  cublas(cublasLtMatrixLayoutCreate(&p.b, key.b, uint64_t(key.trans_b ? key.n : key.k),
                                    uint64_t(key.trans_b ? key.k : key.n), key.ldb),
         "cublasLtMatrixLayoutCreate");
  cublas(cublasLtMatrixLayoutCreate(&p.c, key.c, uint64_t(key.m), uint64_t(key.n), key.ldc),
         "cublasLtMatrixLayoutCreate");
  if (is_fp8(key.a) || is_fp8(key.b)) set_scales(p, scale_a, scale_b, rank, during);
  cublasLtMatmulPreference_t pref = nullptr;
  cublas(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  uint64_t workspace = uint64_t(workspace_bytes);
  cublas(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                              sizeof workspace),
         "cublasLtMatmulPreferenceSetAttribute");
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c}};
  for (const auto& [attribute, bytes] : alignments) {
    cublas(cublasLtMatmulPreferenceSetAttribute(pref, attribute, &bytes, sizeof bytes),
           "cublasLtMatmulPreferenceSetAttribute (alignment)");
  }
  cublasLtMatmulHeuristicResult_t results[8] = {};
  int found = 0;
  cublas(cublasLtMatmulAlgoGetHeuristic(lt, p.desc, p.a, p.b, p.c, p.c, pref, 8, results, &found),
         "cublasLtMatmulAlgoGetHeuristic");
  cublasLtMatmulPreferenceDestroy(pref);
  for (int i = 0; i < found; ++i) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS) p.algos.push_back(results[i].algo);
  }
  if (p.algos.empty()) {
    fail_job(device_failure_message(rank, "cublasLtMatmulAlgoGetHeuristic", "no algorithm", describe(key), during));
  }
  return p;
}

void destroy_gemm_plan(const GemmPlan& plan) {
  cublasLtMatmulDescDestroy(plan.desc);
  cublasLtMatrixLayoutDestroy(plan.a);
  cublasLtMatrixLayoutDestroy(plan.b);
  cublasLtMatrixLayoutDestroy(plan.c);
}

Gemms::~Gemms() {
  for (auto& [key, plan] : plans_) destroy_gemm_plan(plan);
}

void Gemms::run(const GemmKey& key, const void* a, const void* b, void* c, float beta, cudaStream_t stream,
                const float* scale_a, const float* scale_b, int rank, const std::string& during) {
  auto it = plans_.find(key);
  if (it == plans_.end()) {
    if (plans_.size() >= 4096) {
      for (auto& [shape, plan] : plans_) destroy_gemm_plan(plan);
      plans_.clear();
    }
    it = plans_.emplace(key, plan_gemm(lt_, key, workspace_bytes_, scale_a, scale_b, rank, during)).first;
  }
  GemmPlan& p = it->second;
  if (is_fp8(key.a) || is_fp8(key.b)) set_scales(p, scale_a, scale_b, rank, during);  // read at launch
  float alpha = 1.f;
  for (;;) {
    cublasStatus_t code = cublasLtMatmul(lt_, p.desc, &alpha, a, p.a, b, p.b, &beta, c, p.c, c, p.c,
                                         &p.algos[p.chosen], workspace_, size_t(workspace_bytes_), stream);
    if (code == CUBLAS_STATUS_NOT_SUPPORTED && p.chosen + 1 < p.algos.size()) {
      ++p.chosen;  // the next heuristic choice; nothing was launched
      continue;
    }
    if (code != CUBLAS_STATUS_SUCCESS) check_cublas(code, "cublasLtMatmul", rank,
                                                         during + " (GEMM " + describe(key) + ")");
    return;
  }
}

}  // namespace stepcast::cuda
