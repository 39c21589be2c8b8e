// Lowering of context parallelism (the p2p ring, allgather, a2a) and FP8 (delayed and current
// scaling) in closed form: the bytes each exchange moves, the ops each recipe adds, the memory kept.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <set>

#include "cost_model.hpp"
#include "errors.hpp"
#include "lower.hpp"
#include "lower_context.hpp"
#include "lower_fixtures.hpp"
#include "megatron_export.hpp"
#include "memory.hpp"
#include "profile.hpp"
#include "program_check.hpp"

using namespace stepcast;
using namespace stepcast::test;

TEST_CASE("context parallelism: the ring and the gathered kind move K/V in closed form", "[lower]") {
  // Per layer and microbatch, a rank holds s = seq/cp tokens and K/V of 2·kv_heads/tp·d per token.
  // p2p: forward cp−1 K/V blocks to cp_next; backward cp−1 blocks again and cp dK/dV
  // accumulators. all_gather: forward one gather of the sequence's K/V; backward a gather and a
  // reduce_scatter of as much. Flash blocks: cp per pass on the ring, one over all rows gathered.
  ModelConfig model = load_model(source_path("models/tiny.json"));
  Topology topology = test_topology();
  for (int cp : {2, 4}) {
    for (const char* comm : {"p2p", "allgather"}) {
      INFO("cp " << cp << " " << comm);
      Json j = {{"tp_size", 2},
                {"context_parallel_size", cp},
                {"cp_comm_type", comm},
                {"micro_batch_size", 2},
                {"global_batch_size", 4},
                {"dtype", "fp32"},
                {"attention_impl", "flash"},
                {"sequence_parallel", true}};
      Plan plan = make_plan(j, model, topology);
      StepProgram p = lower_program(model, topology, plan);
      REQUIRE(check_program(p).empty());
      CHECK(p.cp_size == cp);
      const int64_t s = model.seq_length / cp, b = 2;
      const double kv_block = double(s) * b * 2 * (model.num_key_value_heads / 2) * model.head_dim() * 4;
      const double passes = double(model.num_hidden_layers) * plan.num_microbatches();
      double sent = 0, gathered = 0, scattered = 0;
      int64_t flash_forward = 0, flash_backward = 0;
      for (const Op& op : p.roles[0].ops) {
        if (op.kind == OpKind::send) {
          CHECK(op.peer == Peer::cp_next);
          CHECK(op.bytes == kv_block);
          sent += op.bytes;
        }
        if (op.kind == OpKind::recv) CHECK(op.peer == Peer::cp_prev);
        if (op.name == OpName::cp_kv) {
          CHECK(op.group == GroupKind::cp);
          gathered += op.bytes;
        }
        if (op.name == OpName::cp_dkv && op.kind == OpKind::reduce_scatter) scattered += op.bytes;
        if (op.name == OpName::flash) {
          (op.phase == Phase::backward ? flash_backward : flash_forward) += 1;
          CHECK(op.m == s);
          CHECK(op.n == (std::string(comm) == "p2p" ? s : model.seq_length));
        }
        if (op.name == OpName::grad_bucket) CHECK(op.group == GroupKind::dp_cp);
      }
      if (std::string(comm) == "p2p") {
        CHECK(sent == Approx(passes * (3 * cp - 2) * kv_block).epsilon(1e-12));
        CHECK(gathered == 0);
        CHECK(flash_forward == int64_t(passes) * cp);
        CHECK(flash_backward == int64_t(passes) * cp);
      } else {
        CHECK(sent == 0);
        CHECK(gathered == Approx(passes * 2 * cp * kv_block).epsilon(1e-12));
        CHECK(scattered == Approx(passes * cp * kv_block).epsilon(1e-12));
        CHECK(flash_forward == int64_t(passes));
      }
    }
  }
}

