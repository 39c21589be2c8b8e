// Run-to-run variation of compute for the simulator (profile.hpp's Variability): each device's
// speed factor, drawn once per device, and each op's deviation, drawn per (rank, op). Draws are a
// pure function of (seed, rank, op): the same seed gives the same prediction, whatever order the
// simulation asks in. No SimGrid here.
//
// A group that synchronises every few ops (a tensor-parallel group) runs at the pace of its
// slowest member. Where the simulator stands one rank in for such a group (fast mode's folded
// tensor parallelism), the stand-in takes the group's slowest device factor, and each stretch of
// compute between two of the group's synchronisations (a segment: ops of durations dᵢ) ends
// max over members of their segment's deviation later: op_time_cv · √(Σ dᵢ²) · max of n standard
// normals (n the group size; for one rank, a plain normal draw).
#pragma once

#include <cstdint>

#include "profile.hpp"

namespace stepcast {

class VariabilityDraws {
 public:
  VariabilityDraws(const Variability& variability, uint64_t seed)
      : v_(variability), seed_(seed) {}
  bool enabled() const { return v_.device_speed_cv > 0 || v_.op_time_cv > 0; }
  const Variability& variability() const { return v_; }
  uint64_t seed() const { return seed_; }

  // The slowdown factor of `rank`'s device (≥ 0.5): 1 + device_speed_cv · z, z a standard
  // normal truncated to [−3, 3]. Larger is slower.
  double device_factor(int64_t rank) const;
  // op_time_cv · √(sum of squared durations) · (max of `members` standard normals, truncated to
  // [−3, 3]), drawn for (rank, segment); the seconds a segment ends later than its nominal end
  // (negative: earlier).
  double segment_deviation_s(int64_t rank, int64_t segment, double sum_squared_durations,
                             int64_t members) const;
  // A standard normal for (a, b, c), truncated to [−3, 3].
  double normal(int64_t a, int64_t b, int64_t c) const;

 private:
  Variability v_;
  uint64_t seed_;
};

}  // namespace stepcast
