// Where and on what the profile was measured: this host, its libraries and memory, and where
// this MPI rank sits (profiler.hpp).
#include "profiler.hpp"

#include <cblas.h>
#include <mpi.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "mpi_check.hpp"

namespace stepcast {

namespace {

std::string read_first_line(const std::string& text) {
  auto end = text.find('\n');
  std::string line = end == std::string::npos ? text : text.substr(0, end);
  while (!line.empty() && (line.back() == ' ' || line.back() == '\r')) line.pop_back();
  return line;
}

}  // namespace

MachineInfo describe_machine() {
  MachineInfo info;
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) == 0) info.hostname = host;
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) {
        info.cpu_model = line.substr(colon + 1);
        info.cpu_model.erase(0, info.cpu_model.find_first_not_of(" \t"));
      }
      break;
    }
  }
  info.cores = sysconf(_SC_NPROCESSORS_ONLN);
  return info;
}

std::map<std::string, std::string> library_versions() {
  std::map<std::string, std::string> out;
  if (const char* config = openblas_get_config()) out["openblas"] = read_first_line(config);
  char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  if (MPI_Get_library_version(version, &length) == MPI_SUCCESS) {
    out["mpi"] = read_first_line(std::string(version, strnlen(version, sizeof version)));
  }
  return out;
}

double host_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key, unit;
  double value = 0;
  while (meminfo >> key >> value >> unit) {
    if (key == "MemTotal:") return value * 1024;  // kB in /proc/meminfo are KiB
  }
  return 0;
}

RankPlacement place_this_rank() {
  RankPlacement p;
  STEPCAST_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &p.rank));
  STEPCAST_MPI(MPI_Comm_size(MPI_COMM_WORLD, &p.size));
  MPI_Comm node_comm;
  STEPCAST_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, p.rank, MPI_INFO_NULL, &node_comm));
  int node_rank = 0;
  STEPCAST_MPI(MPI_Comm_size(node_comm, &p.ranks_per_node));
  STEPCAST_MPI(MPI_Comm_rank(node_comm, &node_rank));
  STEPCAST_MPI(MPI_Comm_free(&node_comm));
  int leader = node_rank == 0 ? 1 : 0;
  STEPCAST_MPI(MPI_Allreduce(&leader, &p.nodes, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
  return p;
}

}  // namespace stepcast
