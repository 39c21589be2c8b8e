// The local experts' GEMMs of one MoE op (cuda_expert_gemm.hpp).
#include "cuda_expert_gemm.hpp"

#include <algorithm>
#include <map>
#include <tuple>

#include "cuda_failure.hpp"
#include "errors.hpp"

namespace stepcast::cuda {

namespace {

auto shape_of(const GroupedProblem& p) { return std::tie(p.m, p.n, p.k, p.lda, p.ldb, p.ldc); }

}  // namespace

bool grouped_gemm_supported(cudaDataType_t ab, cudaDataType_t c) {
  return ab == c && (ab == CUDA_R_16BF || ab == CUDA_R_16F || ab == CUDA_R_32F);
}

ExpertGemms::ExpertGemms(Gemms& gemms, DeviceMemory& memory, void* workspace, int64_t workspace_bytes, bool grouped,
                         int rank, const std::string& during)
    : gemms_(gemms),
      workspace_(workspace),
      workspace_bytes_(workspace_bytes),
      grouped_(grouped),
      rank_(rank),
      pointers_(memory, "the MoE grouped GEMMs' pointer arrays") {
  check_cublas(cublasCreate(&handle_), "cublasCreate", rank_, during);
  // Host scalars (the grouped API refuses device ones). Default math: fp32 problems stay strict fp32
  // (no TF32) as the cuBLASLt plans; split-K partial sums stay fp32, never rounded to a bf16 output.
  check_cublas(cublasSetPointerMode(handle_, CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode", rank_, during);
  const auto math = cublasMath_t(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
  check_cublas(cublasSetMathMode(handle_, math), "cublasSetMathMode", rank_, during);
  check_cuda(cudaEventCreateWithFlags(&pointers_read_, cudaEventDisableTiming), "cudaEventCreate", rank_, during);
}

ExpertGemms::~ExpertGemms() {
  if (pointers_read_) cudaEventSynchronize(pointers_read_);  // before pointers_ is freed
  if (handle_) cublasDestroy(handle_);
  if (pointers_read_) cudaEventDestroy(pointers_read_);
}

// y^T (out×rows) = op_T(w stored in×out) · x^T (in×rows): linear_forward's GEMM.
template <class T>
void ExpertGemms::forward(const T* x, const std::vector<const T*>& w, const std::vector<int64_t>& rows, T* y,
                          int64_t in, int64_t out, cudaStream_t stream, const std::string& during) {
  STEPCAST_CHECK(w.size() == rows.size(), "expert GEMM: a weight per segment");
  std::vector<GroupedProblem> problems;
  int64_t row = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] > 0) problems.push_back({out, rows[i], in, w[i], in, x + row * in, in, y + row * out, out});
    row += rows[i];
  }
  run({true, false, cuda_type<T>(), cuda_type<T>(), 0.f}, problems, stream, during);
}

// dx^T (in×rows) (+)= w^T (in×out) · dy^T (out×rows): linear_backward_data's GEMM.
template <class T>
void ExpertGemms::backward_data(const T* dy, const std::vector<const T*>& w, const std::vector<int64_t>& rows, T* dx,
                                int64_t in, int64_t out, bool accumulate, cudaStream_t stream,
                                const std::string& during) {
  STEPCAST_CHECK(w.size() == rows.size(), "expert GEMM: a weight per segment");
  std::vector<GroupedProblem> problems;
  int64_t row = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] > 0) problems.push_back({in, rows[i], out, w[i], in, dy + row * out, out, dx + row * in, in});
    row += rows[i];
  }
  run({false, false, cuda_type<T>(), cuda_type<T>(), accumulate ? 1.f : 0.f}, problems, stream, during);
}

// dw^T (in×out) += x^T (in×rows) · op_T(dy^T stored out×rows): linear_backward_weight's GEMM.
template <class T, class G>
void ExpertGemms::backward_weight(const T* dy, const T* x, const std::vector<G*>& dw, const std::vector<int64_t>& rows,
                                  int64_t in, int64_t out, cudaStream_t stream, const std::string& during) {
  STEPCAST_CHECK(dw.size() == rows.size(), "expert GEMM: a gradient per segment");
  std::vector<GroupedProblem> problems;
  int64_t row = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] > 0) problems.push_back({in, out, rows[i], x + row * in, in, dy + row * out, out, dw[i], in});
    row += rows[i];
  }
  run({false, true, cuda_type<T>(), cuda_type<G>(), 1.f}, problems, stream, during);
}