TEST_CASE("context parallelism: a2a (Ulysses) moves q, k, v and the output in closed form", "[lower]") {
  // Per layer and microbatch, forward: qkv [s, b, (a + 2kv)·d/tp] all-to-all'd to the whole
  // sequence for 1/cp of the heads, ctx [s, b, a·d/tp] back; backward: d_ctx out and d_qkv back,
  // as many bytes. The attention core runs on [seq, b·a/(tp·cp)] as without context parallelism.
  ModelConfig model = load_model(source_path("models/tiny-gpt.json"));
  Topology topology = test_topology();
  for (int cp : {2, 4}) {
    INFO("cp " << cp);
    const int tp = 4 / cp;
    Json j = {{"tp_size", tp},
              {"context_parallel_size", cp},
              {"cp_comm_type", "a2a"},
              {"micro_batch_size", 2},
              {"global_batch_size", 4},
              {"dtype", "fp32"},
              {"attention_impl", "flash"}};
    Plan plan = make_plan(j, model, topology);
    StepProgram p = lower_program(model, topology, plan);
    REQUIRE(check_program(p).empty());
    const int64_t s = model.seq_length / cp, b = 2, d = model.head_dim();
    const int64_t heads = model.num_attention_heads / tp, kv = model.num_key_value_heads / tp;
    const double qkv_bytes = double(s) * b * (heads + 2 * kv) * d * 4, ctx_bytes = double(s) * b * heads * d * 4;
    const double passes = double(model.num_hidden_layers) * plan.num_microbatches();
    double moved = 0;
    int64_t exchanges = 0, flash = 0;
    for (const Op& op : p.roles[0].ops) {
      CHECK(op.kind != OpKind::send);
      if (op.kind == OpKind::all_to_all) {
        CHECK(op.name == OpName::cp_a2a);
        CHECK(op.group == GroupKind::cp);
        CHECK(op.algorithm == Algorithm::pairwise);
        CHECK((op.bytes == qkv_bytes || op.bytes == ctx_bytes));
        moved += op.bytes;
        ++exchanges;
      }
      if (op.name == OpName::flash) {
        ++flash;
        CHECK(op.m == model.seq_length);
        CHECK(op.n == model.seq_length);
        CHECK(op.batch == b * heads / cp);
      }
    }
    CHECK(exchanges == int64_t(passes) * 4);
    CHECK(moved == Approx(passes * 2 * (qkv_bytes + ctx_bytes)).epsilon(1e-12));
    CHECK(flash == int64_t(passes) * 2);
  }
}

TEST_CASE("FP8: linear layers read FP8 copies and keep their FP8 inputs, in closed form", "[lower][fp8]") {
  ModelConfig model = load_model(source_path("models/tiny.json"));
  Topology topology = test_topology();
  for (const char* attention : {"materialized", "flash"}) {
    Json base = {{"dp_size", 1},    {"micro_batch_size", 2},       {"global_batch_size", 2},
                 {"dtype", "fp32"}, {"attention_impl", attention}, {"dropout", 0.0}};
    Json with = base;
    with["fp8"] = "hybrid";
    Plan plain = make_plan(base, model, topology), fp8 = make_plan(with, model, topology);
    StepProgram program = lower_program(model, topology, fp8);
    REQUIRE(check_program(program).empty());
    CHECK(program.fp8_slots == model.num_hidden_layers * kFp8SlotsPerLayer);
    int64_t gemms = 0, fp8_gemms = 0, casts = 0, weight_casts = 0;
    for (const Op& op : program.roles[0].ops) {
      if (op.kind == OpKind::gemm && op.name != OpName::logits) {
        ++gemms;
        fp8_gemms += op.fp8_slots[0] >= 0;
      }
      if (op.name == OpName::logits) CHECK(op.fp8_slots[0] == -1);  // the output layer stays in the plan's dtype
      casts += op.name == OpName::fp8_cast;
      weight_casts += op.name == OpName::fp8_weights;
    }
    CHECK(fp8_gemms == gemms);
    // One weight cast per layer a step; per layer and microbatch 4 forward casts (ln1, ctx, ln2,
    // act) and 5 gradient casts (qkv, attn_out, mlp_gate, mlp_up, mlp_down).
    CHECK(weight_casts == model.num_hidden_layers);
    CHECK(casts == model.num_hidden_layers * (model.mlp == MlpKind::swiglu ? 9 : 8));
    // What a layer keeps: ln1, ln2 and act in FP8 (one byte) instead of fp32, and ctx's FP8 copy
    // beside it (flash reads ctx again; materialized attention does not keep it then).
    const double s = double(model.seq_length), b = 2, h = double(model.hidden_size),
                 f = double(model.intermediate_size);
    double expected = -(2 * s * b * h + s * b * f) * 3 + s * b * h;
    if (std::string(attention) == "materialized") expected -= 4 * s * b * h;
    CHECK(layer_activation_bytes(model, fp8) - layer_activation_bytes(model, plain) == Approx(expected));
  }
}

