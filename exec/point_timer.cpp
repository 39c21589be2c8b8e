// PointTimer of point_timer.hpp.
#include "point_timer.hpp"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "mpi_check.hpp"
#include "units.hpp"

namespace stepcast {

namespace {

constexpr double kNotMeasured = std::numeric_limits<double>::quiet_NaN();
constexpr int64_t kMaxCalls = 1000000;  // per sample

}  // namespace

double time_calls(const TimedPoint& point, int64_t calls, const std::function<void()>& sync) {
  auto seconds_since = [](std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  if (!point.before_each) {
    auto start = std::chrono::steady_clock::now();
    for (int64_t c = 0; c < calls; ++c) point.body();
    sync();
    return seconds_since(start);
  }
  double spent = 0;
  for (int64_t c = 0; c < calls; ++c) {
    point.before_each();
    sync();
    auto start = std::chrono::steady_clock::now();
    point.body();
    sync();
    spent += seconds_since(start);
  }
  return spent;
}

std::vector<double> PointTimer::seconds_per_call(const std::vector<TimedPoint>& points,
                                                 const std::function<void(int pass)>& after_pass) {
  const size_t n = points.size(), reps = size_t(options_.repetitions);
  std::vector<int64_t> counts(n, 1);
  for (size_t i = 0; i < n; ++i) {
    STEPCAST_MPI(MPI_Barrier(MPI_COMM_WORLD));
    points[i].body();
    sync_();
    // Doubling rounds of back-to-back calls until one lasts an eighth of a sample on every
    // rank (agreed each round: a collective's body must be called alike everywhere), so a
    // slow first call after the previous point is amortised rather than sizing the count.
    for (int64_t calls = 1;; calls *= 2) {
      double start = MPI_Wtime();
      time_calls(points[i], calls, sync_);
      double elapsed = MPI_Wtime() - start;  // with before_each's: a sample's wall time stays min_sample_s
      int enough = !points[i].active || elapsed >= options_.min_sample_s / 8 || calls >= kMaxCalls;
      STEPCAST_MPI(MPI_Allreduce(MPI_IN_PLACE, &enough, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
      if (!enough) continue;
      if (points[i].active) {
        double per_call = std::max(elapsed / double(calls), 1e-9);
        counts[i] = std::clamp<int64_t>(int64_t(std::ceil(options_.min_sample_s / per_call)), 1, kMaxCalls);
      }
      break;
    }
  }
  STEPCAST_MPI(MPI_Allreduce(MPI_IN_PLACE, counts.data(), int(n), MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD));
  std::vector<double> samples(n * reps);  // [point][pass]
  for (size_t pass = 0; pass < reps; ++pass) {
    for (size_t i = 0; i < n; ++i) {
      if (points[i].prepare) points[i].prepare();
      sync_();
      STEPCAST_MPI(MPI_Barrier(MPI_COMM_WORLD));
      double spent = time_calls(points[i], counts[i], sync_);
      samples[i * reps + pass] = points[i].active ? spent / double(counts[i]) : kNotMeasured;
    }
    if (after_pass) after_pass(int(pass) + 1);
  }
  std::vector<double> all(samples.size() * size_t(size_));  // [rank][point][pass]
  STEPCAST_MPI(MPI_Allgather(samples.data(), int(samples.size()), MPI_DOUBLE, all.data(), int(samples.size()),
                             MPI_DOUBLE, MPI_COMM_WORLD));
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) {
    std::vector<double> mine;
    for (size_t r = 0; r < size_t(size_); ++r) {
      for (size_t pass = 0; pass < reps; ++pass) {
        double v = all[(r * n + i) * reps + pass];
        if (!std::isnan(v)) mine.push_back(v);
      }
    }
    out[i] = median(mine);
  }
  return out;
}

}  // namespace stepcast
