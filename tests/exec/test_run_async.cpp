// Asynchronous data parallelism run for real (`stepcast run` under mpirun, fp64): every gradient
// applied exactly k steps late. Data-parallel plans (with pipeline or tensor parallelism, ZeRO-1,
// experts) give the single-rank loss curve of the same delay within 1e-9; the weights stay the
// initial ones for the first k updates (losses of steps 0..k computed on them), so staleness 1 and
// 2 agree up to step 1 and part at step 2; a resumed run continues the uninterrupted one (the
// stale gradients are checkpointed state).
#include <catch2/catch.hpp>

#include <filesystem>

#include "run_fixtures.hpp"

using namespace stepcast;
using namespace stepcast::test;

namespace {

Json async_plan(int tp, int pp, int dp, int staleness) {
  return {{"name", "async"}, {"tp_size", tp}, {"pp_size", pp}, {"dp_size", dp}, {"micro_batch_size", 2},
          {"global_batch_size", 8}, {"dtype", "fp64"}, {"dropout", 0.0},
          {"data_parallel_mode", "async"}, {"staleness", staleness}};
}

}  // namespace

TEST_CASE("run: async data parallelism gives the single-rank loss curve of the same delay (fp64)", "[run][async]") {
  const int steps = 5;
  RunResult single = run_plan("tiny", async_plan(1, 1, 1, 2), steps);
  INFO(single.output);
  REQUIRE(single.exit_code == 0);
  const std::vector<double> reference = losses(single);
  REQUIRE(reference.size() == size_t(steps));
  for (const auto& [tp, pp, dp, zero] :
       {std::tuple{1, 1, 2, 0}, std::tuple{1, 2, 2, 0}, std::tuple{2, 1, 2, 0}, std::tuple{1, 1, 2, 1}}) {
    Json p = async_plan(tp, pp, dp, 2);
    p["zero_stage"] = zero;
    RunResult r = run_plan("tiny", p, steps);
    INFO(p.dump() << "\n" << r.output);
    REQUIRE(r.exit_code == 0);
    CHECK(max_relative_difference(losses(r), reference) < 1e-9);
  }
  // A mixture of experts: expert gradients reduced over edp a step late, dense ones over dp.
  Json moe = async_plan(1, 1, 1, 2);
  moe["moe_expert_capacity_factor"] = 2.0;
  RunResult moe_single = run_plan("tiny-moe", moe, steps);
  moe["dp_size"] = 2;
  moe["expert_model_parallel_size"] = 2;
  RunResult moe_ep = run_plan("tiny-moe", moe, steps);
  INFO(moe_single.output << moe_ep.output);
  REQUIRE(moe_single.exit_code == 0);
  REQUIRE(moe_ep.exit_code == 0);
  CHECK(max_relative_difference(losses(moe_ep), losses(moe_single)) < 1e-9);
}

TEST_CASE("run: async staleness k keeps the initial weights for k steps, then applies the oldest gradient",
          "[run][async]") {
  const int steps = 4;
  RunResult one = run_plan("tiny", async_plan(1, 1, 2, 1), steps);
  RunResult two = run_plan("tiny", async_plan(1, 1, 2, 2), steps);
  Json sync_plan = async_plan(1, 1, 2, 1);
  sync_plan.erase("data_parallel_mode");
  sync_plan.erase("staleness");
  RunResult sync = run_plan("tiny", sync_plan, steps);
  INFO(one.output << two.output << sync.output);
  REQUIRE(one.exit_code == 0);
  REQUIRE(two.exit_code == 0);
  REQUIRE(sync.exit_code == 0);
  const std::vector<double> l1 = losses(one), l2 = losses(two), ls = losses(sync);
  // Step 0 is on the initial weights everywhere; step 1 is on them under any staleness (the
  // synchronous run has updated by then).
  CHECK(l1[0] == Approx(ls[0]).epsilon(1e-12));
  CHECK(l2[0] == Approx(ls[0]).epsilon(1e-12));
  CHECK(l1[1] == Approx(l2[1]).epsilon(1e-12));
  CHECK(std::abs(l1[1] - ls[1]) > 1e-6);
  // Step 2: staleness 1 has applied step 0's gradient, staleness 2 not yet.
  CHECK(std::abs(l1[2] - l2[2]) > 1e-6);
}

TEST_CASE("run: an async run resumed from a checkpoint continues the uninterrupted one (fp64)", "[run][async]") {
  const WholeAndResumed runs = whole_and_resumed("tiny", async_plan(1, 1, 2, 2), 5, 3, fresh_dir("run-async-resume"));
  const std::vector<double>& w = runs.whole;
  const std::vector<double>& r = runs.resumed;
  // Steps 3 and 4 apply the gradients of steps 1 and 2, which the checkpoint carried.
  CHECK(r[0] == Approx(w[3]).epsilon(1e-12));
  CHECK(r[1] == Approx(w[4]).epsilon(1e-12));
}
