// Helpers shared by the CPU kernel files (cpu_kernels_*.cpp), private to them: the dropout mask
// hash (the definition cpu_kernels.hpp documents at dropout_keep) and a double-accumulating dot
// product. Not part of the kernel interface; nothing outside exec/cpu_kernels_*.cpp includes it.
#pragma once

#include <cstdint>
#include <limits>

#include "cpu_kernels.hpp"
#include "errors.hpp"

namespace stepcast::cpu::detail {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// ---- dropout hash ----

constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ull;

// SplitMix64's finalizer: a bijection on 64-bit words with full avalanche.
inline uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline uint64_t absorb(uint64_t h, int64_t word) { return mix(h + kGamma + uint64_t(word)); }

// The hash state after seed, site, step, layer and sample: shared by a whole batch row.
inline uint64_t sample_key(uint64_t seed, DropoutSite site, int64_t step, int64_t layer, int64_t sample) {
  uint64_t h = mix(seed);
  h = absorb(h, int64_t(site));
  h = absorb(h, step);
  h = absorb(h, layer);
  return absorb(h, sample);
}
// The same for sample `bi` of a micro batch under `dropout`; 0 without dropout (null).
inline uint64_t sample_key(const Dropout* dropout, const int64_t* sample_index, int64_t bi) {
  if (!dropout) return 0;
  return sample_key(dropout->seed, dropout->site, dropout->step, dropout->layer, sample_index[bi]);
}

inline bool keep_from(uint64_t h, double p) { return double(h >> 11) * 0x1.0p-53 >= p; }

inline double keep_scale(double p) {
  STEPCAST_CHECK(p >= 0 && p < 1, "dropout probability must be in [0, 1)");
  return 1.0 / (1.0 - p);
}

template <class T>
double dot(const T* x, const T* y, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += double(x[i]) * double(y[i]);
  return sum;
}

}  // namespace stepcast::cpu::detail
