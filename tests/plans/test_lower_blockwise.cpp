// Lowering of FP8 blockwise scaling (fp8_recipe "blockwise"; plans/fp8.hpp): activations and
// gradients in 1×128 blocks with fp32 scales (both ways, cast from the values), each layer's
// weights in 128×128 tiles, transposed from the row-wise tiles where the device reads FP8
// row-wise only; no scale or amax state; the memory that keeps, the cheap path's agreement,
// Megatron-LM's arguments, and the refusals.
#include <catch2/catch.hpp>

#include <cmath>
#include <sstream>
#include <string>

#include "cheap_path_check.hpp"
#include "errors.hpp"
#include "lower.hpp"
#include "lower_fixtures.hpp"
#include "megatron_export.hpp"
#include "memory.hpp"
#include "program_check.hpp"
#include "program_json.hpp"

using namespace stepcast;
using namespace stepcast::test;

namespace {

// localhost-cpu marked as a device that runs blockwise FP8, reading FP8 row-wise only (Hopper's
// fp8_columnwise "transposed") or column-wise too (Blackwell's "native").
Topology blockwise_topology(bool transposed) {
  Topology t = test_topology();
  t.node.device.fp8_blockwise = true;
  t.node.device.fp8_transposed_copies = transposed;
  return t;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

Json blockwise_plan() {
  return {{"micro_batch_size", 2}, {"global_batch_size", 4}, {"dtype", "fp32"}, {"attention_impl", "flash"},
          {"dropout", 0.0},        {"fp8", "hybrid"},         {"fp8_recipe", "blockwise"}};
}

}  // namespace

TEST_CASE("FP8 blockwise: 1x128 blocks for activations and gradients, 128x128 tiles for weights", "[lower][fp8]") {
  ModelConfig model = load_model(source_path("models/small-gpt.json"));
  for (bool transposed : {true, false}) {
    INFO("fp8_columnwise " << (transposed ? "transposed" : "native"));
    const Topology topology = blockwise_topology(transposed);
    const Plan plan = make_plan(blockwise_plan(), model, topology);
    const StepProgram program = lower_program(model, topology, plan);
    REQUIRE(check_program(program).empty());
    const int64_t layers = model.num_hidden_layers, microbatches = plan.num_microbatches();
    int64_t cast_both = 0, weight_casts = 0, weight_transposes = 0, wgrads = 0, dgrads = 0, tiles = 0;
    double tile_bytes = 0, tile_elements = 0;
    for (const Op& op : program.roles[0].ops) {
      INFO(to_string(op.name) << " " << op.buffer);
      if (op.kind == OpKind::alloc) {
        CHECK(op.buffer.rfind("fp8.", 0) != 0);  // no scale, amax or history
        double elements = 1;
        for (int64_t d : op.shape) elements *= double(d);
        if (op.dtype == Dtype::fp8_tile_e4m3) {  // a layer's copies: its elements and a 4-byte scale per tile
          CHECK(op.buffer.rfind("fp8w", 0) == 0);
          CHECK(op.bytes == elements + std::ceil(elements / 4096));
          tile_bytes += op.bytes;
          tile_elements += elements;
          ++tiles;
        } else if (is_fp8_storage(op.dtype)) {  // the codes and a 4-byte scale per 128
          CHECK((op.dtype == Dtype::fp8_block_e4m3 || op.dtype == Dtype::fp8_block_e5m2));
          CHECK(op.bytes == elements * 33 / 32);
        }
      }
      CHECK(op.name != OpName::fp8_amax);
      CHECK(op.name != OpName::fp8_absmax);
      CHECK(op.name != OpName::fp8_transpose);  // activations: each copy cast from the values
      cast_both += op.name == OpName::fp8_cast_transpose;
      if (op.name == OpName::fp8_weights) {
        CHECK(op.inputs.at(0).rfind("weights.L", 0) == 0);
        ++weight_casts;
      }
      if (op.name == OpName::fp8_weights_transpose) {  // the tiles transposed: no arithmetic
        CHECK(op.inputs.at(0).rfind("fp8w.L", 0) == 0);
        CHECK(op.flops == 0);
        ++weight_transposes;
      }
      if (op.kind == OpKind::gemm && op.grad == Grad::wgrad && op.fp8_slots[0] >= 0) {
        CHECK(ends_with(op.inputs.at(0), "_f8_T"));
        CHECK(ends_with(op.inputs.at(1), "_f8_T"));
        ++wgrads;
      }
      if (op.kind == OpKind::gemm && op.grad == Grad::dgrad && op.fp8_slots[0] >= 0) {
        CHECK(is_fp8_transposed_copy(op.inputs.at(1)) == transposed);  // else the row-wise tiles themselves
        ++dgrads;
      }
    }
    CHECK(cast_both == layers * microbatches * 8);  // GeLU's 4 kept inputs and 4 output gradients
    CHECK(weight_casts == layers);
    CHECK(weight_transposes == (transposed ? layers : 0));
    CHECK(tiles == layers * (transposed ? 2 : 1));
    CHECK(wgrads == layers * microbatches * 4);  // GeLU: qkv, attn_out, mlp_up, mlp_down
    CHECK(dgrads == wgrads);
    CHECK(tile_bytes - tile_elements < tile_elements / 4000);  // the tiles' scales: a byte per 4096
  }
}

TEST_CASE("FP8 blockwise: the cheap path agrees with memory and quick_estimate (small-gpt on 8 H100)",
          "[search][fp8]") {
  ModelConfig model = load_model(source_path("models/small-gpt.json"));
  Topology topology = load_topology(source_path("topologies/dgx-h100.json"), 1);
  REQUIRE(topology.node.device.fp8_blockwise);
  SearchSpace space;
  space.global_batch_size = 16;
  space.attention_impl = AttentionImpl::flash;
  space.micro_batch_sizes = {1, 2};
  space.fp8.format = Fp8Format::hybrid;
  space.fp8.scaling = Fp8Scaling::blockwise;
  CHECK(check_cheap_path(model, topology, space, 3) > 0);
}

TEST_CASE("FP8 blockwise: Megatron-LM's arguments name the recipe and no delayed-scaling flag", "[lower][fp8]") {
  ModelConfig model = load_model(source_path("models/small-gpt.json"));
  const MegatronArguments args = megatron_arguments(make_plan(blockwise_plan(), model, blockwise_topology(true)),
                                                    model);
  std::string all;
  for (const std::string& a : args.arguments) all += a + "\n";
  CHECK(all.find("--fp8-format hybrid\n") != std::string::npos);
  CHECK(all.find("--fp8-recipe blockwise\n") != std::string::npos);
  CHECK(all.find("--fp8-amax") == std::string::npos);
}

TEST_CASE("FP8 blockwise: refused on a device without it, with experts, and with dimensions not of 128",
          "[lower][fp8]") {
  const auto message = plan_refusal;
  const Json j = blockwise_plan();
  CHECK_THAT(message(j, "small-gpt", test_topology()),
             Catch::Contains("key 'fp8_recipe' = \"blockwise\"") && Catch::Contains("its key fp8_blockwise") &&
                 Catch::Contains("valid: \"delayed\" or \"tensorwise\""));
  CHECK_THAT(message(j, "tiny-moe", blockwise_topology(true)), Catch::Contains("mixtures of experts"));
  CHECK_THAT(message(j, "tiny", blockwise_topology(true)),
             Catch::Contains("hidden_size = 64") && Catch::Contains("multiples of 128"));
  Json sp = j;  // tp 2 with SP: shards of 128 tokens pass; one sequence a microbatch, 64, does not
  sp["tp_size"] = 2;
  sp["sequence_parallel"] = true;
  CHECK(message(sp, "small-gpt", blockwise_topology(true)) == "accepted");
  sp["micro_batch_size"] = 1;
  CHECK_THAT(message(sp, "small-gpt", blockwise_topology(true)),
             Catch::Contains("a sequence-parallel shard's tokens (those / tp_size) = 64"));
  Json margin = j;
  margin["fp8_margin"] = 1;
  CHECK_THAT(message(margin, "small-gpt", blockwise_topology(true)),
             Catch::Contains("key 'fp8_margin'") && Catch::Contains("fp8_recipe is \"blockwise\""));
}

TEST_CASE("FP8 blockwise: fp32 scales travel in the plan and the program", "[lower][fp8]") {
  ModelConfig model = load_model(source_path("models/small-gpt.json"));
  const Topology topology = blockwise_topology(true);
  Json j = blockwise_plan();
  const StepProgram pow2 = lower_program(model, topology, make_plan(j, model, topology));
  j["fp8_block_scales"] = "fp32";
  const Plan plan = make_plan(j, model, topology);
  CHECK_FALSE(plan.fp8.power_of_two_scales);
  CHECK(plan_to_json(plan).at("fp8_block_scales") == "fp32");
  const StepProgram program = lower_program(model, topology, plan);
  std::ostringstream text;
  write_program_json(program, &text);
  CHECK(text.str().find("\"block_scales\":\"fp32\"") != std::string::npos);
  CHECK_FALSE(parse_program_json_text(text.str(), "program.json").fp8.power_of_two_scales);
  std::ostringstream pow2_text;
  write_program_json(pow2, &pow2_text);
  CHECK(pow2_text.str().find("block_scales") == std::string::npos);
  CHECK(parse_program_json_text(pow2_text.str(), "program.json").fp8.power_of_two_scales);
  CHECK_THAT(plan_refusal(j, "small-gpt", load_topology(source_path("topologies/dgx-b200.json"), 1)),
             Catch::Contains("key 'fp8_block_scales' = \"fp32\"") && Catch::Contains("powers of two"));
  Json delayed = j;
  delayed["fp8_recipe"] = "delayed";
  CHECK_THAT(plan_refusal(delayed, "small-gpt", topology),
             Catch::Contains("key 'fp8_block_scales'") && Catch::Contains("fp8_recipe is \"delayed\""));
  const MegatronArguments args = megatron_arguments(plan, model);
  std::string notes;
  for (const std::string& n : args.notes) notes += n + "\n";
  CHECK(notes.find("NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1") != std::string::npos);
}

TEST_CASE("FP8 blockwise: check_program refuses block buffers the recipe does not store so", "[lower][fp8]") {
  ModelConfig model = load_model(source_path("models/small-gpt.json"));
  const Topology topology = blockwise_topology(true);
  const StepProgram program = lower_program(model, topology, make_plan(blockwise_plan(), model, topology));
  REQUIRE(check_program(program).empty());
  StepProgram mx = program;  // blockwise buffers in an MXFP8 program
  mx.fp8.scaling = Fp8Scaling::mxfp8;
  CHECK(any_error_contains(check_program(mx), "in a program whose fp8 recipe is mxfp8"));
  StepProgram tiled = program;  // an activation in 128x128 tiles
  for (Op& op : tiled.roles[0].ops) {
    if (op.kind == OpKind::alloc && op.dtype == Dtype::fp8_block_e4m3) {
      op.dtype = Dtype::fp8_tile_e4m3;
      break;
    }
  }
  CHECK(any_error_contains(check_program(tiled), "of dtype fp8_tile_e4m3 (class workspace) in a program whose fp8 "
                                                 "recipe is blockwise"));
  StepProgram ragged = program;  // rows not whole 128-row bands
  for (Op& op : ragged.roles[0].ops) {
    if (op.kind == OpKind::alloc && op.dtype == Dtype::fp8_block_e4m3 && op.shape.size() > 1) {
      op.shape = {64, op.shape.back()};
      break;
    }
  }
  CHECK(any_error_contains(check_program(ragged), "(fp8_block_e4m3) of 64 rows of"));
}
