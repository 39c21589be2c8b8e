// Counter-based normal draws for the simulator's variability; see variability.hpp.
#include "variability.hpp"

#include <algorithm>
#include <cmath>

namespace stepcast {

namespace {

// SplitMix64's finaliser: a bijective mix of 64 bits (Steele, Lea, Flood, "Fast splittable
// pseudorandom number generators", OOPSLA 2014).
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A uniform in (0, 1) from 53 bits.
double uniform(uint64_t bits) { return (double(bits >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

constexpr double kTwoPi = 6.283185307179586;

}  // namespace

double VariabilityDraws::normal(int64_t a, int64_t b, int64_t c) const {
  uint64_t h = mix(seed_ ^ mix(uint64_t(a) ^ mix(uint64_t(b) ^ mix(uint64_t(c)))));
  double u1 = uniform(h), u2 = uniform(mix(h));
  double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);  // Box–Muller
  return std::clamp(z, -3.0, 3.0);
}

double VariabilityDraws::device_factor(int64_t rank) const {
  if (v_.device_speed_cv <= 0) return 1;
  return std::max(0.5, 1.0 + v_.device_speed_cv * normal(rank, -1, -1));
}

double VariabilityDraws::segment_deviation_s(int64_t rank, int64_t segment,
                                             double sum_squared_durations, int64_t members) const {
  if (v_.op_time_cv <= 0 || sum_squared_durations <= 0) return 0;
  double largest = -3;
  for (int64_t j = 0; j < std::max<int64_t>(1, members); ++j) {
    largest = std::max(largest, normal(rank, segment, j));
  }
  return v_.op_time_cv * std::sqrt(sum_squared_durations) * largest;
}

}  // namespace stepcast
