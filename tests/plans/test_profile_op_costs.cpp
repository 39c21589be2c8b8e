// Which cost each op of a program gets from a measured profile: attention's score and value as
// the GEMMs they are made of (each variant from its own table), the gradient norm at the gradient
// bytes it reads, and the memory-bound family every op looks up (dropout, LayerNorm, context
// parallelism, mixtures of experts).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "cost_model.hpp"
#include "profile.hpp"
#include "profile_fixtures.hpp"
#include "test_support.hpp"

using namespace stepcast;
using namespace stepcast::test;

TEST_CASE("profile: attention score and value cost the GEMMs they are made of", "[profile]") {
  // Each variant its own rate (dgrad at half, wgrad at a quarter of forward's), so a wrong
  // variant or shape shows. b·heads = 8 GEMMs of s = 64, d = 16 each.
  DeviceProfile profile = synthetic_profile();
  auto scaled = [](const std::string& variant, double factor) {
    std::vector<GemmPoint> points = synthetic_grid(variant, synthetic_gemm_time_s);
    for (GemmPoint& g : points) g.time_s *= factor;
    return points;
  };
  const std::vector<std::pair<std::string, double>> slower = {{"dgrad", 2.0}, {"wgrad", 4.0}};
  for (const auto& [variant, factor] : slower) {
    for (const GemmPoint& g : scaled(variant, factor)) profile.measured->gemm.push_back(g);
  }
  Topology topology = load_topology(source_path("topologies/localhost-cpu.json"));
  ComputeCostModel model(topology.node.device, Dtype::fp32, profile, topology.file);
  GemmRateTable forward(synthetic_grid("forward", synthetic_gemm_time_s));
  GemmRateTable dgrad(scaled("dgrad", 2.0)), wgrad(scaled("wgrad", 4.0));
  auto time = [](const GemmRateTable& t, double m, double n, double k) {
    return 2 * m * n * k / t.flops_per_s(m, n, k);
  };
  Op op;
  op.kind = OpKind::attention;
  op.batch = 8;
  op.m = 64;
  op.n = 64;
  op.k = 16;
  op.flops = 2.0 * 8 * 64 * 64 * 16;
  op.name = OpName::score;
  CHECK(model.op_time_s(op) == Approx(8 * time(forward, 64, 64, 16)).epsilon(1e-12));
  op.name = OpName::value;
  CHECK(model.op_time_s(op) == Approx(8 * time(dgrad, 64, 16, 64)).epsilon(1e-12));
  op.phase = Phase::backward;
  op.flops *= 2;
  CHECK(model.op_time_s(op) ==
        Approx(8 * (time(forward, 64, 64, 16) + time(wgrad, 16, 64, 64))).epsilon(1e-12));
  op.name = OpName::score;
  CHECK(model.op_time_s(op) ==
        Approx(8 * (time(dgrad, 64, 16, 64) + time(wgrad, 16, 64, 64))).epsilon(1e-12));
  op.name = OpName::softmax;
  CHECK(attention_gemms(op).empty());
}

TEST_CASE("profile: the gradient norm is costed at the gradient bytes it reads", "[profile]") {
  // Lowering counts the gradient pass's bytes (gradient_pass_bytes): the shard's 1e6 fp32
  // gradients read once; the table is looked up at those bytes, not at the 4-byte result.
  DeviceProfile profile = synthetic_profile();
  for (double bytes : {65536.0, 1048576.0, 16777216.0}) {
    profile.measured->memory.push_back({"grad_norm", bytes, bytes / 20e9, ""});
  }
  Topology topology = load_topology(source_path("topologies/localhost-cpu.json"));
  ComputeCostModel model(topology.node.device, Dtype::fp32, profile, topology.file);
  Op norm;
  norm.kind = OpKind::optimizer_step;
  norm.name = OpName::grad_norm;
  norm.phase = Phase::optimizer;
  norm.flops = 2e6;
  norm.bytes = 4e6;
  CHECK(memory_family(norm) == "grad_norm");
  CHECK(model.op_time_s(norm) == Approx(4e6 / 20e9).epsilon(1e-9));
}

