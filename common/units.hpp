// Units and the small numeric helpers every layer uses: bytes in GiB, the median of a list, and
// a loop spread over threads (the planner's candidates, the children of scale, calibrate and
// compare-strategies).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace stepcast {

inline constexpr double kKiB = 1024.0;
inline constexpr double kMiB = 1024.0 * kKiB;
inline constexpr double kGiB = 1024.0 * kMiB;

// "75.23 GiB": `bytes` in GiB with `decimals` fixed decimals.
std::string gib(double bytes, int decimals = 2);

// The middle value (the mean of the two middle ones for an even count); `values` not empty.
double median(std::vector<double> values);

// Runs work(i) for every i in [0, n) on `jobs` threads (the caller's among them), `progress`
// (if given) after each under a lock with the count done so far. The first exception a work
// item throws is rethrown once every thread stopped; the items not started then are skipped.
void parallel_for(int64_t n, int jobs, const std::function<void(int64_t)>& work,
                  const std::function<void(int64_t done, int64_t total)>& progress = nullptr);

}  // namespace stepcast
