// The StepProgram's invariants on many plans, and the checker itself on broken programs.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "cost_model.hpp"
#include "errors.hpp"
#include "lower.hpp"
#include "lower_context.hpp"
#include "lower_fixtures.hpp"
#include "memory.hpp"
#include "program_check.hpp"
#include "program_json.hpp"
#include "profile.hpp"
#include "program_stats.hpp"
#include "step_result.hpp"

using namespace stepcast;
using namespace stepcast::test;

namespace {

StepProgram lower_case(const PlanCase& c, ModelConfig* model_out = nullptr, Plan* plan_out = nullptr) {
  ModelConfig model = load_model(source_path(c.model_file));
  Topology topology = test_topology();
  Plan plan = make_plan(c.plan_json, model, topology);
  if (model_out) *model_out = model;
  if (plan_out) *plan_out = plan;
  return lower_program(model, topology, plan);
}

}  // namespace

TEST_CASE("every lowered program passes the invariant checker", "[lower]") {
  auto cases = lowering_cases();
  REQUIRE(cases.size() >= 40);
  for (const auto& c : cases) {
    INFO(c.label());
    StepProgram program = lower_case(c);
    auto errors = check_program(program);
    INFO((errors.empty() ? std::string() : errors.front()));
    CHECK(errors.empty());
    auto list_errors = check_list_order_progress(program);
    INFO((list_errors.empty() ? std::string() : list_errors.front()));
    CHECK(list_errors.empty());
  }
}

TEST_CASE("every op's memory-bound family is one a profile may name", "[lower][profile]") {
  const std::vector<std::string>& families = memory_families();
  std::set<std::string> seen;
  for (const auto& c : lowering_cases()) {
    StepProgram program = lower_case(c);
    for (const Role& role : program.roles) {
      for (const Op& op : role.ops) {
        if (!is_compute(op.kind)) continue;
        for (const char* norm : {"rmsnorm", "layernorm"}) {
          std::string family = memory_family(op, norm);
          if (family.empty()) continue;
          INFO(c.label() << ": " << to_string(op.kind) << " " << to_string(op.name) << " → " << family);
          CHECK(std::find(families.begin(), families.end(), family) != families.end());
          seen.insert(family);
        }
      }
    }
  }
  CHECK(seen.size() >= 15);  // the tiny models' plans reach most of them
}

TEST_CASE("forward GEMM and attention flops sum to the model-flops formula", "[lower]") {
  for (const auto& c : lowering_cases()) {
    INFO(c.label());
    ModelConfig model;
    Plan plan;
    StepProgram program = lower_case(c, &model, &plan);
    ProgramStats stats = program_stats(program);
    ModelConfig padded = model;
    padded.vocab_size = padded_vocab_size(model, plan.tp_size);
    double expected = model_flops_per_token(padded) / 3 * double(program.tokens_per_step);
    CHECK(stats.forward_flops_per_step == Approx(expected).epsilon(1e-12));
  }
}

TEST_CASE("recompute adds exactly the recomputed forward work", "[lower]") {
  ModelConfig model = load_model(source_path("models/tiny-gpt.json"));
  Topology topology = test_topology();
  Json base = {{"tp_size", 2}, {"pp_size", 2}, {"dp_size", 1}, {"micro_batch_size", 1},
               {"global_batch_size", 4}, {"dtype", "fp32"}};
  auto executed = [&](const char* recompute) {
    Json j = base;
    j["recompute"] = recompute;
    return program_stats(lower_program(model, topology, make_plan(j, model, topology)));
  };
  ProgramStats none = executed("none"), full = executed("full"), selective = executed("selective");
  CHECK(none.recompute_flops_per_step == 0);
  CHECK(full.flops_per_step == Approx(none.flops_per_step + full.recompute_flops_per_step));
  // Full recompute redoes every layer's forward: at least the forward GEMMs of the layers.
  double layer_gemm_forward = none.forward_flops_per_step -
                              2.0 * model.hidden_size * padded_vocab_size(model, 2) * 4 * 64;
  CHECK(full.recompute_flops_per_step > layer_gemm_forward);
  CHECK(selective.recompute_flops_per_step > 0);
  CHECK(selective.recompute_flops_per_step < full.recompute_flops_per_step);
}

