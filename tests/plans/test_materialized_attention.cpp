// Materialized attention's measured correction (cost_model.hpp): the six ops the cost model
// composes at a measured point are the ops lowering emits, and a profile's materialized points
// scale those ops to the time measured.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "cost_model.hpp"
#include "lower.hpp"
#include "lower_fixtures.hpp"
#include "profile.hpp"
#include "test_support.hpp"

namespace stepcast {
namespace {

using test::source_path;

double composed_time_s(const ComputeCostModel& model, const AttentionPoint& a, Dtype dtype) {
  double total = 0;
  for (const Op& op : materialized_attention_ops(a.batch, a.heads, a.seq, a.head_dim, dtype)) {
    total += model.op_time_s(op);
  }
  return total;
}

}  // namespace

TEST_CASE("materialized attention: the cost model composes the ops lowering emits", "[profile][lower]") {
  // tiny-gpt (GPT-style, learned positions) in fp16 on one A100, no dropout nor recompute: the
  // score, softmax and value ops of microbatch 0, layer 0.
  ModelConfig model = load_model(source_path("models/tiny-gpt.json"));
  Topology topology = load_topology(source_path("topologies/dgx-a100-80gb.json"), 1);
  Plan plan = test::make_plan({{"micro_batch_size", 3},
                               {"global_batch_size", 3},
                               {"dtype", "fp16"},
                               {"attention_impl", "materialized"},
                               {"dropout", 0.0},
                               {"recompute", "none"}},
                              model, topology);
  StepProgram program = lower_program(model, topology, plan);
  std::vector<Op> lowered;
  for (const Op& op : program.roles.at(0).ops) {
    if (op.kind == OpKind::attention && op.layer == 0 && op.microbatch == 0) lowered.push_back(op);
  }
  const int64_t heads = model.num_attention_heads, d = model.head_dim();
  std::vector<Op> composed = materialized_attention_ops(3, heads, model.seq_length, d, Dtype::fp16);
  REQUIRE(lowered.size() == composed.size());
  for (size_t i = 0; i < composed.size(); ++i) {
    INFO("op " << i << ": " << to_string(lowered[i].name) << " " << to_string(lowered[i].phase));
    CHECK(lowered[i].name == composed[i].name);
    CHECK(lowered[i].phase == composed[i].phase);
    CHECK(lowered[i].flops == Approx(composed[i].flops).epsilon(1e-12));
    CHECK(lowered[i].bytes == Approx(composed[i].bytes).epsilon(1e-12));
    CHECK(lowered[i].batch == composed[i].batch);
    CHECK(lowered[i].m == composed[i].m);
    CHECK(lowered[i].n == composed[i].n);
    CHECK(lowered[i].k == composed[i].k);
  }
}

TEST_CASE("materialized attention: a profile's points correct the composed ops to the time measured", "[profile]") {
  Topology topology = load_topology(source_path("topologies/dgx-a100-80gb.json"));
  DeviceProfile profile = load_profile(source_path("profiles/a100-sxm4-80gb.json"));
  std::vector<AttentionPoint> points;
  for (const AttentionPoint& a : profile.measured->attention) {
    if (a.impl == "materialized") points.push_back(a);
  }
  REQUIRE(points.size() >= 4);
  ComputeCostModel model(topology.node.device, Dtype::fp16, profile, topology.file, "layernorm");

  DeviceProfile without = profile;
  auto& attention = without.measured->attention;
  attention.erase(std::remove_if(attention.begin(), attention.end(),
                                 [](const AttentionPoint& a) { return a.impl == "materialized"; }),
                  attention.end());
  ComputeCostModel uncorrected(topology.node.device, Dtype::fp16, without, topology.file, "layernorm");

  SECTION("at each point, the six ops take the measured time") {
    for (const AttentionPoint& a : points) {
      INFO("seq " << a.seq << ", head_dim " << a.head_dim);
      CHECK(composed_time_s(model, a, Dtype::fp16) == Approx(materialized_point_time_s(a)).epsilon(1e-9));
      // r is the measured time over the uncorrected sum.
      CHECK(model.materialized_correction(a.seq, a.head_dim) ==
            Approx(materialized_point_time_s(a) / composed_time_s(uncorrected, a, Dtype::fp16)).epsilon(1e-9));
    }
  }
  SECTION("between points, log r is interpolated in log seq and log head_dim; outside, clamped") {
    const double r64_2k = model.materialized_correction(2048, 64), r64_4k = model.materialized_correction(4096, 64);
    const double r128_2k = model.materialized_correction(2048, 128);
    CHECK(model.materialized_correction(2896, 64) == Approx(std::sqrt(r64_2k * r64_4k)).epsilon(1e-3));
    CHECK(model.materialized_correction(2048, 91) == Approx(std::sqrt(r64_2k * r128_2k)).epsilon(1e-2));
    CHECK(model.materialized_correction(100000, 64) == Approx(model.materialized_correction(8192, 64)));
    CHECK(model.materialized_correction(2048, 32) == Approx(r64_2k));
  }
  SECTION("only materialized score, softmax and value ops are corrected") {
    Op softmax = materialized_attention_ops(4, 32, 2048, 64, Dtype::fp16)[1];
    CHECK(model.op_time_s(softmax) ==
          Approx(uncorrected.op_time_s(softmax) * model.materialized_correction(2048, 64)).epsilon(1e-12));
    // Context parallelism's gathered scores (2 of 4 chunks of queries over all 2048 keys): the
    // correction at the keys' length.
    Op cp_score = materialized_attention_ops(4, 32, 2048, 64, Dtype::fp16)[0];
    cp_score.name = OpName::cp_score;
    cp_score.m = 1024;
    cp_score.flops /= 2;
    CHECK(model.op_time_s(cp_score) ==
          Approx(uncorrected.op_time_s(cp_score) * model.materialized_correction(2048, 64)).epsilon(1e-12));
    Op dropout = softmax;
    dropout.name = OpName::dropout;
    CHECK(model.op_time_s(dropout) == uncorrected.op_time_s(dropout));
    CHECK(uncorrected.materialized_correction(2048, 64) == 1.0);
  }
}

}  // namespace stepcast

