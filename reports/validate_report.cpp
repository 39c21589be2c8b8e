// validate's per-point figures, the sweep summary and the one-line descriptions of a plan, a
// profile and a point; see validate_report.hpp. The writers: validate_json.cpp (validate.json),
// validate_markdown.cpp (report.md), validate_html.cpp (report.html).
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
#include "units.hpp"

namespace stepcast {

using validate_format::mib;
using validate_format::percent;
using validate_format::seconds;

namespace {

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

bool ValidatePoint::noisy() const {
  auto s = spread();
  return s && *s > kValidateSpreadFlag;
}

bool ValidatePoint::drifted() const { return machine_speed && std::abs(*machine_speed - 1) > kValidateDriftFlag; }

bool ValidatePoint::flagged() const { return noisy() || drifted(); }

std::string ValidatePoint::flag() const {
  if (!ok()) return "FAILED (" + failed_stage + ")";
  std::string text = noisy() ? "noisy" : "";
  if (drifted()) text += (text.empty() ? "machine " : ", machine ") + percent(*machine_speed - 1);
  return text;
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
  for (const StepResult& m : measurements) {
    p.measured_step_times_s.push_back(m.step_time_s);
    if (!m.ops.empty()) p.measured_exposed_comm_s.push_back(m.breakdown.exposed_comm_s);
  }
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

std::optional<double> exposed_comm_error(const ValidatePoint& p) {
  if (!p.compare || p.compare->step_time_s.predicted <= 0) return std::nullopt;
  for (const CompareFigure& f : p.compare->breakdown_s) {
    if (f.name != "exposed_comm") continue;
    if (f.predicted < kValidateExposedCommFloor * p.compare->step_time_s.predicted) return std::nullopt;
    if (p.measured_exposed_comm_s.empty()) return f.relative();
    const double measured = median(p.measured_exposed_comm_s);
    if (measured <= 0) return std::nullopt;
    return (f.predicted - measured) / measured;
  }
  return std::nullopt;
}

std::string exposed_comm_label() {
  return "exposed communication within " + std::to_string(int(std::lround(kValidateExposedCommBand * 100))) +
         "% (unflagged points with " + std::to_string(int(std::lround(kValidateExposedCommFloor * 100))) +
         "% of the step or more in it)";
}

std::string exposed_comm_count(const ValidateSummary& s) {
  if (s.exposed_comm_points == 0) return "n/a";
  return std::to_string(s.exposed_comm_within_band) + " of " + std::to_string(s.exposed_comm_points);
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
    if (auto e = exposed_comm_error(p); e && !p.flagged()) {
      ++s.exposed_comm_points;
      if (std::abs(*e) <= kValidateExposedCommBand) ++s.exposed_comm_within_band;
      if (!s.max_abs_exposed_comm_error || std::abs(*e) > std::abs(s.max_abs_exposed_comm_error->value)) {
        s.max_abs_exposed_comm_error = PointFigure{p.name, *e};
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
  out << "tp " << num("tp_size") << " · pp " << num("pp_size") << " · dp " << num("dp_size");
  if (plan.value("context_parallel_size", 1) > 1) out << " · cp " << num("context_parallel_size");
  if (plan.contains("expert_model_parallel_size")) {
    out << " (ep " << num("expert_model_parallel_size") << " · etp " << num("expert_tensor_parallel_size") << ")";
  }
  out << ", ZeRO " << num("zero_stage") << ", " << str("schedule");
  if (plan.value("virtual_pp_size", 1) > 1) out << " (vpp " << num("virtual_pp_size") << ")";
  out << ", micro batch " << num("micro_batch_size") << " of " << num("global_batch_size")
      << ", recompute " << str("recompute");
  if (plan.value("sequence_parallel", false)) out << ", sequence parallel";
  if (plan.value("moe_routing", std::string("uniform")) != "uniform") {
    out << ", routing " << str("moe_routing");
    if (plan.contains("moe_routing_histogram")) out << " " << str("moe_routing_histogram");
  }
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
      << percent(p.spread(), false) << (p.noisy() ? ", FLAGGED: noisy" : "") << "), error "
      << percent(p.step_time_error()) << ", memory error " << percent(p.memory_error());
  if (p.machine_speed) {
    out << ", machine " << percent(*p.machine_speed - 1) << " against the profile's"
        << (p.drifted() ? " (FLAGGED: the machine drifted)" : "");
  }
  return out.str();
}

}  // namespace stepcast
