// Operand reuse (plans/operand_reuse.hpp): the LRU stack distance of a collective's operands over
// a role's arena, computed by hand on small roles; the reuse table's interpolation between the
// back-to-back and the pool points; the executor's copy and add around a collective
// (collective_local_work) on lowered programs.
#include <catch2/catch.hpp>

#include <cmath>

#include "collective.hpp"
#include "collective_cost.hpp"
#include "lower.hpp"
#include "lower_fixtures.hpp"
#include "operand_reuse.hpp"
#include "profile_fixtures.hpp"

using namespace stepcast;
using namespace stepcast::test;
using Catch::Matchers::Contains;

namespace {

Op alloc(int32_t id, const char* name, double bytes, bool persistent = false) {
  Op op;
  op.id = id;
  op.kind = OpKind::alloc;
  op.buffer = name;
  op.bytes = bytes;
  op.persistent = persistent;
  return op;
}

Op free_op(int32_t id, const char* name, double bytes) {
  Op op = alloc(id, name, bytes);
  op.kind = OpKind::free;
  return op;
}

Op use(int32_t id, OpKind kind, std::vector<const char*> in, std::vector<const char*> out, double bytes) {
  Op op;
  op.id = id;
  op.kind = kind;
  op.bytes = bytes;
  for (const char* b : in) op.inputs.push_back(b);
  for (const char* b : out) op.outputs.push_back(b);
  return op;
}

// W persistent (1 KiB); per step X (2 KiB) and Y (4 KiB): a gemm W → X, an activation X → Y, a
// collective reading W and writing Y. `gemm_bytes`: the gemm's traffic (it touches at most that
// much of each operand).
Role small_role(double gemm_bytes) {
  Role role;
  role.ops = {alloc(0, "W", 1024, true),
              alloc(1, "X", 2048),
              use(2, OpKind::gemm, {"W"}, {"X"}, gemm_bytes),
              alloc(3, "Y", 4096),
              use(4, OpKind::activation, {"X"}, {"Y"}, 1e9),
              use(5, OpKind::all_gather, {"W"}, {"Y"}, 4096),
              free_op(6, "X", 2048),
              free_op(7, "Y", 4096)};
  return role;
}

std::vector<char> only(size_t n, int32_t id) {
  std::vector<char> wanted(n, 0);
  wanted[size_t(id)] = 1;
  return wanted;
}

CollectivePoint point(double bytes, double time_s, double distance = 0) {
  CollectivePoint p{"all_gather", "ring", 2, bytes, time_s, bytes / time_s, 0, "", 1};
  p.reuse_distance_bytes = distance;
  return p;
}

constexpr double MiB = 1024.0 * 1024;

}  // namespace

TEST_CASE("operand reuse: the distinct bytes touched since each operand's last touch, plus the op's own",
          "[operand_reuse]") {
  Role role = small_role(1e9);
  std::vector<OperandReuse> r = operand_reuse(role, only(role.ops.size(), 5));
  REQUIRE(r.size() == role.ops.size());
  CHECK(r[4].pieces.empty());  // not wanted
  const OperandReuse& c = r[5];
  CHECK(c.footprint_bytes == 1024 + 4096);
  // Y was written by the op just before: nothing in between. W was last read by the gemm; X and
  // Y (6 KiB) were touched since.
  REQUIRE(c.pieces.size() == 2);
  CHECK(c.pieces[0].bytes == 4096);
  CHECK(c.pieces[0].distance_bytes == 5120);
  CHECK(c.pieces[1].bytes == 1024);
  CHECK(c.pieces[1].distance_bytes == 6144 + 5120);
}

TEST_CASE("operand reuse: a compute op touches at most its own traffic of each operand", "[operand_reuse]") {
  // The gemm moves 512 bytes: W's first half is touched by it, its second half was last touched
  // by the previous step's collective (then the half, X and Y are newer: 512 + 6144).
  Role role = small_role(512);
  const OperandReuse c = operand_reuse(role, only(role.ops.size(), 5))[5];
  REQUIRE(c.pieces.size() == 3);
  CHECK(c.pieces[0].bytes == 4096);
  CHECK(c.pieces[0].distance_bytes == 5120);
  CHECK(c.pieces[1].bytes == 512);
  CHECK(c.pieces[1].distance_bytes == 6144 + 5120);
  CHECK(c.pieces[2].bytes == 512);
  CHECK(c.pieces[2].distance_bytes == 512 + 6144 + 5120);
}

