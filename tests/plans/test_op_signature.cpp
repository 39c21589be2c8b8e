// The op signature table: names keep their JSON strings, every lowered op binds to its slots,
// and check_program refuses operands that break a slot's count, dtype or shape rule.
#include <catch2/catch.hpp>

#include <set>
#include <string>

#include "json_input.hpp"
#include "lower.hpp"
#include "lower_fixtures.hpp"
#include "op_signature.hpp"
#include "program_check.hpp"

using namespace stepcast;
using namespace stepcast::test;

namespace {

StepProgram tiny_program(const Json& plan_json) {
  ModelConfig model = load_model(source_path("models/tiny-gpt.json"));
  Topology topology = test_topology();
  return lower_program(model, topology, make_plan(plan_json, model, topology));
}

Json tp2_plan() {
  return {{"tp_size", 2}, {"dp_size", 2}, {"micro_batch_size", 1}, {"global_batch_size", 4},
          {"dtype", "fp32"}, {"zero_stage", 1}, {"dropout", 0.1},
          {"attention_impl", "materialized"}};
}

Op* find(StepProgram& p, OpKind kind, OpName name, Grad grad = Grad::none) {
  for (Op& op : p.roles[0].ops) {
    if (op.kind == kind && op.name == name && op.grad == grad) return &op;
  }
  return nullptr;
}

}  // namespace

TEST_CASE("op names and gradients keep their JSON strings", "[program]") {
  CHECK(std::string(to_string(OpName::qkv)) == "qkv");
  CHECK(std::string(to_string(OpName::zero3_param_gather)) == "zero3_param_gather");
  CHECK(std::string(to_string(OpName::none)).empty());
  CHECK(std::string(to_string(Grad::dgrad)) == "dgrad");
  CHECK(std::string(to_string(Grad::none)).empty());
  std::set<std::string> seen;
  for (int i = 1; i <= int(OpName::recv); ++i) {
    std::string text = to_string(OpName(i));
    CHECK(seen.insert(text).second);  // no two names print alike
    REQUIRE(parse_op_name(text).has_value());
    CHECK(*parse_op_name(text) == OpName(i));
  }
  CHECK(!parse_op_name("").has_value());
  CHECK(!parse_op_name("qkv2").has_value());
  CHECK(parse_grad("wgrad") == Grad::wgrad);
  CHECK(!parse_grad("forward").has_value());
}

TEST_CASE("every name the table knows has a signature and every lowered op binds", "[program]") {
  std::set<OpName> named;
  for (const OpSignature& s : op_signatures()) {
    for (OpName n : s.names) named.insert(n);
  }
  for (int i = 1; i <= int(OpName::recv); ++i) {
    INFO(to_string(OpName(i)));
    CHECK(named.count(OpName(i)));
  }
  for (const auto& c : lowering_cases()) {
    INFO(c.label());
    ModelConfig model = load_model(source_path(c.model_file));
    Topology topology = test_topology();
    StepProgram program = lower_program(model, topology, make_plan(c.plan_json, model, topology));
    for (const Role& role : program.roles) {
      for (const Op& op : role.ops) {
        if (op.kind == OpKind::alloc || op.kind == OpKind::free) continue;
        const OpSignature* signature = find_signature(op);
        INFO("op " << op.id << " " << to_string(op.kind) << " " << op.name);
        REQUIRE(signature);
        CHECK(bind_slots(*signature, op).error.empty());
      }
    }
  }
}

TEST_CASE("slots bind by count: optional slots in order, repeated slots, comm scratch", "[program]") {
  StepProgram p = tiny_program(tp2_plan());
  // gemm dgrad [d_y, w (, d_x)] → [d_x]
  Op* dgrad = find(p, OpKind::gemm, OpName::mlp_down, Grad::dgrad);
  REQUIRE(dgrad);
  SlotBinding b = bind_slots(*find_signature(*dgrad), *dgrad);
  REQUIRE(b.error.empty());
  REQUIRE(b.inputs.size() == 2);
  CHECK(std::string(b.inputs[0]->name) == "d_y");
  CHECK(std::string(b.inputs[1]->name) == "w");
  CHECK(std::string(b.outputs[0]->name) == "d_x");
  // adamw [grads×G, states×G, norm_sq] → [states×G, weights×G]
  Op* adamw = find(p, OpKind::optimizer_step, OpName::adamw);
  REQUIRE(adamw);
  b = bind_slots(*find_signature(*adamw), *adamw);
  REQUIRE(b.error.empty());
  size_t groups = (adamw->inputs.size() - 1) / 2;
  CHECK(std::string(b.inputs[groups - 1]->name) == "grads");
  CHECK(std::string(b.inputs[groups]->name) == "states");
  CHECK(std::string(b.inputs.back()->name) == "norm_sq");
  CHECK(std::string(b.outputs.back()->name) == "weights");
  // A host collective's last output is its comm scratch.
  Op* reduce = find(p, OpKind::all_reduce, OpName::tp_attn_out);
  REQUIRE(reduce);
  REQUIRE(is_comm_scratch(reduce->outputs.back()));
  b = bind_slots(*find_signature(*reduce), *reduce);
  REQUIRE(b.error.empty());
  CHECK(b.outputs.back()->role == SlotRole::comm_scratch);
  // adamw with a gradient missing: the repeated slots no longer line up.
  Op broken = *adamw;
  broken.inputs.erase(broken.inputs.begin());
  CHECK(!bind_slots(*find_signature(broken), broken).error.empty());
}

