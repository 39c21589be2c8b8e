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

// The draw for (seed, a, b, c): z = r · cos(2π u2) with radius r = √(−2 ln u1) (Box–Muller).
struct Draw {
  uint64_t h;
  double u1() const { return uniform(h); }
  static double radius(double u1) { return std::sqrt(-2.0 * std::log(u1)); }
  double z(double radius) const { return std::clamp(radius * std::cos(kTwoPi * uniform(mix(h))), -3.0, 3.0); }
};

Draw draw(uint64_t seed, int64_t a, int64_t b, int64_t c) {
  return {mix(seed ^ mix(uint64_t(a) ^ mix(uint64_t(b) ^ mix(uint64_t(c)))))};
}

}  // namespace

double VariabilityDraws::normal(int64_t a, int64_t b, int64_t c) const {
  Draw d = draw(seed_, a, b, c);
  return d.z(Draw::radius(d.u1()));
}

double VariabilityDraws::device_factor(int64_t rank) const {
  if (v_.device_speed_cv <= 0) return 1;
  return std::max(0.5, 1.0 + v_.device_speed_cv * normal(rank, -1, -1));
}

double VariabilityDraws::segment_deviation_s(int64_t rank, int64_t segment,
                                             double sum_squared_durations, int64_t members) const {
  if (v_.op_time_cv <= 0 || sum_squared_durations <= 0) return 0;
  // The largest of the members' normal(rank, segment, j). A draw cannot exceed its radius
  // (|cos| ≤ 1 holds in floating point too), so the members are visited by radius, largest
  // first (smallest u1), and the visit stops at the first whose radius cannot beat the largest
  // draw so far: its u1 above e^(−L²/2) (with a margin for rounding) once L is positive, before
  // its logarithm, or its radius at most L, before its cosine. The same maximum, bit for bit,
  // as drawing every member, for a fraction of the work (a segment of a folded tp 8 group draws 8).
  constexpr int64_t kMembers = 16;  // tp groups are at most a node's devices; more: drawn in turns
  const int64_t n = std::max<int64_t>(1, members);
  double largest = -3;
  for (int64_t first = 0; first < n; first += kMembers) {
    const int64_t count = std::min(kMembers, n - first);
    Draw d[kMembers];
    double u1[kMembers];
    int order[kMembers];
    for (int64_t j = 0; j < count; ++j) {
      d[j] = draw(seed_, rank, segment, first + j);
      u1[j] = d[j].u1();
      // Insertion by u1, ascending: the largest radius first.
      int64_t at = j;
      while (at > 0 && u1[order[at - 1]] > u1[j]) {
        order[at] = order[at - 1];
        --at;
      }
      order[at] = int(j);
    }
    double u1_above_passes = largest > 0 ? std::exp(-0.5 * largest * largest) * (1 + 1e-9) : 2;
    for (int64_t k = 0; k < count; ++k) {
      const int j = order[k];
      if (u1[j] > u1_above_passes) break;
      const double radius = Draw::radius(u1[j]);
      if (radius <= largest) break;
      const double z = d[j].z(radius);
      if (z > largest) {
        largest = z;
        if (largest > 0) u1_above_passes = std::exp(-0.5 * largest * largest) * (1 + 1e-9);
      }
    }
  }
  return v_.op_time_cv * std::sqrt(sum_squared_durations) * largest;
}

}  // namespace stepcast
