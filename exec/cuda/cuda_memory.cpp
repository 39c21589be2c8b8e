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

Json DeviceMemory::report(const std::string& device_name, int ordinal, double workspace_bytes,
                          double staging_bytes) const {
  double used_high = used_high_water_bytes();
  return {{"device", device_name},
          {"device_ordinal", ordinal},
          {"total_bytes", total_bytes_},
          {"used_before_backend_bytes", used_before_},
          {"used_high_water_bytes", used_high},
          {"allocator_high_water_bytes", allocated_high_},
          {"cublaslt_workspace_bytes", workspace_bytes},
          {"nccl_staging_bytes", staging_bytes},
          {"runtime_bytes", used_high - allocated_high_},
          {"method", "allocator: bytes this backend holds from cudaMalloc for the program "
                     "(arena and scratch), high-water mark; used: cudaMemGetInfo's total − "
                     "free at every synchronisation, minimum free, less the level once the "
                     "context existed"}};
}

DeviceScratch::~DeviceScratch() {
  if (data_) cudaFree(data_);
}

char* DeviceScratch::get(int64_t bytes, const std::function<void()>& wait, const std::string& during) {
  if (bytes_ < bytes) {
    if (data_) {
      wait();
      cudaFree(data_);
      data_ = nullptr;
      bytes_ = 0;
    }
    data_ = static_cast<char*>(memory_.raw_alloc(bytes, what_, during));
    bytes_ = bytes;
  }
  return data_;
}

DeviceConstants::~DeviceConstants() {
  for (auto& [values, copy] : copies_) {
    cudaFree(copy.data);
    if (copy.uploaded) cudaEventDestroy(copy.uploaded);
  }
}

const int64_t* DeviceConstants::get(const int64_t* host, int64_t n, cudaStream_t stream, const std::string& during) {
  std::vector<int64_t> values(host, host + n);
  auto it = copies_.find(values);
  if (it != copies_.end()) {
    check_cuda(cudaStreamWaitEvent(stream, it->second.uploaded, 0), "cudaStreamWaitEvent", rank_, during);
    return it->second.data;
  }
  const int64_t bytes = n * int64_t(sizeof(int64_t));
  Copy copy;
  copy.data = static_cast<int64_t*>(memory_.raw_alloc(std::max<int64_t>(bytes, 1), "token positions", during));
  it = copies_.emplace(std::move(values), copy).first;
  check_cuda(cudaEventCreateWithFlags(&it->second.uploaded, cudaEventDisableTiming), "cudaEventCreate", rank_, during);
  check_cuda(cudaMemcpyAsync(copy.data, it->first.data(), size_t(bytes), cudaMemcpyHostToDevice, stream),
             "cudaMemcpyAsync (token positions)", rank_, during);
  check_cuda(cudaEventRecord(it->second.uploaded, stream), "cudaEventRecord", rank_, during);
  return copy.data;
}

}  // namespace stepcast::cuda
