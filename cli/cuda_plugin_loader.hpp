// Loads the CUDA backend plugin (exec/cuda/cuda_plugin.hpp) from next to the executable, once.
// InputError, naming the file and dlopen's reason, where it is missing or does not load (a build
// without CUDA never has it: that message says so).
#pragma once

#include "cuda_plugin.hpp"

namespace stepcast::cli {

const CudaPlugin& load_cuda_plugin();

}  // namespace stepcast::cli
