// Chrome trace event format (opens in Perfetto and chrome://tracing) of per-op records: one
// process per rank, one track per stream (and more where ops of a stream overlap in time, as
// posted pipeline transfers do: "p2p (2)", ...), every op a complete event ("X") with its kind,
// layer, microbatch, bytes and flops; collectives carry their group, algorithm and bytes. Flow
// arrows ("s"/"f") join each send to its receive where both ranks are recorded, and a counter
// track ("C", "memory") per rank follows the bytes of live program buffers from the alloc and
// free records, or where the records leave them out (a prediction's), from their deps' ends.
// Written by `simulate` and `run` alike.
#pragma once

#include <ostream>
#include <vector>

#include "program.hpp"
#include "step_result.hpp"

namespace stepcast {

// `records` may hold any subset of ranks; memory ops and zero-length ops are left out.
void write_chrome_trace(std::ostream& out, const StepProgram& program,
                        const std::vector<OpRecord>& records);

}  // namespace stepcast
