// Parameter servers (plan data_parallel_mode "async" with parameter_servers): the plan keys and
// their refusals, the slices and the staleness rule, and the program — the workers' roles pull
// and push, the servers' roles hold their slices and handle one push, program_check matches them
// transfer for transfer, program.json carries them, and the statistics count the servers' work.
#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>
#include <string>

#include "errors.hpp"
#include "lower.hpp"
#include "lower_fixtures.hpp"
#include "memory.hpp"
#include "parameter_server.hpp"
#include "plan.hpp"
#include "program_check.hpp"
#include "program_json.hpp"
#include "program_stats.hpp"
#include "test_support.hpp"

using namespace stepcast;
using namespace stepcast::test;
using Catch::Matchers::Contains;

namespace {

const std::string kFile = "ps-plan.json";

Json ps_plan(int64_t workers, int64_t servers, int64_t staleness = 1) {
  return {{"dp_size", workers}, {"micro_batch_size", 1}, {"global_batch_size", 2 * workers}, {"dtype", "fp32"},
          {"dropout", 0.0}, {"data_parallel_mode", "async"}, {"staleness", staleness}, {"parameter_servers", servers}};
}

using Lowered = LoweredJson;

Lowered lower_json(const Json& json, int nodes = 2, const std::string& model_name = "tiny") {
  return lower_plan_json(json, kFile, nodes, model_name);
}

std::string error_of(const Json& json, int nodes = 2, const std::string& model_name = "tiny") {
  try {
    lower_json(json, nodes, model_name);
  } catch (const InputError& e) {
    return e.what();
  }
  FAIL("no InputError for " << json.dump());
  return "";
}

}  // namespace

TEST_CASE("parameter_servers: the plan key and its refusals", "[plan][ps]") {
  Plan plan = lower_json(ps_plan(2, 1)).plan;
  CHECK(plan.parameter_servers == 1);
  CHECK(plan.parameter_server());
  CHECK_FALSE(plan.bounded_delay());
  CHECK(plan_to_json(plan)["parameter_servers"] == 1);
  CHECK(parse_plan(plan_to_json(plan), kFile).parameter_servers == 1);
  CHECK_FALSE(plan_to_json(lower_json(ps_plan(2, 1)).plan).contains("microbatches_per_replica"));

  Json sync = ps_plan(2, 1);
  sync.erase("data_parallel_mode");
  sync.erase("staleness");
  CHECK_THAT(error_of(sync), Contains(kFile + ": key 'parameter_servers'"));
  CHECK_THAT(error_of(sync), Contains("data_parallel_mode is \"sync\""));
  CHECK_THAT(error_of(ps_plan(2, 0)), Contains("key 'parameter_servers' = 0"));
  Json tp = ps_plan(2, 1);
  tp["tp_size"] = 2;
  CHECK_THAT(error_of(tp, 4), Contains("key 'parameter_servers' = 1: with tp_size 2"));
  Json zero = ps_plan(2, 1);
  zero["zero_stage"] = 1;
  CHECK_THAT(error_of(zero), Contains("with zero_stage 1 is not supported"));
  Json derived = ps_plan(2, 1);
  derived.erase("dp_size");
  CHECK_THAT(error_of(derived), Contains("needs dp_size"));
  // Four workers and one server need five devices: two localhost-cpu nodes have four.
  CHECK_THAT(error_of(ps_plan(4, 1)), Contains("needs dp_size + parameter_servers = 5 devices"));
  CHECK_NOTHROW(lower_json(ps_plan(4, 1), 3));
  CHECK_THAT(error_of(ps_plan(1, 1), 1, "tiny-moe"), Contains("mixture of experts"));
  Json staleness = ps_plan(2, 1);
  staleness["staleness"] = 0;
  CHECK_THAT(error_of(staleness), Contains("key 'staleness' = 0"));
}

