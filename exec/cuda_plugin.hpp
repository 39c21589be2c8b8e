// The CUDA backend as a plugin: `stepcast` loads libstepcast_cuda.so (dlopen) only when a command
// asks for --backend cuda, so every other command starts without mapping the CUDA runtime,
// cuBLASLt and NCCL (hundreds of MB) and runs where they are missing. This header has no CUDA
// in it; the library exports stepcast_cuda_plugin(), the loader (cli) calls through it.
#pragma once

#include <string>

#include "executor.hpp"
#include "profiler.hpp"

namespace stepcast {

struct CudaPlugin {
  int abi_version;  // kCudaPluginAbi of the library
  // InputError naming the plan file for what the CUDA backend cannot run (the command line
  // calls it before run_program).
  void (*check_plan)(const ModelConfig&, const Plan&);
  // Everything it runs comes from the program (executor.hpp's run_program).
  RunOutput (*run_program)(const StepProgram&, const RunOptions&);
  DeviceProfile (*measure_profile)(const ProfileOptions&);
};

// Bumped whenever CudaPlugin or the types it passes change.
inline constexpr int kCudaPluginAbi = 2;  // 2: check_plan; run_program takes the program only

// The library's file name, next to the `stepcast` executable.
inline constexpr const char* kCudaPluginFile = "libstepcast_cuda.so";

}  // namespace stepcast

extern "C" const stepcast::CudaPlugin* stepcast_cuda_plugin();