TEST_CASE("FP8 current scaling: an amax before each cast, over tp for sequence-parallel inputs, no history",
          "[lower][fp8]") {
  ModelConfig model = load_model(source_path("models/tiny.json"));
  Topology topology = test_topology();
  Json j = {{"tp_size", 2},           {"sequence_parallel", true}, {"micro_batch_size", 2},
            {"global_batch_size", 2}, {"dtype", "fp32"},           {"dropout", 0.0},
            {"fp8", "e4m3"},          {"fp8_recipe", "tensorwise"}};
  Plan plan = make_plan(j, model, topology);
  StepProgram program = lower_program(model, topology, plan);
  REQUIRE(check_program(program).empty());
  CHECK(program.fp8.scaling == Fp8Scaling::current);
  int64_t casts = 0, amaxes = 0, tp_amaxes = 0;
  for (const Op& op : program.roles[0].ops) {
    CHECK(op.name != OpName::fp8_scale_update);
    CHECK(op.buffer != "fp8.history");
    if (op.name == OpName::fp8_cast) {
      ++casts;
      CHECK(std::count(op.outputs.begin(), op.outputs.end(), "fp8.scale") == 1);
    }
    if (op.name == OpName::fp8_absmax) ++amaxes;
    if (op.name == OpName::fp8_amax) {
      CHECK(op.group == GroupKind::tp);
      CHECK(op.fp8_slots[0] ==
            fp8_slot_layout(model, plan)
                .slot(op.layer, op.microbatch, tp_amaxes % 2 == 0 ? Fp8Slot::qkv_x : Fp8Slot::mlp_x));
      ++tp_amaxes;
    }
  }
  CHECK(casts == model.num_hidden_layers * (model.mlp == MlpKind::swiglu ? 9 : 8));
  CHECK(amaxes == casts);
  CHECK(tp_amaxes == 2 * model.num_hidden_layers);  // ln1 and ln2, cast before their gathers
  // Megatron's words: --fp8-recipe tensorwise, without delayed scaling's flags.
  auto args = megatron_arguments(plan, model);
  const std::string line = Json(args.arguments).dump();
  CHECK_THAT(line, Catch::Contains("tensorwise"));
  CHECK_THAT(line, !Catch::Contains("--fp8-amax-history-len"));
}

