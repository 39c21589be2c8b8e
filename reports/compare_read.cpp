// Reading a prediction or measurement back (step_result_from_json), and deciding whether a pair
// can be compared (check_comparable, program_from_inputs); see compare.hpp. The join is in
// compare.cpp.
#include "compare.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <sstream>

#include "compare_fields.hpp"
#include "errors.hpp"
#include "lower.hpp"
#include "model.hpp"
#include "plan.hpp"
#include "program_json.hpp"
#include "topology.hpp"
#include "version.hpp"

namespace stepcast {

namespace compare_detail {

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
              const std::string& prefix) {
  return field(json, key, file, prefix, &Json::is_number, "number").get<double>();
}

int64_t integer(const Json& json, const std::string& key, const std::string& file,
                const std::string& prefix) {
  return field(json, key, file, prefix, &Json::is_number_integer, "integer").get<int64_t>();
}

}  // namespace compare_detail

using namespace compare_detail;

namespace {

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

}  // namespace

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
  if (b.contains("overlap_interference")) {
    r.breakdown.overlap_interference_s = number(b, "overlap_interference", file, "breakdown_s.");
  }
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
    if (ranks[i].contains(kPlacementKey)) number(ranks[i], kPlacementKey, file, at);
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
  if (json.contains("program_sha256") && json["program_sha256"].is_null()) {
    throw_input_error(file, "program_sha256", "null", "made by `simulate --no-program-hash`, which skips the hash",
                      "a prediction simulated without --no-program-hash (compare checks that both sides ran "
                      "the same program by its hash)");
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

}  // namespace stepcast
