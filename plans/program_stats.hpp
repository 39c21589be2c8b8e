// Totals of a StepProgram for summaries: op counts per role, floating-point work per step and
// bytes communicated per step by group kind. Counts every rank (a role's ops times its ranks).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "program.hpp"

namespace stepcast {

struct ProgramStats {
  int64_t ranks = 0;
  std::vector<int64_t> ops_per_role;
  std::vector<int64_t> ranks_per_role;
  double flops_per_step = 0;          // executed (hardware) flops, recompute included, all ranks
  double forward_flops_per_step = 0;  // forward GEMM + attention products (QK^T, AV), all ranks
  double recompute_flops_per_step = 0;
  double matrix_flops_per_step = 0;   // GEMM + attention products in every phase (HFU's numerator)
  // Payload bytes per step summed over all ranks, by group kind ("tp", "dp", ..., and "pp" for
  // pipeline sends); and the largest per-rank figure of each.
  std::map<std::string, double> comm_bytes_per_step;
  std::map<std::string, double> comm_bytes_per_rank_max;
  std::map<std::string, int64_t> collective_ops_by_algorithm;
};

ProgramStats program_stats(const StepProgram& program);

}  // namespace stepcast
