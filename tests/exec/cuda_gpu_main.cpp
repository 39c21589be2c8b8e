// main() of the [gpu] tests (stepcast_cuda_tests). Listing the tests (ctest's discovery at build
// time) works anywhere; running one where no GPU is visible prints why and exits 77, which ctest
// reports as "Skipped" (SKIP_RETURN_CODE). With a GPU, MPI is initialised (the CUDA backend
// bootstraps NCCL over it) and Catch runs the test.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cuda_runtime_api.h>
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <set>
#include <string>

extern char** environ;

namespace stepcast::test {
std::set<std::string> environment_before_mpi;  // cuda_gpu_run.hpp
}  // namespace stepcast::test

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--list", 6) == 0 || std::strcmp(argv[i], "-l") == 0 ||
        std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      listing = true;
    }
  }
  if (listing) return Catch::Session().run(argc, argv);
  int count = 0;
  cudaError_t code = cudaGetDeviceCount(&count);
  if (code != cudaSuccess || count == 0) {
    std::printf("SKIPPED: no GPU visible (cudaGetDeviceCount: %s, %d devices): the [gpu] tests "
                "need an NVIDIA GPU and its driver\n",
                code == cudaSuccess ? "cudaSuccess" : cudaGetErrorName(code), count);
    return 77;
  }
  for (char** e = environ; *e; ++e) {
    std::string entry = *e;
    stepcast::test::environment_before_mpi.insert(entry.substr(0, entry.find('=')));
  }
  MPI_Init(&argc, &argv);
  int result = Catch::Session().run(argc, argv);
  MPI_Finalize();
  return result;
}
