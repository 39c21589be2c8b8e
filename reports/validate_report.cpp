// validate's per-point figures, the sweep summary, validate.json and report.md; see
// validate_report.hpp. The HTML writer is in validate_html.cpp.
#include "validate_report.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <sstream>

#include "errors.hpp"
#include "plan.hpp"
#include "summary.hpp"
#include "validate_format.hpp"

namespace stepcast {

using validate_format::mib;
using validate_format::percent;
using validate_format::seconds;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

Json optional_json(const std::optional<double>& v) { return v ? Json(*v) : Json(nullptr); }

const char* const kClassKeys[] = {"memory_weights_bytes",     "memory_grads_bytes",
                                  "memory_optimizer_bytes",   "memory_activations_bytes",
                                  "memory_workspace_bytes",   "memory_comm_bytes"};

}  // namespace

const RankMemoryCompare* largest_peak_entry(const CompareResult& c) {
  const RankMemoryCompare* best = nullptr;
  double best_peak = -1;
  for (const RankMemoryCompare& rm : c.memory_ranks) {
    double peak = predicted_bytes(rm, "peak_bytes");
    if (peak > best_peak) {
      best_peak = peak;
      best = &rm;
    }
  }
  return best;
}

double predicted_bytes(const RankMemoryCompare& entry, const std::string& key) {
  for (const CompareFigure& f : entry.classes) {
    if (f.name == key) return f.predicted;
  }
  return 0;
}

std::optional<double> ValidatePoint::measured_step_time_s() const {
  if (measured_step_times_s.empty()) return std::nullopt;
  return median(measured_step_times_s);
}

std::optional<double> ValidatePoint::spread() const {
  auto m = measured_step_time_s();
  if (!m || *m <= 0) return std::nullopt;
  auto [lo, hi] = std::minmax_element(measured_step_times_s.begin(), measured_step_times_s.end());
  return (*hi - *lo) / *m;
}

bool ValidatePoint::flagged() const {
  auto s = spread();
  return s && *s > kValidateSpreadFlag;
}

std::optional<double> ValidatePoint::step_time_error() const {
  auto m = measured_step_time_s();
  if (!ok() || !m || !predicted_step_time_s || *m <= 0) return std::nullopt;
  return (*predicted_step_time_s - *m) / *m;
}

std::optional<double> ValidatePoint::memory_error() const {
  if (!ok() || !compare || !compare->measured_peak_max) return std::nullopt;
  return compare->measured_peak_max->relative();
}

std::optional<double> KindErrorSum::relative() const {
  if (measured_s == 0) return std::nullopt;
  return (predicted_s - measured_s) / measured_s;
}

ValidatePoint evaluate_point(const SweepPoint& point, const StepResult& prediction,
                             const std::string& prediction_file,
                             const std::vector<StepResult>& measurements,
                             const std::vector<std::string>& measurement_files) {
  STEPCAST_CHECK(!measurements.empty() && measurements.size() == measurement_files.size(),
                 "evaluate_point needs one file name per measurement, and at least one");
  ValidatePoint p;
  p.name = point.name;
  p.ranks = point.ranks;
  p.steps = point.steps;
  p.plan = plan_to_json(point.plan);
  p.predicted_step_time_s = prediction.step_time_s;
  for (const StepResult& m : measurements) p.measured_step_times_s.push_back(m.step_time_s);
  // The repeat at the (lower) median is the one compared op by op.
  std::vector<size_t> order(measurements.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return measurements[a].step_time_s < measurements[b].step_time_s;
  });
  p.compared_repeat = int64_t(order[(order.size() - 1) / 2]);
  try {
    for (size_t i = 0; i < measurements.size(); ++i) {
      check_comparable(prediction, measurements[i], prediction_file, measurement_files[i]);
    }
    StepProgram program = program_from_inputs(prediction, prediction_file);
    p.compare = compare_results(prediction, measurements[size_t(p.compared_repeat)], program);
  } catch (const InputError& e) {
    p.failed_stage = "compare";
    p.failure = e.what();
  }
  return p;
}

