// Human-readable summaries the command line prints: memory per rank, the lowered program.
// Binary units (GiB) appear only here, at the edge; everything inside is bytes.
#pragma once

#include <ostream>
#include <string>

#include "memory.hpp"
#include "program.hpp"
#include "program_stats.hpp"

namespace stepcast {

std::string format_bytes(double bytes);    // "1.50 GiB", "512.0 MiB", "12 B"
std::string format_count(double value);    // "1.23e+15"
std::string format_rank_ranges(const std::vector<std::pair<int64_t, int64_t>>& ranges);

void print_memory_report(std::ostream& out, const MemoryReport& report);
void print_program_summary(std::ostream& out, const StepProgram& program,
                           const ProgramStats& stats, double model_flops_per_step);

}  // namespace stepcast
