// Asynchronous data parallelism (plan data_parallel_mode "async", staleness k): the plan keys and
// their refusals, and the program it lowers to — the previous step's gradients all-reduced as the
// step starts, the update reading the slot k − 1 steps old, the slots moved up after it, k stale
// gradient buffers per parameter group in memory and in checkpoints — and program.json carrying
// the staleness.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <utility>
#include <sstream>
#include <string>

#include "checkpoint_size.hpp"
#include "errors.hpp"
#include "lower.hpp"
#include "lower_fixtures.hpp"
#include "memory.hpp"
#include "plan.hpp"
#include "program_check.hpp"
#include "program_json.hpp"
#include "test_support.hpp"

using namespace stepcast;
using namespace stepcast::test;
using Catch::Matchers::Contains;

namespace {

const std::string kFile = "async-plan.json";

Json async_plan(int64_t staleness, int64_t dp = 2) {
  return {{"dp_size", dp}, {"micro_batch_size", 1}, {"global_batch_size", 4 * dp}, {"dtype", "fp32"},
          {"dropout", 0.0}, {"data_parallel_mode", "async"}, {"staleness", staleness}};
}

using Lowered = LoweredJson;

Lowered lower_json(const Json& json, const std::string& model_name = "tiny") {
  return lower_plan_json(json, kFile, 4, model_name);
}

std::string error_of(const Json& json) {
  try {
    lower_json(json);
  } catch (const InputError& e) {
    return e.what();
  }
  FAIL("no InputError for " << json.dump());
  return "";
}

}  // namespace

TEST_CASE("async plans: staleness defaults to 1 and is written back, bad combinations are refused", "[plan][async]") {
  Json json = async_plan(1);
  json.erase("staleness");
  Plan plan = lower_json(json).plan;
  CHECK(plan.async_staleness == 1);
  CHECK(plan_to_json(plan)["data_parallel_mode"] == "async");
  CHECK(plan_to_json(plan)["staleness"] == 1);
  CHECK(parse_plan(plan_to_json(plan), kFile).async_staleness == 1);
  // A synchronous plan writes neither key (its outputs keep their bytes).
  Json sync = async_plan(1);
  sync.erase("data_parallel_mode");
  sync.erase("staleness");
  CHECK_FALSE(plan_to_json(parse_plan(sync, kFile)).contains("data_parallel_mode"));

  std::string message = error_of(async_plan(0));
  CHECK_THAT(message, Contains(kFile + ": key 'staleness' = 0"));
  message = error_of(async_plan(-2));
  CHECK_THAT(message, Contains("key 'staleness' = -2"));
  Json staleness_alone = sync;
  staleness_alone["staleness"] = 2;
  CHECK_THAT(error_of(staleness_alone), Contains("key 'staleness' = 2: is given, but data_parallel_mode is \"sync\""));
  Json mode = async_plan(1);
  mode["data_parallel_mode"] = "hogwild";
  CHECK_THAT(error_of(mode), Contains("key 'data_parallel_mode' = \"hogwild\""));
  CHECK_THAT(error_of(mode), Contains("sync"));
  Json zero = async_plan(1);
  zero["zero_stage"] = 1;  // the distributed optimizer: the stale gradients reduce_scattered
  CHECK_NOTHROW(lower_json(zero));
  zero["zero_stage"] = 2;
  message = error_of(zero);
  CHECK_THAT(message, Contains("key 'data_parallel_mode' = async"));
  CHECK_THAT(message, Contains("zero_stage 2"));
  zero["zero_stage"] = 1;
  zero["dp_size"] = 4;
  zero["global_batch_size"] = 16;
  zero["num_distributed_optimizer_instances"] = 2;
  CHECK_THAT(error_of(zero), Contains("key 'num_distributed_optimizer_instances' = 2"));
  Json overlap = async_plan(1);
  overlap["overlap_grad_reduce"] = true;
  CHECK_THAT(error_of(overlap), Contains("key 'overlap_grad_reduce' = true"));
}

