// The helpers of units.hpp.
#include "units.hpp"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <sstream>
#include <thread>

#include "errors.hpp"

namespace stepcast {

std::string gib(double bytes, int decimals) {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(decimals);
  out << bytes / kGiB << " GiB";
  return out.str();
}

double median(std::vector<double> values) {
  STEPCAST_CHECK(!values.empty(), "median of nothing");
  std::sort(values.begin(), values.end());
  size_t half = values.size() / 2;
  return values.size() % 2 ? values[half] : 0.5 * (values[half - 1] + values[half]);
}

void parallel_for(int64_t n, int jobs, const std::function<void(int64_t)>& work,
                  const std::function<void(int64_t, int64_t)>& progress) {
  std::atomic<int64_t> next{0}, done{0};
  std::atomic<bool> failed{false};
  std::mutex mutex;
  std::exception_ptr error;
  auto worker = [&] {
    for (int64_t i = next++; i < n && !failed; i = next++) {
      try {
        work(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!error) error = std::current_exception();
        failed = true;
      }
      int64_t finished = ++done;
      if (progress) {
        std::lock_guard<std::mutex> lock(mutex);
        progress(finished, n);
      }
    }
  };
  std::vector<std::thread> threads;
  for (int j = 1; j < std::min<int64_t>(std::max(1, jobs), n); ++j) threads.emplace_back(worker);
  worker();
  for (std::thread& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace stepcast
