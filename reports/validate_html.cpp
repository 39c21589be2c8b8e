// report.html of `stepcast validate`: the Markdown report's tables plus inline SVG charts
// (reports/html.hpp) — predicted against measured step time with a ±5% band, the breakdown per
// point as stacked bars (predicted and measured side by side), memory by class, error by op kind.
// Times in the charts are milliseconds, memory MiB.
#include <algorithm>
#include <cmath>
#include <sstream>

#include "html.hpp"
#include "validate_format.hpp"
#include "validate_report.hpp"

namespace stepcast {

using validate_format::kClassKeys;
using validate_format::kClassNames;
using validate_format::mib;
using validate_format::percent;
using validate_format::seconds;

namespace {

std::string step_time_chart(const ValidateReport& r) {
  std::vector<html::Point> points;
  for (const ValidatePoint& p : r.points) {
    if (!p.ok() || !p.measured_step_time_s() || !p.predicted_step_time_s) continue;
    points.push_back({*p.measured_step_time_s() * 1e3, *p.predicted_step_time_s * 1e3,
                      p.name + (p.flagged() ? " (" + p.flag() + ")" : "")});
  }
  html::ChartOptions o;
  o.title = "Step time: predicted against measured (±5% band)";
  o.x_label = "measured step time (ms, median of runs)";
  o.y_label = "predicted step time (ms)";
  return html::scatter_chart(o, points, kValidateBand);
}

std::string breakdown_chart(const ValidateReport& r) {
  std::vector<std::string> categories;
  std::vector<html::Series> series = {{"compute", {}}, {"exposed comm", {}}, {"bubble", {}},
                                      {"optimizer", {}}};
  for (const ValidatePoint& p : r.points) {
    if (!p.compare) continue;
    for (bool predicted : {true, false}) {
      categories.push_back(p.name + (predicted ? " pred" : " meas"));
      for (size_t i = 0; i < series.size() && i < p.compare->breakdown_s.size(); ++i) {
        const CompareFigure& f = p.compare->breakdown_s[i];
        series[i].values.push_back((predicted ? f.predicted : f.measured) * 1e3);
      }
    }
  }
  html::ChartOptions o;
  o.title = "Breakdown of the critical rank's step (predicted | measured)";
  o.y_label = "ms";
  o.width_px = std::clamp(int(categories.size()) * 40 + 160, 640, 1160);  // the page is 1200 px
  return html::stacked_bars(o, categories, series);
}

std::string memory_chart(const ValidateReport& r) {
  std::vector<std::string> categories;
  std::vector<html::Series> series;
  for (const char* name : kClassNames) series.push_back({name, {}});
  series.push_back({"measured", {}});
  for (const ValidatePoint& p : r.points) {
    if (!p.compare || !p.compare->measured_peak_max) continue;
    const RankMemoryCompare* rm = largest_peak_entry(*p.compare);
    if (!rm) continue;
    categories.push_back(p.name + " pred");
    for (size_t i = 0; i < std::size(kClassKeys); ++i) {
      series[i].values.push_back(predicted_bytes(*rm, kClassKeys[i]) / 1048576.0);
    }
    series.back().values.push_back(0);
    categories.push_back(p.name + " meas");
    for (size_t i = 0; i < std::size(kClassKeys); ++i) series[i].values.push_back(0);
    series.back().values.push_back(p.compare->measured_peak_max->measured_peak_bytes / 1048576.0);
  }
  html::ChartOptions o;
  o.title = "Memory at the peak: predicted by class | measured";
  o.y_label = "MiB";
  o.width_px = std::clamp(int(categories.size()) * 40 + 160, 640, 1160);  // the page is 1200 px
  return html::stacked_bars(o, categories, series);
}

std::string kind_chart(const ValidateSummary& s) {
  std::vector<std::string> categories;
  html::Series predicted{"predicted", {}}, measured{"measured", {}};
  for (const KindErrorSum& k : s.by_kind) {
    categories.push_back(k.kind);
    predicted.values.push_back(k.predicted_s * 1e3);
    measured.values.push_back(k.measured_s * 1e3);
  }
  html::ChartOptions o;
  o.title = "Time by op kind, summed over points and ranks";
  o.y_label = "ms";
  std::string out = html::grouped_bars(o, categories, {predicted, measured});
  html::Series error{"error (%)", {}};
  for (const KindErrorSum& k : s.by_kind) {
    auto e = k.relative();
    error.values.push_back(e ? *e * 100 : std::nan(""));
  }
  html::ChartOptions e;
  e.title = "Error by op kind: (predicted − measured) / measured";
  e.y_label = "%";
  return out + html::grouped_bars(e, categories, {error});
}

}  // namespace

void write_validate_html(std::ostream& out, const ValidateReport& r) {
  ValidateSummary s = summarize_validate(r);
  std::ostringstream body;
  if (!r.sweep_notes.empty()) body << html::paragraph(r.sweep_notes);
  body << html::table(
      {"", "this validate"},
      {{"machine", r.machine.hostname + " (" + r.machine.cpu_model + ", " +
                       std::to_string(r.machine.cores) + " cores)"},
       {"stepcast", r.stepcast_version + ", git commit " + r.git_commit},
       {"date", r.date_utc},
       {"sweep", r.sweep_file + " (topology " + r.topology_file + ")"},
       {"profile", describe_profile(r)},
       {"runs per point", std::to_string(r.repeats)},
       {"launch", "scripts/mpirun --bind-to core (one rank per core, one BLAS thread)"},
       {"wall time", seconds(r.wall_s)},
       {"command", r.command_line}});
  for (const std::string& w : r.profile_warnings) {
    body << html::paragraph("Warning: the profile was measured on another machine type: " + w);
  }
  body << html::paragraph(
      "Measured = median of the runs' step times; spread = (max − min) / median of them, flagged "
      "above " + percent(kValidateSpreadFlag, false) + "; machine = the speed of a fixed GEMM around the point's runs " +
      (r.machine_reference_gflops > 0 ? "against its speed " + r.machine_reference_when : std::string("(not timed)")) +
      ", flagged beyond ±" + percent(kValidateDriftFlag, false) +
      "; errors are (predicted − measured) / measured. Memory: the measured process peak "
      "(anonymous pages) against the predicted program buffers at the peak, as stepcast compare.");

  body << html::heading("Summary");
  body << html::table(
      {"figure", "value", "point"},
      {{"points (ran, failed, flagged)", std::to_string(s.points) + " (" + std::to_string(s.ran) +
                                             ", " + std::to_string(s.failed) + ", " +
                                             std::to_string(s.flagged) + ")",
        ""},
       {"median |step-time error| (unflagged)", percent(s.median_abs_step_time_error, false), ""},
       {"largest step-time error (unflagged)",
        s.max_abs_step_time_error ? percent(s.max_abs_step_time_error->value) : "n/a",
        s.max_abs_step_time_error ? s.max_abs_step_time_error->point : ""},
       {"largest peak-memory error",
        s.max_abs_memory_error ? percent(s.max_abs_memory_error->value) : "n/a",
        s.max_abs_memory_error ? s.max_abs_memory_error->point : ""},
       {exposed_comm_label(), exposed_comm_count(s), ""},
       {"largest exposed-communication error (those points)",
        s.max_abs_exposed_comm_error ? percent(s.max_abs_exposed_comm_error->value) : "n/a",
        s.max_abs_exposed_comm_error ? s.max_abs_exposed_comm_error->point : ""}});

  body << html::heading("Points");
  std::vector<std::vector<std::string>> rows;
  for (const ValidatePoint& p : r.points) {
    rows.push_back({p.name, std::to_string(p.ranks), describe_plan(p.plan),
                    seconds(p.predicted_step_time_s), seconds(p.measured_step_time_s()),
                    std::to_string(p.measured_step_times_s.size()), percent(p.spread(), false),
                    p.machine_speed ? percent(*p.machine_speed - 1) : "n/a", percent(p.step_time_error()),
                    percent(p.memory_error()), p.flag()});
  }
  body << html::table({"point", "ranks", "plan", "predicted", "measured", "runs", "spread", "machine", "error",
                       "memory error", "flag"},
                      rows);
  if (s.failed > 0) {
    rows.clear();
    for (const ValidatePoint& p : r.points) {
      if (!p.ok()) rows.push_back({p.name, p.failed_stage, p.failure});
    }
    body << html::heading("Failed points", 3) << html::table({"point", "stage", "message"}, rows);
  }
  body << step_time_chart(r);

  body << html::heading("Breakdown (critical rank)") << breakdown_chart(r);
  body << html::heading("Memory (rank with the largest predicted peak)") << memory_chart(r);
  rows.clear();
  for (const ValidatePoint& p : r.points) {
    if (!p.compare || !p.compare->measured_peak_max) continue;
    rows.push_back({p.name, mib(p.compare->measured_peak_max->predicted_arena_peak_bytes),
                    mib(p.compare->measured_peak_max->measured_peak_bytes),
                    percent(p.memory_error())});
  }
  body << html::table({"point", "predicted peak − runtime", "measured peak", "error"},
                      rows);

  body << html::heading("Error by op kind") << kind_chart(s);
  rows.clear();
  for (const KindErrorSum& k : s.by_kind) {
    rows.push_back({k.kind, std::to_string(k.points), std::to_string(k.count),
                    seconds(k.predicted_s), seconds(k.measured_s), percent(k.relative())});
  }
  body << html::table({"kind", "points", "ops", "predicted", "measured", "error"}, rows);

  body << html::heading("Worst ops");
  rows.clear();
  for (const PointOp& o : s.worst_ops) {
    rows.push_back({o.point, o.op.label, std::to_string(o.op.rank), std::to_string(o.op.id),
                    seconds(o.op.predicted_s), seconds(o.op.measured_s), seconds(o.op.error_s()),
                    percent(o.share_of_step, false)});
  }
  body << html::table({"point", "op", "rank", "id", "predicted", "measured", "error", "of step"},
                      rows);
  const std::string title = "stepcast validate: " + r.sweep_name;
  out << html::page(title, html::heading(title, 1) + body.str());
}

}  // namespace stepcast
