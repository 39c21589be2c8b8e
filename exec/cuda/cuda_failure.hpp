// How the CUDA backend stops on a failed CUDA, cuBLAS or NCCL call: the message once, from this
// rank (device_checks.hpp's wording), then MPI_Abort of the whole job, since a peer blocked in
// NCCL could not be reached otherwise. Success (and NCCL's ncclInProgress) returns.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

namespace stepcast::cuda {

// A failure in the middle of a run: the message once, from this rank, then the whole job stops.
[[noreturn]] void fail_job(const std::string& message);

// `during` names the op or phase the rank was in (the interpreter's current op).
void check_cuda(cudaError_t code, const char* call, int rank, const std::string& during);
void check_cublas(cublasStatus_t code, const char* call, int rank, const std::string& during);
void check_nccl(ncclResult_t code, const char* call, int rank, const std::string& during);

}  // namespace stepcast::cuda
