// `stepcast profile`'s measurements: with every MPI rank busy at once, as in training, each rank
// times the backend's kernels (GEMMs of a linear layer on a grid of shapes, memory-bound kernel
// families over sizes), then collectives by message and group size and point-to-point ping-pong.
// Returns the measured DeviceProfile (profile.hpp) on rank 0; prints nothing (progress goes to a
// callback). Every figure is the median over ranks and repetitions, in seconds and bytes.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "profile.hpp"
#include "topology.hpp"

namespace stepcast {

struct ProfileOptions {
  Dtype dtype = Dtype::fp32;       // fp32 or fp64: the CPU backend's compute types
  bool quick = false;              // a few points of each table (tests: a few seconds)
  double min_sample_s = 1e-3;      // one sample repeats a call until at least this long
  int repetitions = 5;             // samples per point and rank
  std::function<void(const std::string&)> progress;  // called on rank 0 only
};

// Collective over MPI_COMM_WORLD (MPI initialised). The profile is complete on rank 0; other
// ranks get the same object without points.
DeviceProfile measure_cpu_profile(const ProfileOptions& options);

// This host: hostname, /proc/cpuinfo's model name, online logical CPUs.
MachineInfo describe_machine();
// openblas (openblas_get_config) and mpi (MPI_Get_library_version, first line).
std::map<std::string, std::string> library_versions();
// MemTotal of /proc/meminfo, bytes; 0 when unreadable.
double host_memory_bytes();

// A topology of this machine from a measured CPU profile: `nodes` nodes of `ranks_per_node`
// devices ("cpu-core"); the dtype's peak = the fastest measured GEMM rate; memory bandwidth = the
// profile's fitted bandwidth; intra-node bandwidth and latency = its link fit; memory =
// `host_memory_bytes` / ranks_per_node. The figures' origins are in its notes (returned JSON).
Json measured_cpu_topology(const DeviceProfile& profile, int nodes, int ranks_per_node,
                           double host_memory_bytes);

}  // namespace stepcast