TEST_CASE("FP8 current scaling: a GEMM reads the scale its operands were cast with under every pipeline schedule",
          "[lower][fp8]") {
  // The FP8 copy of a linear layer's input waits for its wgrad while later microbatches' forwards
  // cast the same layer's inputs: under current scaling each microbatch's input has its own slot,
  // which no other cast writes before the wgrad reads it (as Transformer Engine keeps the scale
  // with each saved FP8 tensor). Every FP8 GEMM's activation operands (x or d_y; a wgrad's x and
  // d_y) are held to that.
  ModelConfig model = load_model(source_path("models/tiny.json"));
  Topology topology = test_topology();
  for (const char* schedule : {"1f1b", "gpipe", "interleaved_1f1b"}) {
    for (const char* recipe : {"tensorwise", "delayed"}) {
      INFO(schedule << " " << recipe);
      Json j = {{"pp_size", 2},           {"micro_batch_size", 1}, {"global_batch_size", 4},
                {"dtype", "fp32"},        {"dropout", 0.0},        {"schedule", schedule},
                {"fp8", "hybrid"},        {"fp8_recipe", recipe}};
      if (std::string(schedule) == "interleaved_1f1b") j["virtual_pp_size"] = 2;
      Plan plan = make_plan(j, model, topology);
      StepProgram program = lower_program(model, topology, plan);
      REQUIRE(check_program(program).empty());
      const bool current = std::string(recipe) == "tensorwise";
      // Each layer's slots; under current scaling one per layer, input kind (4) and microbatch a
      // chunk holds at once: 1F1B's first stage pp of the 4, GPipe's and (its warm-up this deep)
      // interleaved's every one.
      const int64_t held = fp8_slot_layout(model, plan).inputs;
      CHECK(held == (!current ? 1 : std::string(schedule) == "1f1b" ? 2 : 4));
      CHECK(program.fp8_slots == model.num_hidden_layers * (kFp8SlotsPerLayer + (current ? 4 * held : 0)));
      int64_t wgrads = 0;
      for (const Role& role : program.roles) {
        std::map<std::string, int32_t> cast_slot;  // an FP8 input's buffer → the slot its cast wrote
        std::map<int32_t, int64_t> writes;        // slot → scale writes so far
        std::map<std::string, int64_t> writes_at_cast;
        for (const Op& op : role.ops) {
          const bool sets_scale = std::count(op.outputs.begin(), op.outputs.end(), "fp8.scale") > 0;
          if (op.name == OpName::fp8_cast) {
            CHECK(sets_scale == current);
            cast_slot[op.outputs[0]] = op.fp8_slots[0];
            if (sets_scale) ++writes[op.fp8_slots[0]];
            writes_at_cast[op.outputs[0]] = writes[op.fp8_slots[0]];
          } else if (sets_scale && op.fp8_slots[0] >= 0 && op.name != OpName::fp8_weights) {
            ++writes[op.fp8_slots[0]];
          }
          if (op.kind != OpKind::gemm || op.fp8_slots[0] < 0) continue;
          for (size_t i = 0; i < (op.grad == Grad::wgrad ? 2u : 1u); ++i) {
            REQUIRE(cast_slot.count(op.inputs[i]) == 1);
            CHECK(op.fp8_slots[i] == cast_slot[op.inputs[i]]);
            CHECK(writes[op.fp8_slots[i]] == writes_at_cast[op.inputs[i]]);  // not overwritten since
          }
          wgrads += op.grad == Grad::wgrad;
        }
      }
      CHECK(wgrads == model.num_hidden_layers * 4 * (model.mlp == MlpKind::swiglu ? 5 : 4));
    }
  }
}