TEST_CASE("lowering is deterministic and the hash tracks the inputs", "[lower]") {
  auto cases = lowering_cases();
  StepProgram a = lower_case(cases[5]);
  StepProgram b = lower_case(cases[5]);
  hash_program(a);
  hash_program(b);
  CHECK(a.program_sha256 == b.program_sha256);
  CHECK(a.program_sha256.size() == 64);
  PlanCase other = cases[5];
  other.plan_json["dropout"] = 0.05;
  StepProgram c = lower_case(other);
  hash_program(c);
  CHECK(c.program_sha256 != a.program_sha256);
}

TEST_CASE("pipeline ranks send and receive each microbatch once per boundary", "[lower]") {
  ModelConfig model = load_model(source_path("models/tiny.json"));
  Topology topology = test_topology();
  Json j = {{"pp_size", 4}, {"micro_batch_size", 1}, {"global_batch_size", 8}, {"dtype", "fp32"}};
  StepProgram p = lower_program(model, topology, make_plan(j, model, topology));
  for (const Role& role : p.roles) {
    int sends = 0, recvs = 0;
    for (const Op& op : role.ops) {
      sends += op.kind == OpKind::send;
      recvs += op.kind == OpKind::recv;
    }
    int boundaries = (role.pp_stage > 0) + (role.pp_stage < 3);
    CHECK(sends == 8 * boundaries);
    CHECK(recvs == 8 * boundaries);
  }
}

TEST_CASE("without overlap_p2p_comm a stage's next compute waits for its pipeline transfers", "[lower]") {
  ModelConfig model = load_model(source_path("models/tiny.json"));
  Topology topology = test_topology();
  // Megatron's rule is the default: blocking under 1F1B, overlapped under the interleaved schedule.
  Json one_f_one_b = {{"pp_size", 2}, {"micro_batch_size", 1}, {"global_batch_size", 4}, {"dtype", "fp32"}};
  Json interleaved = one_f_one_b;
  interleaved["schedule"] = "interleaved_1f1b";
  interleaved["virtual_pp_size"] = 2;
  CHECK_FALSE(make_plan(one_f_one_b, model, topology).overlap_p2p_comm);
  CHECK(make_plan(interleaved, model, topology).overlap_p2p_comm);
  CHECK(plan_to_json(make_plan(interleaved, model, topology)).at("overlap_p2p_comm") == true);

  // Per role: how many transfers a later compute-stream op (not a free) lists as a dependency,
  // and whether each such op is the first compute-stream op after the transfer.
  auto waited = [&](const Json& j) {
    StepProgram p = lower_program(model, topology, make_plan(j, model, topology));
    INFO(j.dump());
    std::vector<std::string> errors = check_program(p), in_order = check_list_order_progress(p);
    INFO((errors.empty() ? std::string() : errors.front()));
    CHECK(errors.empty());
    INFO((in_order.empty() ? std::string() : in_order.front()));
    CHECK(in_order.empty());  // an in-order executor runs it without deadlock
    int transfers = 0, waited_for = 0, sends_waited = 0;
    for (const Role& role : p.roles) {
      for (const Op& op : role.ops) {
        if (op.kind != OpKind::send && op.kind != OpKind::recv) continue;
        ++transfers;
        const Op* next = nullptr;  // the first compute-stream op after the transfer
        for (size_t i = size_t(op.id) + 1; i < role.ops.size() && !next; ++i) {
          const Op& o = role.ops[i];
          if (o.stream == Stream::compute && o.kind != OpKind::alloc && o.kind != OpKind::free) next = &o;
        }
        bool any = false;
        for (const Op& o : role.ops) {
          if (o.kind == OpKind::free || o.id <= op.id) continue;
          if (std::find(o.deps.begin(), o.deps.end(), op.id) == o.deps.end()) continue;
          if (op.kind == OpKind::send) {
            CHECK(&o == next);  // a send is waited for by that op only
            ++sends_waited;
          }
          any = any || &o == next;
        }
        waited_for += any;
      }
    }
    return std::make_tuple(transfers, waited_for, sends_waited);
  };
  auto [transfers, blocking, sends_blocking] = waited(one_f_one_b);
  CHECK(transfers == 2 * 2 * 4);  // 2 stages, a send and a receive per microbatch and pass
  CHECK(blocking == transfers);
  CHECK(sends_blocking == transfers / 2);
  Json overlapped = one_f_one_b;
  overlapped["overlap_p2p_comm"] = true;
  auto [transfers_overlapped, unused, sends_overlapped] = waited(overlapped);
  CHECK(transfers_overlapped == transfers);
  CHECK(sends_overlapped == 0);  // only frees wait for a send
  (void)unused;
  // GPipe blocks too.
  Json gpipe = one_f_one_b;
  gpipe["schedule"] = "gpipe";
  auto [transfers_gpipe, waited_gpipe, sends_gpipe] = waited(gpipe);
  CHECK(waited_gpipe == transfers_gpipe);
  CHECK(sends_gpipe == transfers_gpipe / 2);
  // So does the interleaved schedule, in Megatron's rounds, from 3 stages on (Megatron's rule):
  // 5 boundaries between the 6 virtual stages, a send and a receive each way, per microbatch.
  Json interleaved_blocking = interleaved;
  interleaved_blocking["overlap_p2p_comm"] = false;
  CHECK_THROWS_WITH(make_plan(interleaved_blocking, model, topology),
                    Catch::Contains("key 'overlap_p2p_comm' = false: blocking pipeline transfers under "
                                    "schedule \"interleaved_1f1b\" need pp_size > 2"));
  model.num_hidden_layers = 6;
  interleaved_blocking["pp_size"] = 3;
  interleaved_blocking["global_batch_size"] = 6;
  auto [transfers_il, waited_il, sends_il] = waited(interleaved_blocking);
  CHECK(transfers_il == 5 * 2 * 2 * 6);
  CHECK(waited_il == transfers_il);
  CHECK(sends_il == transfers_il / 2);
}

