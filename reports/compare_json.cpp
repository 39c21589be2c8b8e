// compare.json: the CompareResult as data, every figure with its unit in its key; see
// compare.hpp.
#include "compare.hpp"

#include "compare_fields.hpp"
#include "version.hpp"

namespace stepcast {

using namespace compare_detail;

namespace {

Json optional_json(const std::optional<double>& v) { return v ? Json(*v) : Json(nullptr); }

Json figure_json(const CompareFigure& f, const char* unit) {
  return {{"predicted" + std::string(unit), f.predicted},
          {"measured" + std::string(unit), f.measured},
          {"error" + std::string(unit), f.error()},
          {"relative_error", optional_json(f.relative())}};
}

Json peak_json(const MeasuredPeakCompare& p) {
  Json j = {{"predicted_arena_peak_bytes", p.predicted_arena_peak_bytes},
            {"measured_peak_bytes", p.measured_peak_bytes},
            {"error_bytes", p.error_bytes()},
            {"relative_error", optional_json(p.relative())}};
  if (p.rank >= 0) j["rank"] = p.rank;
  if (p.arena_extent_bytes >= 0) j["arena_extent_bytes"] = p.arena_extent_bytes;
  return j;
}

Json groups_json(const std::vector<OpGroupCompare>& groups) {
  Json out = Json::array();
  for (const OpGroupCompare& g : groups) {
    Json j = {{"kind", g.kind},
              {"label", g.label()},
              {"count", g.count},
              {"predicted_s", g.predicted_s},
              {"measured_s", g.measured_s},
              {"error_s", g.error_s()},
              {"relative_error", optional_json(g.relative())},
              {"abs_gap_s", g.abs_gap_s}};
    if (!g.name.empty()) j["name"] = g.name;
    if (!g.group.empty()) j["group"] = g.group;
    if (!g.algorithm.empty()) j["algorithm"] = g.algorithm;
    out.push_back(j);
  }
  return out;
}

}  // namespace

Json compare_to_json(const CompareResult& c) {
  Json breakdown = Json::object();
  for (const CompareFigure& f : c.breakdown_s) {
    Json j = figure_json(f, "_s");
    j["error_relative_to_measured_step"] = optional_json(ratio(f.error(), c.step_time_s.measured));
    breakdown[f.name] = j;
  }
  Json ranks = Json::array();
  for (const RankMemoryCompare& rm : c.memory_ranks) {
    Json classes = Json::object();
    for (const CompareFigure& f : rm.classes) classes[f.name] = figure_json(f, "_bytes");
    Json ranges = Json::array();
    for (auto [lo, hi] : rm.ranks) ranges.push_back({lo, hi});
    ranks.push_back(
        {{"rank", rm.rank}, {"ranks", ranges}, {"stage", rm.stage}, {"classes", classes}});
  }
  Json memory = {{"ranks", ranks}, {"peak_bytes_max", figure_json(c.peak_bytes_max, "_bytes")}};
  if (c.measured_peak_max) {
    Json measured = peak_json(*c.measured_peak_max);
    measured["note"] = kMeasuredPeakNote;
    Json per_rank = Json::array();
    for (const auto& r : c.measured_peak_ranks) per_rank.push_back(peak_json(r));
    measured["ranks"] = per_rank;
    memory["measured_peak"] = measured;
  }
  Json top = Json::array();
  for (const OpCompare& o : c.top_ops) {
    top.push_back({{"rank", o.rank},
                   {"id", o.id},
                   {"label", o.label},
                   {"predicted_s", o.predicted_s},
                   {"measured_s", o.measured_s},
                   {"error_s", o.error_s()}});
  }
  Json ops = {
      {"duration", "end_s - max(start_s, ready_s); ops that take time: alloc and free are neither joined nor aggregated"},
      {"predicted_ranks", c.predicted_ranks},
      {"measured_ranks", c.measured_ranks},
      {"joined", c.ops_joined},
      {"waiting_ops_joined", c.waiting_ops_joined},
      {"waiting_ops_measured_ready_at_start", c.waiting_ops_measured_ready_at_start},
      {"predicted_only", c.ops_predicted_only},
      {"measured_only", c.ops_measured_only},
      {"by_kind", groups_json(c.by_kind)},
      {"by_compute_name", groups_json(c.by_compute_name)},
      {"by_collective", groups_json(c.by_collective)},
      {"contributors", groups_json(c.contributors)},
      {"top_ops", top}};
  return {{"schema_version", 1},
          {"command", "compare"},
          {"stepcast_version", stepcast_version()},
          {"git_commit", stepcast_git_commit()},
          {"program_sha256", c.program_sha256},
          {"step_time_error", optional_json(c.step_time_s.relative())},
          {"step_time_s", figure_json(c.step_time_s, "_s")},
          {"critical_rank",
           {{"predicted", c.predicted_critical_rank}, {"measured", c.measured_critical_rank}}},
          {"breakdown_s", breakdown},
          {"memory", memory},
          {"ops", ops},
          {"inputs", c.inputs}};
}

}  // namespace stepcast