TEST_CASE("server_slice and ssp_may_start", "[plan][ps]") {
  CHECK(server_slice(10, 3, 0) == std::pair<int64_t, int64_t>{0, 4});
  CHECK(server_slice(10, 3, 1) == std::pair<int64_t, int64_t>{4, 7});
  CHECK(server_slice(10, 3, 2) == std::pair<int64_t, int64_t>{7, 10});
  CHECK(server_slice(2, 3, 2) == std::pair<int64_t, int64_t>{2, 2});
  // Staleness 1: a worker starts step c once every worker has pushed c − 1 steps.
  CHECK(ssp_may_start({3, 2}, 3, 1));
  CHECK_FALSE(ssp_may_start({4, 2}, 4, 1));
  CHECK(ssp_may_start({4, 2}, 4, 2));
  CHECK(ssp_may_start({0, 0}, 0, 1));
}

TEST_CASE("a parameter-server program: workers pull and push, servers hold slices and handle a push", "[lower][ps]") {
  Lowered l = lower_json(ps_plan(2, 2), 2);
  const StepProgram& p = l.program;
  CHECK(p.parameter_servers == 2);
  CHECK(p.ranks() == 4);
  REQUIRE(p.roles.size() == 3);
  CHECK(p.role_of_rank(1).index == 0);
  CHECK(p.role_of_rank(2).server == 0);
  CHECK(p.role_of_rank(3).server == 1);
  CHECK(check_program(p).empty());
  // The worker: no optimizer state, no collective, its pulls first and its pushes last.
  const Role& worker = p.roles[0];
  double pulled = 0, pushed = 0, weights = 0;
  for (const Op& op : worker.ops) {
    CHECK_FALSE(is_collective(op.kind));
    CHECK(op.name != OpName::adamw);
    if (op.kind == OpKind::alloc && op.buffer_class == BufferClass::optimizer) FAIL("a worker with optimizer state");
    if (op.kind == OpKind::alloc && op.persistent && op.buffer.rfind("weights.", 0) == 0) weights += op.bytes;
    if (op.name == OpName::param_pull) pulled += op.bytes;
    if (op.name == OpName::grad_push) pushed += op.bytes;
  }
  CHECK(pulled == Approx(weights));   // every weight once, from its server
  CHECK(pushed == Approx(weights));   // fp32 gradients: the same bytes
  // Each server: its slices of weights and optimizer state; one AdamW per push.
  double server_weights = 0;
  for (size_t r = 1; r < 3; ++r) {
    int adamw = 0;
    for (const Op& op : p.roles[r].ops) {
      if (op.kind == OpKind::alloc && op.persistent && op.buffer.rfind("weights.", 0) == 0) server_weights += op.bytes;
      adamw += op.name == OpName::adamw;
      if (is_p2p(op.kind)) CHECK(op.peer == Peer::ps_worker);
    }
    CHECK(adamw == 1);
  }
  CHECK(server_weights == Approx(weights));
  // Memory: the servers' ranks have their roles.
  MemoryReport memory = memory_report(p, load_topology(source_path("topologies/localhost-cpu.json"), 2));
  REQUIRE(memory.ranks.size() == 3);
  CHECK(memory.ranks[1].ranks == std::vector<std::pair<int64_t, int64_t>>{{2, 2}});
  CHECK(memory.ranks[1].optimizer_bytes > 0);
  CHECK(memory.ranks[0].optimizer_bytes == 0);
  // Statistics: the servers' transfers are "ps", their updates counted once per worker step.
  ProgramStats stats = program_stats(p);
  CHECK(stats.comm_bytes_per_step.at("ps") == Approx(2 * pushed + 2 * pulled + 2 * 2 * 4));
  // program.json carries it and reads back to the same bytes.
  const std::string path = write_temp_file("ps-program.json", "");
  {
    std::ofstream out(path);
    write_program_json(p, &out);
  }
  StepProgram back = read_program_json(path);
  CHECK(back.parameter_servers == 2);
  CHECK(back.roles[2].server == 1);
  CHECK(write_program_json(back, nullptr) == write_program_json(p, nullptr));
}

TEST_CASE("check_program: a server that does not receive what its workers push is caught", "[lower][ps]") {
  Lowered l = lower_json(ps_plan(2, 1), 2);
  StepProgram& p = l.program;
  for (Op& op : p.roles[1].ops) {
    if (op.name == OpName::grad_push) {
      op.bytes += 4;  // one element more than the worker sends
      break;
    }
  }
  std::vector<std::string> errors = check_program(p);
  REQUIRE_FALSE(errors.empty());
  CHECK_THAT(errors.front(), Contains("role 0 and server 0"));
}
