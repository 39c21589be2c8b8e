// Time to train under failures: steps of a known time, checkpoints every k steps, failures that
// roll the job back to its last durable checkpoint, and a restart plus a reload after each.
// Pure functions (no I/O): the expectation for exponential failures, Young's and Daly's
// intervals, a sweep of intervals, seeded Monte-Carlo draws and failures at given steps. Seconds
// throughout; a failure interval is the job's (the whole job stops when any rank dies).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace stepcast {

struct GoodputInputs {
  int64_t steps = 0;                 // steps to train
  double step_time_s = 0;
  double checkpoint_write_s = 0;     // one checkpoint written to storage
  bool async_checkpoint = false;
  // Asynchronous saves: the step loop stops only for the copy to host memory; the write runs in
  // the background and the checkpoint is durable when it ends. The next copy waits for it.
  double checkpoint_snapshot_s = 0;
  double restart_s = 0;              // a failure seen to the processes ready again, reload excluded
  double reload_s = 0;               // the checkpoint read back
  double job_mtbf_s = 0;             // mean time between failures of the job (exponential)
};

// The parts of one time to train; they add up to time_to_train_s.
struct GoodputTime {
  int64_t interval_steps = 0;
  double time_to_train_s = 0;
  double compute_s = 0;              // steps × step time: the work itself
  double checkpoint_s = 0;           // time the step loop stands still for checkpoints that count
  double lost_s = 0;                 // work, and checkpoint time, done again after failures
  double restart_s = 0;              // restarts and reloads (failures during them included)
  double failures = 0;               // expected (or drawn) number of failures
  int64_t checkpoints = 0;           // checkpoints of the run that completes
};

// Checkpoints of a run: after every k-th step and after the last.
int64_t checkpoint_count(int64_t steps, int64_t interval_steps);
// The step loop's stall per checkpoint: the write when synchronous; when asynchronous the
// snapshot, plus the wait for the previous write when k steps take less than a write.
double checkpoint_stall_s(const GoodputInputs& in, int64_t interval_steps);

// Without failures: compute plus checkpoint stalls.
GoodputTime time_without_failures(const GoodputInputs& in, int64_t interval_steps);
// The expectation under exponential failures of mean job_mtbf_s. Synchronous saves: exact for
// the process Monte-Carlo draws (Daly 2006, eq. 13 per segment: a segment of work plus its
// checkpoint completes once it runs without a failure; a failure costs the time since the segment
// began, then a restart that failures may also interrupt). Asynchronous saves: first order, a
// failure loses on average half a period plus the write still in flight.
GoodputTime expected_time(const GoodputInputs& in, int64_t interval_steps);

// Work between checkpoints, in seconds, that minimises the expected time: Young (1974)
// sqrt(2·δ·M) and Daly (2006) sqrt(2·δ·M)·(1 + √(δ/2M)/3 + (δ/2M)/9) − δ (M when δ ≥ 2M), for a
// checkpoint cost δ (the stall) and MTBF M.
double young_interval_s(double checkpoint_cost_s, double mtbf_s);
double daly_interval_s(double checkpoint_cost_s, double mtbf_s);
// Seconds of work → whole steps, at least 1 and at most `steps`.
int64_t interval_steps_of(double interval_s, double step_time_s, int64_t steps);

// Intervals of a sweep: 1 step, then ×2^(1/4) (rounded, distinct) up to `steps`.
std::vector<int64_t> interval_grid(int64_t steps);
constexpr double kIntervalGridRatio = 1.189207115002721;  // 2^(1/4)

// Seeded Monte-Carlo: `runs` runs with exponential failure draws (a seeded 64-bit Mersenne
// Twister, inverse transform; the same seed, the same draws on every machine).
struct MonteCarloResult {
  int64_t runs = 0;
  uint64_t seed = 0;
  double mean_s = 0, stddev_s = 0, min_s = 0, p05_s = 0, p50_s = 0, p95_s = 0, max_s = 0;
  double mean_failures = 0;
  GoodputTime mean_parts;            // the parts averaged over the runs
};
// Drawing stops being useful, and a run would not end in practice, where the expectation has a
// run fail more than kMaxDrawnFailures times (or forever: failures come faster than a segment of
// work and its checkpoint); why, or nullopt where monte_carlo can run.
constexpr double kMaxDrawnFailures = 1e6;
std::optional<std::string> monte_carlo_refusal(const GoodputInputs& in, int64_t interval_steps);
// Requires monte_carlo_refusal to be nullopt.
MonteCarloResult monte_carlo(const GoodputInputs& in, int64_t interval_steps, int64_t runs, uint64_t seed);

// Failures at given steps: a failure as step s (0-based) is about to begin for the first time,
// each once; what a run with those failures does and takes.
struct ScriptedRun {
  GoodputTime time;
  int64_t steps_run = 0;                    // steps executed, redone ones included
  std::vector<int64_t> resumed_from_steps;  // the checkpoint each restart resumes (0: the start)
};
ScriptedRun scripted_failures(const GoodputInputs& in, int64_t interval_steps,
                              const std::vector<int64_t>& failure_steps);

}  // namespace stepcast