TEST_CASE("FP8 current scaling with experts: each local expert's own slots, its amax over its rows",
          "[lower][moe][fp8]") {
  // Transformer Engine's grouped linear quantizes each expert's GEMM operands with its own
  // quantizer: under current scaling the expert casts' amax ops read the counts (each local
  // expert's rows into its slot), and the grouped GEMMs read local expert 0's slots (expert l's l
  // after); the kept inputs a slot per microbatch. Delayed scaling keeps the layer's MLP slots.
  ModelConfig model = load_model(source_path("models/tiny-moe.json"));
  Topology topology = test_topology();
  for (const char* recipe : {"tensorwise", "delayed"}) {
    INFO(recipe);
    Json j = {{"dp_size", 2},          {"expert_model_parallel_size", 2}, {"micro_batch_size", 1},
              {"global_batch_size", 8}, {"dtype", "fp32"},                 {"dropout", 0.0},
              {"fp8", "hybrid"},        {"fp8_recipe", recipe},           {"pp_size", 2}};
    Plan plan = make_plan(j, model, topology);
    StepProgram program = lower_program(model, topology, plan);
    REQUIRE(check_program(program).empty());
    const bool current = std::string(recipe) == "tensorwise";
    // pp 2 under 1F1B: the first stage holds 2 of the 4 microbatches at once, so 2 slots a kept input.
    const int64_t local = model.num_experts / 2, layers = model.num_hidden_layers, mbs = program.num_microbatches;
    const int64_t held = current ? 2 : 1, stage_layers = plan.layers_per_stage[0];
    CHECK(mbs == 4);
    CHECK(fp8_slot_layout(model, plan).inputs == held);
    const int64_t dense = layers * (kFp8SlotsPerLayer + (current ? 4 * held : 0));
    CHECK(program.fp8_slots == dense + (current ? layers * local * (kFp8SlotsPerLayer + 4 * held) : 0));
    std::set<int32_t> input_slots;  // the expert inputs' (mlp_x) slots a microbatch's casts take
    int64_t expert_casts = 0, expert_amaxes = 0, grouped = 0;
    const Op* last_amax = nullptr;
    for (const Op& op : program.roles[0].ops) {
      const bool counts = !op.inputs.empty() && op.inputs.back().str().ends_with("counts");
      if (op.name == OpName::fp8_absmax) last_amax = &op;
      if (op.name == OpName::fp8_absmax && counts) ++expert_amaxes;
      if ((op.name == OpName::fp8_cast || op.name == OpName::fp8_cast_transpose) && counts) {
        ++expert_casts;
        CHECK((op.fp8_slots[0] >= dense) == current);
        CHECK(op.fp8_slots[0] + (current ? local : 1) <= program.fp8_slots);
        if (current) {  // its amax just before, on the same slot, over the same rows
          REQUIRE(last_amax != nullptr);
          CHECK(last_amax->fp8_slots[0] == op.fp8_slots[0]);
          CHECK(last_amax->inputs[0] == op.inputs[0]);
        }
        if (op.outputs[0].str().find("xe_f8") != std::string::npos) input_slots.insert(op.fp8_slots[0]);
      }
      if (op.kind == OpKind::gemm && op.name == OpName::expert_up && op.fp8_slots[0] >= 0) {
        ++grouped;
        const Fp8Slot a = op.grad == Grad::dgrad ? Fp8Slot::mlp_up_d : Fp8Slot::mlp_x;
        const Fp8Slot b = op.grad == Grad::none    ? Fp8Slot::mlp_up_w
                          : op.grad == Grad::dgrad ? Fp8Slot::mlp_up_w
                                                   : Fp8Slot::mlp_up_d;
        CHECK(op.fp8_slots[0] == fp8_slot_layout(model, plan).expert_slot(op.layer, op.microbatch, a));
        CHECK(op.fp8_slots[1] == fp8_slot_layout(model, plan).expert_slot(op.layer, op.microbatch, b));
      }
    }
    CHECK(expert_casts > 0);
    CHECK(grouped == stage_layers * mbs * 3);
    CHECK(expert_amaxes == (current ? expert_casts : 0));
    // Current scaling: each layer of the stage 2 input slots (the microbatches it holds at once, each
    // expert l at l after); delayed: the layer's MLP slot.
    CHECK(int64_t(input_slots.size()) == stage_layers * held);
  }
}

TEST_CASE("FP8 under ZeRO-3: the gathered weights cast at each use, no FP8 copy kept", "[lower][fp8]") {
  // Megatron-FSDP without fp8_param_gather gathers the parameters in the plan's dtype and
  // Transformer Engine casts them at each use: a forward and a backward cast of every layer per
  // microbatch (full recompute re-runs the forward on the backward's gathered weights and their
  // copy), each into a transient copy freed with the gathered weights;
  // on a device that reads FP8 row-wise only, the backward's transposed for its dgrads.
  ModelConfig model = load_model(source_path("models/tiny.json"));
  Topology topology = test_topology();
  topology.node.device.fp8_transposed_copies = true;
  for (const char* recompute : {"none", "full"}) {
    INFO(recompute);
    Json j = {{"dp_size", 2},    {"zero_stage", 3},  {"micro_batch_size", 1}, {"global_batch_size", 4},
              {"dtype", "fp32"}, {"dropout", 0.0},   {"fp8", "hybrid"},       {"recompute", recompute}};
    Plan plan = make_plan(j, model, topology);
    StepProgram program = lower_program(model, topology, plan);
    REQUIRE(check_program(program).empty());
    const int64_t uses = model.num_hidden_layers * program.num_microbatches;
    int64_t casts = 0, transposes = 0, backward_casts = 0;
    std::set<std::string> live;
    for (const Op& op : program.roles[0].ops) {
      if (op.kind == OpKind::alloc && op.buffer.str().rfind("fp8w", 0) == 0) {
        CHECK_FALSE(op.persistent);
        live.insert(op.buffer.str());
      }
      if (op.kind == OpKind::free) live.erase(op.buffer.str());
      if (op.name == OpName::fp8_weights) {
        ++casts;
        backward_casts += op.phase == Phase::backward;
        CHECK(op.inputs[0].str().rfind("wfull.", 0) == 0);
      }
      if (op.name == OpName::fp8_weights_transpose) {
        ++transposes;
        CHECK(op.phase == Phase::backward);
      }
    }
    CHECK(live.empty());  // every copy freed with its gathered weights
    CHECK(casts == 2 * uses);
    CHECK(backward_casts == uses);
    CHECK(transposes == uses);
  }
}