ValidateSummary summarize_validate(const ValidateReport& report) {
  ValidateSummary s;
  std::vector<double> errors;
  std::map<std::string, KindErrorSum> kinds;
  for (const ValidatePoint& p : report.points) {
    ++s.points;
    if (!p.ok()) {
      ++s.failed;
      continue;
    }
    ++s.ran;
    if (auto m = p.memory_error()) {
      if (!s.max_abs_memory_error || std::abs(*m) > std::abs(s.max_abs_memory_error->value)) {
        s.max_abs_memory_error = PointFigure{p.name, *m};
      }
    }
    if (p.flagged()) {
      ++s.flagged;
    } else if (auto e = p.step_time_error()) {
      errors.push_back(std::abs(*e));
      if (!s.max_abs_step_time_error || std::abs(*e) > std::abs(s.max_abs_step_time_error->value)) {
        s.max_abs_step_time_error = PointFigure{p.name, *e};
      }
    }
    if (!p.compare) continue;
    for (const OpGroupCompare& g : p.compare->by_kind) {
      KindErrorSum& k = kinds[g.kind];
      k.kind = g.kind;
      ++k.points;
      k.count += g.count;
      k.predicted_s += g.predicted_s;
      k.measured_s += g.measured_s;
    }
    double step = p.measured_step_time_s().value_or(0);
    for (const OpCompare& o : p.compare->top_ops) {
      s.worst_ops.push_back({p.name, o, step > 0 ? std::abs(o.error_s()) / step : 0});
    }
  }
  if (!errors.empty()) s.median_abs_step_time_error = median(errors);
  for (const auto& [name, k] : kinds) s.by_kind.push_back(k);
  std::stable_sort(s.by_kind.begin(), s.by_kind.end(),
                   [](const KindErrorSum& a, const KindErrorSum& b) { return a.measured_s > b.measured_s; });
  std::stable_sort(s.worst_ops.begin(), s.worst_ops.end(), [](const PointOp& a, const PointOp& b) {
    return a.share_of_step > b.share_of_step;
  });
  if (s.worst_ops.size() > kValidateWorstOps) s.worst_ops.resize(kValidateWorstOps);
  return s;
}

std::string describe_plan(const Json& plan) {
  std::ostringstream out;
  auto num = [&](const char* key) { return plan.value(key, Json()).dump(); };
  auto str = [&](const char* key) { return plan.value(key, std::string("?")); };
  out << "tp " << num("tp_size") << " · pp " << num("pp_size") << " · dp " << num("dp_size")
      << ", ZeRO " << num("zero_stage") << ", " << str("schedule");
  if (plan.value("virtual_pp_size", 1) > 1) out << " (vpp " << num("virtual_pp_size") << ")";
  out << ", micro batch " << num("micro_batch_size") << " of " << num("global_batch_size")
      << ", recompute " << str("recompute");
  if (plan.value("sequence_parallel", false)) out << ", sequence parallel";
  return out.str();
}

std::string describe_profile(const ValidateReport& r) {
  if (r.profile_source == "roofline") {
    return "none: the roofline on the topology's datasheet peaks (" + r.profile_name + ")";
  }
  return r.profile_file + " (" + r.profile_name + "; " +
         (r.profile_source == "file" ? "given" : "measured by this validate, " + r.profile_source) +
         ")";
}

std::string describe_point_result(const ValidatePoint& p) {
  std::ostringstream out;
  if (!p.ok()) {
    std::string first_line = p.failure.substr(0, p.failure.find('\n'));
    out << "FAILED at " << p.failed_stage << ": " << first_line;
    return out.str();
  }
  out << "predicted " << seconds(p.predicted_step_time_s) << ", measured "
      << seconds(p.measured_step_time_s()) << " (" << p.measured_step_times_s.size()
      << (p.measured_step_times_s.size() == 1 ? " repeat" : " repeats") << ", spread "
      << percent(p.spread(), false) << (p.flagged() ? ", FLAGGED: noisy" : "") << "), error "
      << percent(p.step_time_error()) << ", memory error " << percent(p.memory_error());
  return out.str();
}

// ---- validate.json ----------------------------------------------------------------------------

namespace {

Json point_json(const ValidatePoint& p) {
  Json j = {{"name", p.name},
            {"ranks", p.ranks},
            {"steps", p.steps},
            {"plan", p.plan},
            {"dir", p.dir},
            {"status", p.ok() ? "ok" : "failed"},
            {"predicted_step_time_s", optional_json(p.predicted_step_time_s)},
            {"measured_step_times_s", p.measured_step_times_s},
            {"measured_step_time_s", optional_json(p.measured_step_time_s())},
            {"spread", optional_json(p.spread())},
            {"flagged", p.flagged()},
            {"step_time_error", optional_json(p.step_time_error())},
            {"memory_error", optional_json(p.memory_error())},
            {"wall_s", p.wall_s}};
  if (!p.ok()) j["failure"] = {{"stage", p.failed_stage}, {"message", p.failure}};
  if (p.compare) {
    j["compared_repeat"] = p.compared_repeat + 1;
    Json c = compare_to_json(*p.compare);
    c.erase("inputs");  // the point's plan is above; the rest is in its compare.json
    j["compare"] = c;
  }
  return j;
}

}  // namespace

