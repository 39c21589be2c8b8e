// The planner's quick estimate (plans/quick_estimate.hpp) against the simulator where both should
// agree (one microbatch, no overlap, no contention: both cost every op with the same models, so
// these check how the estimate composes them), and the context-parallel ring's clock on its own.
#include <catch2/catch.hpp>

#include <string>

#include "lower.hpp"
#include "profile.hpp"
#include "quick_estimate.hpp"
#include "search.hpp"
#include "collective_cost.hpp"
#include "sim_fixtures.hpp"
#include "simulator.hpp"
#include "test_support.hpp"

using namespace stepcast;
using namespace stepcast::test;

namespace {

// A ring transfer (a send to cp_next, or the receive of `buffer` from cp_prev) and a compute op
// reading `input`.
Op ring_op(OpKind kind, int64_t tag, double bytes, const std::string& buffer) {
  Op op;
  op.kind = kind;
  op.peer = kind == OpKind::send ? Peer::cp_next : Peer::cp_prev;
  op.tag = tag;
  op.bytes = bytes;
  if (kind == OpKind::send) op.inputs = {buffer};
  else op.outputs = {buffer};
  return op;
}
Op reading(const std::string& input) {
  Op op;
  op.kind = OpKind::attention;
  op.inputs = {input};
  return op;
}

}  // namespace

TEST_CASE("the context-parallel ring's clock: waits where a block is read, transfers queue on the link", "[search]") {
  // A link of 1 GB/s and 1 µs: a 1 MB block takes 1.001 ms.
  const Topology link = parse_test_topology(star_topology_json(1, 2, 1e9, 1e-6, 1, 1e9, 1e-6));
  const CollectiveCostModel sends(roofline_profile(link), link);
  const double t = 1e-6 + 1e6 / 1e9;
  REQUIRE(sends.p2p_time_s(1e6, false) == Approx(t));
  {  // step 0 sends block 0 and posts the receive of block 1; 0.4 ms of attention hide part of it
    CpRingClock ring(sends, false);
    ring.transfer(ring_op(OpKind::send, 7, 1e6, "kv.0"));
    ring.transfer(ring_op(OpKind::recv, 7, 1e6, "kv.1"));
    ring.compute(reading("kv.0"), 0.4e-3);  // the own block: here already
    CHECK(ring.exposed_s() == 0);
    ring.compute(reading("kv.1"), 0.4e-3);  // waits for the rest of the transfer
    CHECK(ring.exposed_s() == Approx(t - 0.4e-3));
  }
  {  // two blocks sent at once share the link in turn; a block is forwarded only once it is here
    CpRingClock ring(sends, false);
    ring.transfer(ring_op(OpKind::send, 1, 1e6, "a"));
    ring.transfer(ring_op(OpKind::send, 2, 1e6, "b"));
    ring.transfer(ring_op(OpKind::recv, 2, 1e6, "b.in"));
    ring.compute(reading("b.in"), 0);
    CHECK(ring.exposed_s() == Approx(2 * t));
    ring.transfer(ring_op(OpKind::recv, 1, 1e6, "a.in"));
    ring.transfer(ring_op(OpKind::send, 3, 1e6, "a.in"));  // forwarded: after it arrived (at t)
    ring.transfer(ring_op(OpKind::recv, 3, 1e6, "a.out"));
    ring.compute(reading("a.out"), 0);  // and after the link is free (2t): arrives at 3t
    CHECK(ring.exposed_s() == Approx(3 * t));
  }
  {  // a compute op long enough hides the whole transfer
    CpRingClock ring(sends, false);
    ring.transfer(ring_op(OpKind::send, 1, 1e6, "x"));
    ring.transfer(ring_op(OpKind::recv, 1, 1e6, "y"));
    ring.compute(reading("x"), 2e-3);
    ring.compute(reading("y"), 1e-3);
    CHECK(ring.exposed_s() == 0);
  }
}