TEST_CASE("FP8 needs a device with an FP8 peak: the simulator's cost model names the key", "[lower][fp8]") {
  Topology a100 = load_topology(source_path("topologies/dgx-a100-80gb.json"));
  Topology h100 = load_topology(source_path("topologies/dgx-h100.json"));
  ComputeCostModel bf16(h100.node.device, Dtype::bf16, roofline_profile(h100), h100.file);
  bf16.use_fp8(h100.node.device, h100.file);
  Op gemm;
  gemm.kind = OpKind::gemm;
  gemm.name = OpName::qkv;
  gemm.batch = 1;
  gemm.m = gemm.n = gemm.k = 8192;
  gemm.flops = 2.0 * 8192 * 8192 * 8192;
  double sixteen = bf16.op_time_s(gemm);
  gemm.fp8_slots = {0, 1};
  gemm.bytes = 3.0 * 8192 * 8192;  // (the roofline's compute term dominates either way)
  // H100 SXM: 1978.9 FP8 against 989.4 bf16 TFLOP/s (topologies/dgx-h100.json).
  CHECK(bf16.op_time_s(gemm) == Approx(sixteen * 989.4 / 1978.9).epsilon(1e-3));
  ComputeCostModel a(a100.node.device, Dtype::bf16, roofline_profile(a100), a100.file);
  try {
    a.use_fp8(a100.node.device, a100.file);
    FAIL("A100 has no FP8 peak");
  } catch (const InputError& e) {
    CHECK_THAT(e.what(), Catch::Contains("node.device.peak_flops_per_s.fp8"));
  }
}