TEST_CASE("the blocking interleaved schedule posts a round's transfers together, sends first", "[lower]") {
  // Megatron's send_forward_backward_recv_forward_backward: after a steady forward and backward,
  // one batch; the ops between two compute ops are that batch, and the compute op after it waits
  // for every transfer in it. pp 3 (Megatron-LM today asks for pp > 2 here), vpp 2, m 6, on a
  // 6-layer tiny model (one layer per virtual stage).
  ModelConfig model = load_model(source_path("models/tiny.json"));
  model.num_hidden_layers = 6;
  Topology topology = test_topology();
  Json j = {{"pp_size", 3}, {"micro_batch_size", 1}, {"global_batch_size", 6}, {"dtype", "fp32"},
            {"schedule", "interleaved_1f1b"}, {"virtual_pp_size", 2}, {"overlap_p2p_comm", false}};
  Plan plan = make_plan(j, model, topology);
  REQUIRE(plan.layers_per_stage.size() == 6);
  StepProgram p = lower_program(model, topology, plan);
  std::vector<std::string> errors = check_program(p), in_order = check_list_order_progress(p);
  INFO((errors.empty() ? std::string() : errors.front()));
  CHECK(errors.empty());
  INFO((in_order.empty() ? std::string() : in_order.front()));
  CHECK(in_order.empty());
  int four_way = 0;
  for (const Role& role : p.roles) {
    std::vector<int32_t> batch;  // transfers since the last compute-stream op
    for (const Op& op : role.ops) {
      if (op.kind == OpKind::send || op.kind == OpKind::recv) {
        if (op.kind == OpKind::send) {
          for (int32_t b : batch) CHECK(role.ops[size_t(b)].kind == OpKind::send);  // sends first
        }
        batch.push_back(op.id);
        continue;
      }
      if (op.stream != Stream::compute || op.kind == OpKind::alloc || op.kind == OpKind::free) continue;
      for (int32_t b : batch) CHECK(std::find(op.deps.begin(), op.deps.end(), b) != op.deps.end());
      four_way += batch.size() == 4;
      batch.clear();
    }
  }
  CHECK(four_way > 0);  // a steady round of a middle stage sends and receives both ways
}

