// Context parallelism's attention blocks on a measured profile (cost_model.hpp): an op that reads a
// K/V block (the ring's or the gathered) is costed at the profile's cp_flash points, every other
// flash op at its flash points; the points round-trip through the profile's file format.
#include <catch2/catch.hpp>

#include "cost_model.hpp"
#include "lower.hpp"
#include "lower_fixtures.hpp"
#include "op_signature.hpp"
#include "profile.hpp"
#include "test_support.hpp"

namespace stepcast {

TEST_CASE("context-parallel flash blocks cost at the profile's cp_flash points", "[profile][cp]") {
  const ModelConfig model = load_model(test::source_path("models/tiny.json"));
  const Topology topology = load_topology(test::source_path("topologies/localhost-cpu.json"));
  DeviceProfile profile = load_profile(test::source_path("reports/cpu/profile.json"));
  REQUIRE(profile.measured);
  // Its own cp_flash points (a profile measured since they exist) out: the test sets its own.
  std::erase_if(profile.measured->attention, [](const AttentionPoint& a) { return a.impl == "cp_flash"; });
  // cp_flash points at half the flash points' rates.
  std::vector<AttentionPoint> cp_points;
  for (const AttentionPoint& a : profile.measured->attention) {
    if (a.impl != "flash") continue;
    AttentionPoint c = a;
    c.impl = "cp_flash";
    c.flops_per_s = a.flops_per_s / 2;
    cp_points.push_back(c);
  }
  REQUIRE(!cp_points.empty());
  DeviceProfile with_cp = profile;
  for (const AttentionPoint& c : cp_points) with_cp.measured->attention.push_back(c);
  // The file format keeps them (impl written, no batch or heads).
  DeviceProfile back = parse_profile(profile_to_json(with_cp), "profile.json");
  int64_t read_back = 0;
  for (const AttentionPoint& a : back.measured->attention) read_back += a.impl == "cp_flash";
  CHECK(read_back == int64_t(cp_points.size()));
  const Dtype dtype = profile.measured->dtype;
  ComputeCostModel plain(topology.node.device, dtype, profile, topology.file, "rmsnorm");
  ComputeCostModel cp(topology.node.device, dtype, back, topology.file, "rmsnorm");

  for (const char* comm : {"p2p", "allgather"}) {
    Json j = {{"context_parallel_size", 2}, {"cp_comm_type", comm}, {"attention_impl", "flash"},
              {"micro_batch_size", 2}, {"global_batch_size", 2}, {"dtype", to_string(dtype)}};
    Plan plan = test::make_plan(j, model, topology);
    StepProgram program = lower_program(model, topology, plan);
    int64_t blocks = 0;
    for (const Op& op : program.roles[0].ops) {
      if (op.kind != OpKind::attention || op.name != OpName::flash) continue;
      REQUIRE(Operands(op).has_in("kv"));  // every flash op of a cp plan reads a K/V block
      ++blocks;
      INFO(comm << " op " << op.id);
      CHECK(cp.op_time_s(op) == Approx(2 * plain.op_time_s(op)).epsilon(1e-12));
    }
    CHECK(blocks > 0);
  }
  // Without cp, flash ops read no K/V block: the flash points, whatever the cp_flash ones say.
  Json j = {{"attention_impl", "flash"}, {"micro_batch_size", 2}, {"global_batch_size", 2}, {"dtype", to_string(dtype)}};
  StepProgram program = lower_program(model, topology, test::make_plan(j, model, topology));
  int64_t flash = 0;
  for (const Op& op : program.roles[0].ops) {
    if (op.kind != OpKind::attention || op.name != OpName::flash) continue;
    ++flash;
    CHECK(cp.op_time_s(op) == plain.op_time_s(op));
  }
  CHECK(flash > 0);
}

}  // namespace stepcast
