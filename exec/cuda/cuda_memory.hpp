// Device memory of one rank's CUDA backend: cudaMalloc with the out-of-memory errors a run
// reports, the bytes the allocator holds for the program and their high-water mark (the measured
// peak), and cudaMemGetInfo's used level sampled at every synchronisation. Sizes in bytes.
#pragma once

#include <cstdint>
#include <map>
#include <string>

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

 private:
  int rank_;
  std::map<char*, int64_t> allocated_;
  double allocated_bytes_ = 0, allocated_high_ = 0;
  double total_bytes_ = 0, used_before_ = 0, free_min_ = 0;
};

}  // namespace stepcast::cuda
