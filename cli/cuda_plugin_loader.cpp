// load_cuda_plugin of cuda_plugin_loader.hpp.
#include "cuda_plugin_loader.hpp"

#include <dlfcn.h>

#include <filesystem>

#include "errors.hpp"

namespace stepcast::cli {

const CudaPlugin& load_cuda_plugin() {
#ifndef STEPCAST_HAVE_CUDA
  throw InputError("command line: --backend 'cuda': this stepcast was built without CUDA (no CUDA "
                   "toolkit with cuBLASLt and NCCL found when it was configured); valid: cpu, or "
                   "rebuild where /usr/local/cuda exists");
#else
  // dlopen of a loaded library returns it again; the library stays loaded for the process.
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe");
  std::string path = (exe.parent_path() / kCudaPluginFile).string();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    throw InputError("--backend cuda: cannot load the CUDA backend " + path + ": " +
                     (why ? why : "unknown reason") +
                     "; valid: a build with CUDA whose libraries (CUDA runtime, cuBLASLt, NCCL) "
                     "the loader finds");
  }
  using Entry = const CudaPlugin* (*)();
  auto entry = reinterpret_cast<Entry>(dlsym(handle, "stepcast_cuda_plugin"));
  STEPCAST_CHECK(entry != nullptr, path + " has no stepcast_cuda_plugin");
  const CudaPlugin* p = entry();
  STEPCAST_CHECK(p && p->abi_version == kCudaPluginAbi,
                 path + " is another build's plugin (ABI " + std::to_string(p ? p->abi_version : -1) + ")");
  return *p;
#endif
}

}  // namespace stepcast::cli
