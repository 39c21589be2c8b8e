// Plans for the lowering tests: a deterministic spread over tp, pp, dp, ZeRO stage, schedule,
// recompute, sequence parallelism, attention and dropout on the tiny test models.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "errors.hpp"
#include "json_input.hpp"
#include "lower.hpp"
#include "model.hpp"
#include "plan.hpp"
#include "sha256.hpp"
#include "test_support.hpp"
#include "topology.hpp"

namespace stepcast::test {

// A program JSON text with its program_sha256 recomputed: a program edited and hashed again.
inline std::string rehash(std::string text) {
  const std::string marker = ",\"program_sha256\":\"";
  size_t at = text.rfind(marker);
  if (at == std::string::npos) throw std::runtime_error("no program_sha256 in the program text");
  text.replace(at + marker.size(), 64, sha256_hex(std::string_view(text).substr(0, at)));
  return text;
}

// Whether one of check_program's errors contains `text`.
inline bool any_error_contains(const std::vector<std::string>& errors, const std::string& text) {
  for (const auto& e : errors) {
    if (e.find(text) != std::string::npos) return true;
  }
  return false;
}

struct PlanCase {
  std::string model_file;
  Json plan_json;
  std::string label() const { return model_file + " " + plan_json.dump(); }
};

// The plan of `json` on `topology`; without a dp size, dp_size 1 (these tests' plans use a few of
// the 32 ranks; a plan file's dp_size absent would be the world / (tp·pp·cp)).
inline Plan make_plan(const Json& json, const ModelConfig& model, const Topology& topology) {
  Json with_dp = json;
  if (!with_dp.contains("dp_size") && !with_dp.contains("data_parallel_size")) with_dp["dp_size"] = 1;
  Plan plan = parse_plan(with_dp, "test-plan.json");
  validate_plan(plan, model, topology);
  return plan;
}

// make_plan's refusal of `json` for models/<model_name>.json, or "accepted".
inline std::string plan_refusal(const Json& json, const std::string& model_name, const Topology& topology) {
  ModelConfig model = load_model(source_path("models/" + model_name + ".json"));
  try {
    make_plan(json, model, topology);
  } catch (const InputError& e) {
    return std::string(e.what());
  }
  return "accepted";
}

// A plan file's JSON (named `file` in errors) validated on `nodes` localhost-cpu nodes and
// lowered with models/MODEL.json: the plan and its program. InputError as validate_plan throws.
struct LoweredJson {
  Plan plan;
  StepProgram program;
};
inline LoweredJson lower_plan_json(const Json& json, const std::string& file, int nodes,
                                   const std::string& model_name = "tiny") {
  ModelConfig model = load_model(source_path("models/" + model_name + ".json"));
  Topology topology = load_topology(source_path("topologies/localhost-cpu.json"), nodes);
  Plan plan = parse_plan(json, file);
  validate_plan(plan, model, topology);
  StepProgram program = lower_program(model, topology, plan);
  return {plan, std::move(program)};
}

// localhost-cpu with 16 nodes of 2 "devices": 32 ranks, multi-node groups included.
inline Topology test_topology() {
  return load_topology(source_path("topologies/localhost-cpu.json"), 16);
}

inline std::vector<PlanCase> lowering_cases() {
  std::vector<PlanCase> cases;
  const char* models[] = {"models/tiny.json", "models/tiny-gpt.json"};
  const char* recomputes[] = {"none", "selective", "full"};
  const char* attentions[] = {"materialized", "flash"};
  int index = 0;
  for (int tp : {1, 2}) {
    for (int pp : {1, 2, 4}) {
      for (int dp : {1, 2}) {
        for (int zero = 0; zero <= 3; ++zero) {
          ++index;
          Json plan = {{"tp_size", tp}, {"pp_size", pp}, {"dp_size", dp}, {"zero_stage", zero},
                       {"micro_batch_size", 1 + index % 2}, {"dtype", "fp32"}};
          int m = pp * (1 + index % 3);  // microbatches per dp rank, a multiple of pp
          plan["global_batch_size"] = plan["micro_batch_size"].get<int>() * dp * m;
          if (pp == 2 && index % 3 == 0) {
            plan["schedule"] = "interleaved_1f1b";
            plan["virtual_pp_size"] = 2;
          } else if (pp > 1 && index % 3 == 1) {
            plan["schedule"] = "gpipe";
          }
          plan["recompute"] = recomputes[index % 3];
          plan["attention_impl"] = attentions[(index / 3) % 2];
          plan["dropout"] = (index % 4 == 0) ? 0.0 : 0.1;
          if (tp > 1 && index % 2 == 0) plan["sequence_parallel"] = true;
          if (tp > 1 && pp > 1 && index % 2 == 1) plan["scatter_gather_tensors_in_pipeline"] = true;
          if (index % 5 < 3) plan["overlap_grad_reduce"] = true;
          if (zero > 0 && index % 2 == 1) plan["overlap_param_gather"] = true;
          cases.push_back({models[index % 2], plan});
        }
      }
    }
  }
  // Hybrid sharding: dp 4 as 2 replicas of 2-rank shard groups, every ZeRO stage that shards.
  for (int tp : {1, 2}) {
    for (int pp : {1, 2, 4}) {
      for (int zero = 1; zero <= 3; ++zero) {
        ++index;
        Json plan = {{"tp_size", tp}, {"pp_size", pp}, {"dp_size", 4}, {"zero_stage", zero},
                     {"num_distributed_optimizer_instances", 2}, {"micro_batch_size", 1},
                     {"global_batch_size", 4 * pp * (1 + index % 2)}, {"dtype", "fp32"}};
        if (pp == 2 && index % 2 == 0) {
          plan["schedule"] = "interleaved_1f1b";
          plan["virtual_pp_size"] = 2;
        }
        plan["attention_impl"] = attentions[index % 2];
        if (index % 3 != 0) plan["overlap_grad_reduce"] = true;
        if (index % 2 == 1) plan["overlap_param_gather"] = true;
        cases.push_back({models[index % 2], plan});
      }
    }
  }
  // Context parallelism: cp 2 and 4 over the ring and the gathered kind, with tp (SP), pp, dp,
  // ZeRO and the recompute modes (flash attention, and materialized scores over gathered K/V).
  for (int cp : {2, 4}) {
    for (int tp : {1, 2}) {
      for (int pp : {1, 2}) {
        for (const char* comm : {"p2p", "allgather"}) {
          ++index;
          int dp = 1 + index % 2;
          Json plan = {{"tp_size", tp}, {"pp_size", pp}, {"dp_size", dp}, {"context_parallel_size", cp},
                       {"cp_comm_type", comm}, {"zero_stage", index % 4}, {"micro_batch_size", 1},
                       {"global_batch_size", dp * pp * (1 + index % 2)}, {"dtype", "fp32"},
                       {"attention_impl", std::string(comm) == "allgather" && index % 3 == 0 ? "materialized" : "flash"},
                       {"recompute", recomputes[index % 3]},
                       {"dropout", index % 2 ? 0.1 : 0.0}};
          if (tp > 1 && index % 3 != 1) plan["sequence_parallel"] = true;
          if (index % 2 == 0) plan["overlap_grad_reduce"] = true;
          cases.push_back({models[index % 2], plan});
        }
      }
    }
  }
  // FP8 linear layers (both formats) with tp (SP), pp, dp, ZeRO 0-2, both attention kinds and
  // the recompute modes.
  for (int tp : {1, 2}) {
    for (int pp : {1, 2}) {
      for (int zero = 0; zero <= 2; ++zero) {
        ++index;
        Json plan = {{"tp_size", tp}, {"pp_size", pp}, {"dp_size", 2}, {"zero_stage", zero},
                     {"micro_batch_size", 1}, {"global_batch_size", 2 * pp * (1 + index % 2)}, {"dtype", "fp32"},
                     {"fp8", index % 2 ? "hybrid" : "e4m3"}, {"fp8_amax_history_len", 1 + index % 3},
                     {"attention_impl", attentions[index % 2]}, {"recompute", recomputes[index % 3]},
                     {"dropout", index % 2 ? 0.1 : 0.0}};
        if (tp > 1 && index % 2 == 0) plan["sequence_parallel"] = true;
        cases.push_back({models[index % 2], plan});
      }
    }
  }
  // Asynchronous data parallelism (ZeRO-0 and ZeRO-1): staleness 1 and 2, with tp (SP), pp, dp 1 and 2.
  for (int tp : {1, 2}) {
    for (int pp : {1, 2}) {
      ++index;
      int dp = 1 + index % 2;
      Json plan = {{"tp_size", tp}, {"pp_size", pp}, {"dp_size", dp}, {"micro_batch_size", 1},
                   {"global_batch_size", dp * pp * 2}, {"dtype", "fp32"}, {"data_parallel_mode", "async"},
                   {"staleness", 1 + index % 2}, {"recompute", recomputes[index % 3]}, {"dropout", 0.0},
                   {"zero_stage", pp == 2 ? 1 : 0}};
      if (tp > 1 && index % 2 == 0) plan["sequence_parallel"] = true;
      cases.push_back({models[index % 2], plan});
    }
  }
  return cases;
}

}  // namespace stepcast::test
