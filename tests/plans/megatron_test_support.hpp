// Helpers the Megatron-LM tests share (test_megatron_export.cpp, test_megatron_import.cpp,
// test_megatron_moe.cpp): shipped inputs, launch lines, imports and the flags of an export.
#pragma once

#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <utility>

#include "errors.hpp"
#include "megatron_export.hpp"
#include "megatron_import.hpp"
#include "model.hpp"
#include "plan.hpp"
#include "test_support.hpp"
#include "topology.hpp"

namespace stepcast::test {

inline ModelConfig shipped_model(const std::string& name) {
  return load_model(test::source_path("models/" + name + ".json"));
}

inline Topology shipped_topology(const std::string& name, int nodes) {
  return load_topology(test::source_path("topologies/" + name + ".json"), nodes);
}

inline Plan validated(const Json& json, const ModelConfig& model, const Topology& topology) {
  Plan plan = parse_plan(json, "plan.json");
  validate_plan(plan, model, topology);
  return plan;
}

inline std::string launch_line(const MegatronArguments& args) {
  std::string line = "torchrun --nproc_per_node 8 pretrain_gpt.py";
  for (const auto& a : args.arguments) line += " " + a;
  return line;
}

// The imported model and plan, validated on `topology` (dp_size from its devices).
inline std::pair<ModelConfig, Plan> imported(const std::string& text, const Topology& topology) {
  MegatronImport in = import_megatron_arguments(text, "launch.sh", "imported");
  ModelConfig model = parse_model(in.model, "launch.sh");
  Plan plan = parse_plan(in.plan, "launch.sh");
  validate_plan(plan, model, topology);
  return {model, plan};
}

inline std::string import_error(const std::string& text) {
  try {
    import_megatron_arguments(text, "launch.sh", "imported");
  } catch (const InputError& e) {
    return e.what();
  }
  FAIL("no InputError for: " << text);
  return "";
}

// Export → import of a runnable plan: the same model and plan come back (names aside); returns
// the plan read back.
inline Plan check_round_trip(const ModelConfig& model, const Plan& plan, const Topology& topology) {
  MegatronArguments args = megatron_arguments(plan, model);
  REQUIRE(args.runnable);
  std::string line = launch_line(args);
  INFO(line);
  auto [model_back, plan_back] = imported(line, topology);
  Json a = model_to_json(model), b = model_to_json(model_back);
  a.erase("name");
  b.erase("name");
  CHECK(a == b);
  Json p = plan_to_json(plan), q = plan_to_json(plan_back);
  p.erase("name");
  q.erase("name");
  CHECK(p == q);
  return plan_back;
}

// Flag → value ("" for a switch), quotes taken off; each flag given once.
inline std::map<std::string, std::string> flags_of(const MegatronArguments& m) {
  std::map<std::string, std::string> out;
  for (const auto& a : m.arguments) {
    auto space = a.find(' ');
    std::string name = a.substr(0, space);
    std::string value = space == std::string::npos ? "" : a.substr(space + 1);
    if (value.size() >= 2 && value.front() == '\'' && value.back() == '\'') value = value.substr(1, value.size() - 2);
    INFO(a);
    CHECK(out.count(name) == 0);
    out[name] = value;
  }
  return out;
}

inline int64_t integer(const std::map<std::string, std::string>& f, const std::string& name) {
  INFO(name);
  REQUIRE(f.count(name) == 1);
  return std::stoll(f.at(name));
}

}  // namespace stepcast::test
