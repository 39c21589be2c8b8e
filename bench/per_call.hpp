// The benches' timing of one kernel call: seconds per call of `kernel`, each call timed on its own
// after `before` (untimed; none: back to back), the median of `samples` samples, each at least
// `min_sample_s` long and `min_calls` calls. Not the profiler's PointTimer (exec/point_timer.hpp),
// which sizes samples across MPI ranks: these benches run one process on one core.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

namespace stepcast::bench {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double per_call(const std::function<void()>& before, const std::function<void()>& kernel, int samples,
                       double min_sample_s, int64_t min_calls) {
  std::vector<double> per_sample;
  for (int pass = 0; pass < samples; ++pass) {
    double spent = 0, start = now_s();
    int64_t calls = 0;
    while (now_s() - start < min_sample_s || calls < min_calls) {
      if (before) before();
      double t0 = now_s();
      kernel();
      spent += now_s() - t0;
      ++calls;
    }
    per_sample.push_back(spent / double(calls));
  }
  std::sort(per_sample.begin(), per_sample.end());
  return per_sample[per_sample.size() / 2];
}

}  // namespace stepcast::bench
