// The CUDA backend's failure path (cuda_failure.hpp).
#include "cuda_failure.hpp"

#include <mpi.h>

#include <cstdlib>
#include <iostream>

#include "device_checks.hpp"

namespace stepcast::cuda {

void fail_job(const std::string& message) {
  std::cerr << "stepcast: " << message << "\n" << std::flush;
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Abort(MPI_COMM_WORLD, 3);
  std::abort();
}

void check_cuda(cudaError_t code, const char* call, int rank, const std::string& during) {
  if (code == cudaSuccess) return;
  fail_job(device_failure_message(rank, call, cudaGetErrorName(code), cudaGetErrorString(code), during));
}
void check_cublas(cublasStatus_t code, const char* call, int rank, const std::string& during) {
  if (code == CUBLAS_STATUS_SUCCESS) return;
  fail_job(device_failure_message(rank, call, cublasLtGetStatusName(code), cublasLtGetStatusString(code), during));
}
void check_nccl(ncclResult_t code, const char* call, int rank, const std::string& during) {
  if (code == ncclSuccess || code == ncclInProgress) return;
  fail_job(
      device_failure_message(rank, call, "ncclResult " + std::to_string(int(code)), ncclGetErrorString(code), during));
}

}  // namespace stepcast::cuda
