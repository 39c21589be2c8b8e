// Printing of the memory report and the program summary; see summary.hpp.
#include "summary.hpp"

#include <cstdio>
#include <iomanip>
#include <sstream>

namespace stepcast {

std::string format_bytes(double bytes) {
  if (bytes < 0) return "-" + format_bytes(-bytes);  // (a plan's headroom when it does not fit)
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = bytes;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%.0f %s", v, units[u]);
  else std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

std::string format_count(double value) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", value);
  return buf;
}

std::string format_rank_ranges(const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  std::ostringstream out;
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (i) out << ",";
    if (i == 3) {
      out << "...(" << ranges.size() << " ranges)";
      break;
    }
    out << ranges[i].first;
    if (ranges[i].second != ranges[i].first) out << "-" << ranges[i].second;
  }
  return out.str();
}

void print_memory_report(std::ostream& out, const MemoryReport& report) {
  out << std::left << std::setw(18) << "ranks" << std::setw(6) << "stage";
  for (const char* h : {"weights", "grads", "optimizer", "activations", "workspace", "comm",
                        "placement", "runtime", "peak"}) {
    out << std::right << std::setw(12) << h;
  }
  out << "\n";
  for (const RankMemory& m : report.ranks) {
    out << std::left << std::setw(18) << format_rank_ranges(m.ranks) << std::setw(6) << m.stage;
    for (double v : {m.weights_bytes, m.grads_bytes, m.optimizer_bytes, m.activations_bytes,
                     m.workspace_bytes, m.comm_bytes, m.placement_bytes, m.runtime_bytes, m.peak_bytes}) {
      out << std::right << std::setw(12) << format_bytes(v);
    }
    out << "\n";
  }
  out << "peak " << format_bytes(report.peak_bytes_max) << " + reserved "
      << format_bytes(report.reserved_bytes) << " of " << format_bytes(report.capacity_bytes)
      << " per device: " << (report.fits ? "fits" : "DOES NOT FIT") << "\n";
}

void print_program_summary(std::ostream& out, const StepProgram& program,
                           const ProgramStats& stats, double model_flops_per_step) {
  out << "ranks " << stats.ranks << " (tp " << program.tp_size;
  if (program.cp_size > 1) out << ", cp " << program.cp_size;
  out << ", pp " << program.pp_size << ", dp " << program.dp_size << ", order " << program.order << "), roles "
      << program.roles.size() << ", microbatches " << program.num_microbatches
      << ", tokens per step " << program.tokens_per_step << "\n";
  out << "ops per role:";
  for (size_t i = 0; i < stats.ops_per_role.size(); ++i) {
    if (i == 8) {
      out << " ...";
      break;
    }
    out << " " << stats.ops_per_role[i];
  }
  out << "\n";
  out << "flops per step: executed " << format_count(stats.flops_per_step) << ", model "
      << format_count(model_flops_per_step) << " (recompute "
      << format_count(stats.recompute_flops_per_step) << ")\n";
  out << "bytes communicated per step (all ranks; largest per rank):\n";
  for (const auto& [group, bytes] : stats.comm_bytes_per_step) {
    out << "  " << std::left << std::setw(10) << group << std::right << std::setw(14)
        << format_bytes(bytes) << std::setw(14) << format_bytes(stats.comm_bytes_per_rank_max.at(group))
        << "\n";
  }
  out << "collectives by algorithm (all ranks):";
  for (const auto& [algorithm, count] : stats.collective_ops_by_algorithm) {
    out << " " << algorithm << " " << count;
  }
  out << "\nprogram_sha256 " << program.program_sha256 << "\n";
}

}  // namespace stepcast