TEST_CASE("profile: dropout and LayerNorm ops look up their own families", "[profile]") {
  Op op;
  op.kind = OpKind::attention;
  op.name = OpName::dropout;
  CHECK(memory_family(op) == "attention_dropout_forward");
  op.phase = Phase::backward;
  CHECK(memory_family(op) == "dropout_backward");
  op.kind = OpKind::activation;
  op.name = OpName::dropout_add;
  CHECK(memory_family(op) == "dropout_backward");
  op.phase = Phase::recompute;
  CHECK(memory_family(op) == "residual_add");  // no mask output: no dropout
  op.outputs = {"x_mid", "mask1"};
  CHECK(memory_family(op) == "dropout_add_forward");
  op.kind = OpKind::embedding;  // the embedding's dropout: its mask decides, as dropout_add's
  op.name = OpName::position_dropout;
  op.phase = Phase::forward;
  op.outputs = {"out", "mask"};
  CHECK(memory_family(op) == "dropout_add_forward");
  op.outputs = {"out"};
  CHECK(memory_family(op) == "copy");
  op.phase = Phase::backward;
  op.inputs = {"g", "mask"};
  CHECK(memory_family(op) == "dropout_backward");
  op.inputs = {"g"};
  CHECK(memory_family(op) == "copy");
  // The word lookup and its gradient rows' accumulation; a tensor-parallel rank's loss statistics
  // (grad_stash: asynchronous data parallelism's gradient moved to its next slot, a copy).
  op.name = OpName::word;
  CHECK(memory_family(op) == "embedding_backward");
  op.phase = Phase::forward;
  CHECK(memory_family(op) == "embedding_forward");
  op.kind = OpKind::loss;
  op.name = OpName::cross_entropy_stats;
  CHECK(memory_family(op) == "cross_entropy_stats");
  op.name = OpName::cross_entropy;  // tp 1: statistics and softmax; tp > 1: from the gathered statistics
  op.inputs = {"logits", "targets"};
  CHECK(memory_family(op) == "cross_entropy_forward");
  op.inputs = {"logits", "targets", "stats_all"};
  CHECK(memory_family(op) == "cross_entropy_softmax");
  op.kind = OpKind::optimizer_step;
  op.name = OpName::grad_stash;
  op.phase = Phase::optimizer;
  CHECK(memory_family(op) == "copy");
  op.phase = Phase::backward;
  // A mixture of experts' routing and its row moves have families of their own (a recompute
  // routes again: forward), the shared experts' add is a residual add.
  op.kind = OpKind::activation;
  op.name = OpName::moe_route;
  CHECK(memory_family(op) == "moe_route_backward");
  op.phase = Phase::recompute;
  CHECK(memory_family(op) == "moe_route_forward");
  op.name = OpName::moe_permute;
  CHECK(memory_family(op) == "moe_permute_forward");
  op.name = OpName::moe_unpermute;
  op.phase = Phase::backward;
  CHECK(memory_family(op) == "moe_unpermute_backward");
  op.name = OpName::moe_add;
  CHECK(memory_family(op) == "residual_add");
  op.phase = Phase::recompute;
  op.kind = OpKind::norm;
  op.name = OpName::input_norm;
  CHECK(memory_family(op) == "norm_forward");
  CHECK(memory_family(op, "layernorm") == "layernorm_forward");
  // A LayerNorm model takes the layernorm table where the profile has one.
  DeviceProfile profile = synthetic_profile();
  for (double bytes : {16384.0, 1048576.0}) {
    profile.measured->memory.push_back({"layernorm_forward", bytes, bytes / 2e9, ""});
  }
  Topology topology = load_topology(source_path("topologies/localhost-cpu.json"));
  ComputeCostModel layer(topology.node.device, Dtype::fp32, profile, topology.file, "layernorm");
  ComputeCostModel rms(topology.node.device, Dtype::fp32, profile, topology.file, "rmsnorm");
  op.bytes = 65536;
  CHECK(layer.op_time_s(op) == Approx(65536 / 2e9).epsilon(1e-9));
  CHECK(rms.op_time_s(op) == Approx(1e-6 + 65536 / 10e9).epsilon(1e-12));
  // The MoE row moves: their own tables where the profile has them, a profile from before them
  // costs them as copies.
  Op move = op;
  move.kind = OpKind::activation;
  move.name = OpName::moe_unpermute;
  move.phase = Phase::backward;
  Op copy = move;
  copy.kind = OpKind::optimizer_step;
  copy.name = OpName::grad_stash;
  REQUIRE(memory_family(copy) == "copy");
  for (double bytes : {16384.0, 1048576.0}) profile.measured->memory.push_back({"copy", bytes, bytes / 4e9, ""});
  ComputeCostModel copies(topology.node.device, Dtype::fp32, profile, topology.file, "rmsnorm");
  CHECK(copies.op_time_s(copy) == Approx(65536 / 4e9).epsilon(1e-9));
  CHECK(copies.op_time_s(move) == Approx(65536 / 4e9).epsilon(1e-9));
  for (double bytes : {16384.0, 1048576.0}) {
    profile.measured->memory.push_back({"moe_unpermute_backward", bytes, bytes / 1e9, ""});
  }
  ComputeCostModel with_moves(topology.node.device, Dtype::fp32, profile, topology.file, "rmsnorm");
  CHECK(with_moves.op_time_s(move) == Approx(65536 / 1e9).epsilon(1e-9));
}