TEST_CASE("scatter_gather_tensors_in_pipeline sends 1/tp of each activation and gathers it over tp", "[lower]") {
  // Megatron-LM v2 (2021): split_tensor_into_1d_equal_chunks before the send,
  // gather_split_1d_tensor (an all_gather over tp) after the receive. tp 2, pp 2, 4 microbatches.
  ModelConfig model = load_model(source_path("models/tiny.json"));
  Topology topology = test_topology();
  Json j = {{"tp_size", 2}, {"pp_size", 2}, {"micro_batch_size", 1}, {"global_batch_size", 4}, {"dtype", "fp32"}};
  auto transfers = [&](const Json& plan_json) {
    StepProgram p = lower_program(model, topology, make_plan(plan_json, model, topology));
    std::vector<std::string> errors = check_program(p);
    INFO((errors.empty() ? std::string() : errors.front()));
    CHECK(errors.empty());
    double sent = 0;
    int slices = 0, gathers = 0;
    for (const Role& role : p.roles) {
      for (const Op& op : role.ops) {
        if (op.kind == OpKind::send) sent += op.bytes;
        if (op.kind == OpKind::send) slices += op.group == GroupKind::tp;
        if (op.kind == OpKind::all_gather && op.name == OpName::pp_gather) {
          ++gathers;
          CHECK(op.group == GroupKind::tp);
          CHECK(op.bytes == double(model.seq_length * model.hidden_size * 4));  // the whole [s, b, h] per rank
        }
      }
    }
    // Round trip through program.json keeps the slice.
    std::ostringstream text;
    write_program_json(p, &text);
    StepProgram back = parse_program_json_text(text.str(), "program.json");
    int slices_back = 0;
    for (const Role& role : back.roles) {
      for (const Op& op : role.ops) slices_back += op.kind == OpKind::send && op.group == GroupKind::tp;
    }
    CHECK(slices_back == slices);
    return std::make_tuple(sent, slices, gathers);
  };
  auto [whole, no_slices, no_gathers] = transfers(j);
  CHECK(no_slices == 0);
  CHECK(no_gathers == 0);
  j["scatter_gather_tensors_in_pipeline"] = true;
  auto [split, slices, gathers] = transfers(j);
  CHECK(split == Approx(whole / 2));
  CHECK(slices == 2 * 4);   // a forward and a backward send per microbatch, one boundary
  CHECK(gathers == 2 * 4);  // one per receive
  j["sequence_parallel"] = true;
  CHECK_THROWS_WITH(make_plan(j, model, topology),
                    Catch::Contains("key 'scatter_gather_tensors_in_pipeline' = true"));
}

TEST_CASE("gradient_accumulation_fusion false adds each later microbatch's weight gradient in", "[lower]") {
  // 2021 Megatron-LM: autograd's AccumulateGrad adds each microbatch's fresh weight gradients into
  // .grad; the first one is kept as written. pp 2, 4 microbatches, ZeRO 1 (unsharded gradients).
  ModelConfig model = load_model(source_path("models/tiny.json"));
  Topology topology = load_topology(source_path("topologies/dgx-a100-80gb.json"), 1);  // an fp16 device
  Json j = {{"pp_size", 2}, {"dp_size", 2}, {"zero_stage", 1}, {"micro_batch_size", 1}, {"global_batch_size", 8},
            {"dtype", "fp16"}, {"grad_dtype", "fp16"}};
  auto count = [&](const Json& plan_json) {
    StepProgram p = lower_program(model, topology, make_plan(plan_json, model, topology));
    std::vector<std::string> errors = check_program(p);
    INFO((errors.empty() ? std::string() : errors.front()));
    CHECK(errors.empty());
    int adds = 0;
    double bytes = 0;
    for (const Op& op : p.roles[0].ops) {
      if (op.name != OpName::grad_accumulate) continue;
      ++adds;
      bytes += op.bytes;
      CHECK(op.microbatch > 0);
      CHECK(op.bytes == Approx(3 * op.flops * 2));  // two fp16 tensors read, one written
    }
    return std::make_pair(adds, bytes);
  };
  CHECK(count(j).first == 0);  // fused: the default
  j["gradient_accumulation_fusion"] = false;
  auto [adds, bytes] = count(j);
  // Stage 0's groups (its layers, the embedding and positions) for microbatches 1 to 3.
  CHECK(adds > 0);
  CHECK(adds % 3 == 0);
  Plan plan = make_plan(j, model, topology);
  CHECK(plan_to_json(plan)["gradient_accumulation_fusion"] == false);
  j["gradient_accumulation_fusion"] = "no";
  CHECK_THROWS_WITH(make_plan(j, model, topology), Catch::Contains("gradient_accumulation_fusion"));
}

