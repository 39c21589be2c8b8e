// What the profiler's measurements share (internal to exec/): backend memory owned until the
// profile ends, filled with small values or copied from the host, the grid and its sizes, timing
// a list of points, progress lines. profiler.cpp's Profiler provides them; profiler_memory.cpp
// measures the memory-bound families with them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend.hpp"
#include "point_timer.hpp"
#include "profiler.hpp"

namespace stepcast {

template <class T, class G, class W>
class ProfilerTools {
 public:
  virtual ~ProfilerTools() = default;

  // Backend memory released when the profiler ends.
  virtual char* allocate_owned(Backend<T, G, W>& backend, int64_t bytes) = 0;
  virtual const ProfileGrid& grid() const = 0;
  // The grid's sizes from `first` to `last` by 4×, or `quick`'s with --quick.
  virtual std::vector<double> sizes(double first, double last, const std::vector<double>& quick) const = 0;
  // Times `points`, printing a line per pass: "LABEL: pass P/R".
  virtual std::vector<double> time(const std::string& label, const std::vector<TimedPoint>& points) = 0;
  virtual void progress(const std::string& line) = 0;

  // Backend memory of `count` elements of X holding small non-zero values (no denormals, no
  // overflow however often a kernel accumulates into it). `random_signs`: each value's sign
  // drawn at random, as activations' are — a kernel that branches on it runs faster on values
  // of one sign (GeLU on libm's tanh did, 1.6×; the kernels' own tanh no longer branches).
  template <class X = T>
  X* buffer(Backend<T, G, W>& backend, int64_t count, bool random_signs = false) {
    char* memory = allocate_owned(backend, count * int64_t(sizeof(X)));
    std::vector<X> host(static_cast<size_t>(count));
    uint64_t state = 0x9E3779B97F4A7C15ull;
    for (int64_t i = 0; i < count; ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;  // LCG, top bit
      double sign = random_signs && (state >> 63) ? -1.0 : 1.0;
      host[size_t(i)] = X(sign * (0.25 + 0.01 * double(i % 17)));
    }
    backend.upload(memory, host.data(), count * int64_t(sizeof(X)));
    return reinterpret_cast<X*>(memory);
  }
  // Backend memory holding a copy of host data (token ids, masks, sample indices).
  template <class X>
  X* copy_of(Backend<T, G, W>& backend, const std::vector<X>& host) {
    char* memory = allocate_owned(backend, int64_t(host.size() * sizeof(X)));
    backend.upload(memory, host.data(), int64_t(host.size() * sizeof(X)));
    return reinterpret_cast<X*>(memory);
  }
};

// The memory-bound kernel families at the grid's sizes, into t.memory (profiler_memory.cpp).
template <class T, class G, class W>
void measure_memory_families(ProfilerTools<T, G, W>& tools, Backend<T, G, W>& backend, MeasuredTables& t);

}  // namespace stepcast
