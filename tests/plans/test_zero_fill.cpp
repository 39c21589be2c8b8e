// The zero fills of a program's buffers (plans/zero_fill.hpp): which buffers, and which op runs
// each fill, over the lowering cases; the cost model charges that op.
#include <catch2/catch.hpp>

#include <algorithm>

#include "cost_model.hpp"
#include "lower.hpp"
#include "lower_fixtures.hpp"
#include "profile.hpp"
#include "zero_fill.hpp"

using namespace stepcast;
using namespace stepcast::test;

TEST_CASE("zero fills: every filled buffer's first toucher is a compute op or a collective", "[lower]") {
  Topology topology = test_topology();
  int64_t persistent_grads = 0, per_step = 0;
  for (const PlanCase& c : lowering_cases()) {
    INFO(c.label());
    ModelConfig model = load_model(source_path(c.model_file));
    StepProgram program = lower_program(model, topology, make_plan(c.plan_json, model, topology));
    for (const Role& role : program.roles) {
      ZeroFills z = zero_fills(role);
      REQUIRE(z.filled.size() == role.ops.size());
      double charged = 0, filled = 0;
      for (const Op& op : role.ops) {
        if (z.filled[size_t(op.id)]) {
          CHECK(op.kind == OpKind::alloc);
          filled += op.bytes;
          (op.persistent ? persistent_grads : per_step) += 1;
        }
        for (int32_t alloc : z.fills_before[size_t(op.id)]) {
          INFO("op " << op.id << " " << to_string(op.kind) << " fills " << role.ops[size_t(alloc)].buffer.str());
          // (A transfer first would be filled at no cost in the simulator.)
          CHECK((is_compute(op.kind) || is_collective(op.kind)));
          CHECK(alloc < op.id);
        }
        charged += z.bytes_before[size_t(op.id)];
        for (int32_t alloc : z.step_fills_before[size_t(op.id)]) {
          CHECK(role.ops[size_t(alloc)].persistent);
          CHECK(std::count(z.fills_before[size_t(op.id)].begin(), z.fills_before[size_t(op.id)].end(), alloc) == 1);
        }
      }
      for (int32_t alloc : z.untouched) filled -= role.ops[size_t(alloc)].bytes;
      CHECK(charged == Approx(filled));
      // Every persistent gradient buffer is filled each step, and no other persistent buffer.
      for (const Op& op : role.ops) {
        if (op.kind != OpKind::alloc || !op.persistent) continue;
        bool grads = op.buffer_class == BufferClass::grads && !is_stale_grads(op.buffer);
        CHECK(bool(z.filled[size_t(op.id)]) == grads);
      }
    }
  }
  CHECK(persistent_grads > 0);
  CHECK(per_step > 0);
}

TEST_CASE("zero fills: the first op to touch a filled buffer pays its fill in the cost model", "[lower][profile]") {
  ModelConfig model = load_model(source_path("models/tiny.json"));
  Topology topology = load_topology(source_path("topologies/localhost-cpu.json"));
  Plan plan = make_plan({{"dp_size", 2}, {"zero_stage", 0}, {"micro_batch_size", 2}, {"global_batch_size", 8},
                         {"dtype", "fp32"}},
                        model, topology);
  StepProgram program = lower_program(model, topology, plan);
  const Role& role = program.roles.at(0);
  ZeroFills z = zero_fills(role);
  // The persistent gradient buffer: filled before the first wgrad that accumulates into it.
  int32_t grads = -1;
  for (const Op& op : role.ops) {
    if (op.kind == OpKind::alloc && op.persistent && op.buffer_class == BufferClass::grads) grads = op.id;
  }
  REQUIRE(grads >= 0);
  int32_t first = -1;
  for (const Op& op : role.ops) {
    for (int32_t a : z.fills_before[size_t(op.id)]) {
      if (a == grads) first = op.id;
    }
  }
  REQUIRE(first >= 0);
  CHECK(role.ops[size_t(first)].grad == Grad::wgrad);
  ComputeCostModel cost(topology.node.device, Dtype::fp32, roofline_profile(topology), topology.file);
  CHECK(cost.fill_time_s(role.ops[size_t(grads)].bytes) > 0);
  CHECK(cost.fill_time_s(0) == 0);
}