TEST_CASE("operand reuse: the table interpolates log time in log distance, clamped, never faster farther",
          "[operand_reuse]") {
  // Back to back: 100 µs at 1 MiB, 400 µs at 4 MiB; pools of 16 MiB (both sizes) and 64 MiB (1 MiB
  // only: a pool holds two slots of the size's operands at least).
  CollectiveReuseTable table({point(MiB, 100e-6), point(4 * MiB, 400e-6)},
                             {point(MiB, 150e-6, 16 * MiB), point(4 * MiB, 600e-6, 16 * MiB),
                              point(MiB, 200e-6, 64 * MiB)});
  CHECK(table.time_s(MiB, 2 * MiB, 2 * MiB) == Approx(100e-6).epsilon(1e-12));  // its own footprint
  CHECK(table.time_s(MiB, MiB, 2 * MiB) == Approx(100e-6).epsilon(1e-12));      // clamped below
  CHECK(table.time_s(MiB, 16 * MiB, 2 * MiB) == Approx(150e-6).epsilon(1e-12));
  CHECK(table.time_s(MiB, 32 * MiB, 2 * MiB) == Approx(std::sqrt(150e-6 * 200e-6)).epsilon(1e-9));
  CHECK(table.time_s(MiB, 1024 * MiB, 2 * MiB) == Approx(200e-6).epsilon(1e-12));  // clamped above
  // Halfway in log between the footprint (2 MiB) and 16 MiB: √(100·150) µs.
  CHECK(table.time_s(MiB, std::sqrt(2.0 * 16) * MiB, 2 * MiB) == Approx(std::sqrt(100e-6 * 150e-6)).epsilon(1e-9));
  // 4 MiB: the 64 MiB pool did not measure it; the 16 MiB pool's time stays.
  CHECK(table.time_s(4 * MiB, 64 * MiB, 8 * MiB) == Approx(600e-6).epsilon(1e-12));
  // A pool point faster than back to back (noise) takes the back-to-back time.
  CollectiveReuseTable noisy({point(MiB, 100e-6)}, {point(MiB, 80e-6, 16 * MiB)});
  CHECK(noisy.time_s(MiB, 16 * MiB, 2 * MiB) == Approx(100e-6).epsilon(1e-12));
  // An op's operands: each piece's share of the footprint at its distance.
  OperandReuse operands{{{MiB, 2 * MiB}, {MiB, 16 * MiB}}, 2 * MiB};
  CHECK(table.time_s(MiB, operands) == Approx(0.5 * 100e-6 + 0.5 * 150e-6).epsilon(1e-12));
  CHECK(table.time_s(MiB, OperandReuse{}) == Approx(100e-6).epsilon(1e-12));  // none: back to back
}

TEST_CASE("operand reuse: the cost model uses the reuse points where an op's operands are given",
          "[operand_reuse]") {
  DeviceProfile profile = synthetic_profile();  // all_reduce ring over 2: 400 µs at 1 MiB
  profile.measured->collective_reuse.push_back(
      {"all_reduce", "ring", 2, 1048576, 8e-4, 1.31072e9, 1.31072e9, "", 1, 64 * MiB});
  Topology topology = load_topology(source_path("topologies/localhost-cpu.json"));
  ComputeCostModel model(topology.node.device, Dtype::fp32, profile, topology.file);
  REQUIRE(model.has_collective_reuse());
  CHECK(*model.measured_collective_time_s(OpKind::all_reduce, Algorithm::ring, 2, 1048576) ==
        Approx(4e-4).epsilon(1e-12));
  OperandReuse far{{{2 * MiB, 128 * MiB}}, 2 * MiB};
  CHECK(*model.measured_collective_time_s(OpKind::all_reduce, Algorithm::ring, 2, 1048576, &far) ==
        Approx(8e-4).epsilon(1e-12));
  CHECK_FALSE(model.measured_collective_time_s(OpKind::all_gather, Algorithm::ring, 2, 1048576, &far));
  CHECK_FALSE(ComputeCostModel(topology.node.device, Dtype::fp32, synthetic_profile(), topology.file)
                  .has_collective_reuse());
}

