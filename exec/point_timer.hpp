// Times a list of measurement points the same way on every MPI rank (exec/profiler.cpp's
// tables): sized so one sample lasts min_sample_s, `repetitions` interleaved passes, a barrier
// before each sample, the median over every rank's samples.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "profiler.hpp"

namespace stepcast {

// One point to time: `body` makes one call. `active` false: this rank has no part in it (no
// partner for a ping-pong): it sizes nothing and adds no samples.
struct TimedPoint {
  std::function<void()> body;
  bool active = true;
  // Untimed, before each timed sample (not before the sizing calls): sets the state the sample
  // starts from (the collective reuse points: the pool read through, the next slot first).
  std::function<void()> prepare = nullptr;
  // Untimed, before every call of a sample (the sizing calls too): the state a training step
  // leaves a kernel in (the CPU backend: a GEMM just before it). With it each call is timed on its
  // own, the samples' calls sized by both together.
  std::function<void()> before_each = nullptr;
};

// Seconds `calls` calls of `point` take, `sync` after them: the calls back to back, or with a
// before_each each call timed alone after it (the time between them not counted).
double time_calls(const TimedPoint& point, int64_t calls, const std::function<void()>& sync);

// Times a list of points, every rank the same list in the same order. A sizing pass makes one
// untimed call of each point and sets its count (the largest over ranks needed for a sample to
// last min_sample_s); then `repetitions` passes take one sample of every
// point each, a barrier before each sample. Passes rather than back-to-back samples: a burst of
// load from elsewhere on the machine then lands on one sample of many points, which the median
// discards, instead of on every sample of a few. Returns seconds per call of each point, the
// median over every rank's samples (the same on all ranks).
class PointTimer {
 public:
  // `sync` waits for the work the bodies queued (a GPU backend's streams; nothing on the CPU)
  // before the clock is read.
  PointTimer(const ProfileOptions& options, int rank, int size, std::function<void()> sync)
      : options_(options), rank_(rank), size_(size), sync_(std::move(sync)) {}

  std::vector<double> seconds_per_call(const std::vector<TimedPoint>& points,
                                       const std::function<void(int pass)>& after_pass);

 private:
  const ProfileOptions& options_;
  int rank_, size_;
  std::function<void()> sync_;
};

}  // namespace stepcast