Json validate_to_json(const ValidateReport& r) {
  ValidateSummary s = summarize_validate(r);
  auto figure = [](const std::optional<PointFigure>& f) {
    return f ? Json{{"point", f->point}, {"value", f->value}} : Json(nullptr);
  };
  Json kinds = Json::array();
  for (const KindErrorSum& k : s.by_kind) {
    kinds.push_back({{"kind", k.kind},
                     {"points", k.points},
                     {"count", k.count},
                     {"predicted_s", k.predicted_s},
                     {"measured_s", k.measured_s},
                     {"relative_error", optional_json(k.relative())}});
  }
  Json worst = Json::array();
  for (const PointOp& o : s.worst_ops) {
    worst.push_back({{"point", o.point},
                     {"rank", o.op.rank},
                     {"id", o.op.id},
                     {"label", o.op.label},
                     {"predicted_s", o.op.predicted_s},
                     {"measured_s", o.op.measured_s},
                     {"error_s", o.op.error_s()},
                     {"share_of_step", o.share_of_step}});
  }
  Json points = Json::array();
  for (const ValidatePoint& p : r.points) points.push_back(point_json(p));
  return {{"schema_version", 1},
          {"command", "validate"},
          {"stepcast_version", r.stepcast_version},
          {"git_commit", r.git_commit},
          {"date_utc", r.date_utc},
          {"command_line", r.command_line},
          {"machine", {{"hostname", r.machine.hostname},
                       {"cpu_model", r.machine.cpu_model},
                       {"cores", r.machine.cores}}},
          {"sweep", {{"name", r.sweep_name},
                     {"file", r.sweep_file},
                     {"notes", r.sweep_notes},
                     {"topology_file", r.topology_file}}},
          {"profile", {{"source", r.profile_source},
                       {"file", r.profile_file},
                       {"name", r.profile_name},
                       {"warnings", r.profile_warnings}}},
          {"repeats", r.repeats},
          {"spread_flag_threshold", kValidateSpreadFlag},
          {"definitions",
           {{"measured_step_time_s", "median of the repeats' step times (each the median of its "
                                     "timed steps)"},
            {"spread", "(max - min) / median of the repeats' step times"},
            {"step_time_error", "(predicted - measured) / measured"},
            {"memory_error", "(predicted peak_bytes - memory_runtime_bytes - measured peak) "
                             "/ measured, as compare"}}},
          {"summary", {{"points", s.points},
                       {"ran", s.ran},
                       {"failed", s.failed},
                       {"flagged", s.flagged},
                       {"median_abs_step_time_error", optional_json(s.median_abs_step_time_error)},
                       {"max_abs_step_time_error", figure(s.max_abs_step_time_error)},
                       {"max_abs_memory_error", figure(s.max_abs_memory_error)}}},
          {"by_kind", kinds},
          {"worst_ops", worst},
          {"points", points},
          {"wall_s", r.wall_s}};
}

// ---- report.md --------------------------------------------------------------------------------

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

  out << "\n## Points\n\n";
  md_header(out, {"point", "ranks", "plan", "predicted", "measured", "runs", "spread", "error",
                  "memory error", "flag"});
  for (const ValidatePoint& p : r.points) {
    std::string flag = !p.ok() ? "FAILED (" + p.failed_stage + ")" : p.flagged() ? "noisy" : "";
    md_row(out, {p.name, std::to_string(p.ranks), describe_plan(p.plan),
                 seconds(p.predicted_step_time_s), seconds(p.measured_step_time_s()),
                 std::to_string(p.measured_step_times_s.size()), percent(p.spread(), false),
                 percent(p.step_time_error()), percent(p.memory_error()), flag});
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
         "(`compared_repeat` in validate.json).\n";

  out << "\n## Memory (rank with the largest predicted peak)\n\n";
  md_header(out, {"point", "weights", "grads", "optimizer", "activations", "workspace", "comm",
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
