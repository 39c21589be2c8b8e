// Device memory of one rank's CUDA backend: cudaMalloc with the out-of-memory errors a run
// reports, the bytes the allocator holds for the program and their high-water mark (the measured
// peak), and cudaMemGetInfo's used level sampled at every synchronisation. Sizes in bytes.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "json_input.hpp"

namespace stepcast::cuda {

class DeviceMemory {
 public:
  explicit DeviceMemory(int rank) : rank_(rank) {}

  // Once the context exists: the device's total and the level already used (the runtime's).
  void record_baseline(const std::string& during);
  // At a synchronisation: the lowest free level seen so far.
  void sample_free();

  // cudaMalloc, untracked. Out of memory: InputError naming `what` (the backend's own buffers),
  // or DeviceOutOfMemory where what is null (the program's memory, which the caller reports).
  void* raw_alloc(int64_t bytes, const char* what, const std::string& during);
  // The program's memory: at least 256 bytes, zeroed, counted towards the high-water mark.
  char* allocate(int64_t bytes, const std::string& during);
  void release(char* memory, const std::string& during);

  double total_bytes() const { return total_bytes_; }
  double used_before_bytes() const { return used_before_; }
  // cudaMemGetInfo's total − the minimum free seen, less the level before the backend.
  double used_high_water_bytes() const { return total_bytes_ - free_min_ - used_before_; }
  double allocator_high_water_bytes() const { return allocated_high_; }
  // measurement.json's memory.device_rank0: these figures with the backend's own buffers.
  Json report(const std::string& device_name, int ordinal, double workspace_bytes, double staging_bytes) const;

 private:
  int rank_;
  std::map<char*, int64_t> allocated_;
  double allocated_bytes_ = 0, allocated_high_ = 0;
  double total_bytes_ = 0, used_before_ = 0, free_min_ = 0;
};

// A device buffer of the backend's own that grows on demand (scratch, staging): a larger request
// first waits (`wait`: the streams that may still use the old buffer), frees it and allocates.
class DeviceScratch {
 public:
  DeviceScratch(DeviceMemory& memory, const char* what) : memory_(memory), what_(what) {}
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  ~DeviceScratch();

  char* get(int64_t bytes, const std::function<void()>& wait, const std::string& during);
  template <class X>
  X* get(int64_t count, const std::function<void()>& wait, const std::string& during) {
    return reinterpret_cast<X*>(get(count * int64_t(sizeof(X)), wait, during));
  }
  int64_t capacity_bytes() const { return bytes_; }

 private:
  DeviceMemory& memory_;
  const char* what_;
  char* data_ = nullptr;
  int64_t bytes_ = 0;
};

// Read-only device copies of small host int64 arrays (context parallelism's token positions,
// which take a handful of values over a run): one per distinct content, uploaded once from a host
// copy kept here, on the stream of the first request, with an event every later request's stream
// waits for. Never rewritten, so no kernel still reading one races a later upload.
class DeviceConstants {
 public:
  DeviceConstants(DeviceMemory& memory, int rank) : memory_(memory), rank_(rank) {}
  DeviceConstants(const DeviceConstants&) = delete;
  DeviceConstants& operator=(const DeviceConstants&) = delete;
  ~DeviceConstants();

  // The device copy of host[0, n), valid for work issued on `stream` after this call.
  const int64_t* get(const int64_t* host, int64_t n, cudaStream_t stream, const std::string& during);

 private:
  struct Copy {
    int64_t* data = nullptr;
    cudaEvent_t uploaded = nullptr;
  };
  DeviceMemory& memory_;
  int rank_;
  std::map<std::vector<int64_t>, Copy> copies_;  // keyed by content; the key is the upload's source
};

}  // namespace stepcast::cuda
