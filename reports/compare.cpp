// The prediction/measurement join and its three writers; see compare.hpp.
#include "compare.hpp"

#include <algorithm>
#include <limits>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include "errors.hpp"
#include "lower.hpp"
#include "model.hpp"
#include "plan.hpp"
#include "program_json.hpp"
#include "summary.hpp"
#include "topology.hpp"
#include "version.hpp"

namespace stepcast {

namespace {

const char* const kMemoryKeys[] = {"memory_weights_bytes",   "memory_grads_bytes",
                                   "memory_optimizer_bytes", "memory_activations_bytes",
                                   "memory_workspace_bytes", "memory_comm_bytes",
                                   "memory_runtime_bytes",   "peak_bytes"};
const char* const kMeasuredPeakNote =
    "measured_peak_bytes is the process's anonymous memory after the steps (pages the steps "
    "touched stay resident) above its level before the arena was allocated (after a throwaway "
    "warm-up step, so without the runtime allowance): it is compared with peak_bytes - memory_runtime_bytes";

const Json& field(const Json& json, const std::string& key, const std::string& file,
                  const std::string& prefix, bool (Json::*is_type)() const, const char* type) {
  auto it = json.find(key);
  if (it == json.end()) {
    throw_input_error(file, prefix + key, "", "missing from a StepResult",
                      std::string("a ") + type);
  }
  if (!((*it).*is_type)()) {
    throw_input_error(file, prefix + key, it->dump(), "has the wrong type",
                      std::string("a ") + type);
  }
  return *it;
}

double number(const Json& json, const std::string& key, const std::string& file,
              const std::string& prefix = "") {
  return field(json, key, file, prefix, &Json::is_number, "number").get<double>();
}

int64_t integer(const Json& json, const std::string& key, const std::string& file,
                const std::string& prefix = "") {
  return field(json, key, file, prefix, &Json::is_number_integer, "integer").get<int64_t>();
}

// Leaves of a JSON object by dotted path; arrays are leaves.
void flatten(const Json& json, const std::string& path, std::map<std::string, Json>& out) {
  if (!json.is_object()) {
    out[path] = json;
    return;
  }
  for (auto it = json.begin(); it != json.end(); ++it)
    flatten(it.value(), path + "." + it.key(), out);
}

std::string version_of(const StepResult& r) {
  return r.extra.value("stepcast_version", std::string("?")) + " (git " +
         r.extra.value("git_commit", std::string("?")) + ")";
}

std::optional<double> ratio(double error, double measured) {
  if (measured == 0) return std::nullopt;
  return error / measured;
}

Json optional_json(const std::optional<double>& v) { return v ? Json(*v) : Json(nullptr); }

const Json* memory_entry_of_rank(const Json& ranks, int64_t rank) {
  for (const Json& entry : ranks) {
    for (const Json& range : entry.at("ranks")) {
      if (range.at(0).get<int64_t>() <= rank && rank <= range.at(1).get<int64_t>()) return &entry;
    }
  }
  return nullptr;
}

void add_to_group(std::map<std::string, OpGroupCompare>& groups, OpGroupCompare key,
                  double predicted_s, double measured_s) {
  auto [it, inserted] = groups.try_emplace(key.label(), std::move(key));
  OpGroupCompare& g = it->second;
  ++g.count;
  g.predicted_s += predicted_s;
  g.measured_s += measured_s;
  g.abs_gap_s += std::abs(predicted_s - measured_s);
}

std::vector<OpGroupCompare> sorted_groups(const std::map<std::string, OpGroupCompare>& groups,
                                          bool by_gap) {
  std::vector<OpGroupCompare> out;
  for (const auto& [label, g] : groups) out.push_back(g);
  std::stable_sort(out.begin(), out.end(), [&](const OpGroupCompare& a, const OpGroupCompare& b) {
    return by_gap ? a.abs_gap_s > b.abs_gap_s : a.measured_s > b.measured_s;
  });
  return out;
}

}  // namespace

std::optional<double> CompareFigure::relative() const { return ratio(error(), measured); }
std::optional<double> MeasuredPeakCompare::relative() const {
  return ratio(error_bytes(), measured_peak_bytes);
}
std::optional<double> OpGroupCompare::relative() const { return ratio(error_s(), measured_s); }

std::string OpGroupCompare::label() const {
  std::string out = kind;
  for (const std::string* part : {&name, &group, &algorithm}) {
    if (!part->empty()) out += " " + *part;
  }
  return out;
}

StepResult step_result_from_json(const Json& json, const std::string& file) {
  if (!json.is_object()) throw InputError(file + ": not a StepResult (not a JSON object)");
  StepResult r;
  r.file = file;
  if (integer(json, "schema_version", file) != StepResult::kSchemaVersion) {
    throw_input_error(file, "schema_version", json.at("schema_version").dump(), "unsupported",
                      std::to_string(StepResult::kSchemaVersion));
  }
  r.source = field(json, "source", file, "", &Json::is_string, "string").get<std::string>();
  r.step_time_s = number(json, "step_time_s", file);
  r.critical_rank = integer(json, "critical_rank", file);
  const Json& b = field(json, "breakdown_s", file, "", &Json::is_object, "object");
  r.breakdown.compute_s = number(b, "compute", file, "breakdown_s.");
  r.breakdown.exposed_comm_s = number(b, "exposed_comm", file, "breakdown_s.");
  r.breakdown.bubble_s = number(b, "bubble", file, "breakdown_s.");
  r.breakdown.optimizer_s = number(b, "optimizer", file, "breakdown_s.");
  if (b.contains("variability")) r.breakdown.variability_s = number(b, "variability", file, "breakdown_s.");
  r.tokens_per_s = number(json, "tokens_per_s", file);
  r.mfu = number(json, "mfu", file);
  r.hfu = number(json, "hfu", file);
  r.memory = field(json, "memory", file, "", &Json::is_object, "object");
  // Every entry as compare reads it: {rank, stage, ranks: [[first, last], ...], memory_*_bytes}.
  const Json& ranks = field(r.memory, "ranks", file, "memory.", &Json::is_array, "array");
  for (size_t i = 0; i < ranks.size(); ++i) {
    const std::string at = "memory.ranks[" + std::to_string(i) + "].";
    if (!ranks[i].is_object()) {
      throw_input_error(file, "memory.ranks[" + std::to_string(i) + "]", ranks[i].dump(), "has the wrong type",
                        "an object {rank, stage, ranks, memory_*_bytes, peak_bytes}");
    }
    integer(ranks[i], "rank", file, at);
    integer(ranks[i], "stage", file, at);
    for (const Json& range : field(ranks[i], "ranks", file, at, &Json::is_array, "array")) {
      if (!range.is_array() || range.size() != 2 || !range[0].is_number_integer() || !range[1].is_number_integer()) {
        throw_input_error(file, at + "ranks", range.dump(), "has the wrong type", "[first, last] rank pairs");
      }
    }
    for (const char* key : kMemoryKeys) number(ranks[i], key, file, at);
  }
  if (r.memory.contains("measured")) {
    for (const Json& m : field(r.memory, "measured", file, "memory.", &Json::is_array, "array")) {
      if (!m.is_object()) throw_input_error(file, "memory.measured[]", m.dump(), "has the wrong type", "an object");
      integer(m, "rank", file, "memory.measured[].");
      number(m, "measured_peak_bytes", file, "memory.measured[].");
    }
  }
  if (json.contains("scaling_efficiency") && json["scaling_efficiency"].is_number()) {
    r.scaling_efficiency = json["scaling_efficiency"].get<double>();
  }
  r.program_sha256 =
      field(json, "program_sha256", file, "", &Json::is_string, "string").get<std::string>();
  r.inputs = field(json, "inputs", file, "", &Json::is_object, "object");
  for (const Json& o : field(json, "ops", file, "", &Json::is_array, "array")) {
    int64_t id = integer(o, "id", file, "ops[].");
    if (id < 0 || id > std::numeric_limits<int32_t>::max()) {
      throw_input_error(file, "ops[].id", std::to_string(id), "out of range", "an op id in [0, 2^31 - 1]");
    }
    r.ops.push_back({integer(o, "rank", file, "ops[]."), int32_t(id),
                     number(o, "start_s", file, "ops[]."), number(o, "end_s", file, "ops[]."),
                     number(o, "ready_s", file, "ops[].")});
  }
  for (auto it = json.begin(); it != json.end(); ++it) {
    static const char* const known[] = {
        "schema_version", "source", "step_time_s", "critical_rank", "breakdown_s",
        "tokens_per_s",   "mfu",    "hfu",         "memory",        "scaling_efficiency",
        "program_sha256", "inputs", "ops"};
    if (std::find(std::begin(known), std::end(known), it.key()) == std::end(known)) {
      r.extra[it.key()] = it.value();
    }
  }
  return r;
}

void check_comparable(const StepResult& prediction, const StepResult& measurement,
                      const std::string& prediction_file, const std::string& measurement_file) {
  auto refuse_source = [](const std::string& file, const std::string& source,
                          const std::string& wanted, const char* position) {
    if (source == wanted) return;
    std::string why =
        std::string("the ") + position + " argument must be " +
        (wanted == "simulator" ? "a prediction (prediction.json of `stepcast simulate`)"
                               : "a measurement (measurement.json of `stepcast run`)");
    if (source == "simulator") why += ", this is a prediction";
    if (source == "executor") why += ", this is a measurement";
    why += "; compare takes one prediction, then one measurement of the same program";
    throw_input_error(file, "source", "\"" + source + "\"", why, "\"" + wanted + "\"");
  };
  refuse_source(prediction_file, prediction.source, "simulator", "first");
  refuse_source(measurement_file, measurement.source, "executor", "second");
  if (prediction.program_sha256 == measurement.program_sha256) return;

  std::map<std::string, Json> p, m;
  for (const char* key : {"model", "topology", "plan"}) {
    flatten(prediction.inputs.value(key, Json()), std::string("inputs.") + key, p);
    flatten(measurement.inputs.value(key, Json()), std::string("inputs.") + key, m);
  }
  std::map<std::string, std::pair<std::string, std::string>> differ;
  for (const auto& [key, value] : p) {
    auto it = m.find(key);
    if (it == m.end())
      differ[key] = {value.dump(), "(absent)"};
    else if (it->second != value)
      differ[key] = {value.dump(), it->second.dump()};
  }
  for (const auto& [key, value] : m) {
    if (!p.count(key)) differ[key] = {"(absent)", value.dump()};
  }
  std::ostringstream why;
  why << prediction_file << " and " << measurement_file
      << " are of different programs (program_sha256 " << prediction.program_sha256.substr(0, 12)
      << " vs " << measurement.program_sha256.substr(0, 12) << "): ";
  if (differ.empty()) {
    why << "their resolved model, topology and plan agree, so the programs were lowered by "
           "different stepcast versions (prediction "
        << version_of(prediction) << ", measurement " << version_of(measurement)
        << "); simulate and run with one stepcast";
  } else {
    why << differ.size() << " resolved input key" << (differ.size() > 1 ? "s differ" : " differs");
    for (const auto& [key, values] : differ) {
      why << "; " << key << ": prediction " << values.first << ", measurement " << values.second;
    }
    why << " — simulate and run the same model, topology and plan";
  }
  throw InputError(why.str());
}

StepProgram program_from_inputs(const StepResult& result, const std::string& file) {
  auto input = [&](const char* key) -> const Json& {
    auto it = result.inputs.find(key);
    if (it == result.inputs.end() || !it->is_object()) {
      throw_input_error(file, std::string("inputs.") + key, "", "missing: cannot lower the program",
                        "the resolved inputs stepcast writes, or pass --program program.json");
    }
    return *it;
  };
  ModelConfig model = parse_model(input("model"), file + " (inputs.model)");
  Topology topology = parse_topology(input("topology"), file + " (inputs.topology)");
  Plan plan = parse_plan(input("plan"), file + " (inputs.plan)");
  validate_plan(plan, model, topology);
  StepProgram program = lower_program(model, topology, plan);
  hash_program(program);
  if (program.program_sha256 != result.program_sha256) {
    throw_input_error(file, "program_sha256", "\"" + result.program_sha256 + "\"",
                      std::string("this stepcast (") + stepcast_version() + ", git " +
                          stepcast_git_commit() +
                          ") lowers its resolved inputs to another program (" +
                          program.program_sha256 + "), so op ids would not match",
                      "pass the pair's program with --program program.json (`stepcast lower`)");
  }
  return program;
}

namespace {

// Memory by class, rank entry by rank entry (both sides list the same entries), and the measured
// high-water marks.
// Where a StepResult came from, for messages: its file, or its role when made in memory.
std::string label(const StepResult& r, const char* role) { return r.file.empty() ? role : r.file; }

void compare_memory(const StepResult& prediction, const StepResult& measurement, CompareResult& c) {
  const Json& p_ranks = prediction.memory.at("ranks");
  const Json& m_ranks = measurement.memory.at("ranks");
  double arena_peak_max = 0;
  for (const Json& pe : p_ranks) {
    RankMemoryCompare rm;
    rm.rank = integer(pe, "rank", label(prediction, "prediction"), "memory.ranks[].");
    rm.stage = integer(pe, "stage", label(prediction, "prediction"), "memory.ranks[].");
    for (const Json& range : pe.at("ranks")) rm.ranks.emplace_back(range.at(0), range.at(1));
    const Json* me = memory_entry_of_rank(m_ranks, rm.rank);
    if (!me) {
      throw_input_error(
          label(measurement, "measurement"), "memory.ranks", "",
          "has no entry for rank " + std::to_string(rm.rank) + ", which the prediction lists",
          "the memory of the same program");
    }
    for (const char* key : kMemoryKeys) {
      rm.classes.push_back({key, number(pe, key, label(prediction, "prediction"), "memory.ranks[]."),
                            number(*me, key, label(measurement, "measurement"), "memory.ranks[].")});
    }
    arena_peak_max = std::max(arena_peak_max, pe.at("peak_bytes").get<double>() -
                                                  pe.at("memory_runtime_bytes").get<double>());
    c.memory_ranks.push_back(std::move(rm));
  }
  c.peak_bytes_max = {"peak_bytes_max",
                      number(prediction.memory, "peak_bytes_max", label(prediction, "prediction"), "memory."),
                      number(measurement.memory, "peak_bytes_max", label(measurement, "measurement"), "memory.")};
  if (measurement.memory.contains("measured_peak_bytes_max")) {
    c.measured_peak_max = MeasuredPeakCompare{
        -1, arena_peak_max,
        number(measurement.memory, "measured_peak_bytes_max", label(measurement, "measurement"), "memory.")};
  }
  for (const Json& mp : measurement.memory.value("measured", Json::array())) {
    MeasuredPeakCompare rank_peak;
    rank_peak.rank = integer(mp, "rank", label(measurement, "measurement"), "memory.measured[].");
    rank_peak.measured_peak_bytes =
        number(mp, "measured_peak_bytes", label(measurement, "measurement"), "memory.measured[].");
    const Json* pe = memory_entry_of_rank(p_ranks, rank_peak.rank);
    if (!pe) continue;  // a rank the prediction's memory does not list: nothing to compare with
    rank_peak.predicted_arena_peak_bytes =
        number(*pe, "peak_bytes", label(prediction, "prediction")) - number(*pe, "memory_runtime_bytes", label(prediction, "prediction"));
    c.measured_peak_ranks.push_back(rank_peak);
  }
}

// The op join on (rank, id) and its aggregations.
void compare_ops(const StepResult& prediction, const StepResult& measurement,
                 const StepProgram& program, CompareResult& c) {
  auto check_record = [&](const OpRecord& r, const std::string& side) {
    if (r.rank < 0 || r.rank >= program.world_size() || r.id < 0 ||
        r.id >= int32_t(program.role_of_rank(r.rank).ops.size())) {
      throw_input_error(
          side, "ops[]", "{rank " + std::to_string(r.rank) + ", id " + std::to_string(r.id) + "}",
          "is not an op of the program",
          "ranks 0.." + std::to_string(program.world_size() - 1) + " and the ids of their role");
    }
  };
  std::map<std::pair<int64_t, int32_t>, const OpRecord*> predicted;
  std::set<int64_t> p_ranks, m_ranks;
  for (const OpRecord& r : prediction.ops) {
    check_record(r, label(prediction, "prediction"));
    predicted[{r.rank, r.id}] = &r;
    p_ranks.insert(r.rank);
  }
  c.predicted_ranks.assign(p_ranks.begin(), p_ranks.end());
  auto duration = [](const OpRecord& r) {
    return std::max(0.0, r.end_s - std::max(r.start_s, r.ready_s));
  };
  std::map<std::string, OpGroupCompare> kinds, names, collectives, finest;
  std::vector<OpCompare> ops;
  for (const OpRecord& mr : measurement.ops) {
    check_record(mr, label(measurement, "measurement"));
    m_ranks.insert(mr.rank);
    auto it = predicted.find({mr.rank, mr.id});
    if (it == predicted.end()) {
      ++c.ops_measured_only;
      continue;
    }
    ++c.ops_joined;
    const Op& op = program.role_of_rank(mr.rank).ops[mr.id];
    if (op.kind == OpKind::alloc || op.kind == OpKind::free) continue;
    if (is_collective(op.kind) || op.kind == OpKind::recv) {
      ++c.waiting_ops_joined;
      c.waiting_ops_measured_ready_at_start += mr.ready_s == mr.start_s;
    }
    double p_s = duration(*it->second), m_s = duration(mr);
    OpGroupCompare key;
    key.kind = to_string(op.kind);
    add_to_group(kinds, key, p_s, m_s);
    if (is_compute(op.kind)) {
      key.name = op.grad == Grad::none ? to_string(op.name) : to_string(op.name) + std::string("/") + to_string(op.grad);
      add_to_group(names, key, p_s, m_s);
    } else if (is_collective(op.kind)) {
      key.group = to_string(op.group);
      key.algorithm = to_string(op.algorithm);
      add_to_group(collectives, key, p_s, m_s);
    }
    add_to_group(finest, key, p_s, m_s);
    std::ostringstream label;
    label << key.label() << " (" << to_string(op.phase);
    if (op.layer >= 0) label << ", layer " << op.layer;
    if (op.microbatch >= 0) label << ", microbatch " << op.microbatch;
    label << ")";
    ops.push_back({mr.rank, mr.id, label.str(), p_s, m_s});
  }
  c.measured_ranks.assign(m_ranks.begin(), m_ranks.end());
  c.ops_predicted_only = int64_t(predicted.size()) - c.ops_joined;
  c.by_kind = sorted_groups(kinds, false);
  c.by_compute_name = sorted_groups(names, false);
  c.by_collective = sorted_groups(collectives, false);
  c.contributors = sorted_groups(finest, true);
  std::stable_sort(ops.begin(), ops.end(), [](const OpCompare& a, const OpCompare& b) {
    return std::abs(a.error_s()) > std::abs(b.error_s());
  });
  if (ops.size() > size_t(kCompareTopOps)) ops.resize(kCompareTopOps);
  c.top_ops = std::move(ops);
}

}  // namespace

CompareResult compare_results(const StepResult& prediction, const StepResult& measurement,
                              const StepProgram& program) {
  check_comparable(prediction, measurement, label(prediction, "prediction"), label(measurement, "measurement"));
  if (program.program_sha256 != prediction.program_sha256) {
    throw InputError("the program given (program_sha256 " + program.program_sha256 +
                     ") is not the one the pair ran (" + prediction.program_sha256 + ")");
  }
  CompareResult c;
  c.program_sha256 = prediction.program_sha256;
  c.inputs = prediction.inputs;
  c.step_time_s = {"step_time_s", prediction.step_time_s, measurement.step_time_s};
  c.predicted_critical_rank = prediction.critical_rank;
  c.measured_critical_rank = measurement.critical_rank;
  const Breakdown& pb = prediction.breakdown;
  const Breakdown& mb = measurement.breakdown;
  // A measurement's compute includes its run-to-run variation; the prediction's is split out.
  c.breakdown_s = {{"compute", pb.compute_s + pb.variability_s, mb.compute_s + mb.variability_s},
                   {"exposed_comm", pb.exposed_comm_s, mb.exposed_comm_s},
                   {"bubble", pb.bubble_s, mb.bubble_s},
                   {"optimizer", pb.optimizer_s, mb.optimizer_s}};
  compare_memory(prediction, measurement, c);
  compare_ops(prediction, measurement, program, c);
  return c;
}

// ---- writers ---------------------------------------------------------------------------------

namespace {

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
      header(out, {"rank", "predicted peak − runtime", "measured peak", "error", "relative"}, true);
      for (const auto& r : c.measured_peak_ranks) {
        row(out,
            {std::to_string(r.rank), format_bytes(r.predicted_arena_peak_bytes),
             format_bytes(r.measured_peak_bytes), signed_bytes(r.error_bytes()),
             percent(r.relative())},
            true);
      }
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
      << "); duration = end_s − max(start_s, ready_s), alloc/free not counted\n";
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
      {"duration", "end_s - max(start_s, ready_s); alloc and free are joined, not aggregated"},
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