TEST_CASE("an interpreter reads operands by slot name, not by position", "[program]") {
  StepProgram p = tiny_program(tp2_plan());
  Op* dgrad = find(p, OpKind::gemm, OpName::mlp_down, Grad::dgrad);
  REQUIRE(dgrad);
  Operands operands(*dgrad);
  CHECK(operands.in("d_y") == dgrad->inputs[0]);
  CHECK(operands.in("w") == dgrad->inputs[1]);
  CHECK(operands.out("d_x") == dgrad->outputs[0]);
  CHECK_FALSE(operands.has_in("d_x"));  // the optional accumulate-into input is absent here
  CHECK(operands.has_out("d_x"));
  CHECK_THROWS_AS(operands.in("x"), std::logic_error);  // no such slot on this side
  // A slot named on both sides: the norm backward reads d_x and writes it.
  Op* norm = nullptr;
  for (Op& op : p.roles[0].ops) {
    if (op.kind == OpKind::norm && op.phase == Phase::backward) norm = &op;
  }
  REQUIRE(norm);
  Operands n(*norm);
  CHECK(n.in("d_x") == norm->inputs[3]);
  CHECK(n.out("d_x") == norm->outputs[0]);
  CHECK(n.out("dw") == norm->outputs[1]);
  // Repeated slots give every buffer, in order.
  Op* adamw = find(p, OpKind::optimizer_step, OpName::adamw);
  REQUIRE(adamw);
  Operands a(*adamw);
  size_t groups = (adamw->inputs.size() - 1) / 2;
  std::vector<BufferName> grads = a.ins("grads");
  REQUIRE(grads.size() == groups);
  CHECK(grads.front() == adamw->inputs.front());
  CHECK(a.outs("weights").size() == groups);
  CHECK(a.in("norm_sq") == adamw->inputs.back());
  // An op that does not fit its signature is refused when its operands are read.
  Op broken = *adamw;
  broken.inputs.erase(broken.inputs.begin());
  CHECK_THROWS_AS(Operands(broken), std::logic_error);
  // alloc and free have no operands.
  CHECK_FALSE(Operands(p.roles[0].ops.front()).has_in("x"));
}

TEST_CASE("the checker refuses operands that break their signature", "[program]") {
  SECTION("a missing operand") {
    StepProgram p = tiny_program(tp2_plan());
    find(p, OpKind::gemm, OpName::qkv)->inputs.pop_back();
    CHECK(any_error_contains(check_program(p), "inputs: 1 buffers; the signature takes 2"));
  }
  SECTION("an operand of the wrong shape") {
    StepProgram p = tiny_program(tp2_plan());
    find(p, OpKind::gemm, OpName::mlp_up)->k += 1;  // x no longer holds m·k elements
    CHECK(any_error_contains(check_program(p), "input slot 'x'"));
  }
  SECTION("an operand of the wrong dtype") {
    StepProgram p = tiny_program(tp2_plan());
    for (Op& op : p.roles[0].ops) {
      if (op.kind == OpKind::alloc && op.buffer.find("probs_mask") != std::string::npos) {
        op.dtype = Dtype::fp32;
      }
    }
    CHECK(any_error_contains(check_program(p), "output slot 'mask'"));
  }
  SECTION("an op without a signature") {
    StepProgram p = tiny_program(tp2_plan());
    find(p, OpKind::gemm, OpName::qkv)->grad = Grad::wgrad;  // a wgrad in the forward pass
    CHECK(any_error_contains(check_program(p), "no signature for (gemm, 'qkv', 'wgrad', forward)"));
  }
  SECTION("the program as lowered") {
    StepProgram p = tiny_program(tp2_plan());
    CHECK(check_program(p).empty());
  }
}

TEST_CASE("the program schema names every op name, and no other", "[signature]") {
  // schemas/program.schema.json's op name enum against the code's names (a name added to one and
  // not the other would refuse valid programs or document ops that do not exist).
  const Json schema = load_json_file(source_path("schemas/program.schema.json"));
  std::set<std::string> in_schema;
  for (const Json& name : schema.at("$defs").at("op").at("properties").at("name").at("enum")) {
    in_schema.insert(name.get<std::string>());
  }
  std::set<std::string> in_code;
  for (int i = 1; i <= int(OpName::recv); ++i) in_code.insert(to_string(OpName(i)));
  CHECK(in_schema == in_code);
}
