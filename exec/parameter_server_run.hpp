// A run with parameter servers (plan parameter_servers, plans/parameter_server.hpp) on the CPU
// backend: ranks 0 … dp − 1 are workers, each running its role's steps with the interpreter at
// its own pace (no step-wide synchronisation); ranks dp … dp + S − 1 are servers, each
// interpreting its role's ops here: every worker's push received as it arrives (the norm from
// whichever worker sent one, then that worker's gradient slices), AdamW on its slices clipped by
// the worker's norm, and its weights' slices sent (from a copy, so that the next update need not
// wait for the transfer) to each worker stale synchronous parallelism lets start its next step.
// Workers' losses are their own batches' (their gradients are their own batches' means); the
// measurement's step is one global batch (every worker one step) at the measured throughput of
// the run's second half (the steady state: the simulator reads its own so), and the staleness is
// counted over the pushes of that half.
#pragma once

#include "backend.hpp"
#include "executor.hpp"

namespace stepcast {

// One step on throwaway workers and servers (their own interpreters, arenas and buffers, on
// `backend`, a throwaway too), so that what the first step faults in outside the program (code
// pages, BLAS and MPI buffers) is in the measured memory's baseline, as run_program's warm-up
// step does. Collective over MPI_COMM_WORLD.
template <class T>
void warm_up_parameter_servers(const StepProgram& program, const ModelConfig& model, const Plan& plan,
                               const RunOptions& options, Backend<T>& backend);

// Collective over MPI_COMM_WORLD of program.ranks() processes. Instantiated for float and double.
template <class T>
RunOutput run_parameter_servers(const StepProgram& program, const ModelConfig& model, const Plan& plan,
                                const Topology& topology, const RunOptions& options, Backend<T>& backend);

}  // namespace stepcast