TEST_CASE("cross_entropy_loss_fusion false moves the bytes of Megatron-LM's unfused loss", "[lower]") {
  // fp16 logits: forward the cast to fp32 (2 + 4), max (4), subtract (8), exp (8), sum (4),
  // divide (8): 38 bytes a logit; backward the in-place scale (8) and the cast back (6): 14. The
  // fused loss moves the logits and the softmax once each way (6 and 6, and a few per token).
  ModelConfig model = load_model(source_path("models/tiny.json"));
  Topology topology = load_topology(source_path("topologies/dgx-a100-80gb.json"), 1);
  for (int64_t tp : {1, 2}) {
    INFO("tp " << tp);
    Json j = {{"tp_size", tp}, {"micro_batch_size", 2}, {"global_batch_size", 4}, {"dtype", "fp16"}};
    auto loss_bytes = [&](const Json& plan_json, Phase phase) {
      StepProgram p = lower_program(model, topology, make_plan(plan_json, model, topology));
      CHECK(check_program(p).empty());
      double bytes = 0;
      for (const Op& op : p.roles[0].ops) {
        if (op.kind == OpKind::loss && op.phase == phase && op.microbatch == 0) bytes += op.bytes;
      }
      return bytes;
    };
    const double logits = double(model.seq_length) * 2 * double(model.vocab_size / tp);
    // (Under tp the fused forward reads the logits twice, the shard's statistics then the loss,
    // and the statistics of every rank: 48 bytes a token, 0.375 a logit of a 128-wide shard.)
    CHECK(loss_bytes(j, Phase::forward) == Approx((tp > 1 ? 8.375 : 6) * logits).epsilon(0.02));
    CHECK(loss_bytes(j, Phase::backward) == Approx(6 * logits).epsilon(0.02));
    j["cross_entropy_loss_fusion"] = false;
    CHECK(loss_bytes(j, Phase::forward) == Approx(38 * logits));
    CHECK(loss_bytes(j, Phase::backward) == Approx(14 * logits));
    CHECK(plan_to_json(make_plan(j, model, topology))["cross_entropy_loss_fusion"] == false);
  }
}

TEST_CASE("the optimizer's bytes follow Megatron-LM's mixed-precision optimizer", "[lower]") {
  // fp16 weights and gradients: the gradient pass casts (2 + 4), unscales (8) and reads (4) the
  // fp32 main gradients; Adam reads the main gradient, moments and master (16), writes them (12),
  // and the copy reads the master (4) and writes the weights (2). fp32: the norm reads 4; Adam's
  // count leaves the weight's read out (24), as the CPU profile's adamw points count it.
  CHECK(gradient_pass_bytes(Dtype::fp16, Dtype::fp16) == 18);
  CHECK(adamw_bytes(Dtype::fp16, Dtype::fp16) == 34);
  CHECK(gradient_pass_bytes(Dtype::bf16, Dtype::fp32) == 4);  // no cast, no loss scaling
  CHECK(adamw_bytes(Dtype::bf16, Dtype::fp32) == 34);
  CHECK(gradient_pass_bytes(Dtype::fp32, Dtype::fp32) == 4);
  CHECK(adamw_bytes(Dtype::fp32, Dtype::fp32) == 24);
  ModelConfig model = load_model(source_path("models/tiny.json"));
  Topology topology = load_topology(source_path("topologies/dgx-a100-80gb.json"), 1);
  Json j = {{"micro_batch_size", 1}, {"global_batch_size", 1}, {"dtype", "fp16"}, {"grad_dtype", "fp16"}};
  StepProgram p = lower_program(model, topology, make_plan(j, model, topology));
  double params = 0;
  for (const Op& op : p.roles[0].ops) {
    if (op.name == OpName::adamw) params = op.flops / 14;
  }
  REQUIRE(params > 0);
  for (const Op& op : p.roles[0].ops) {
    if (op.name == OpName::grad_norm && op.kind == OpKind::optimizer_step) CHECK(op.bytes == Approx(18 * params));
    if (op.name == OpName::adamw) CHECK(op.bytes == Approx(34 * params));
  }
}