void ExpertGemms::run(const GroupedOp& op, const std::vector<GroupedProblem>& problems, cudaStream_t stream,
                      const std::string& during) {
  std::vector<GroupedProblem> work;
  for (const GroupedProblem& p : problems) {
    // k = 0 leaves C as it is only where beta is 1 (the wgrad); elsewhere it would scale C.
    STEPCAST_CHECK(p.k > 0 || op.beta == 1.f, "expert GEMM: an empty sum with beta " + std::to_string(op.beta));
    if (p.m > 0 && p.n > 0 && p.k > 0) work.push_back(p);
  }
  if (work.empty()) return;
  if (groupable(op, work) && run_grouped(op, work, stream, during)) return;
  for (const GroupedProblem& p : work) {
    GemmKey key{op.trans_a, op.trans_b, p.m, p.n, p.k, p.lda, p.ldb, p.ldc, op.ab, op.ab, op.c, alignment_of(p.a),
                alignment_of(p.b), alignment_of(p.c)};
    gemms_.run(key, p.a, p.b, p.c, op.beta, stream, nullptr, nullptr, rank_, during);
    ++single_launches_;
  }
}

bool ExpertGemms::groupable(const GroupedOp& op, const std::vector<GroupedProblem>& problems) const {
#if CUBLAS_VERSION >= 120500
  if (!grouped_ || !grouped_gemm_supported(op.ab, op.c)) return false;
  return std::all_of(problems.begin(), problems.end(), [](const GroupedProblem& p) {
    return alignment_of(p.a) >= 16 && alignment_of(p.b) >= 16 && alignment_of(p.c) >= 16;
  });
#else
  (void)op;
  (void)problems;
  return false;  // cuBLAS before 12.5 has no grouped GEMM
#endif
}

