// The simulator costs a program's compute ops from the profile's tables as the program asks: the
// loss of a plan without cross_entropy_loss_fusion at the unfused cross entropy's tables, with it
// at the fused one's; in order, a GEMM at its operands' reuse distance. One SimGrid engine per
// test case.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>

#include "cost_model.hpp"
#include "lower.hpp"
#include "operand_reuse.hpp"
#include "profile.hpp"
#include "sim_fixtures.hpp"
#include "simulator.hpp"
#include "test_support.hpp"
#include "zero_fill.hpp"

using namespace stepcast;
using namespace stepcast::test;

namespace {

// One loss backward of 64 KiB on one device, its profile holding the fused loss's table at
// 1 GB/s and the unfused one's at 4 GB/s: the op's time.
double loss_backward_s(bool fusion) {
  Topology t = parse_test_topology(star_topology_json(1, 1, 1e11, 0, 1, 1e11, 0));
  DeviceProfile profile = roofline_profile(t);
  profile.is_roofline = false;
  profile.name = "measured-loss";
  profile.gemm[Dtype::fp32] = GemmEfficiency{};
  MeasuredTables tables;
  tables.dtype = Dtype::fp32;
  for (double bytes : {16384.0, 1048576.0}) {
    tables.memory.push_back({"cross_entropy_backward", bytes, bytes / 1e9, ""});
    tables.memory.push_back({"cross_entropy_unfused_backward", bytes, bytes / 4e9, ""});
  }
  profile.measured = tables;
  StepProgram p = empty_program(1, 1, 1, 1);
  p.plan["cross_entropy_loss_fusion"] = fusion;
  Op loss;
  loss.kind = OpKind::loss;
  loss.name = OpName::cross_entropy;
  loss.phase = Phase::backward;
  loss.bytes = 65536;
  push_op(p.roles[0], loss);
  SimulationOutput out = simulate_program(p, t, profile, SimulateOptions{});
  REQUIRE(!out.records.empty());
  return out.records[0].end_s - out.records[0].start_s;
}

}  // namespace

TEST_CASE("sim: an unfused loss takes the unfused cross entropy's table", "[sim]") {
  CHECK(loss_backward_s(false) == Approx(65536 / 4e9).epsilon(1e-9));
}

TEST_CASE("sim: a fused loss takes the fused cross entropy's table", "[sim]") {
  CHECK(loss_backward_s(true) == Approx(65536 / 1e9).epsilon(1e-9));
}

TEST_CASE("sim: in order a GEMM takes its table's time at its operands' reuse distance", "[sim]") {
  // tiny, dp 2 on two CPU cores; GEMMs at 2 Gflop/s with operands rotating through 8 MiB (the
  // table), at 4 Gflop/s back to back and 1 Gflop/s with operands 64 MiB away.
  Topology t = load_topology(source_path("topologies/localhost-cpu.json"));
  ModelConfig model = load_model(source_path("models/tiny.json"));
  Plan plan = parse_plan({{"dp_size", 2}, {"micro_batch_size", 2}, {"global_batch_size", 8}, {"dtype", "fp32"}},
                         "dp2.json");
  validate_plan(plan, model, t);
  StepProgram program = lower_program(model, t, plan);
  MeasuredTables tables;
  tables.gemm_table_pool_bytes = 8.0 * (1 << 20);
  for (const char* variant : {"forward", "dgrad", "wgrad"}) {
    for (double distance : {-1.0, 0.0, 64.0 * (1 << 20)}) {
      for (int64_t m : {16, 512}) {
        for (int64_t n : {16, 512}) {
          for (int64_t k : {16, 512}) {
            GemmPoint g{variant, m, n, k, 0, "", 1};
            g.time_s = g.flops() / (distance < 0 ? 2e9 : distance == 0 ? 4e9 : 1e9);
            g.reuse_distance_bytes = std::max(distance, 0.0);
            (distance < 0 ? tables.gemm : tables.gemm_reuse).push_back(g);
          }
        }
      }
    }
  }
  DeviceProfile p = in_order_measured_profile(t, "gemm-reuse-test", tables);
  SimulateOptions o;
  o.mode = SimMode::full;
  SimulationOutput out = simulate_program(program, t, p, o);

  const Role& role = program.roles[0];
  std::vector<char> gemms(role.ops.size(), 0);
  for (const Op& op : role.ops) gemms[size_t(op.id)] = op.kind == OpKind::gemm;
  std::vector<OperandReuse> reuse = operand_reuse(role, gemms);
  std::map<std::string, std::vector<GemmPoint>> far;
  for (const GemmPoint& g : tables.gemm_reuse) far[g.variant].push_back(g);
  const ZeroFills fills = zero_fills(role);
  int checked = 0, faster = 0;
  for (const OpRecord& r : out.records) {
    const Op& op = role.ops[size_t(r.id)];
    // (a GEMM that first touches a gradient buffer also pays its every-step fill)
    if (r.rank != 0 || op.kind != OpKind::gemm || !fills.step_fills_before[size_t(op.id)].empty()) continue;
    ++checked;
    GemmReuseTable table(far[gemm_variant(op)], tables.gemm_table_pool_bytes, 4);
    double factor = table.factor(op.m, op.n, op.k, reuse[size_t(op.id)]);
    double base = op.flops / 2e9;  // the table's rate everywhere
    CHECK(r.end_s - std::max(r.start_s, r.ready_s) == Approx(base * factor).epsilon(1e-6));
    faster += factor < 0.99;
  }
  CHECK(checked > 0);
  CHECK(faster > 0);  // tiny's operands sit closer than the table's 8 MiB rotation
}
