// Where every buffer of a role lies in its rank's arena. The offsets are planned once from the
// role's alloc/free ops (the same walk the memory model makes): buffers placed largest first in
// the tightest gap their lifetime allows, or first fit in op order where that is smaller. The
// executors allocate extent_bytes and nothing during steps; the memory model (memory.hpp)
// counts extent − live peak as the placement's gaps, so what it predicts is what they hold.
#pragma once

#include <cstdint>
#include <vector>

#include "program.hpp"

namespace stepcast {

struct ArenaPlan {
  std::vector<int64_t> offset_of_op;  // per op: the alloc's offset in bytes (-1 for other ops)
  int64_t extent_bytes = 0;           // arena size the plan needs
  int64_t live_peak_bytes = 0;        // the memory model's peak of the same walk
};

ArenaPlan plan_arena(const Role& role, int64_t alignment = 64);

}  // namespace stepcast