bool ExpertGemms::run_grouped(const GroupedOp& op, const std::vector<GroupedProblem>& problems, cudaStream_t stream,
                              const std::string& during) {
#if CUBLAS_VERSION >= 120500
  auto cuda = [&](cudaError_t code, const char* call) { check_cuda(code, call, rank_, during); };
  auto cublas = [&](cublasStatus_t code, const char* call) { check_cublas(code, call, rank_, during); };
  // Launch j takes the j-th problem writing each C (in order: an expert's segments accumulate as
  // the per-expert path adds them); within a launch, a group per distinct shape.
  std::vector<std::vector<GroupedProblem>> launches;
  std::map<void*, size_t> writes;
  for (const GroupedProblem& p : problems) {
    size_t j = writes[p.c]++;
    if (j == launches.size()) launches.emplace_back();
    launches[j].push_back(p);
  }
  for (auto& launch : launches) {
    std::stable_sort(launch.begin(), launch.end(),
                     [](const GroupedProblem& a, const GroupedProblem& b) { return shape_of(a) < shape_of(b); });
  }
  // Device pointer arrays [A…, B…, C…], each in launch order; one upload for the op.
  const size_t total = problems.size();
  host_pointers_.resize(3 * total);
  size_t i = 0;
  for (const auto& launch : launches) {
    for (const GroupedProblem& p : launch) {
      host_pointers_[i] = const_cast<void*>(p.a);
      host_pointers_[total + i] = const_cast<void*>(p.b);
      host_pointers_[2 * total + i] = p.c;
      ++i;
    }
  }
  void** device = pointers_.get<void*>(
      int64_t(3 * total), [&] { cuda(cudaEventSynchronize(pointers_read_), "cudaEventSynchronize"); }, during);
  cuda(cudaStreamWaitEvent(stream, pointers_read_, 0), "cudaStreamWaitEvent");
  // Pageable source: the call returns once host_pointers_ is read, so it may change after.
  cuda(cudaMemcpyAsync(device, host_pointers_.data(), 3 * total * sizeof(void*), cudaMemcpyHostToDevice, stream),
       "cudaMemcpyAsync (MoE GEMM pointers)");
  cublas(cublasSetStream(handle_, stream), "cublasSetStream");
  // After the stream: cublasSetStream puts the handle back on cuBLAS's own workspace pool.
  cublas(cublasSetWorkspace(handle_, workspace_, size_t(workspace_bytes_)), "cublasSetWorkspace");
  const cublasOperation_t ta = op.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = op.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  std::vector<cublasOperation_t> trans_a, trans_b;
  std::vector<int64_t> m, n, k, lda, ldb, ldc, sizes;
  std::vector<float> alpha, beta;
  size_t first = 0;
  for (const auto& launch : launches) {
    for (auto* v : {&m, &n, &k, &lda, &ldb, &ldc, &sizes}) v->clear();
    trans_a.clear();
    trans_b.clear();
    alpha.clear();
    beta.clear();
    for (size_t j = 0; j < launch.size(); ++j) {
      const GroupedProblem& p = launch[j];
      if (j == 0 || shape_of(p) != shape_of(launch[j - 1])) {
        m.push_back(p.m), n.push_back(p.n), k.push_back(p.k);
        lda.push_back(p.lda), ldb.push_back(p.ldb), ldc.push_back(p.ldc);
        trans_a.push_back(ta);
        trans_b.push_back(tb);
        alpha.push_back(1.f);
        beta.push_back(op.beta);
        sizes.push_back(0);
      }
      ++sizes.back();
    }
    cublasStatus_t code = cublasGemmGroupedBatchedEx_64(
        handle_, trans_a.data(), trans_b.data(), m.data(), n.data(), k.data(), alpha.data(), device + first, op.ab,
        lda.data(), device + total + first, op.ab, ldb.data(), beta.data(), device + 2 * total + first, op.c,
        ldc.data(), int64_t(sizes.size()), sizes.data(), CUBLAS_COMPUTE_32F);
    if (code == CUBLAS_STATUS_NOT_SUPPORTED && first == 0) {  // nothing launched: the per-expert GEMMs instead
      cuda(cudaEventRecord(pointers_read_, stream), "cudaEventRecord");
      return false;
    }
    cublas(code, "cublasGemmGroupedBatchedEx");
    first += launch.size();
    ++grouped_launches_;
  }
  cuda(cudaEventRecord(pointers_read_, stream), "cudaEventRecord");
  return true;
#else
  (void)op;
  (void)problems;
  (void)stream;
  (void)during;
  return false;
#endif
}

template void ExpertGemms::forward<bf16>(const bf16*, const std::vector<const bf16*>&, const std::vector<int64_t>&,
                                         bf16*, int64_t, int64_t, cudaStream_t, const std::string&);
template void ExpertGemms::forward<float>(const float*, const std::vector<const float*>&, const std::vector<int64_t>&,
                                          float*, int64_t, int64_t, cudaStream_t, const std::string&);
template void ExpertGemms::backward_data<bf16>(const bf16*, const std::vector<const bf16*>&,
                                               const std::vector<int64_t>&, bf16*, int64_t, int64_t, bool, cudaStream_t,
                                               const std::string&);
template void ExpertGemms::backward_data<float>(const float*, const std::vector<const float*>&,
                                                const std::vector<int64_t>&, float*, int64_t, int64_t, bool,
                                                cudaStream_t, const std::string&);
template void ExpertGemms::backward_weight<bf16, float>(const bf16*, const bf16*, const std::vector<float*>&,
                                                        const std::vector<int64_t>&, int64_t, int64_t, cudaStream_t,
                                                        const std::string&);
template void ExpertGemms::backward_weight<bf16, bf16>(const bf16*, const bf16*, const std::vector<bf16*>&,
                                                       const std::vector<int64_t>&, int64_t, int64_t, cudaStream_t,
                                                       const std::string&);
template void ExpertGemms::backward_weight<float, float>(const float*, const float*, const std::vector<float*>&,
                                                         const std::vector<int64_t>&, int64_t, int64_t, cudaStream_t,
                                                         const std::string&);

}  // namespace stepcast::cuda
