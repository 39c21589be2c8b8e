// The CPU backend: host memory, OpenBLAS and the reference kernels of cpu_kernels.hpp, MPI for
// every collective (the program's algorithms over point-to-point, or MPI's own) and pipeline
// transfer, a watchdog on every wait. fp32 or fp64 (T).
#pragma once

#include <memory>

#include "backend.hpp"
#include "watchdog.hpp"

namespace stepcast {

template <class T>
std::unique_ptr<Backend<T>> make_cpu_backend(const RankGrid& grid, int64_t rank,
                                             int64_t devices_per_node, bool use_mpi_collectives,
                                             double watchdog_s);

}  // namespace stepcast