TEST_CASE("collective local work: the executor's copy and add around a collective", "[operand_reuse]") {
  ModelConfig model = load_model(source_path("models/tiny.json"));
  Topology topology = test_topology();
  int gathers = 0, sharded_buckets = 0;
  Json zero3 = {{"dp_size", 2}, {"zero_stage", 3}, {"micro_batch_size", 1}, {"global_batch_size", 4},
                {"dtype", "fp32"}};
  StepProgram program = lower_program(model, topology, make_plan(zero3, model, topology));
  for (const Op& op : program.roles[0].ops) {
    CollectiveLocalWork w = collective_local_work(op, 2);
    if (op.name == OpName::zero3_param_gather) {
      ++gathers;
      CHECK(w.copy_bytes == op.bytes / 2);  // the shard to its place in the full buffer
      CHECK(w.add_bytes == 0);
    } else if (op.kind == OpKind::reduce_scatter && op.name == OpName::grad_bucket) {
      ++sharded_buckets;
      CHECK(w.add_bytes == op.bytes / 2);  // the reduced chunk into the gradient shard
      CHECK(w.copy_bytes == 0);
    } else {
      CHECK(w.copy_bytes == 0);
      CHECK(w.add_bytes == 0);
    }
    CHECK(collective_local_work(op, 1).copy_bytes == 0);  // a group of one moves nothing
  }
  CHECK(gathers > 0);
  CHECK(sharded_buckets > 0);
  // ZeRO-1: the bucket is reduced in place, the updated parameters gathered in place.
  Json zero1 = zero3;
  zero1["zero_stage"] = 1;
  program = lower_program(model, topology, make_plan(zero1, model, topology));
  for (const Op& op : program.roles[0].ops) {
    CollectiveLocalWork w = collective_local_work(op, 2);
    CHECK(w.copy_bytes + w.add_bytes == 0);
  }
  // Sequence parallelism: every gather copies its chunk in, every reduce_scatter its chunk out.
  Json sp = {{"tp_size", 2}, {"sequence_parallel", true}, {"micro_batch_size", 1}, {"global_batch_size", 2},
             {"dtype", "fp32"}};
  int sp_ops = 0;
  program = lower_program(model, topology, make_plan(sp, model, topology));
  for (const Op& op : program.roles[0].ops) {
    if (op.kind != OpKind::all_gather && op.kind != OpKind::reduce_scatter) continue;
    ++sp_ops;
    CHECK(collective_local_work(op, 2).copy_bytes == op.bytes / 2);
  }
  CHECK(sp_ops > 0);
}

TEST_CASE("operand reuse: profiles carry the reuse points, and refuse them malformed", "[operand_reuse]") {
  DeviceProfile p = synthetic_profile();
  for (auto [bytes, time_s] : {std::pair{65536.0, 5e-5}, {1048576.0, 8e-4}}) {
    p.measured->collective_reuse.push_back(
        {"all_reduce", "ring", 2, bytes, time_s, bytes / time_s, bytes / time_s, "", 1, 16 * MiB});
  }
  Json json = profile_to_json(p);
  REQUIRE(json["measured"]["collective_reuse_points"].size() == 2);
  CHECK(json["measured"]["collective_reuse_points"][0]["reuse_distance_bytes"] == 16 * MiB);
  CHECK_FALSE(json["measured"]["collective_points"][0].contains("reuse_distance_bytes"));
  DeviceProfile back = parse_profile(json, "reuse.json");
  REQUIRE(back.measured->collective_reuse.size() == 2);
  CHECK(back.measured->collective_reuse[1].time_s == 8e-4);
  CHECK(profile_to_json(back) == json);
  Json missing = json;
  missing["measured"]["collective_reuse_points"][0].erase("reuse_distance_bytes");
  CHECK_THROWS_WITH(parse_profile(missing, "bad.json"),
                    Contains("bad.json") && Contains("collective_reuse_points[0].reuse_distance_bytes"));
  Json zero = json;
  zero["measured"]["collective_reuse_points"][0]["reuse_distance_bytes"] = 0;
  CHECK_THROWS_WITH(parse_profile(zero, "bad.json"), Contains("reuse_distance_bytes"));
  Json misplaced = json;
  misplaced["measured"]["collective_points"][0]["reuse_distance_bytes"] = 16 * MiB;
  CHECK_THROWS_WITH(parse_profile(misplaced, "bad.json"),
                    Contains("collective_points[0]") && Contains("reuse_distance_bytes"));
  Json unordered = json;
  std::swap(unordered["measured"]["collective_reuse_points"][0], unordered["measured"]["collective_reuse_points"][1]);
  CHECK_THROWS_WITH(parse_profile(unordered, "bad.json"),
                    Contains("collective_reuse_points[1]") && Contains("out of order"));
  // Another pool is another table: the same size again is fine there.
  Json other_pool = json;
  other_pool["measured"]["collective_reuse_points"][1]["bytes"] = 65536;
  other_pool["measured"]["collective_reuse_points"][1]["time_s"] = 6e-5;
  other_pool["measured"]["collective_reuse_points"][1].erase("algbw_bytes_per_s");
  other_pool["measured"]["collective_reuse_points"][1].erase("busbw_bytes_per_s");
  other_pool["measured"]["collective_reuse_points"][1]["reuse_distance_bytes"] = 64 * MiB;
  CHECK_NOTHROW(parse_profile(other_pool, "ok.json"));
}

