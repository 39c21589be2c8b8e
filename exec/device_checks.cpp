// The pure checks and messages of device_checks.hpp.
#include "device_checks.hpp"
#include "units.hpp"

#include <cmath>
#include <cstdlib>
#include <sstream>

namespace stepcast {

namespace {

std::optional<int> parse_int(const char* text) {
  if (text == nullptr || *text == '\0') return std::nullopt;
  char* end = nullptr;
  long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value < 0) return std::nullopt;
  return int(value);
}

}  // namespace

std::optional<LocalRank> local_rank_from_environment(
    const std::function<const char*(const char*)>& getenv) {
  struct Source {
    const char* rank;
    const char* size;
  };
  for (const Source& s : {Source{"OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
                          Source{"SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
                          Source{"MPI_LOCALRANKID", "MPI_LOCALNRANKS"}}) {
    std::optional<int> rank = parse_int(getenv(s.rank));
    if (!rank) continue;
    std::optional<int> size = parse_int(getenv(s.size));
    LocalRank out;
    out.local_rank = *rank;
    out.local_size = size && *size > *rank ? *size : *rank + 1;
    out.source = s.rank;
    return out;
  }
  return std::nullopt;
}

std::string gpu_assignment_problem(int local_rank, int local_size, int visible_gpus,
                                   const std::optional<std::string>& visible_devices) {
  std::string devices = visible_devices ? "\"" + *visible_devices + "\"" : "unset";
  if (visible_gpus <= 0) {
    return "no GPU visible (CUDA_VISIBLE_DEVICES " + devices +
           "): --backend cuda needs one GPU per rank; valid: a machine with NVIDIA GPUs and "
           "their driver, or --backend cpu";
  }
  if (local_size > visible_gpus || local_rank >= visible_gpus) {
    return "local rank " + std::to_string(local_rank) + ": " + std::to_string(local_size) +
           " ranks on this node but " + std::to_string(visible_gpus) +
           " GPU(s) visible (CUDA_VISIBLE_DEVICES " + devices +
           "): NCCL needs one GPU per rank; valid: at most " + std::to_string(visible_gpus) +
           " ranks per node (e.g. mpirun --map-by ppr:" + std::to_string(visible_gpus) +
           ":node) and more nodes";
  }
  return "";
}

std::string placement_problem(int rank, int world, const LocalRank& local, int64_t devices_per_node) {
  if (local.local_size >= world) return "";
  if (local.local_size == devices_per_node && local.local_rank == rank % devices_per_node) return "";
  return "rank " + std::to_string(rank) + ": the launcher made it local rank " +
         std::to_string(local.local_rank) + " of " + std::to_string(local.local_size) +
         " on its host (" + local.source + "), but the topology has " +
         std::to_string(devices_per_node) + " devices per node (rank " + std::to_string(rank) +
         " is its node's device " + std::to_string(rank % devices_per_node) +
         "): the hostfile does not match the topology; valid: slots=" +
         std::to_string(devices_per_node) + " per host, ranks filled host by host (mpirun's default "
         "--map-by slot), or a topology of the hosts given";
}

std::string out_of_memory_message(const OutOfMemory& oom) {
  std::ostringstream out;
  out << "out of GPU memory allocating " << oom.what << " ("
      << gib(oom.bytes, 3) << ", " << std::llround(oom.bytes) << " bytes";
  if (!oom.class_bytes.empty()) {
    out << ":";
    for (const auto& [name, bytes] : oom.class_bytes) out << " " << name << " " << gib(bytes, 3);
  }
  out << "); the device had " << gib(oom.free_bytes, 3) << " free of " << gib(oom.total_bytes, 3);
  if (oom.predicted_peak_bytes > 0) {
    out << "; the plan's predicted peak on this rank is " << gib(oom.predicted_peak_bytes, 3);
  }
  out << "; valid: a plan whose peak fits (stepcast memory; ZeRO, recompute, a smaller micro "
         "batch, flash attention) or a GPU with more memory";
  return out.str();
}

std::string device_failure_message(int rank, const std::string& call, const std::string& name,
                                   const std::string& detail, const std::string& during) {
  std::string message = "rank " + std::to_string(rank) + ": " + call + " failed: " + name;
  if (!detail.empty()) message += " (" + detail + ")";
  if (!during.empty()) message += " during " + during;
  return message;
}

}  // namespace stepcast
