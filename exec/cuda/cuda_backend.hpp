// The CUDA backend of backend.hpp: device memory from cudaMalloc (tracked: the allocator's
// high-water mark is the measured peak), cuBLASLt GEMMs (bf16 or fp32 in, fp32 accumulate, a
// workspace the backend owns and reports), the kernels of cuda_kernels.hpp on a compute stream,
// NCCL for every collective (a communicator per group kind, split from a world communicator
// bootstrapped over MPI) and pipeline transfer on communication streams ordered against compute
// with events. Every CUDA, cuBLAS and NCCL call is checked; a failure mid-run prints the rank's
// message and aborts the whole MPI job (a peer blocked in NCCL could not be reached otherwise).
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

#include "backend.hpp"
#include "device_checks.hpp"
#include "executor.hpp"
#include "profiler.hpp"

namespace stepcast {

// An allocation the device could not satisfy (allocate() throws it; run_program_cuda turns it
// into out_of_memory_message with the plan's figures).
class DeviceOutOfMemory : public std::runtime_error {
 public:
  DeviceOutOfMemory(int on_rank, double requested, double free, double total)
      : std::runtime_error("rank " + std::to_string(on_rank) + ": out of GPU memory allocating " +
                           std::to_string(int64_t(requested)) + " bytes"),
        rank(on_rank), bytes(requested), free_bytes(free), total_bytes(total) {}
  int rank;
  double bytes, free_bytes, total_bytes;
};

struct CudaBackendOptions {
  int device = 0;                 // CUDA device ordinal of this rank
  double watchdog_s = 300;        // a wait on the GPU (an NCCL peer) longer than this aborts
  int64_t workspace_bytes = 32 << 20;  // cuBLASLt workspace (Hopper: 32 MiB, as cuBLAS's)
  // The local experts' GEMMs: one cuBLAS grouped GEMM per MoE op (true), or a cuBLASLt GEMM per
  // expert segment (false; STEPCAST_CUDA_MOE_GROUPED=0, for comparison).
  bool moe_grouped_gemms = true;
};

// STEPCAST_CUDA_MOE_GROUPED's value (null: unset) as CudaBackendOptions::moe_grouped_gemms:
// unset or "1" true, "0" false; InputError naming the variable for anything else.
bool moe_grouped_gemms_from_environment(const char* value);

// T: bf16 or float; G: bf16 or float (weight gradients); the wide class is float. Collective
// over MPI_COMM_WORLD (NCCL bootstrap and communicator splits).
template <class T, class G>
std::unique_ptr<Backend<T, G, float>> make_cuda_backend(const RankGrid& grid, int64_t rank,
                                                        int64_t devices_per_node,
                                                        const CudaBackendOptions& options);

// The GPU this rank uses: local rank from the launcher's environment, checked against the
// visible GPUs (InputError with gpu_assignment_problem's message).
int select_cuda_device();

// What `stepcast run --backend cuda` runs: bf16 plans with fp32 (or bf16) gradients, and fp32
// plans; InputError naming the plan file for anything else.
void check_cuda_plan(const ModelConfig& model, const Plan& plan);
// The run, from the program alone (its inputs checked again); out of memory names the class,
// bytes and the plan's predicted peak.
RunOutput run_program_cuda(const StepProgram& program, const RunOptions& options);

// `stepcast profile --backend cuda`: GEMMs through cuBLASLt (bf16 in, fp32 accumulate), the
// memory-bound kernels, NCCL collectives (with more than one rank) and send/recv, every rank
// busy at once (profiler.hpp's method).
DeviceProfile measure_cuda_profile(const ProfileOptions& options);

}  // namespace stepcast
