// The console summary and compare.md: one body (write_report) in two layouts, console columns
// or Markdown tables; see compare.hpp.
#include "compare.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "compare_fields.hpp"
#include "summary.hpp"
#include "version.hpp"

namespace stepcast {

using namespace compare_detail;

namespace {

std::string seconds(double s) {
  char buf[32];
  double a = std::abs(s);
  if (a != 0 && a < 1e-3)
    std::snprintf(buf, sizeof buf, "%.1f µs", s * 1e6);
  else if (a < 1)
    std::snprintf(buf, sizeof buf, "%.3f ms", s * 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.3f s", s);
  return buf;
}

std::string percent(const std::optional<double>& v) {
  if (!v) return "n/a";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.1f%%", *v * 100);
  return buf;
}

std::string signed_bytes(double bytes) {
  return (bytes < 0 ? "-" : bytes > 0 ? "+" : "") + format_bytes(std::abs(bytes));
}

size_t shown_width(const std::string& s) {  // code points, so "µs" pads like two characters
  size_t n = 0;
  for (char ch : s) n += (static_cast<unsigned char>(ch) & 0xC0) != 0x80;
  return n;
}

// One row per cell list: Markdown ("| a | b |") or console columns, the first left-aligned in
// `first_width`, the others right-aligned.
void row(std::ostream& out, const std::vector<std::string>& cells, bool markdown,
         size_t first_width = 34) {
  if (markdown) {
    out << "|";
    for (const auto& c : cells) out << " " << c << " |";
  } else {
    for (size_t i = 0; i < cells.size(); ++i) {
      size_t width = i == 0 ? first_width : 13;
      std::string pad(width - std::min(width, shown_width(cells[i])), ' ');
      out << (i ? " " : "  ") << (i ? pad + cells[i] : cells[i] + pad);
    }
  }
  out << "\n";
}

void header(std::ostream& out, const std::vector<std::string>& cells, bool markdown,
            size_t first_width = 34) {
  row(out, cells, markdown, first_width);
  if (markdown) row(out, std::vector<std::string>(cells.size(), "---"), true);
}

void group_table(std::ostream& out, const std::vector<OpGroupCompare>& groups, size_t limit,
                 bool markdown) {
  header(out, {"ops", "count", "predicted", "measured", "error", "relative", "Σ abs(gap)"},
         markdown);
  for (size_t i = 0; i < groups.size() && i < limit; ++i) {
    const OpGroupCompare& g = groups[i];
    row(out,
        {g.label(), std::to_string(g.count), seconds(g.predicted_s), seconds(g.measured_s),
         seconds(g.error_s()), percent(g.relative()), seconds(g.abs_gap_s)},
        markdown);
  }
}

// The shared body of the console summary and the Markdown report.
void write_report(std::ostream& out, const CompareResult& c, bool markdown, size_t limit) {
  auto section = [&](const std::string& title) {
    out << (markdown ? "\n## " + title + "\n\n" : title + ":\n");
  };
  double step = c.step_time_s.measured;
  section("Step time and breakdown (critical rank: predicted " +
          std::to_string(c.predicted_critical_rank) + ", measured " +
          std::to_string(c.measured_critical_rank) + ")");
  header(out, {"", "predicted", "measured", "error", "relative", "of step"}, markdown);
  row(out,
      {"step time", seconds(c.step_time_s.predicted), seconds(step), seconds(c.step_time_s.error()),
       percent(c.step_time_s.relative()), ""},
      markdown);
  for (const CompareFigure& f : c.breakdown_s) {
    row(out,
        {f.name, seconds(f.predicted), seconds(f.measured), seconds(f.error()),
         percent(f.relative()), percent(ratio(f.error(), step))},
        markdown);
  }

  section("Memory by class");
  bool all_equal = true;
  for (const auto& rm : c.memory_ranks) {
    for (const auto& f : rm.classes) all_equal = all_equal && f.error() == 0;
  }
  if (all_equal && !markdown) {
    out << "  every class agrees on every rank entry (" << c.memory_ranks.size()
        << "); peak_bytes_max " << format_bytes(c.peak_bytes_max.predicted) << "\n";
  } else {
    header(out, {"ranks", "class", "predicted", "measured", "error", "relative"}, markdown);
    for (const auto& rm : c.memory_ranks) {
      for (const auto& f : rm.classes) {
        if (!markdown && f.error() == 0) continue;
        row(out,
            {format_rank_ranges(rm.ranks) + " (stage " + std::to_string(rm.stage) + ")", f.name,
             format_bytes(f.predicted), format_bytes(f.measured), signed_bytes(f.error()),
             percent(f.relative())},
            markdown);
      }
    }
    row(out,
        {"max", "peak_bytes_max", format_bytes(c.peak_bytes_max.predicted),
         format_bytes(c.peak_bytes_max.measured), signed_bytes(c.peak_bytes_max.error()),
         percent(c.peak_bytes_max.relative())},
        markdown);
  }
  if (c.measured_peak_max) {
    const MeasuredPeakCompare& p = *c.measured_peak_max;
    out << (markdown ? "\n" : "  ") << "measured peak "
        << format_bytes(p.measured_peak_bytes)
        << " vs predicted peak without the runtime allowance "
        << format_bytes(p.predicted_arena_peak_bytes) << ": error " << signed_bytes(p.error_bytes())
        << " (" << percent(p.relative()) << ")\n"
        << (markdown ? "\n" : "  (") << kMeasuredPeakNote << (markdown ? ".\n" : ")\n");
    if (markdown && !c.measured_peak_ranks.empty()) {
      out << "\n";
      header(out, {"rank", "predicted peak − runtime", "measured peak", "error", "relative", "arena as placed"},
             true);
      for (const auto& r : c.measured_peak_ranks) {
        row(out,
            {std::to_string(r.rank), format_bytes(r.predicted_arena_peak_bytes),
             format_bytes(r.measured_peak_bytes), signed_bytes(r.error_bytes()), percent(r.relative()),
             r.arena_extent_bytes < 0 ? "n/a" : format_bytes(r.arena_extent_bytes)},
            true);
      }
      out << "\n(The arena as placed: the program's buffers at the executor's offsets; the predicted peak "
             "counts what the placement could not pack as memory_placement_bytes.)\n";
    }
  }

  auto list = [](const std::vector<int64_t>& v) {
    std::string s;
    for (size_t i = 0; i < v.size() && i < 8; ++i) s += (i ? "," : "") + std::to_string(v[i]);
    return v.size() > 8 ? s + ",... (" + std::to_string(v.size()) + ")" : s;
  };
  section("Ops joined on (rank, id)");
  out << (markdown ? "" : "  ") << c.ops_joined << " joined, " << c.ops_predicted_only
      << " predicted only, " << c.ops_measured_only << " measured only (ranks: predicted "
      << list(c.predicted_ranks) << "; measured " << list(c.measured_ranks)
      << "); ops that take time (alloc and free are not joined); duration = end_s − max(start_s, ready_s)\n";
  if (c.waiting_ops_joined > 0 && c.waiting_ops_measured_ready_at_start == c.waiting_ops_joined) {
    out << (markdown ? "\n" : "  ") << "note: the measurement's ready_s equals start_s on all "
        << c.waiting_ops_joined << " collectives and receives, so its durations include the "
        << "wait for peers that the prediction's leave out\n";
  }
  if (markdown) out << "\n### By kind\n\n";
  group_table(out, c.by_kind, limit, markdown);
  if (markdown) {
    out << "\n### Compute by name\n\n";
    group_table(out, c.by_compute_name, limit, markdown);
  }
  if (!c.by_collective.empty()) {
    section(markdown ? "Collectives by (kind, group, algorithm)" : "collectives");
    group_table(out, c.by_collective, limit, markdown);
  }
  section("Largest contributors (Σ|predicted − measured|)");
  group_table(out, c.contributors, markdown ? limit : 5, markdown);
  section("Ops with the largest |predicted − measured|");
  size_t shown = markdown ? c.top_ops.size() : std::min<size_t>(5, c.top_ops.size());
  size_t width = 2;
  for (size_t i = 0; i < shown; ++i) width = std::max(width, shown_width(c.top_ops[i].label));
  header(out, {"op", "rank", "id", "predicted", "measured", "error"}, markdown, width);
  for (size_t i = 0; i < shown; ++i) {
    const OpCompare& o = c.top_ops[i];
    row(out,
        {o.label, std::to_string(o.rank), std::to_string(o.id), seconds(o.predicted_s),
         seconds(o.measured_s), seconds(o.error_s())},
        markdown, width);
  }
}

}  // namespace

void print_compare_summary(std::ostream& out, const CompareResult& c) {
  out << "stepcast compare: program " << c.program_sha256.substr(0, 12) << ", step time predicted "
      << seconds(c.step_time_s.predicted) << ", measured " << seconds(c.step_time_s.measured)
      << ", error " << percent(c.step_time_s.relative()) << "\n";
  write_report(out, c, false, 8);
}

void write_compare_markdown(std::ostream& out, const CompareResult& c) {
  out << "# stepcast compare\n\nProgram `" << c.program_sha256 << "`; stepcast "
      << stepcast_version() << " (git " << stepcast_git_commit() << "). Errors are predicted − "
      << "measured; relative errors divide by the measured figure.\n\n**Step-time error: "
      << percent(c.step_time_s.relative()) << "**\n";
  write_report(out, c, true, size_t(-1));
}

}  // namespace stepcast