TEST_CASE("an async program reduces the previous step's gradients as the step starts and updates from the slot k late",
          "[lower][async]") {
  for (auto [k, zero] : {std::pair<int64_t, int>{1, 0}, {3, 0}, {2, 1}}) {
    INFO("staleness " << k << ", ZeRO-" << zero);
    Json json = async_plan(k);
    json["zero_stage"] = zero;
    Lowered l = lower_json(json);
    CHECK(l.program.async_staleness == k);
    CHECK(check_program(l.program).empty());
    const Role& role = l.program.roles[0];
    std::map<std::string, int> stale_allocs;
    int first_compute = -1, reductions_before_compute = 0, stashes = 0, groups = 0;
    for (const Op& op : role.ops) {
      if (op.kind == OpKind::alloc && op.persistent && op.buffer.rfind("grads.", 0) == 0) ++groups;
      if (op.kind == OpKind::alloc && op.buffer.rfind("stale_grads", 0) == 0) {
        CHECK(op.persistent);
        CHECK(op.buffer_class == BufferClass::grads);
        ++stale_allocs[op.buffer.substr(op.buffer.find('.') + 1)];
      }
      if (is_compute(op.kind) && first_compute < 0) first_compute = op.id;
      if (op.name == OpName::grad_bucket) {
        // Only the stale slot 0, on the comm stream, before any compute: nothing of this step.
        CHECK(op.kind == (zero == 0 ? OpKind::all_reduce : OpKind::reduce_scatter));
        CHECK(op.stream == Stream::comm);
        CHECK(op.phase == Phase::forward);
        for (const auto& name : op.inputs) CHECK(name.rfind("stale_grads0.", 0) == 0);
        if (first_compute < 0) ++reductions_before_compute;
        CHECK(op.deps.size() == size_t(std::count_if(op.deps.begin(), op.deps.end(), [&](int32_t d) {
                return role.ops[size_t(d)].kind == OpKind::alloc;
              })));
      }
      if (op.name == OpName::adamw || (op.kind == OpKind::optimizer_step && op.name == OpName::grad_norm)) {
        for (const auto& name : op.inputs) {
          if (name.find("grads") != std::string::npos) {
            CHECK(name.rfind("stale_grads" + std::to_string(k - 1) + ".", 0) == 0);
          }
        }
      }
      if (op.name == OpName::grad_stash) ++stashes;
    }
    CHECK(reductions_before_compute >= 1);
    REQUIRE(groups > 0);
    CHECK(stale_allocs.size() == size_t(groups));
    for (const auto& [group, n] : stale_allocs) CHECK(n == k);
    CHECK(stashes == k * groups);
  }
}

TEST_CASE("async memory holds k more gradient copies and program.json keeps the staleness", "[lower][async]") {
  Json sync = async_plan(1);
  sync.erase("data_parallel_mode");
  sync.erase("staleness");
  Lowered s = lower_json(sync);
  Lowered a = lower_json(async_plan(2));
  Topology topology = load_topology(source_path("topologies/localhost-cpu.json"), 4);
  MemoryReport ms = memory_report(s.program, topology), ma = memory_report(a.program, topology);
  const double sync_grads = ms.ranks[0].grads_bytes;
  CHECK(sync_grads > 0);
  CHECK(ma.ranks[0].grads_bytes == Approx(3 * sync_grads));

  // A checkpoint saves the stale gradients too (the updates still to come): goodput's write time
  // counts them.
  CHECK(checkpoint_size(a.program).rank_bytes_max ==
        Approx(checkpoint_size(s.program).rank_bytes_max + 2 * sync_grads));

  std::ostringstream text, sync_text;
  write_program_json(a.program, &text);
  StepProgram read = parse_program_json_text(text.str(), "async-program.json");
  CHECK(read.async_staleness == 2);
  CHECK(write_program_json(read, nullptr) == write_program_json(a.program, nullptr));
  CHECK(text.str().find("\"async_staleness\":2") != std::string::npos);
  write_program_json(s.program, &sync_text);
  CHECK(sync_text.str().find("async_staleness") == std::string::npos);
}