namespace stepcast {

TEST_CASE("materialized attention: on a GPU a batched GEMM runs at the rate of its rows together", "[profile]") {
  // The H100 profile's GEMM tables, without its materialized points: a score forward of 64
  // GEMMs of 512 x 512 x 64 costs one GEMM of 64·512 rows (one batched launch), not 64 small
  // ones; a profile that runs in order (a CPU's) costs them one after another.
  Topology topology = load_topology(source_path("topologies/dgx-h100.json"));
  DeviceProfile profile = load_profile(source_path("profiles/h100-sxm.json"));
  auto& attention = profile.measured->attention;
  attention.erase(std::remove_if(attention.begin(), attention.end(),
                                 [](const AttentionPoint& a) { return a.impl == "materialized"; }),
                  attention.end());
  // Its one GEMM table (dgrad: OpenXLA's grid) stands for every variant.
  std::vector<GemmPoint> grid;
  for (const GemmPoint& g : profile.measured->gemm) {
    if (g.count == 1) grid.push_back(g);
  }
  REQUIRE(grid.size() == profile.measured->gemm.size());
  GemmRateTable table(grid);
  Op score = materialized_attention_ops(4, 16, 512, 64, Dtype::bf16)[0];
  REQUIRE(score.batch == 64);
  const double flops = 2.0 * 64 * 512 * 512 * 64;
  ComputeCostModel gpu(topology.node.device, Dtype::bf16, profile, topology.file);
  CHECK(gpu.op_time_s(score) == Approx(flops / table.flops_per_s(64 * 512, 512, 64)).epsilon(1e-12));
  profile.execution_in_order = true;
  ComputeCostModel in_order(topology.node.device, Dtype::bf16, profile, topology.file);
  CHECK(in_order.op_time_s(score) == Approx(flops / table.flops_per_s(512, 512, 64)).epsilon(1e-12));
  CHECK(in_order.op_time_s(score) > gpu.op_time_s(score));
}

}  // namespace stepcast
