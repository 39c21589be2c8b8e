// The plugin entry point of cuda_plugin.hpp.
#include "cuda_plugin.hpp"

#include "cuda_backend.hpp"

extern "C" __attribute__((visibility("default"))) const stepcast::CudaPlugin* stepcast_cuda_plugin() {
  static const stepcast::CudaPlugin plugin{stepcast::kCudaPluginAbi, &stepcast::check_cuda_plan,
                                           &stepcast::run_program_cuda,
                                           &stepcast::measure_cuda_profile};
  return &plugin;
}