TEST_CASE("collective algorithms follow the group's placement", "[lower]") {
  // tp 2 inside a 2-device node, dp 16 across nodes with one member per node.
  ModelConfig model = load_model(source_path("models/tiny.json"));
  Topology topology = test_topology();
  Json j = {{"tp_size", 2}, {"dp_size", 16}, {"micro_batch_size", 1}, {"global_batch_size", 16},
            {"dtype", "fp32"}, {"grad_bucket_bytes", 1e9}};
  StepProgram p = lower_program(model, topology, make_plan(j, model, topology));
  std::map<std::string, std::string> algorithm_of;
  for (const Op& op : p.roles[0].ops) {
    if (is_collective(op.kind)) algorithm_of[to_string(op.group)] = to_string(op.algorithm);
  }
  CHECK(algorithm_of["tp"] == "ring");
  CHECK(algorithm_of.count("dp") == 1);
}

TEST_CASE("hybrid sharding: reduce_scatter in the shard group, then the shards all-reduced across replicas",
          "[lower]") {
  ModelConfig model = load_model(source_path("models/tiny.json"));
  Topology topology = test_topology();
  for (int zero : {1, 2, 3}) {
    INFO("ZeRO-" << zero);
    // dp 4 as 2 instances of 2 ranks; 3 microbatches; small buckets so there are several.
    Json j = {{"dp_size", 4}, {"zero_stage", zero}, {"num_distributed_optimizer_instances", 2},
              {"micro_batch_size", 1}, {"global_batch_size", 12}, {"dtype", "fp32"},
              {"overlap_grad_reduce", true}, {"grad_bucket_bytes", 20000}};
    Plan plan = make_plan(j, model, topology);
    StepProgram p = lower_program(model, topology, plan);
    REQUIRE(check_program(p).empty());
    CHECK(p.dp_shard_size == 2);
    const Role& role = p.roles[0];
    const int32_t last_mb = int32_t(plan.num_microbatches() - 1);
    int64_t last_pass_buckets = 0, replica_ops = 0;
    double replica_bytes = 0, shard_elements = 0;
    GroupKind norm_group = GroupKind::world;
    for (const Op& op : role.ops) {
      if (op.name == OpName::grad_bucket) {
        CHECK(op.kind == OpKind::reduce_scatter);
        CHECK(op.group == GroupKind::dp_shard);
        if (op.microbatch == last_mb) ++last_pass_buckets;
      }
      if (op.name == OpName::replica_grads) {
        CHECK(op.kind == OpKind::all_reduce);
        CHECK(op.group == GroupKind::dp_replica);
        CHECK(op.microbatch == last_mb);  // after the gradients are final, once per step
        ++replica_ops;
        replica_bytes += op.bytes;
      }
      if (op.name == OpName::param_gather || op.name == OpName::zero3_param_gather) {
        CHECK(op.group == GroupKind::dp_shard);
      }
      if (op.kind == OpKind::all_reduce && op.name == OpName::grad_norm) norm_group = op.group;
      if (op.kind == OpKind::alloc && op.persistent && op.buffer.rfind("optimizer.", 0) == 0) {
        shard_elements += op.bytes / 4 / 2;  // [elements, m and v] in fp32 (no master copy)
      }
    }
    // One all_reduce per bucket of the last pass, carrying every shard once.
    CHECK(replica_ops == last_pass_buckets);
    CHECK(replica_ops > 1);
    CHECK(replica_bytes == Approx(shard_elements * 4).epsilon(1e-12));
    CHECK(norm_group == GroupKind::instance);
    // The shards are those of dp 2 without replicas.
    Json two = j;
    two["dp_size"] = 2;
    two["num_distributed_optimizer_instances"] = 1;
    two["global_batch_size"] = 6;
    StepProgram q = lower_program(model, topology, make_plan(two, model, topology));
    auto persistent = [](const StepProgram& program) {
      std::map<std::string, double> bytes;
      for (const Op& op : program.roles[0].ops) {
        if (op.kind == OpKind::alloc && op.persistent) bytes[op.buffer] = op.bytes;
      }
      return bytes;
    };
    CHECK(persistent(p) == persistent(q));
  }
}

// ---- the checker must catch broken programs ----

namespace {

StepProgram small_pipeline() {
  ModelConfig model = load_model(source_path("models/tiny-gpt.json"));
  Topology topology = test_topology();
  Json j = {{"pp_size", 2}, {"dp_size", 2}, {"tp_size", 2}, {"micro_batch_size", 1},
            {"global_batch_size", 8}, {"dtype", "fp32"}, {"zero_stage", 1}};
  StepProgram p = lower_program(model, topology, make_plan(j, model, topology));
  REQUIRE(check_program(p).empty());
  return p;
}

Op* find_op(StepProgram& p, int role, OpKind kind, int nth = 0) {
  for (Op& op : p.roles[role].ops) {
    if (op.kind == kind && nth-- == 0) return &op;
  }
  return nullptr;
}

}  // namespace