namespace {

// The quick estimate of the plan's program and the program simulated (no run-to-run variation;
// one simulation per process: SimGrid's engine).
struct EstimateAndSimulation {
  QuickEstimate estimate;
  double simulated_s = 0;
};
// The quick estimate of `plan`'s program; with `simulated_s`, that program simulated too (once a
// process: SimGrid's engine starts once).
QuickEstimate estimate(const ModelConfig& model, const Topology& topology, const DeviceProfile& profile, Plan plan,
                       double* simulated_s = nullptr) {
  validate_plan(plan, model, topology);
  StepProgram program = lower_program(model, topology, plan);
  ComputeCostModel costs(topology.node.device, plan.param_dtype, profile, topology.file, to_string(model.norm));
  QuickEstimate e = quick_estimate(program, plan, plan.num_microbatches(), topology, costs);
  if (simulated_s) {
    SimulateOptions options;
    options.variability = false;
    *simulated_s = simulate_program(program, topology, profile, options).step_time_s;
  }
  return e;
}

EstimateAndSimulation estimate_and_simulate(const ModelConfig& model, const Topology& topology,
                                            const DeviceProfile& profile, Plan plan) {
  EstimateAndSimulation out;
  out.estimate = estimate(model, topology, profile, plan, &out.simulated_s);
  return out;
}

// tiny-moe widened: hidden 512, 16 experts of width 1,024, top 4, 1,024 tokens.
ModelConfig widened_tiny_moe() {
  ModelConfig model = load_model(source_path("models/tiny-moe.json"));
  model.hidden_size = 512;
  model.num_attention_heads = 8;
  model.num_key_value_heads = 8;
  model.intermediate_size = 1024;
  model.moe_intermediate_size = 1024;
  model.num_experts = 16;
  model.num_experts_per_tok = 4;
  model.seq_length = 1024;
  model.max_position_embeddings = 1024;
  return model;
}

// The widened tiny-moe's plan on one DGX H100: dp 8, ep 8, one microbatch, dropless, with the
// `routing` keys.
Plan widened_ep8_plan(const Json& routing, const std::string& name) {
  Json plan = {{"dp_size", 8},           {"expert_model_parallel_size", 8}, {"micro_batch_size", 1},
               {"global_batch_size", 8}, {"attention_impl", "flash"},       {"dropout", 0.0},
               {"overlap_grad_reduce", false}};
  plan.update(routing);
  return parse_plan(plan, name);
}

}  // namespace

TEST_CASE("the quick estimate costs collectives as the simulator does (A100 profile, no contention)", "[search]") {
  // GPT-2 124M, dp 8 in one DGX A100, one microbatch, no overlap: the step is compute, the
  // gradient all_reduce on NVLink and the optimizer, one after the other. With the datasheet α-β
  // (no link fractions, no measured tables) the estimate's all_reduce was 2.99 ms against the
  // simulation's 4.15 ms, the step 7.1% short; now they agree.
  ModelConfig model = load_model(source_path("models/gpt2-124m.json"));
  Topology topology = load_topology(source_path("topologies/dgx-a100-80gb.json"), 1);
  DeviceProfile profile = load_profile(source_path("profiles/a100-sxm4-80gb.json"));
  Plan plan = parse_plan({{"dp_size", 8}, {"micro_batch_size", 1}, {"global_batch_size", 8}}, "dp8.json");
  auto [e, simulated_s] = estimate_and_simulate(model, topology, profile, plan);
  INFO("estimate " << e.step_time_s << " s (dp " << e.dp_comm_s << "), simulated " << simulated_s << " s");
  CHECK(e.dp_comm_s > 0.1 * e.step_time_s);
  CHECK(e.step_time_s == Approx(simulated_s).epsilon(0.03));
}

TEST_CASE("the quick estimate costs pipeline sends with the profile's send table", "[search]") {
  // GPT-2 124M, pp 2 on two nodes of one device, one microbatch: each stage's send crosses the
  // network. The profile's sendrecv table across nodes is 3 times the α-β time at every size:
  // three times the sends (the simulator's flows take the table too: "sim: a send across nodes
  // takes its measured point-to-point table's time").
  ModelConfig model = load_model(source_path("models/gpt2-124m.json"));
  Topology topology = parse_test_topology(star_topology_json(2, 1, 300e9, 2e-6, 1, 25e9, 3e-6));
  DeviceProfile plain = roofline_profile(topology);
  plain.is_roofline = false;
  plain.gemm[Dtype::fp32] = GemmEfficiency{};
  plain.measured = MeasuredTables{};
  plain.measured->dtype = Dtype::fp32;
  DeviceProfile measured = plain;
  const LinkFigures l = link_figures(topology);
  for (double bytes = 1024; bytes < 4e9; bytes *= 2) {
    const double alpha_beta = l.inter_latency_s + bytes / l.inter_bandwidth_bytes_per_s;
    measured.measured->p2p_inter_node.push_back({bytes, 3 * alpha_beta, ""});
  }
  Plan plan =
      parse_plan({{"pp_size", 2}, {"micro_batch_size", 1}, {"global_batch_size", 1}, {"dropout", 0.0}, {"dtype", "fp32"}},
                 "pp2.json");
  QuickEstimate without = estimate(model, topology, plain, plan);
  QuickEstimate e = estimate(model, topology, measured, plan);
  REQUIRE(without.pp_comm_s > 0);
  CHECK(e.pp_comm_s == Approx(3 * without.pp_comm_s).epsilon(0.01));
  CHECK(e.step_time_s > without.step_time_s);
}

