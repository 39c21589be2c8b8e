// report.md: a validate report for reading, summary first, then a section per point; see
// validate_report.hpp.
#include "validate_report.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "summary.hpp"
#include "validate_format.hpp"

namespace stepcast {

using validate_format::kClassKeys;
using validate_format::mib;
using validate_format::percent;
using validate_format::seconds;

namespace {

void md_row(std::ostream& out, const std::vector<std::string>& cells) {
  out << "|";
  for (const std::string& c : cells) {
    std::string cell = c;
    for (size_t i = 0; (i = cell.find('|', i)) != std::string::npos; i += 2) cell.replace(i, 1, "\\|");
    for (char& ch : cell) {
      if (ch == '\n') ch = ' ';
    }
    out << " " << cell << " |";
  }
  out << "\n";
}

void md_header(std::ostream& out, const std::vector<std::string>& cells) {
  md_row(out, cells);
  md_row(out, std::vector<std::string>(cells.size(), "---"));
}

}  // namespace

void write_validate_markdown(std::ostream& out, const ValidateReport& r) {
  ValidateSummary s = summarize_validate(r);
  out << "# stepcast validate: " << r.sweep_name << "\n\n";
  if (!r.sweep_notes.empty()) out << r.sweep_notes << "\n\n";
  out << "- machine: " << r.machine.hostname << " (" << r.machine.cpu_model << ", "
      << r.machine.cores << " cores)\n"
      << "- stepcast " << r.stepcast_version << ", git commit `" << r.git_commit << "`\n"
      << "- date: " << r.date_utc << "\n"
      << "- sweep: `" << r.sweep_file << "`, topology `" << r.topology_file << "`\n"
      << "- profile: " << describe_profile(r) << "\n";
  for (const std::string& w : r.profile_warnings) {
    out << "- **warning**: the profile was measured on another machine type: " << w << "\n";
  }
  out << "- " << r.repeats << (r.repeats == 1 ? " run" : " runs")
      << " per point under `scripts/mpirun --bind-to core` (one rank per core, one BLAS thread); "
         "wall time "
      << seconds(r.wall_s) << "\n"
      << "- command: `" << r.command_line << "`\n\n"
      << "Measured = median of the runs' step times; spread = (max − min) / median of them, "
         "flagged above "
      << percent(kValidateSpreadFlag, false)
      << "; machine = the speed of a fixed GEMM around the point's runs against "
      << (r.machine_reference_gflops > 0 ? "its speed " + r.machine_reference_when : std::string("(not timed)"))
      << ", flagged beyond ±" << percent(kValidateDriftFlag, false)
      << "; errors are (predicted − measured) / measured. Memory: the measured process "
         "peak (anonymous pages the steps added) against the predicted program buffers at the peak (peak_bytes − "
         "memory_runtime_bytes), as `stepcast compare`.\n\n";

  out << "## Summary\n\n"
      << s.points << " points: " << s.ran << " ran, " << s.failed << " failed, " << s.flagged
      << " flagged.\n\n";
  md_header(out, {"figure", "value", "point"});
  md_row(out, {"median |step-time error| (unflagged)", percent(s.median_abs_step_time_error, false), ""});
  md_row(out, {"largest step-time error (unflagged)",
               s.max_abs_step_time_error ? percent(s.max_abs_step_time_error->value) : "n/a",
               s.max_abs_step_time_error ? s.max_abs_step_time_error->point : ""});
  md_row(out, {"largest peak-memory error",
               s.max_abs_memory_error ? percent(s.max_abs_memory_error->value) : "n/a",
               s.max_abs_memory_error ? s.max_abs_memory_error->point : ""});
  md_row(out, {exposed_comm_label(), exposed_comm_count(s), ""});
  md_row(out, {"largest exposed-communication error (those points)",
               s.max_abs_exposed_comm_error ? percent(s.max_abs_exposed_comm_error->value) : "n/a",
               s.max_abs_exposed_comm_error ? s.max_abs_exposed_comm_error->point : ""});

  out << "\n## Points\n\n";
  md_header(out, {"point", "ranks", "plan", "predicted", "measured", "runs", "spread", "machine", "error",
                  "memory error", "flag"});
  for (const ValidatePoint& p : r.points) {
    md_row(out, {p.name, std::to_string(p.ranks), describe_plan(p.plan),
                 seconds(p.predicted_step_time_s), seconds(p.measured_step_time_s()),
                 std::to_string(p.measured_step_times_s.size()), percent(p.spread(), false),
                 p.machine_speed ? percent(*p.machine_speed - 1) : "n/a", percent(p.step_time_error()),
                 percent(p.memory_error()), p.flag()});
  }
  if (s.failed > 0) {
    out << "\n### Failed points\n\n";
    md_header(out, {"point", "stage", "message"});
    for (const ValidatePoint& p : r.points) {
      if (!p.ok()) md_row(out, {p.name, p.failed_stage, "`" + p.failure + "`"});
    }
  }

  out << "\n## Breakdown (critical rank)\n\n";
  md_header(out, {"point", "side", "compute", "exposed comm", "bubble", "optimizer", "step"});
  for (const ValidatePoint& p : r.points) {
    if (!p.compare) continue;
    for (bool predicted : {true, false}) {
      std::vector<std::string> cells = {p.name, predicted ? "predicted" : "measured"};
      for (const CompareFigure& f : p.compare->breakdown_s) {
        cells.push_back(seconds(predicted ? f.predicted : f.measured));
      }
      cells.push_back(seconds(predicted ? p.compare->step_time_s.predicted
                                        : p.compare->step_time_s.measured));
      md_row(out, cells);
    }
  }
  out << "\nThe measured side is the compared run's: the run at the median step time "
         "(`compared_repeat` in validate.json). The exposed-communication error of the summary is "
         "against the median over every repeat's instrumented step (`measured_exposed_comm_s`).\n";

  out << "\n## Memory (rank with the largest predicted peak)\n\n";
  md_header(out, {"point", "weights", "grads", "optimizer", "activations", "workspace", "comm", "placement",
                  "predicted peak − runtime", "measured peak", "error"});
  for (const ValidatePoint& p : r.points) {
    if (!p.compare) continue;
    const RankMemoryCompare* rm = largest_peak_entry(*p.compare);
    std::vector<std::string> cells = {p.name};
    for (const char* key : kClassKeys) cells.push_back(rm ? mib(predicted_bytes(*rm, key)) : "n/a");
    if (p.compare->measured_peak_max) {
      cells.push_back(mib(p.compare->measured_peak_max->predicted_arena_peak_bytes));
      cells.push_back(mib(p.compare->measured_peak_max->measured_peak_bytes));
    } else {
      cells.insert(cells.end(), {"n/a", "n/a"});
    }
    cells.push_back(percent(p.memory_error()));
    md_row(out, cells);
  }

  out << "\n## Error by op kind (summed over the points that ran)\n\n"
      << "Durations are end_s − max(start_s, ready_s) summed over every rank's ops of the kind "
         "(the wait for a peer left out), from the compared run.\n\n";
  md_header(out, {"kind", "points", "ops", "predicted", "measured", "error"});
  for (const KindErrorSum& k : s.by_kind) {
    md_row(out, {k.kind, std::to_string(k.points), std::to_string(k.count), seconds(k.predicted_s),
                 seconds(k.measured_s), percent(k.relative())});
  }

  out << "\n## Largest contributors per point (Σ|predicted − measured| by op group)\n\n";
  md_header(out, {"point", "ops", "count", "predicted", "measured", "Σ abs(gap)"});
  for (const ValidatePoint& p : r.points) {
    if (!p.compare) continue;
    for (size_t i = 0; i < p.compare->contributors.size() && i < 3; ++i) {
      const OpGroupCompare& g = p.compare->contributors[i];
      md_row(out, {p.name, g.label(), std::to_string(g.count), seconds(g.predicted_s),
                   seconds(g.measured_s), seconds(g.abs_gap_s)});
    }
  }

  out << "\n## Worst ops (|predicted − measured| as a share of the point's measured step)\n\n";
  md_header(out, {"point", "op", "rank", "id", "predicted", "measured", "error", "of step"});
  for (const PointOp& o : s.worst_ops) {
    md_row(out, {o.point, o.op.label, std::to_string(o.op.rank), std::to_string(o.op.id),
                 seconds(o.op.predicted_s), seconds(o.op.measured_s), seconds(o.op.error_s()),
                 percent(o.share_of_step, false)});
  }
}

}  // namespace stepcast
