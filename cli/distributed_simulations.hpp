// A command's simulations spread over an MPI job (`mpirun -np N stepcast plan ...`, `srun`):
// rank 0 runs the command as one process would and writes every output; ranks 1..N-1 serve
// simulations. Rank 0's SimulationRunner sends each request (its text: no path into rank 0's
// folders) to a rank with a free slot, or runs it in a child of its own, up to --jobs per rank;
// the serving rank runs the same child on the same text and answers with prediction.json's text
// or the child's log, so the figures are a single process's. A rank whose child is killed (a
// signal), or that stops answering, has that simulation rerun on another rank; it is named on
// stderr and the command ends with exit 1 after writing complete results.
#pragma once

#include <functional>
#include <string>

#include "simulation_request.hpp"

namespace stepcast::cli {

// The size of the MPI job that launched this process, from the launcher's environment before
// MPI is initialised (OMPI_COMM_WORLD_SIZE, PMI_SIZE; PMIX_RANK with Slurm's step size); 1 when
// none launched it. InputError for srun without an MPI plugin (tasks but no PMI).
int launched_job_size();

// The --help paragraph of the commands that spread.
inline constexpr const char* kSpreadHelp =
    "\nAcross a cluster: `mpirun -np N stepcast ...` or `srun --mpi=pmix stepcast ...` runs the same command;\n"
    "rank 0 runs it and writes every output, the other ranks run its simulations, --jobs at a time\n"
    "on each rank (rank 0 too); the figures are a single process's. Inputs must read the same on\n"
    "every node. A rank whose simulation is killed or that stops answering is named, its work\n"
    "rerun on another rank, and the command exits 1 once its outputs are written.";

// How long a rank waits without a word from another (every rank says something each second)
// before it gives that rank up.
inline constexpr double kSilenceLimitS = 60;

// Runs `command` across the job: MPI initialised, rank 0 runs command(runner) on a thread of its
// own while its main thread makes every MPI call (MPI_THREAD_FUNNELED); the other ranks serve
// until rank 0 is done. `command` reports its own errors and returns an exit code, which every
// rank returns (1 where a rank failed during the sweep and the exit code was 0).
int run_spread(const std::string& command_name, int argc, char** argv,
               const std::function<int(SimulationRunner& runner)>& command, double silence_limit_s = kSilenceLimitS);

}  // namespace stepcast::cli