namespace {

// small-llama at 8,192 tokens on one DGX H100 (roofline), cp × dp = 8, flash, one microbatch, no
// overlap: the quick estimate against the simulation (one per process: SimGrid's engine).
void check_cp_estimate(const char* comm, int cp) {
  ModelConfig model = load_model(source_path("models/small-llama.json"));
  model.seq_length = 8192;
  model.max_position_embeddings = 8192;
  Topology topology = load_topology(source_path("topologies/dgx-h100.json"), 1);
  DeviceProfile profile = roofline_profile(topology);
  Plan plan = parse_plan({{"context_parallel_size", cp},
                          {"cp_comm_type", comm},
                          {"dp_size", 8 / cp},
                          {"micro_batch_size", 1},
                          {"global_batch_size", 8 / cp},
                          {"attention_impl", "flash"},
                          {"dropout", 0.0},
                          {"overlap_grad_reduce", false}},
                         "cp" + std::to_string(cp) + "-" + comm + ".json");
  auto [e, simulated_s] = estimate_and_simulate(model, topology, profile, plan);
  INFO(comm << ": estimate " << e.step_time_s << " s (cp exposed " << e.cp_comm_s << " s), simulated " << simulated_s
            << " s");
  CHECK(e.cp_comm_s > 0);
  CHECK(e.step_time_s == Approx(simulated_s).epsilon(0.03));
}

}  // namespace

// The ring's transfers hide behind the attention blocks but for what the blocks leave exposed
// (CpRingClock: the compute stream waits where a block is read); the gathers and all-to-alls
// over cp sit between the ops that need them.
TEST_CASE("the quick estimate costs the context-parallel ring as the simulator does", "[search]") {
  check_cp_estimate("p2p", 4);
}
TEST_CASE("the quick estimate costs the context-parallel gathers as the simulator does", "[search]") {
  check_cp_estimate("allgather", 4);
}
TEST_CASE("the quick estimate costs the context-parallel all-to-alls as the simulator does", "[search]") {
  check_cp_estimate("a2a", 2);  // (Ulysses: cp divides the 6 heads and 2 KV heads)
}

TEST_CASE("the quick estimate costs a skewed mixture of experts as the simulator's draws do", "[search]") {
  // tiny-moe widened (hidden 512, 16 experts of width 1,024, top 4, 1,024 tokens) with ep 8 over
  // one DGX H100, dropless, Zipf skew 1: the busiest ep rank's expert GEMMs and the dispatch and
  // combine paced by it. The estimate takes the routing's expectation, the simulation its draws
  // (the busiest rank of each draw, a little above the expectation's).
  ModelConfig model = widened_tiny_moe();
  Topology topology = load_topology(source_path("topologies/dgx-h100.json"), 1);
  DeviceProfile profile = roofline_profile(topology);
  Plan plan = widened_ep8_plan({{"moe_routing", "skew"}, {"moe_routing_skew", 1.0}}, "moe-skew.json");
  auto [e, simulated_s] = estimate_and_simulate(model, topology, profile, plan);
  INFO("estimate " << e.step_time_s << " s (ep comm " << e.ep_comm_s << ", imbalance " << e.expert_imbalance_s
                   << "), simulated " << simulated_s << " s");
  CHECK(e.expert_imbalance_s > 0.05 * e.step_time_s);
  CHECK(e.step_time_s == Approx(simulated_s).epsilon(0.05));
}