TEST_CASE("profile: an unfused loss looks up the unfused cross entropy's tables", "[profile]") {
  Op op;
  op.kind = OpKind::loss;
  op.name = OpName::cross_entropy;
  op.inputs = {"logits", "targets"};
  CHECK(memory_family(op, "rmsnorm", false) == "cross_entropy_unfused_forward");
  op.inputs = {"logits", "targets", "stats_all"};  // tp > 1: the division's pass
  CHECK(memory_family(op, "rmsnorm", false) == "cross_entropy_unfused_forward");
  op.phase = Phase::recompute;
  CHECK(memory_family(op, "rmsnorm", false) == "cross_entropy_unfused_forward");
  op.phase = Phase::backward;
  CHECK(memory_family(op, "rmsnorm", false) == "cross_entropy_unfused_backward");
  CHECK(memory_family(op, "rmsnorm", true) == "cross_entropy_backward");
  op.name = OpName::cross_entropy_stats;
  op.phase = Phase::forward;
  CHECK(memory_family(op, "rmsnorm", false) == "cross_entropy_unfused_forward");
  CHECK(memory_family(op) == "cross_entropy_stats");
  for (const char* f : {"cross_entropy_unfused_forward", "cross_entropy_unfused_backward"}) {
    CHECK(std::count(memory_families().begin(), memory_families().end(), f) == 1);
  }

  // Fused and unfused tables at different rates: each plan's loss takes its own; a profile
  // without the unfused tables costs an unfused loss at the fused table, as before them.
  DeviceProfile profile = synthetic_profile();
  for (double bytes : {16384.0, 1048576.0}) {
    profile.measured->memory.push_back({"cross_entropy_backward", bytes, bytes / 1e9, ""});
  }
  Topology topology = load_topology(source_path("topologies/localhost-cpu.json"));
  op.name = OpName::cross_entropy;
  op.phase = Phase::backward;
  op.bytes = 65536;
  ComputeCostModel fused(topology.node.device, Dtype::fp32, profile, topology.file, "rmsnorm", true);
  ComputeCostModel before(topology.node.device, Dtype::fp32, profile, topology.file, "rmsnorm", false);
  CHECK(fused.op_time_s(op) == Approx(65536 / 1e9).epsilon(1e-9));
  CHECK(before.op_time_s(op) == Approx(65536 / 1e9).epsilon(1e-9));
  for (double bytes : {16384.0, 1048576.0}) {
    profile.measured->memory.push_back({"cross_entropy_unfused_backward", bytes, bytes / 3e9, ""});
  }
  ComputeCostModel unfused(topology.node.device, Dtype::fp32, profile, topology.file, "rmsnorm", false);
  ComputeCostModel still_fused(topology.node.device, Dtype::fp32, profile, topology.file, "rmsnorm", true);
  CHECK(unfused.op_time_s(op) == Approx(65536 / 3e9).epsilon(1e-9));
  CHECK(still_fused.op_time_s(op) == Approx(65536 / 1e9).epsilon(1e-9));
}
