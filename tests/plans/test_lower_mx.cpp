// Lowering of MXFP8 (fp8_recipe "mxfp8"; plans/fp8.hpp): every FP8 buffer an MX buffer (codes and
// a scale per 32), no scale or amax state, each GEMM reading its operands blocked along its
// reduction (column-wise copies for dgrad's weights and wgrad's operands), the memory that keeps,
// the cheap path's agreement, Megatron-LM's arguments, and the refusals.
#include <catch2/catch.hpp>

#include <map>
#include <string>

#include "cheap_path_check.hpp"
#include "errors.hpp"
#include "lower.hpp"
#include "lower_fixtures.hpp"
#include "megatron_export.hpp"
#include "memory.hpp"
#include "program_check.hpp"

using namespace stepcast;
using namespace stepcast::test;

namespace {

Topology mx_topology() {
  Topology t = test_topology();
  t.node.device.mxfp8 = true;
  return t;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

TEST_CASE("MXFP8: MX buffers without scale state, GEMMs on column-wise copies where they reduce down columns",
          "[lower][fp8]") {
  ModelConfig model = load_model(source_path("models/tiny.json"));
  const Topology topology = mx_topology();
  Json base = {{"micro_batch_size", 2}, {"global_batch_size", 4}, {"dtype", "fp32"}, {"attention_impl", "flash"},
               {"dropout", 0.0},        {"fp8", "hybrid"}};
  Json mx = base;
  mx["fp8_recipe"] = "mxfp8";
  const Plan delayed_plan = make_plan(base, model, topology), mx_plan = make_plan(mx, model, topology);
  const StepProgram delayed = lower_program(model, topology, delayed_plan);
  const StepProgram program = lower_program(model, topology, mx_plan);
  REQUIRE(check_program(program).empty());
  const int64_t layers = model.num_hidden_layers, microbatches = mx_plan.num_microbatches();
  std::map<std::string, double> bytes_of;
  int64_t casts = 0, cast_both = 0, weight_casts = 0, weight_columnwise = 0, wgrads = 0, dgrads = 0;
  double copies = 0, delayed_copy = 0;
  for (const Op& op : program.roles[0].ops) {
    INFO(to_string(op.name) << " " << op.buffer);
    if (op.kind == OpKind::alloc) {
      bytes_of[op.buffer] = op.bytes;
      CHECK(op.buffer.rfind("fp8.", 0) != 0);  // no scale, amax or history
      if (is_fp8_storage(op.dtype)) {
        CHECK(is_mx_storage(op.dtype));
        double elements = 1;
        for (int64_t d : op.shape) elements *= double(d);
        CHECK(op.bytes == elements * 33 / 32);  // the codes and a scale byte per 32
      }
      if (op.buffer.rfind("fp8w", 0) == 0) copies += op.bytes;
    }
    CHECK(op.name != OpName::fp8_amax);
    CHECK(op.name != OpName::fp8_scale_update);
    CHECK(op.name != OpName::fp8_absmax);
    CHECK(op.name != OpName::fp8_transpose);  // nothing transposed: each copy cast from the values
    casts += op.name == OpName::fp8_cast;
    cast_both += op.name == OpName::fp8_cast_transpose;
    if (op.name == OpName::fp8_weights || op.name == OpName::fp8_weights_transpose) {
      REQUIRE(op.inputs.size() == 1);
      CHECK(op.inputs[0].rfind("weights.L", 0) == 0);  // both copies from the layer's own weights
      weight_casts += op.name == OpName::fp8_weights;
      weight_columnwise += op.name == OpName::fp8_weights_transpose;
    }
    if (op.kind == OpKind::gemm && op.grad == Grad::wgrad && op.fp8_slots[0] >= 0) {
      // x's column-wise copy kept from the forward, d_y's written beside its row-wise one.
      REQUIRE(op.inputs.size() == 2);
      CHECK(ends_with(op.inputs[0], "_f8_T"));
      CHECK(ends_with(op.inputs[1], "_f8_T"));
      ++wgrads;
    }
    if (op.kind == OpKind::gemm && op.grad == Grad::dgrad && op.fp8_slots[0] >= 0) {
      CHECK(is_fp8_transposed_copy(op.inputs[1]));  // the weights' column-wise copy
      ++dgrads;
    }
    if (op.kind == OpKind::free) bytes_of.erase(op.buffer);
  }
  for (const Op& op : delayed.roles[0].ops) {
    if (op.kind == OpKind::alloc && op.buffer.rfind("fp8w", 0) == 0) delayed_copy += op.bytes;
  }
  // Per layer and microbatch: the four kept inputs (ln1, ctx, ln2, act) and the five output
  // gradients cast both ways, none only row-wise (nothing recomputed); each layer's weights cast
  // twice a step.
  CHECK(casts == 0);
  CHECK(cast_both == layers * microbatches * 9);
  CHECK(weight_casts == layers);
  CHECK(weight_columnwise == layers);
  CHECK(wgrads == layers * microbatches * 5);
  CHECK(dgrads == wgrads);
  // Two MX copies of the weights against delayed scaling's one (a native device's): 2·33/32 as many bytes.
  CHECK(delayed_copy > 0);
  CHECK(copies == Approx(delayed_copy * 2 * 33 / 32).epsilon(1e-12));
  // Kept activations: the same inputs in one byte an element, plus their scales.
  const double s = double(model.seq_length), b = 2, h = double(model.hidden_size),
               f = double(model.intermediate_size);
  CHECK(layer_activation_bytes(model, mx_plan) - layer_activation_bytes(model, delayed_plan) ==
        Approx((3 * s * b * h + s * b * f) / 32));
  // The weights' class: the copies' bytes, less delayed scaling's scale state.
  const double mx_weights = memory_report(program, topology).ranks[0].weights_bytes;
  const double delayed_weights = memory_report(delayed, topology).ranks[0].weights_bytes;
  const double state = double(delayed.fp8_slots) * 4 * (2 + delayed_plan.fp8.amax_history_len);
  CHECK(mx_weights - delayed_weights == Approx(copies - delayed_copy - state).epsilon(1e-12));
}

TEST_CASE("MXFP8: sequence-parallel inputs gathered with their scales, recompute casts row-wise only",
          "[lower][fp8]") {
  // tp 2 with SP: each kept input's shard [s/2·b rows] is cast both ways, its row-wise copy
  // gathered for the forward and its column-wise copy gathered again for the wgrad, each gather
  // moving the codes and their scales. Full recompute's first forward keeps nothing: its casts
  // are row-wise only.
  ModelConfig model = load_model(source_path("models/tiny.json"));
  const Topology topology = mx_topology();
  Json j = {{"tp_size", 2},          {"sequence_parallel", true}, {"micro_batch_size", 2},
            {"global_batch_size", 2}, {"dtype", "fp32"},          {"attention_impl", "flash"},
            {"dropout", 0.0},        {"fp8", "e4m3"},             {"fp8_recipe", "mxfp8"},
            {"recompute", "full"}};
  const Plan plan = make_plan(j, model, topology);
  const StepProgram program = lower_program(model, topology, plan);
  REQUIRE(check_program(program).empty());
  const double tokens = double(model.seq_length) * 2, h = double(model.hidden_size);
  int64_t gathers = 0, row_only = 0;
  for (const Op& op : program.roles[0].ops) {
    if (op.kind == OpKind::all_gather && (op.name == OpName::sp_ln1 || op.name == OpName::sp_ln2) &&
        op.inputs[0].find("_f8") != std::string::npos) {
      CHECK(op.bytes == tokens * h * 33 / 32);
      ++gathers;
    }
    if (op.name == OpName::fp8_cast) {
      CHECK(op.phase == Phase::forward);
      ++row_only;
    }
  }
  // Forward, recompute and backward: ln1 and ln2 each gathered three times a layer.
  CHECK(gathers == model.num_hidden_layers * 2 * 3);
  CHECK(row_only == model.num_hidden_layers * 4);
}

TEST_CASE("MXFP8: the cheap path agrees with memory and quick_estimate (tiny on 8 B200)", "[search][fp8]") {
  ModelConfig model = load_model(source_path("models/tiny.json"));
  Topology topology = load_topology(source_path("topologies/dgx-b200.json"), 1);
  REQUIRE(topology.node.device.mxfp8);
  SearchSpace space;
  space.global_batch_size = 16;
  space.attention_impl = AttentionImpl::flash;
  space.micro_batch_sizes = {1, 2};
  space.fp8.format = Fp8Format::hybrid;
  space.fp8.scaling = Fp8Scaling::mxfp8;
  CHECK(check_cheap_path(model, topology, space, 3) > 0);
}

TEST_CASE("MXFP8: Megatron-LM's arguments name the recipe and no delayed-scaling flag", "[lower][fp8]") {
  ModelConfig model = load_model(source_path("models/tiny.json"));
  Json j = {{"micro_batch_size", 2}, {"global_batch_size", 4}, {"dtype", "fp32"}, {"fp8", "e4m3"},
            {"fp8_recipe", "mxfp8"}};
  const MegatronArguments args = megatron_arguments(make_plan(j, model, mx_topology()), model);
  std::string all;
  for (const std::string& a : args.arguments) all += a + "\n";
  CHECK(all.find("--fp8-format e4m3\n") != std::string::npos);
  CHECK(all.find("--fp8-recipe mxfp8\n") != std::string::npos);
  CHECK(all.find("--fp8-amax") == std::string::npos);
}

TEST_CASE("MXFP8: refused on a device without MX tensor cores, with experts, and with dimensions not of 32",
          "[lower][fp8]") {
  const auto message = plan_refusal;
  Json j = {{"micro_batch_size", 2}, {"global_batch_size", 4}, {"dtype", "fp32"},
            {"attention_impl", "flash"}, {"fp8", "e4m3"},         {"fp8_recipe", "mxfp8"}};
  CHECK_THAT(message(j, "tiny", test_topology()),
             Catch::Contains("key 'fp8_recipe' = \"mxfp8\"") && Catch::Contains("has none (its key mxfp8") &&
                 Catch::Contains("valid: \"delayed\" or \"tensorwise\""));
  CHECK_THAT(message(j, "tiny-moe", mx_topology()), Catch::Contains("mixtures of experts"));
  Json sp = j;  // tp 2 with SP and one sequence a microbatch: shards of 32 tokens pass, 16 do not
  sp["tp_size"] = 2;
  sp["sequence_parallel"] = true;
  sp["micro_batch_size"] = 1;
  CHECK(message(sp, "tiny", mx_topology()) == "accepted");
  sp["context_parallel_size"] = 2;
  CHECK_THAT(message(sp, "tiny", mx_topology()),
             Catch::Contains("a sequence-parallel shard's tokens (those / tp_size) = 16") &&
                 Catch::Contains("multiples of 32"));
  Json history = j;
  history["fp8_amax_history_len"] = 4;
  CHECK_THAT(message(history, "tiny", mx_topology()),
             Catch::Contains("key 'fp8_amax_history_len'") && Catch::Contains("fp8_recipe is \"mxfp8\""));
}

TEST_CASE("MXFP8: check_program refuses FP8 buffers the recipe does not store so", "[lower][fp8]") {
  ModelConfig model = load_model(source_path("models/tiny.json"));
  const Topology topology = mx_topology();
  Json j = {{"micro_batch_size", 2}, {"global_batch_size", 2}, {"dtype", "fp32"}, {"fp8", "e4m3"},
            {"fp8_recipe", "mxfp8"}};
  const StepProgram program = lower_program(model, topology, make_plan(j, model, topology));
  REQUIRE(check_program(program).empty());
  auto first_activation = [](StepProgram& p) -> Op& {
    for (Op& op : p.roles[0].ops) {
      if (op.kind == OpKind::alloc && is_mx_storage(op.dtype) && op.shape.size() > 1) return op;
    }
    FAIL("no MX activation buffer");
    return p.roles[0].ops[0];
  };
  StepProgram per_tensor = program;  // a per-tensor FP8 buffer in an MXFP8 program
  first_activation(per_tensor).dtype = Dtype::fp8_e4m3;
  CHECK(any_error_contains(check_program(per_tensor), "of dtype fp8_e4m3 (class workspace) in a program whose fp8 "
                                                      "recipe is mxfp8"));
  StepProgram delayed = program;  // MX buffers in a delayed-scaling program
  delayed.fp8.scaling = Fp8Scaling::delayed;
  CHECK(any_error_contains(check_program(delayed),
                           "of dtype mxfp8_e4m3 (class activations) in a program whose fp8 recipe is delayed"));
  StepProgram ragged = program;  // rows not whole 32-row blocks
  Op& alloc = first_activation(ragged);
  alloc.shape = {33, alloc.shape.back()};
  CHECK(any_error_contains(check_program(ragged), "(mxfp8_e4m3) of 33 rows of"));
  StepProgram blockwise = program;  // MX buffers in a blockwise program
  blockwise.fp8.scaling = Fp8Scaling::blockwise;
  CHECK(any_error_contains(check_program(blockwise),
                           "of dtype mxfp8_e4m3 (class activations) in a program whose fp8 recipe is blockwise"));
}
