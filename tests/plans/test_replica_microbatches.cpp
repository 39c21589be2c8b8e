// Unequal data-parallel replicas (plan microbatches_per_replica): the plan key and its refusals,
// the sample slots (each of the step's microbatches once, the equal mapping unchanged), the split
// by replica speed, and the program — a role per stage of each replica class, the rank → role map,
// the checks (a collective over the replicas that one class issues more often than another is
// caught), and program.json carrying it.
#include <catch2/catch.hpp>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "errors.hpp"
#include "lower.hpp"
#include "lower_fixtures.hpp"
#include "memory.hpp"
#include "plan.hpp"
#include "program_check.hpp"
#include "program_json.hpp"
#include "replica_microbatches.hpp"
#include "test_support.hpp"

using namespace stepcast;
using namespace stepcast::test;
using Catch::Matchers::Contains;

namespace {

const std::string kFile = "unequal-plan.json";

Json unequal_plan(std::vector<int64_t> counts, int64_t pp = 1) {
  return {{"dp_size", int64_t(counts.size())}, {"pp_size", pp}, {"micro_batch_size", 2},
          {"microbatches_per_replica", counts}, {"dtype", "fp32"}, {"dropout", 0.0}};
}

using Lowered = LoweredJson;

Lowered lower_json(const Json& json, const std::string& model_name = "tiny") {
  return lower_plan_json(json, kFile, 4, model_name);
}

std::string error_of(const Json& json, const std::string& model_name = "tiny") {
  try {
    lower_json(json, model_name);
  } catch (const InputError& e) {
    return e.what();
  }
  FAIL("no InputError for " << json.dump());
  return "";
}

}  // namespace

TEST_CASE("microbatches_per_replica: the global batch derives from it and bad lists are refused", "[plan][replicas]") {
  Plan plan = lower_json(unequal_plan({3, 1})).plan;
  CHECK(plan.global_batch_size == 8);  // (3 + 1) microbatches of 2
  CHECK(plan.num_microbatches() == 3);
  CHECK(plan.microbatches_of_replica(1) == 1);
  CHECK(plan_to_json(plan)["microbatches_per_replica"] == Json({3, 1}));
  // Equal counts are the equal plan: the key is dropped, the outputs keep their bytes.
  Plan equal = lower_json(unequal_plan({2, 2})).plan;
  CHECK_FALSE(equal.unequal_microbatches());
  CHECK_FALSE(plan_to_json(equal).contains("microbatches_per_replica"));
  CHECK(equal.global_batch_size == 8);

  CHECK_THAT(error_of(unequal_plan({3, 0})), Contains(kFile + ": key 'microbatches_per_replica'"));
  Json three = unequal_plan({3, 1, 1});
  three["dp_size"] = 2;
  CHECK_THAT(error_of(three), Contains("key 'microbatches_per_replica' = [3, 1, 1]: has 3 entries for dp_size = 2"));
  Json sum = unequal_plan({3, 1});
  sum["global_batch_size"] = 10;
  CHECK_THAT(error_of(sum), Contains("sums to 4 microbatches"));
  CHECK_THAT(error_of(sum), Contains("not global_batch_size = 10"));
  Json interleaved = unequal_plan({3, 1}, 2);
  interleaved["dp_size"] = 2;
  interleaved["schedule"] = "interleaved_1f1b";
  interleaved["virtual_pp_size"] = 2;
  interleaved["overlap_p2p_comm"] = true;
  CHECK_THAT(error_of(interleaved), Contains("multiple of pp_size = 2"));
  interleaved["microbatches_per_replica"] = {4, 2};
  CHECK_NOTHROW(lower_json(interleaved));
  Json zero = unequal_plan({3, 1});
  zero["zero_stage"] = 2;
  CHECK_THAT(error_of(zero), Contains("with zero_stage 2 is not supported"));
  zero["zero_stage"] = 1;
  CHECK_NOTHROW(lower_json(zero));
  Json moe = unequal_plan({3, 1});
  CHECK_THAT(error_of(moe, "tiny-moe"), Contains("with a mixture of experts is not supported"));
  Json empty = unequal_plan({});
  empty["dp_size"] = 2;
  CHECK_THAT(error_of(empty), Contains("key 'microbatches_per_replica'"));
  CHECK_THAT(error_of(empty), Contains("is empty"));
}