TEST_CASE("collective local work: the planner's estimate charges it in order, as the simulator does",
          "[operand_reuse]") {
  ModelConfig model = load_model(source_path("models/tiny.json"));
  Topology topology = load_topology(source_path("topologies/localhost-cpu.json"));
  Json zero3 = {{"dp_size", 2}, {"zero_stage", 3}, {"micro_batch_size", 1}, {"global_batch_size", 4},
                {"dtype", "fp32"}};
  StepProgram program = lower_program(model, topology, make_plan(zero3, model, topology));
  DeviceProfile in_order = synthetic_profile();
  in_order.measured->collectives.push_back({"all_gather", "ring", 2, 1048576, 3e-4, 0, 0, "", 1});
  ComputeCostModel compute(topology.node.device, Dtype::fp32, in_order, topology.file);
  CollectiveCostModel collectives(in_order, topology);
  const GroupShape pair{2, 1, 2};
  int gathers = 0;
  for (const Op& op : program.roles[0].ops) {
    if (op.name != OpName::zero3_param_gather) continue;
    ++gathers;
    double plain = uncontended_collective_s(compute, collectives, op.kind, op.algorithm, op.bytes, pair);
    CHECK(uncontended_collective_op_s(compute, collectives, op, pair) ==
          Approx(plain + compute.staging_copy_time_s(op.bytes / 2)).epsilon(1e-12));
  }
  CHECK(gathers > 0);
  // Concurrent streams (a GPU profile): the transfer alone.
  DeviceProfile streams = in_order;
  streams.execution_in_order = false;
  streams.execution_staged_sends = false;
  ComputeCostModel gpu_like(topology.node.device, Dtype::fp32, streams, topology.file);
  CollectiveCostModel gpu_collectives(streams, topology);
  for (const Op& op : program.roles[0].ops) {
    if (op.name != OpName::zero3_param_gather) continue;
    CHECK(uncontended_collective_op_s(gpu_like, gpu_collectives, op, pair) ==
          uncontended_collective_s(gpu_like, gpu_collectives, op.kind, op.algorithm, op.bytes, pair));
  }
}

namespace {

// One variant's reuse points on the grid {16, 256}³: back to back at `b2b` flop/s, pools of
// 16 MiB at `near` and 64 MiB at `far`.
std::vector<GemmPoint> reuse_grid(double b2b, double near, double far) {
  std::vector<GemmPoint> points;
  for (auto [distance, rate] : {std::pair{0.0, b2b}, {16 * MiB, near}, {64 * MiB, far}}) {
    for (int64_t m : {16, 256}) {
      for (int64_t n : {16, 256}) {
        for (int64_t k : {16, 256}) {
          GemmPoint p{"forward", m, n, k, 0, "", 1};
          p.time_s = p.flops() / rate;
          p.reuse_distance_bytes = distance;
          points.push_back(p);
        }
      }
    }
  }
  return points;
}

}  // namespace