TEST_CASE("the checker catches a mismatched tag", "[lower]") {
  StepProgram p = small_pipeline();
  find_op(p, 0, OpKind::send)->tag += 1000;
  CHECK(any_error_contains(check_program(p), "tag"));
}

TEST_CASE("the checker catches a missing receive", "[lower]") {
  StepProgram p = small_pipeline();
  Op* recv = find_op(p, 1, OpKind::recv);
  recv->kind = OpKind::activation;  // the buffer is still written, but nothing is received
  CHECK(any_error_contains(check_program(p), "receives"));
}

TEST_CASE("the checker catches a use after free and a leak", "[lower]") {
  StepProgram p = small_pipeline();
  // Move a free of an activation before its buffer's users: turn it into a no-op alloc name.
  Role& role = p.roles[0];
  for (size_t i = 0; i < role.ops.size(); ++i) {
    if (role.ops[i].kind == OpKind::free) {
      std::string name = role.ops[i].buffer;
      role.ops[i].buffer = "renamed-" + name;  // the real buffer now leaks; this frees nothing
      break;
    }
  }
  auto errors = check_program(p);
  CHECK(any_error_contains(errors, "not live"));
  CHECK(any_error_contains(errors, "never freed"));
}

TEST_CASE("the checker catches collectives that differ across a group", "[lower]") {
  StepProgram p = small_pipeline();
  for (Op& op : p.roles[1].ops) {
    bool spans = op.group == GroupKind::model || op.group == GroupKind::world;
    if (spans && is_collective(op.kind)) op.bytes *= 2;
  }
  CHECK(any_error_contains(check_program(p), "other collectives"));
}

TEST_CASE("the checker catches a deadlock", "[lower]") {
  StepProgram p = small_pipeline();
  // Make stage 0's first send wait for its last op: stage 1 never gets its first input.
  Op* send = find_op(p, 0, OpKind::send);
  send->deps.push_back(int32_t(p.roles[0].ops.size()) - 1);
  auto errors = check_program(p);
  CHECK((any_error_contains(errors, "deadlock") || any_error_contains(errors, "later op")));
}

TEST_CASE("ready times come from the matching send and the last member of a collective", "[lower]") {
  ModelConfig model = load_model(source_path("models/tiny.json"));
  Topology topology = test_topology();
  Json j = {{"pp_size", 2}, {"dp_size", 2}, {"micro_batch_size", 1}, {"global_batch_size", 4},
            {"dtype", "fp32"}};
  StepProgram p = lower_program(model, topology, make_plan(j, model, topology));
  // Every rank's op i starts at i µs, rank 3 one second later than the others.
  std::vector<OpRecord> records;
  for (int64_t rank = 0; rank < p.world_size(); ++rank) {
    for (const Op& op : p.role_of_rank(rank).ops) {
      double start = op.id * 1e-6 + (rank == 3 ? 1.0 : 0.0);
      records.push_back({rank, op.id, start, start + 1e-7, start});
    }
  }
  fill_ready_times(p, records);
  int checked_recv = 0, checked_collective = 0;
  for (const OpRecord& r : records) {
    const Op& op = p.role_of_rank(r.rank).ops[r.id];
    if (op.kind == OpKind::recv && r.rank == 2) {  // stage 1, dp 0: its sender is rank 0
      const Role& sender = p.roles[0];
      for (const Op& s : sender.ops) {
        if (s.kind == OpKind::send && s.tag == op.tag) {
          CHECK(r.ready_s == Approx(std::max(r.start_s, s.id * 1e-6)));
          ++checked_recv;
        }
      }
    }
    if (is_collective(op.kind) && op.group == GroupKind::dp && r.rank == 2) {
      // rank 2's dp partner is rank 3, one second late: ready is rank 3's start.
      CHECK(r.ready_s >= 1.0);
      ++checked_collective;
    }
  }
  CHECK(checked_recv > 0);
  CHECK(checked_collective > 0);
}
