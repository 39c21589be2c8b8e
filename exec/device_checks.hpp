// Pure checks and messages of the CUDA backend that need no GPU (so the tests run everywhere):
// the launcher's local rank, ranks per node against visible GPUs, out-of-memory and CUDA/NCCL
// failure messages. Messages name the rank, the figures and what would be valid; bytes are bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

namespace stepcast {

// This rank's index on its node and the ranks on the node, from the launcher's environment:
// OpenMPI (OMPI_COMM_WORLD_LOCAL_RANK / _LOCAL_SIZE), Slurm (SLURM_LOCALID /
// SLURM_NTASKS_PER_NODE), MPICH/Hydra (MPI_LOCALRANKID / MPI_LOCALNRANKS). `getenv` is passed in
// (std::getenv in the program, a map in tests). nullopt when no launcher variable is set.
struct LocalRank {
  int local_rank = 0;
  int local_size = 1;
  std::string source;  // the variable read
};
std::optional<LocalRank> local_rank_from_environment(
    const std::function<const char*(const char*)>& getenv);

// "" when `local_size` ranks can each have a GPU of the `visible_gpus`; else the message (no GPU
// visible at all; more ranks on the node than GPUs). `visible_devices` is CUDA_VISIBLE_DEVICES
// (nullopt when unset), quoted in the message. The caller's error reporting adds the rank.
std::string gpu_assignment_problem(int local_rank, int local_size, int visible_gpus,
                                   const std::optional<std::string>& visible_devices);

// "" when the launcher's placement agrees with the topology: every rank on one host (a
// single-machine run, oversubscribed or not), or `local_size` = devices_per_node and each rank
// local rank `rank` mod devices_per_node (hosts filled in turn, as the topology numbers its
// devices); else the message (a hostfile of other slots than the topology's nodes).
std::string placement_problem(int rank, int world, const LocalRank& local, int64_t devices_per_node);

// An allocation that did not fit: `what` (the arena with its classes, the cuBLASLt workspace,
// NCCL staging, ...), the bytes asked, the device's free and total bytes then, and the plan's
// predicted peak per rank (memory_report's peak_bytes of this rank; 0: not known, left out).
struct OutOfMemory {
  std::string what;
  double bytes = 0;
  double free_bytes = 0, total_bytes = 0;
  double predicted_peak_bytes = 0;
  std::map<std::string, double> class_bytes;  // memory_<class>_bytes of the rank, when known
};
std::string out_of_memory_message(const OutOfMemory& oom);

// A failed CUDA, cuBLAS or NCCL call: "rank R: CALL failed: NAME (DETAIL) during WHAT".
std::string device_failure_message(int rank, const std::string& call, const std::string& name,
                                   const std::string& detail, const std::string& during);

}  // namespace stepcast