TEST_CASE("gemm reuse: a GEMM's time at its operands' distance over its time at the table's", "[reuse]") {
  // fp32, the table's calls rotating through 8 MiB of each operand: a 64³ GEMM's copies are 4096
  // elements apart, 512 of them, each call touching 3·4096·4 B = 48 KiB: 24 MiB between uses.
  GemmReuseTable table(reuse_grid(4e9, 2e9, 1e9), 8 * MiB, 4);
  const double footprint = 48 * 1024.0, at_table = 24 * MiB;
  CHECK(table.table_distance_bytes(64, 64, 64) == Approx(at_table));
  // A skewed shape: its largest operand sets the stride, every operand the footprint.
  CHECK(table.table_distance_bytes(16, 256, 64) ==
        Approx(std::floor(8 * MiB / 4 / (256 * 64)) * (16 * 64 + 64 * 256 + 16 * 256) * 4.0));
  // log time linear in log distance: back to back at the footprint, then 16 and 64 MiB.
  auto log_time = [&](double d) {
    const double flops = 2.0 * 64 * 64 * 64;
    if (d <= footprint) return std::log(flops / 4e9);
    if (d <= 16 * MiB) {
      double t = std::log(d / footprint) / std::log(16 * MiB / footprint);
      return std::log(flops / 4e9) + t * std::log(2.0);
    }
    if (d >= 64 * MiB) return std::log(flops / 1e9);
    double t = std::log(d / (16 * MiB)) / std::log(4.0);
    return std::log(flops / 2e9) + t * std::log(2.0);
  };
  CHECK(table.factor(64, 64, 64, at_table) == Approx(1.0));
  for (double d : {1024.0, footprint, 1 * MiB, 16 * MiB, 40 * MiB, 64 * MiB, 1024 * MiB}) {
    INFO(d);
    CHECK(table.factor(64, 64, 64, d) == Approx(std::exp(log_time(d) - log_time(at_table))));
  }
  // The pieces of an op's operands, by their share of its footprint.
  OperandReuse operands;
  operands.footprint_bytes = 3 * footprint;
  operands.pieces = {{footprint, footprint}, {2 * footprint, 1024 * MiB}};
  CHECK(table.factor(64, 64, 64, operands) ==
        Approx(table.factor(64, 64, 64, footprint) / 3 + 2 * table.factor(64, 64, 64, 1024 * MiB) / 3));
  CHECK(table.factor(64, 64, 64, OperandReuse{}) == 1);
  // Faster farther out is noise: the time never falls as the distance grows.
  GemmReuseTable noisy(reuse_grid(4e9, 2e9, 3e9), 8 * MiB, 4);
  CHECK(noisy.factor(64, 64, 64, 64 * MiB) == Approx(noisy.factor(64, 64, 64, 16 * MiB)));
}

TEST_CASE("gemm reuse: profiles carry the points and the table's pool, and refuse them malformed", "[reuse]") {
  DeviceProfile p = synthetic_profile();
  p.measured->gemm_reuse = reuse_grid(4e9, 2e9, 1e9);
  p.measured->gemm_table_pool_bytes = 8 * MiB;
  Json json = profile_to_json(p);
  REQUIRE(json["measured"]["gemm_reuse_points"].size() == 24);
  CHECK(json["measured"]["gemm_reuse_points"][0]["reuse_distance_bytes"] == 0);
  CHECK(json["measured"]["gemm_table_pool_bytes"] == 8 * MiB);
  CHECK_FALSE(json["measured"]["gemm_points"][0].contains("reuse_distance_bytes"));
  DeviceProfile back = parse_profile(json, "reuse.json");
  CHECK(back.measured->gemm_reuse.size() == 24);
  CHECK(back.measured->gemm_reuse[23].reuse_distance_bytes == 64 * MiB);
  CHECK(profile_to_json(back) == json);
  Json no_pool = json;
  no_pool["measured"].erase("gemm_table_pool_bytes");
  CHECK_THROWS_WITH(parse_profile(no_pool, "bad.json"), Contains("bad.json") && Contains("gemm_table_pool_bytes"));
  Json negative = json;
  negative["measured"]["gemm_reuse_points"][3]["reuse_distance_bytes"] = -1;
  CHECK_THROWS_WITH(parse_profile(negative, "bad.json"), Contains("gemm_reuse_points[3].reuse_distance_bytes"));
  Json missing = json;
  missing["measured"]["gemm_reuse_points"][0].erase("reuse_distance_bytes");
  CHECK_THROWS_WITH(parse_profile(missing, "bad.json"), Contains("gemm_reuse_points[0].reuse_distance_bytes"));
  Json unordered = json;
  std::swap(unordered["measured"]["gemm_reuse_points"][0], unordered["measured"]["gemm_reuse_points"][1]);
  CHECK_THROWS_WITH(parse_profile(unordered, "bad.json"), Contains("gemm_reuse_points[1]") && Contains("out of order"));
  Json misplaced = json;
  misplaced["measured"]["gemm_points"][0]["reuse_distance_bytes"] = 0;
  CHECK_THROWS_WITH(parse_profile(misplaced, "bad.json"),
                    Contains("gemm_points[0]") && Contains("reuse_distance_bytes"));
}