TEST_CASE("microbatch_slot: every slot of the step once and the equal mapping unchanged", "[plan][replicas]") {
  for (int64_t dp : {1, 2, 3}) {
    for (int64_t j = 0; j < 3; ++j) {
      for (int64_t d = 0; d < dp; ++d) CHECK(microbatch_slot({}, dp, d, j) == j * dp + d);
    }
    std::vector<int64_t> equal(size_t(dp), 3);
    for (int64_t d = 0; d < dp; ++d) CHECK(microbatch_slot(equal, dp, d, 2) == 2 * dp + d);
  }
  // Rounds over the replicas that still have a microbatch: [3, 1, 2] → round 0: 0, 1, 2;
  // round 1: 3 (replica 0), 4 (replica 2); round 2: 5 (replica 0).
  const std::vector<int64_t> counts{3, 1, 2};
  CHECK(microbatch_slot(counts, 3, 0, 1) == 3);
  CHECK(microbatch_slot(counts, 3, 2, 1) == 4);
  CHECK(microbatch_slot(counts, 3, 0, 2) == 5);
  std::set<int64_t> slots;
  for (int64_t d = 0; d < 3; ++d) {
    for (int64_t j = 0; j < counts[size_t(d)]; ++j) CHECK(slots.insert(microbatch_slot(counts, 3, d, j)).second);
  }
  CHECK(slots == std::set<int64_t>{0, 1, 2, 3, 4, 5});
}

TEST_CASE("speed_balanced_microbatches: the fast replicas take more, in units, pipeline fill counted", "[plan][replicas]") {
  CHECK(speed_balanced_microbatches(4, 1, 0, {1.0, 0.5}) == std::vector<int64_t>{3, 1});
  CHECK(speed_balanced_microbatches(8, 1, 0, {1.0, 1.0, 0.5, 0.5}) == std::vector<int64_t>{3, 3, 1, 1});
  CHECK(speed_balanced_microbatches(6, 1, 0, {1.0, 1.0}) == std::vector<int64_t>{3, 3});
  // Interleaved with pp 2: units of 2 microbatches.
  CHECK(speed_balanced_microbatches(8, 2, 0.5, {1.0, 0.5}) == std::vector<int64_t>{6, 2});
  // A fill of 3 microbatches' time (pp 4): the largest (m + 3) / speed is least at 12 and 4,
  // max(15, 14), against max(14, 16) for 11 and 5 and max(16, 12) for 13 and 3.
  CHECK(speed_balanced_microbatches(16, 1, 3, {1.0, 0.5}) == std::vector<int64_t>{12, 4});
  CHECK_THROWS_AS(speed_balanced_microbatches(3, 2, 0, {1.0, 0.5}), InputError);
  CHECK_THROWS_AS(speed_balanced_microbatches(1, 1, 0, {1.0, 0.5}), InputError);
  CHECK_THROWS_AS(speed_balanced_microbatches(4, 1, 0, {1.0, 0.0}), InputError);
}

