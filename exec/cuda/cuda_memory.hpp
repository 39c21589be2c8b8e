// Device memory of one rank's CUDA backend: cudaMalloc with the out-of-memory errors a run
// reports, the bytes the allocator holds for the program and their high-water mark (the measured
// peak), and cudaMemGetInfo's used level sampled at every synchronisation. Sizes in bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

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

}  // namespace stepcast::cuda
