// The executor: runs a StepProgram for real on a backend (the CPU one here: OpenBLAS kernels in
// fp32 or fp64, MPI for every collective and pipeline transfer; exec/cuda/ the CUDA one), one MPI
// rank per program rank. Its interpreter (interpreter.hpp) walks its role's ops in list order and
// looks buffers up by name in one arena; it decides neither the schedule nor the dataflow.
// Measurement: step time (median after warm-up) from timed steps, per-op records from a separate
// instrumented step, memory measured from the process.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend.hpp"
#include "checkpoint_run.hpp"
#include "model.hpp"
#include "plan.hpp"
#include "program.hpp"
#include "step_result.hpp"
#include "topology.hpp"

namespace stepcast {

struct RunOptions {
  int64_t steps = 10;
  bool collectives_mpi = false;   // MPI's own collectives instead of the recorded algorithms
  std::string corpus_path;        // byte-level corpus for 256-token vocabularies
  uint64_t seed = 1234;
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.95, adam_eps = 1e-8, weight_decay = 0.1;
  double max_grad_norm = 1.0;
  bool quiet = false;             // no per-step progress lines
  double watchdog_s = 300;        // a wait on a peer longer than this aborts the job
  std::string checkpoint_dir;     // write checkpoints here ...
  int64_t checkpoint_every = 0;   // ... every this many steps (0: never)
  std::string resume_dir;         // continue from the latest complete checkpoint in here
  // A straggler (--slowdown RANK:FACTOR): this rank's compute ops each take slowdown_factor
  // times their measured duration (the extra spun after the op); -1: none.
  int64_t slowdown_rank = -1;
  double slowdown_factor = 1;
};

// measurement.json's "hyperparameters": the optimizer's settings and the seed.
Json hyperparameters_json(const RunOptions& options);

struct RunOutput {
  std::vector<double> losses;            // one per step run (after a resume: from there)
  int64_t first_step = 0;                // index of the first step run (0, or the resumed step)
  std::vector<double> step_times_s;      // every step, slowest rank
  std::vector<int64_t> moe_dropped_tokens;  // MoE: token copies capacity dropped, per step, all ranks
  // MoE: token copies routed to each expert (dropped ones too), a row per MoE layer, over the
  // steps run and every rank
  std::vector<std::vector<int64_t>> moe_tokens_per_expert;
  // ... and per MoE layer, those of each (step, microbatch, expert block) of the first steps
  std::vector<std::vector<std::vector<int64_t>>> moe_routing_samples;
  std::vector<double> grad_norms;        // the gradient norm each step clipped with, largest over ranks
  double grad_norm_rank_spread = 0;      // the largest (max − min) / max over ranks of a step's norm
  StepResult result;                     // filled on rank 0
  double measured_peak_bytes = 0;        // this rank
  double heap_growth_after_first_step_bytes = 0;  // this rank: malloc'd bytes outside the arena
  double resident_high_water_bytes = -1;  // host: VmHWM over the steps − baseline (-1: a device)
};

// InputError naming the plan's or the topology's file for what the CPU backend cannot run:
// 16-bit dtypes, gradients in another dtype than the weights, sequence parallelism with sharded
// gradients, a topology that is not a host. The command line calls it before run_program.
void check_cpu_backend(const Plan& plan, const Topology& topology);
// Collective over MPI_COMM_WORLD, whose size must equal program.world_size() (checked by the
// caller). Everything it runs comes from the program: its ops and the resolved inputs it
// carries (program_inputs.hpp); check_cpu_backend is applied to those again.
RunOutput run_program(const StepProgram& program, const RunOptions& options);

// A decorator the tests put around the backend a CPU run makes (tests/exec/fault_main.cpp: fault
// injection through the backend's progress hooks); none by default. The throwaway backend of
// the memory warm-up step is never wrapped.
struct BackendWrapper {
  virtual ~BackendWrapper() = default;
  virtual std::unique_ptr<Backend<float>> wrap(std::unique_ptr<Backend<float>> backend) const = 0;
  virtual std::unique_ptr<Backend<double>> wrap(std::unique_ptr<Backend<double>> backend) const = 0;
};
void set_backend_wrapper(const BackendWrapper* wrapper);  // null: none

// The same run on a backend the caller made (the CUDA backend lives in its own library, which
// calls this). Instantiated for <float>, <double>, <bf16, float, float>, <bf16, bf16, float>;
// the caller checks the plan against what the backend supports.
template <class T, class G, class W>
RunOutput run_with_backend(const StepProgram& program, const RunOptions& options,
                           Backend<T, G, W>& backend);

}  // namespace stepcast