TEST_CASE("a program with unequal replicas has a role per stage of each replica class", "[lower][replicas]") {
  Json json = unequal_plan({3, 1, 3, 1}, 2);
  json["dp_size"] = 4;
  Lowered l = lower_json(json);  // 8 ranks: tp 1, dp 4, pp 2
  const StepProgram& p = l.program;
  CHECK(p.num_microbatches == 3);
  CHECK(p.class_microbatches() == std::vector<int64_t>{3, 1});
  REQUIRE(p.roles.size() == 4);
  for (size_t r = 0; r < 4; ++r) {
    CHECK(p.roles[r].index == int32_t(r));
    CHECK(p.roles[r].pp_stage == int64_t(r % 2));
    CHECK(p.roles[r].num_microbatches == (r < 2 ? 3 : 1));
  }
  RankGrid grid = p.grid();
  for (int64_t rank = 0; rank < grid.world_size(); ++rank) {
    RankCoord at = grid.coord(rank);
    const Role& role = p.role_of_rank(rank);
    CHECK(role.pp_stage == at.pp);
    CHECK(role.num_microbatches == (at.dp % 2 == 0 ? 3 : 1));
  }
  // The classes' forward passes: as many as their microbatches.
  auto microbatches_seen = [](const Role& role) {
    std::set<int32_t> seen;
    for (const Op& op : role.ops) {
      if (op.phase == Phase::forward && op.microbatch >= 0) seen.insert(op.microbatch);
    }
    return seen.size();
  };
  CHECK(microbatches_seen(p.roles[0]) == 3);
  CHECK(microbatches_seen(p.roles[2]) == 1);
  CHECK(check_program(p).empty());
  CHECK(check_list_order_progress(p).empty());
  // memory: each role with its own ranks (rank = dp + 4 · pp): class 0 is dp 0 and 2.
  MemoryReport memory = memory_report(p, load_topology(source_path("topologies/localhost-cpu.json"), 4));
  REQUIRE(memory.ranks.size() == 4);
  CHECK(memory.ranks[0].ranks == std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {2, 2}});
  CHECK(memory.ranks[3].ranks == std::vector<std::pair<int64_t, int64_t>>{{5, 5}, {7, 7}});
  // The class of 3 microbatches holds more activations than the class of 1... or as much (1F1B
  // keeps at most pp in flight): never less.
  CHECK(memory.ranks[0].peak_bytes >= memory.ranks[2].peak_bytes);

  // program.json carries it and reads back to the same bytes.
  const std::string path = write_temp_file("unequal-program.json", "");
  {
    std::ofstream out(path);
    write_program_json(p, &out);
  }
  StepProgram back = read_program_json(path);
  CHECK(back.microbatches_per_replica == std::vector<int64_t>{3, 1, 3, 1});
  CHECK(back.role_of_rank(grid.rank({0, 1, 1, 0})).index == 3);
  CHECK(write_program_json(back, nullptr) == write_program_json(p, nullptr));
  // Equal replicas: one role per stage and no new keys.
  Lowered equal = lower_json(unequal_plan({2, 2}));
  CHECK(equal.program.roles.size() == 1);
  std::ostringstream text;
  write_program_json(equal.program, &text);
  CHECK(text.str().find("microbatches_per_replica") == std::string::npos);
}

TEST_CASE("check_program: a collective over the replicas issued more often by one class is caught", "[lower][replicas]") {
  // ZeRO-2 reduce-scatters every microbatch over the dp group: with 3 and 1 microbatches the
  // replicas would wait on each other forever. Validation refuses it; lowered anyway, the check
  // names the group and the roles.
  ModelConfig model = load_model(source_path("models/tiny.json"));
  Topology topology = load_topology(source_path("topologies/localhost-cpu.json"), 4);
  Json json = unequal_plan({2, 2});
  json["zero_stage"] = 2;
  Plan plan = parse_plan(json, kFile);
  validate_plan(plan, model, topology);
  plan.microbatches_per_replica = {3, 1};
  std::vector<std::string> errors = check_program(lower_program(model, topology, plan));
  REQUIRE_FALSE(errors.empty());
  CHECK_THAT(errors.front(), Contains("group dp"));
  CHECK_THAT(errors.front(), Contains("role 1 (stage 0, 1 microbatches) issues other collectives than role 0 (3 microbatches)"));
}
