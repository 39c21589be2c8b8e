// What the profiler's measurements share (internal to exec/): backend memory owned until the
// profile ends, filled with small values or copied from the host, the grid and its sizes, timing
// a list of points, progress lines. profiler.cpp's Profiler provides them; profiler_memory.cpp
// measures the memory-bound families with them.
#pragma once

#include <cstdint>
#include <functional>
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
  virtual bool quick() const = 0;  // --quick: a few points of each table
  // Reads `used` bytes of `pool` (host memory) round from byte `from`, one word a cache line, so
  // that the reuse points' next call finds its operands the whole pool away.
  void read_round(const char* pool, int64_t used, int64_t from) {
    uint64_t sum = 0;
    for (int64_t i = 0; i < used; i += 64) sum += *reinterpret_cast<const uint64_t*>(pool + (from + i) % used);
    sink_ = sink_ + sum;
  }

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
  // What a training step runs just before most of its other kernels, for TimedPoint::before_each:
  // on the CPU backend a 128×128×128 linear layer (about a validation model's: tiny's qkv at micro
  // batch 2 is 128 tokens × 64 × 128); nothing elsewhere. BLAS's AVX-512 GEMMs leave the core
  // slower for a while after them. On this project's 2-core VM (Xeon, family 6 model 167,
  // OpenBLAS's SkylakeX kernels) the CPU kernels' RMSNorm of 64 KiB took 1.12–1.25× its
  // back-to-back time right after a 64³–128³ sgemm, of 1 MiB 1.03–1.22×, of 16 MiB 1.01–1.04×;
  // after a memcpy of a GEMM's bytes, or a GEMM on OpenBLAS's AVX2 kernels, 0.96–1.03×
  // (`bash bench/after_gemm.sh`). Timed back to back, the tables read a step's norms, activations
  // and attention fast: the CPU sweep's median |error| 7.4% → 3.7% on that VM (README).
  std::function<void()> step_gemm(Backend<T, G, W>& backend) {
    if (std::string(backend.name()) != "cpu") return nullptr;
    constexpr int64_t d = 128;
    T* x = buffer(backend, d * d, true);
    T* w = buffer(backend, d * d, true);
    T* y = buffer(backend, d * d);
    return [&backend, x, w, y] { backend.linear_forward(x, w, nullptr, y, d, d, d); };
  }
  // Backend memory holding a copy of host data (token ids, masks, sample indices).
  template <class X>
  X* copy_of(Backend<T, G, W>& backend, const std::vector<X>& host) {
    char* memory = allocate_owned(backend, int64_t(host.size() * sizeof(X)));
    backend.upload(memory, host.data(), int64_t(host.size() * sizeof(X)));
    return reinterpret_cast<X*>(memory);
  }

 private:
  volatile uint64_t sink_ = 0;  // the pool reads' sum, so that they are made
};

// The memory-bound kernel families at the grid's sizes, into t.memory (profiler_memory.cpp).
template <class T, class G, class W>
void measure_memory_families(ProfilerTools<T, G, W>& tools, Backend<T, G, W>& backend, MeasuredTables& t);

// The GEMMs of the grid's gemm_reuse_axis (m, n, k each; the three variants) back to back and with
// their operands rotating through each of the grid's reuse pools, into t.gemm_reuse (a CPU
// backend whose GEMM table rotated through t.gemm_table_pool_bytes; others: nothing).
// profiler_gemm_reuse.cpp.
template <class T, class G, class W>
void measure_gemm_reuse(ProfilerTools<T, G, W>& tools, Backend<T, G, W>& backend, MeasuredTables& t);

}  // namespace stepcast