TEST_CASE("FP8 on a device that reads column-wise operands only transposed: weights kept transposed, wgrad operands "
          "transposed before their GEMM",
          "[lower][fp8]") {
  // fp8_columnwise transposed (Hopper): one fp8_transpose a layer a step (after its weight cast,
  // reading and writing one byte an element), every dgrad GEMM reading the transposed copy, and
  // one more byte a layer parameter in the weights class; every wgrad GEMM reads transient
  // transposed copies of its x and d_y (workspace): x's written just before it (SwiGLU's gate and
  // up wgrads share their input's), d_y's by its FP8 cast (fp8_cast_transpose), both freed after;
  // native (the default) keeps none of them.
  ModelConfig model = load_model(source_path("models/tiny.json"));
  Topology native = test_topology();
  Topology transposed = native;
  transposed.node.device.fp8_transposed_copies = true;
  Json base = {{"dp_size", 1},    {"micro_batch_size", 2},     {"global_batch_size", 4},
               {"dtype", "fp32"}, {"attention_impl", "flash"}, {"dropout", 0.0},
               {"fp8", "hybrid"}};
  Plan plan = make_plan(base, model, native);
  StepProgram a = lower_program(model, native, plan), b = lower_program(model, transposed, plan);
  REQUIRE(check_program(b).empty());
  int64_t weight_transposes = 0, operand_transposes = 0, dgrads_native = 0, dgrads_read_copy = 0;
  int64_t wgrads_native = 0, wgrads_read_copies = 0;
  double copy_elements = 0;
  const std::vector<Op>& ops = b.roles[0].ops;
  std::map<std::string, double> bytes_of;  // live buffers
  std::map<std::string, int64_t> x_copy_readers;
  std::set<std::string> written_by_cast;
  int64_t cast_transposes = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    if (op.kind == OpKind::alloc) bytes_of[op.buffer] = op.bytes;
    if (op.name == OpName::fp8_cast_transpose) {
      // [d, scale, amax] → [d8, d8_T, amax]: the gradient's codes row-wise and transposed in one
      // pass (d read, both written).
      ++cast_transposes;
      REQUIRE(op.outputs.size() >= 2);
      CHECK(op.outputs[1] == fp8_transposed_operand_name(op.outputs[0]));
      CHECK(double(op.m) * double(op.n) == bytes_of.at(op.outputs[0]));
      CHECK(op.bytes == bytes_of.at(op.inputs[0]) + 2 * bytes_of.at(op.outputs[0]));
      written_by_cast.insert(op.outputs[1]);
    }
    if (op.name == OpName::fp8_weights_transpose) {
      CHECK(op.bytes > 0);
      CHECK(op.phase == Phase::forward);
      ++weight_transposes;
    }
    if (op.name == OpName::fp8_transpose) {
      CHECK(op.bytes > 0);
      // [x8] → [x8_T]: m·n bytes read and written, the copy allocated just for it (workspace).
      ++operand_transposes;
      REQUIRE(op.inputs.size() == 1);
      REQUIRE(op.outputs.size() == 1);
      CHECK(op.outputs[0] == fp8_transposed_operand_name(op.inputs[0]));
      CHECK(double(op.m) * double(op.n) == bytes_of.at(op.inputs[0]));
      CHECK(bytes_of.at(op.outputs[0]) == bytes_of.at(op.inputs[0]));
      CHECK(op.bytes == 2 * bytes_of.at(op.inputs[0]));
    }
    if (op.kind == OpKind::alloc && op.buffer.rfind("fp8wt.", 0) == 0) {
      CHECK(op.persistent);
      copy_elements += op.bytes;  // one byte an element
    }
    if (op.kind == OpKind::gemm && op.grad == Grad::dgrad && op.fp8_slots[0] >= 0) {
      bool reads_copy = false;
      for (const std::string& input : op.inputs) reads_copy = reads_copy || is_fp8_transposed_copy(input);
      dgrads_read_copy += reads_copy;
    }
    if (op.kind == OpKind::gemm && op.grad == Grad::wgrad && op.fp8_slots[0] >= 0) {
      REQUIRE(op.inputs.size() == 4);
      CHECK(op.inputs[2] == fp8_transposed_operand_name(op.inputs[0]));
      CHECK(op.inputs[3] == fp8_transposed_operand_name(op.inputs[1]));
      CHECK(written_by_cast.count(op.inputs[3]) == 1);  // d_y's, by its cast
      ++wgrads_read_copies;
      ++x_copy_readers[op.inputs[2]];
    }
    if (op.kind == OpKind::free) bytes_of.erase(op.buffer);
  }
  // Each copy made once: SwiGLU's gate and up wgrads share their input's (ln2), the others one each.
  int64_t shared = 0;
  for (const auto& [name, readers] : x_copy_readers) {
    CHECK(readers <= 2);
    shared += readers - 1;
    CHECK(bytes_of.count(name) == 0);  // freed
  }
  CHECK(shared == model.num_hidden_layers * plan.num_microbatches());
  for (const Op& op : a.roles[0].ops) {
    CHECK(op.name != OpName::fp8_transpose);
    CHECK(op.name != OpName::fp8_weights_transpose);
    if (op.kind == OpKind::gemm && op.grad == Grad::dgrad && op.fp8_slots[0] >= 0) ++dgrads_native;
    if (op.kind == OpKind::gemm && op.grad == Grad::wgrad && op.fp8_slots[0] >= 0) {
      CHECK(op.inputs.size() == 2);
      ++wgrads_native;
    }
  }
  CHECK(weight_transposes == model.num_hidden_layers);
  CHECK(dgrads_read_copy == dgrads_native);
  CHECK(dgrads_native > 0);
  CHECK(wgrads_native > 0);
  CHECK(wgrads_read_copies == wgrads_native);
  CHECK(operand_transposes == wgrads_native - shared);
  CHECK(cast_transposes == wgrads_native);
  for (const auto& [name, bytes] : bytes_of) CHECK(name.find("_T") == std::string::npos);  // every copy freed
  const double weights_a = memory_report(a, native).ranks[0].weights_bytes;
  const double weights_b = memory_report(b, transposed).ranks[0].weights_bytes;
  CHECK(copy_elements > 0);
  CHECK(weights_b - weights_a == Approx(copy_elements).epsilon(1e-12));
  // The transient copies are workspace, live at the start of the backward: the peak grows.
  CHECK(memory_report(b, transposed).ranks[0].peak_bytes > memory_report(a, native).ranks[0].peak_bytes);
}
