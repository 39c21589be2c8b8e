// validate.json: a validate report as data, each point with its compare; see validate_report.hpp.
#include "validate_report.hpp"

namespace stepcast {

namespace {

Json optional_json(const std::optional<double>& v) { return v ? Json(*v) : Json(nullptr); }

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
            {"measured_exposed_comm_s", p.measured_exposed_comm_s},
            {"exposed_comm_error", optional_json(exposed_comm_error(p))},
            {"spread", optional_json(p.spread())},
            {"machine_speed", optional_json(p.machine_speed)},
            {"machine_speeds",
             p.machine_speed_gemm && p.machine_speed_softmax
                 ? Json{{"gemm", *p.machine_speed_gemm}, {"softmax", *p.machine_speed_softmax}}
                 : Json(nullptr)},
            {"flagged", p.flagged()},
            {"flag", p.flag()},
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
          {"machine_reference",
           r.machine_reference_gflops > 0
               ? Json{{"canary_gflops", r.machine_reference_gflops},
                      {"canary_softmax_gbps", r.machine_reference_softmax_gbps},
                      {"when", r.machine_reference_when}}
               : Json(nullptr)},
          {"repeats", r.repeats},
          {"spread_flag_threshold", kValidateSpreadFlag},
          {"drift_flag_threshold", kValidateDriftFlag},
          {"definitions",
           {{"measured_step_time_s", "median of the repeats' step times (each the median of its "
                                     "timed steps)"},
            {"spread", "(max - min) / median of the repeats' step times"},
            {"machine_speed", "of the two canaries (a GEMM, a softmax), the one further from 1: "
                              "its rate around the point's runs (mean of before and after) over its rate "
                              "at machine_reference; flagged beyond 1 +- drift_flag_threshold"},
            {"step_time_error", "(predicted - measured) / measured"},
            {"memory_error", "(predicted peak_bytes - memory_runtime_bytes - measured peak) "
                             "/ measured, as compare"}}},
          {"summary", {{"points", s.points},
                       {"ran", s.ran},
                       {"failed", s.failed},
                       {"flagged", s.flagged},
                       {"median_abs_step_time_error", optional_json(s.median_abs_step_time_error)},
                       {"max_abs_step_time_error", figure(s.max_abs_step_time_error)},
                       {"max_abs_memory_error", figure(s.max_abs_memory_error)},
                       {"exposed_comm_points", s.exposed_comm_points},
                       {"exposed_comm_within_band", s.exposed_comm_within_band},
                       {"max_abs_exposed_comm_error", figure(s.max_abs_exposed_comm_error)}}},
          {"by_kind", kinds},
          {"worst_ops", worst},
          {"points", points},
          {"wall_s", r.wall_s}};
}

}  // namespace stepcast
