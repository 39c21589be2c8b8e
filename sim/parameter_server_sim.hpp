// The simulator's interpreter of a program with parameter servers (StepProgram::parameter_servers
// > 0, parameter_server.hpp): free-running workers and servers as SimGrid actors over many worker
// steps, each worker on its device's host and each server on its own.
//
// A worker's step: the weights' slices from every server (flows from the server's host, one per
// server carrying its slices), its compute ops (its role's compute, all on the compute stream,
// each at its cost over the device's speed factor), then its pushes: the norm and the gradient's
// slices to every server (one flow per server), posted without waiting. A server handles the
// pushes in the order they arrive: its AdamW over its slices (its role's ops at their cost over
// its device's speed), then the weights to every worker that stale synchronous parallelism lets
// start its next step, each first copied into the worker's staging slot (a staged send's copy).
// The servers send the initial weights as the run starts. Each worker runs
// parameter_server_steps(staleness) steps; the steady state is read from the second half.
//
// Outputs: step_time_s is the time of one global batch (every worker one step) at the steady
// state's throughput, W / Σ_w 1 / step_w; the critical rank the slowest worker, whose breakdown
// has its compute, its gradient norm (optimizer) and the rest as exposed communication (waiting
// for its weights: the transfers, the servers' updates and the staleness bound); the staleness
// (updates a server applied between a worker's pull and its push) over the steady state. No
// per-op records, no variability draws (the profile's variability is not applied).
#pragma once

#include <cstdint>

#include "simulator.hpp"

namespace stepcast {

// Worker steps simulated for a staleness bound: 4 · (staleness + 1), at least 16, at most 64.
int64_t parameter_server_steps(int64_t staleness);

// One SimGrid engine: call once per process (simulate_program calls it for such programs).
SimulationOutput simulate_parameter_servers(const StepProgram& program, const Topology& topology,
                                            const DeviceProfile& profile, const SimulateOptions& options);

}  // namespace stepcast
