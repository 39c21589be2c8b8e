// Device memory of the CUDA backend (cuda_memory.hpp).
#include "cuda_memory.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "cuda_backend.hpp"
#include "cuda_failure.hpp"
#include "device_checks.hpp"
#include "errors.hpp"

namespace stepcast::cuda {

void DeviceMemory::record_baseline(const std::string& during) {
  size_t free = 0, total = 0;
  check_cuda(cudaMemGetInfo(&free, &total), "cudaMemGetInfo", rank_, during);
  total_bytes_ = double(total);
  used_before_ = double(total - free);
  free_min_ = double(free);
}

void DeviceMemory::sample_free() {
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) == cudaSuccess) free_min_ = std::min(free_min_, double(free));
}

void* DeviceMemory::raw_alloc(int64_t bytes, const char* what, const std::string& during) {
  void* p = nullptr;
  cudaError_t code = cudaMalloc(&p, size_t(bytes));
  if (code == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear it
    size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    if (what) {
      OutOfMemory oom;
      oom.what = what;
      oom.bytes = double(bytes);
      oom.free_bytes = double(free);
      oom.total_bytes = double(total);
      throw InputError(out_of_memory_message(oom));
    }
    throw DeviceOutOfMemory(rank_, double(bytes), double(free), double(total));
  }
  check_cuda(code, "cudaMalloc", rank_, during);
  return p;
}

char* DeviceMemory::allocate(int64_t bytes, const std::string& during) {
  char* p = static_cast<char*>(raw_alloc(std::max<int64_t>(bytes, 256), nullptr, during));
  check_cuda(cudaMemset(p, 0, size_t(std::max<int64_t>(bytes, 256))), "cudaMemset", rank_, during);
  allocated_[p] = std::max<int64_t>(bytes, 256);
  allocated_bytes_ += double(allocated_[p]);
  allocated_high_ = std::max(allocated_high_, allocated_bytes_);
  return p;
}

void DeviceMemory::release(char* memory, const std::string& during) {
  auto it = allocated_.find(memory);
  if (it != allocated_.end()) {
    allocated_bytes_ -= double(it->second);
    allocated_.erase(it);
  }
  check_cuda(cudaFree(memory), "cudaFree", rank_, during);
}

}  // namespace stepcast::cuda