TEST_CASE("the quick estimate averages over the measured samples a histogram gives, as the simulation replays them",
          "[search]") {
  // The widened tiny-moe again; summed, the routing is even (one row, all experts alike), but each
  // measured microbatch loads one ep rank 4:1: the simulation replays them and the estimate
  // averages over them, where the summed shares alone would see no imbalance.
  ModelConfig model = widened_tiny_moe();
  Topology topology = load_topology(source_path("topologies/dgx-h100.json"), 1);
  DeviceProfile profile = roofline_profile(topology);
  Json samples = Json::array();
  for (int lean = 0; lean < 8; ++lean) {  // sample `lean`: ep rank `lean`'s two experts 4 shares each
    Json one = Json::array();
    for (int e = 0; e < 16; ++e) one.push_back(e / 2 == lean ? 8 : 2);
    samples.push_back(one);
  }
  auto plan_with = [&](const std::string& name, const Json& histogram) {
    return widened_ep8_plan(
        {{"moe_routing", "histogram"}, {"moe_routing_histogram", write_temp_file(name, histogram.dump())}},
        "moe-samples.json");
  };
  const Json even = {{"tokens_per_expert", std::vector<int>(16, 1)}};
  Json leaning = even;
  leaning["samples"] = Json::array();
  leaning["samples"].push_back(samples);  // one list for every layer
  const QuickEstimate flat = estimate(model, topology, profile, plan_with("even.json", even));  // not simulated
  auto [e, simulated_s] = estimate_and_simulate(model, topology, profile, plan_with("leaning.json", leaning));
  INFO("estimate " << e.step_time_s << " s (imbalance " << e.expert_imbalance_s << "), simulated " << simulated_s
                   << " s; even routing: estimate " << flat.step_time_s << " s (imbalance "
                   << flat.expert_imbalance_s << ")");
  CHECK(e.expert_imbalance_s > flat.expert_imbalance_s + 0.05 * flat.step_time_s);
  CHECK(e.step_time_s == Approx(simulated_s).epsilon(0.05));
}

TEST_CASE("the quick estimate slows a stage's compute by its slowest device", "[search]") {
  // pp 2 × dp 2 on 4 CPU devices (order tp-dp-pp: stage 1 on devices 2 and 3), device 3 at 0.5.
  Json j = load_json_file(source_path("topologies/localhost-cpu.json"));
  j["node"]["devices_per_node"] = 4;
  j["heterogeneity"] = {{"devices", {{{"device", 3}, {"compute_speed_factor", 0.5}}}}};
  Topology topology = parse_topology(j, "heterogeneous-cpu.json");
  Plan plan;
  plan.pp_size = 2;
  plan.dp_size = 2;
  CHECK(stage_speeds(plan, topology) == std::vector<double>{1.0, 0.5});
  CHECK(stage_speeds(plan, load_topology(source_path("topologies/localhost-cpu.json"))).empty());
  // Two stages of 1 ms compute (0.6 ms of it backward) a microbatch, 4 microbatches, 1F1B: the
  // slow stage's 2 ms paces the pipeline (Plan's default schedule).
  StageTimes t;
  t.compute_mb_s = 1e-3;
  t.backward_mb_s = 0.6e-3;
  std::vector<StageTimes> stages{t, t};
  stages[1].stage = 1;
  const double equal = combine_stage_times(stages, plan, 4).step_time_s;
  const QuickEstimate slowed = combine_stage_times(stages, plan, 4, {1.0, 0.5});
  CHECK(slowed.step_time_s == Approx(2 * equal));
  CHECK(slowed.critical_stage == 1);
  CHECK(slowed.compute_s == Approx(4 * 2e-3));
}

TEST_CASE("the quick estimate lets a microbatch's dp collectives go on beside the next microbatch", "[search]") {
  // One stage, 4 microbatches of 1 ms compute (0.6 ms of it backward), overlap_grad_reduce: the
  // comm stream carries each microbatch's dp collectives (ZeRO-2/3) beside the compute, its own
  // and the next microbatch's; what exceeds a whole microbatch's compute stays exposed, and the
  // last one's what exceeds its backward (ZeRO-2's reductions; with ZeRO-3's gathers among them,
  // each microbatch's excess over its backward).
  Plan plan;
  plan.overlap_grad_reduce = true;
  StageTimes t;
  t.compute_mb_s = 1e-3;
  t.backward_mb_s = 0.6e-3;
  t.dp_mb_s = 0.8e-3;  // more than the backward, less than the microbatch: only the last's 0.2 ms
  QuickEstimate e = combine_stage_times({t}, plan, 4);
  CHECK(e.dp_comm_s == Approx(0.2e-3));
  CHECK(e.step_time_s == Approx(4e-3 + 0.2e-3));
  t.dp_mb_s = 1.5e-3;  // more than the microbatch: 3 × 0.5 ms, and the last's 0.9 ms
  e = combine_stage_times({t}, plan, 4);
  CHECK(e.dp_comm_s == Approx(3 * 0.5e-3 + 0.9e-3));
  CHECK(e.step_time_s == Approx(4e-3 + 2.4e-3));
  t.zero3_mb_s = 0.5e-3;  // ZeRO-3's gathers among them are needed in their microbatch: each one's 0.9 ms
  e = combine_stage_times({t}, plan, 4);
  CHECK(e.dp_comm_s == Approx(4 * 0.9e-3));
  plan.overlap_grad_reduce = false;  // every microbatch's, whole
  e = combine_stage_times({t}, plan, 4);
  CHECK(e.dp_comm_s == Approx(4 * 1.5e-3));
}
