// The published report as data: its means, and published.json; see published_report.hpp.
#include "published_report.hpp"

#include <cmath>
#include <iomanip>
#include <sstream>

#include "version.hpp"

namespace stepcast::cli {

std::string fixed_or_na(double v, int digits) {
  if (!std::isfinite(v)) return "n/a";
  std::ostringstream out;
  out << std::fixed << std::setprecision(digits) << v;
  return out.str();
}

std::string signed_percent(double fraction) {
  if (!std::isfinite(fraction)) return "n/a";
  std::ostringstream out;
  out << std::showpos << std::fixed << std::setprecision(1) << 100 * fraction << "%";
  return out.str();
}

double PublishedReport::megatron_mean() const {
  std::vector<double> e;
  for (const auto& r : megatron) {
    if (r.ok) e.push_back(r.error());
  }
  return mean_absolute(e);
}

double PublishedReport::nccl_mean() const {
  std::vector<double> e;
  for (const auto& r : nccl) {
    if (r.row->excluded.empty()) e.push_back(r.error());
  }
  return mean_absolute(e);
}

double PublishedReport::overall_mean() const {
  std::vector<double> e;
  for (const auto& r : megatron) {
    if (r.ok) e.push_back(r.error());
  }
  for (const auto& r : nccl) {
    if (r.row->excluded.empty()) e.push_back(r.error());
  }
  return mean_absolute(e);
}

Json published_report_json(const PublishedReport& report) {
  Json out;
  out["schema_version"] = 1;
  out["command"] = "validate --sweep published";
  out["stepcast_version"] = stepcast_version();
  out["git_commit"] = stepcast_git_commit();
  out["created_utc"] = report.created_utc;
  out["machine"] = {{"hostname", report.machine.hostname},
                    {"cpu_model", report.machine.cpu_model},
                    {"cores", report.machine.cores}};
  out["source"] = "data/published.json (each row names its published source)";
  out["profiles"] = report.profiles;
  out["error_definition"] = "(predicted - published) / published; means of absolute values";
  out["megatron_plan_rule"] = megatron_plan_rule();
  Json rows = Json::array();
  for (const auto& r : report.megatron) {
    const MegatronRow& row = *r.row;
    Json j = {{"name", row.name},
              {"params_billion", row.params_billion},
              {"heads", row.heads},
              {"hidden", row.hidden},
              {"layers", row.layers},
              {"tp", row.tp},
              {"pp", row.pp},
              {"dp", row.dp()},
              {"gpus", row.gpus},
              {"nodes", r.nodes},
              {"batch", row.batch},
              {"plan", megatron_plan_json(row)},
              {"flops_per_iteration", megatron_iteration_flops(row)},
              {"published",
               {{"tflops_per_gpu", row.published_tflops_per_gpu},
                {"iteration_time_s", r.published_time_s()}}},
              {"ok", r.ok},
              {"simulation_wall_s", r.wall_s}};
    if (r.ok) {
      j["predicted"] = {{"tflops_per_gpu", r.tflops_per_gpu},
                        {"iteration_time_s", r.step_time_s},
                        {"breakdown_s", r.breakdown},
                        {"mfu", r.mfu},
                        {"fits", r.fits},
                        {"peak_bytes_max", r.peak_bytes_max}};
      j["error"] = r.error();
      j["iteration_time_error"] = r.time_error();
    } else {
      j["failure"] = r.failure;
    }
    rows.push_back(j);
  }
  out["megatron"] = rows;
  out["megatron_mean_abs_error"] = report.megatron_mean();
  Json nccl = Json::array();
  for (const auto& r : report.nccl) {
    const NcclRow& row = *r.row;
    Json j = {{"name", row.name},
              {"system", row.system},
              {"source", row.source},
              {"topology", "topologies/" + row.topology + ".json"},
              {"profile", r.profile_file},
              {"nodes", row.nodes},
              {"gpus", row.nodes * (row.devices_per_node > 0 ? row.devices_per_node : 8)},
              {"bytes", row.bytes},
              {"bytes_note", row.bytes_note},
              {"published_busbw_bytes_per_s", row.published_busbw_bytes_per_s},
              {"predicted",
               {{"algorithm", r.predicted.algorithm},
                {"time_s", r.predicted.time_s},
                {"algbw_bytes_per_s", r.predicted.algbw_bytes_per_s},
                {"busbw_bytes_per_s", r.predicted.busbw_bytes_per_s}}},
              {"error", r.error()},
              {"in_mean", row.excluded.empty()}};
    if (!row.excluded.empty()) j["excluded"] = row.excluded;
    nccl.push_back(j);
  }
  out["nccl"] = nccl;
  out["nccl_mean_abs_error"] = report.nccl_mean();
  Json sections = Json::array();
  for (const ComponentSection& c : report.components) {
    Json summary = Json::object();
    for (const auto& [family, s] : c.summary()) {
      summary[family] = {{"points", s.points}, {"median_abs_error", s.median_abs_error},
                         {"largest_abs_error", s.largest_abs_error}};
    }
    Json points = Json::array();
    for (const ComponentCheck& k : c.checks) {
      points.push_back({{"family", k.family}, {"what", k.what}, {"source", k.source}, {"method", k.method},
                        {"measured_s", k.measured_s}, {"predicted_s", k.predicted_s},
                        {"error", k.relative_error()}});
    }
    sections.push_back({{"profile", c.profile_file}, {"topology", c.topology_file}, {"summary", summary},
                        {"points", points}});
  }
  out["components"] = sections;
  if (!report.baseline_file.empty()) out["baseline"] = report.baseline_file;
  out["mean_abs_error"] = report.overall_mean();
  out["wall_s"] = report.wall_s;
  // JSON has no NaN: a mean over no rows is null.
  for (const char* key : {"megatron_mean_abs_error", "nccl_mean_abs_error", "mean_abs_error"}) {
    if (!std::isfinite(out[key].get<double>())) out[key] = nullptr;
  }
  return out;
}

}  // namespace stepcast::cli
