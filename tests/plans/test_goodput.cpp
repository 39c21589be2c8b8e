// The failure model (plans/goodput.hpp) against closed forms and against its own Monte-Carlo
// draws: Daly's expectation by hand, the limit without failures, Young/Daly against the sweep,
// seeded draws that reproduce and converge, failures at given steps worked by hand.
#include <catch2/catch.hpp>

#include <cmath>

#include "goodput.hpp"

using namespace stepcast;

namespace {

GoodputInputs inputs(int64_t steps, double step_s, double write_s, double restart_s, double reload_s, double mtbf_s) {
  GoodputInputs g;
  g.steps = steps;
  g.step_time_s = step_s;
  g.checkpoint_write_s = write_s;
  g.restart_s = restart_s;
  g.reload_s = reload_s;
  g.job_mtbf_s = mtbf_s;
  return g;
}

}  // namespace

TEST_CASE("goodput: the expectation is Daly's, segment by segment, and its parts add up", "[goodput]") {
  // 10 steps of 1 s, a checkpoint every 5 (1 s each), no restart cost, MTBF 100 s: two segments
  // of 6 s, each expected to take M·(e^(6/M) − 1).
  GoodputInputs g = inputs(10, 1, 1, 0, 0, 100);
  GoodputTime e = expected_time(g, 5);
  CHECK(e.time_to_train_s == Approx(2 * 100 * (std::exp(0.06) - 1)).epsilon(1e-12));
  CHECK(e.checkpoints == 2);
  CHECK(e.compute_s == 10);
  CHECK(e.checkpoint_s == 2);
  CHECK(e.restart_s == 0);
  CHECK(e.failures == Approx(2 * (std::exp(0.06) - 1)).epsilon(1e-12));
  CHECK(e.compute_s + e.checkpoint_s + e.lost_s + e.restart_s == Approx(e.time_to_train_s).epsilon(1e-12));
  // With a restart of R: the factor e^(R/M) (a failure may strike the restart too).
  g.restart_s = 7;
  g.reload_s = 3;
  GoodputTime r = expected_time(g, 5);
  CHECK(r.time_to_train_s == Approx(2 * 100 * std::exp(0.1) * (std::exp(0.06) - 1)).epsilon(1e-12));
  CHECK(r.restart_s == Approx(2 * (std::exp(0.06) - 1) * 100 * (std::exp(0.1) - 1)).epsilon(1e-12));
  // A shorter last segment: 11 steps at k = 5 is 5 + 5 + 1, three checkpoints.
  GoodputTime odd = expected_time(inputs(11, 1, 1, 0, 0, 100), 5);
  CHECK(odd.checkpoints == 3);
  CHECK(odd.time_to_train_s == Approx(100 * (2 * std::expm1(0.06) + std::expm1(0.02))).epsilon(1e-12));
}

TEST_CASE("goodput: without failures the expectation is compute plus checkpoints", "[goodput]") {
  GoodputInputs g = inputs(1000, 2, 30, 600, 40, 1e15);
  for (int64_t k : {1, 7, 100, 1000}) {
    GoodputTime e = expected_time(g, k);
    GoodputTime ideal = time_without_failures(g, k);
    CHECK(ideal.time_to_train_s == 2000 + 30.0 * double(checkpoint_count(1000, k)));
    CHECK(e.time_to_train_s == Approx(ideal.time_to_train_s).epsilon(1e-6));
    CHECK(e.failures < 1e-6);
  }
}

TEST_CASE("goodput: Young/Daly's optimum lies within one step of the interval grid's best", "[goodput]") {
  struct Case {
    double step_s, write_s, mtbf_s;
  };
  for (Case c : {Case{1, 10, 3600}, Case{10, 120, 8 * 3600}, Case{0.5, 2, 600}, Case{20, 40, 11000}}) {
    GoodputInputs g = inputs(200000, c.step_s, c.write_s, 600, 60, c.mtbf_s);
    GoodputTime best;
    best.time_to_train_s = INFINITY;
    std::vector<int64_t> grid = interval_grid(g.steps);
    for (int64_t k : grid) {
      GoodputTime e = expected_time(g, k);
      if (e.time_to_train_s < best.time_to_train_s) best = e;
    }
    double daly_steps = daly_interval_s(c.write_s, c.mtbf_s) / c.step_s;
    double young_steps = young_interval_s(c.write_s, c.mtbf_s) / c.step_s;
    INFO("step " << c.step_s << " s, write " << c.write_s << " s, MTBF " << c.mtbf_s << " s: best " << best.interval_steps
                 << " steps, Daly " << daly_steps << ", Young " << young_steps);
    CHECK(std::abs(std::log(double(best.interval_steps) / daly_steps)) <= std::log(kIntervalGridRatio) + 1e-9);
    CHECK(std::abs(std::log(double(best.interval_steps) / young_steps)) <= 2 * std::log(kIntervalGridRatio));
    // And the expectation at Daly's interval is within 0.1% of the grid's best.
    GoodputTime at_daly = expected_time(g, interval_steps_of(daly_interval_s(c.write_s, c.mtbf_s), c.step_s, g.steps));
    CHECK(at_daly.time_to_train_s <= best.time_to_train_s * 1.001);
  }
  // The grid: 1 step first, the run's steps last, ratios no larger than 2^(1/4) once past rounding.
  std::vector<int64_t> grid = interval_grid(1000);
  CHECK(grid.front() == 1);
  CHECK(grid.back() == 1000);
  for (size_t i = 1; i < grid.size(); ++i) {
    CHECK(grid[i] > grid[i - 1]);
    if (grid[i - 1] >= 10) CHECK(double(grid[i]) / double(grid[i - 1]) <= kIntervalGridRatio * 1.06);
  }
}

TEST_CASE("goodput: Monte-Carlo is reproducible for a seed and its mean is the expectation", "[goodput]") {
  GoodputInputs g = inputs(3000, 1, 5, 20, 10, 400);
  int64_t k = interval_steps_of(daly_interval_s(5, 400), 1, g.steps);
  MonteCarloResult a = monte_carlo(g, k, 200, 42);
  MonteCarloResult b = monte_carlo(g, k, 200, 42);
  CHECK(a.mean_s == b.mean_s);  // identical, not approximately
  CHECK(a.stddev_s == b.stddev_s);
  CHECK(a.p95_s == b.p95_s);
  CHECK(monte_carlo(g, k, 200, 43).mean_s != a.mean_s);
  double expected = expected_time(g, k).time_to_train_s;
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    MonteCarloResult m = monte_carlo(g, k, 400, seed);
    INFO("seed " << seed << ": Monte-Carlo " << m.mean_s << " s, expected " << expected << " s");
    CHECK(std::abs(m.mean_s - expected) / expected < 0.05);
    CHECK(m.mean_parts.compute_s == 3000);
    CHECK(m.min_s >= time_without_failures(g, k).time_to_train_s);
    CHECK(m.p05_s <= m.p50_s);
    CHECK(m.p50_s <= m.p95_s);
  }
  // Over many seeds together: the mean of 4,000 runs within 1%.
  MonteCarloResult many = monte_carlo(g, k, 4000, 7);
  CHECK(std::abs(many.mean_s - expected) / expected < 0.01);
  CHECK(std::abs(many.mean_failures - expected_time(g, k).failures) / expected_time(g, k).failures < 0.05);
}

TEST_CASE("goodput: asynchronous saves stall for the snapshot only, and draws match first order", "[goodput]") {
  GoodputInputs g = inputs(2000, 1, 20, 30, 10, 3000);
  g.async_checkpoint = true;
  g.checkpoint_snapshot_s = 1;
  CHECK(checkpoint_stall_s(g, 50) == 1);       // a 20 s write hides behind 50 s of steps
  CHECK(checkpoint_stall_s(g, 10) == 1 + 10);  // behind 10 s of steps, the next snapshot waits 10 s
  // Without failures: compute, 40 snapshots and the last write waited for.
  CHECK(time_without_failures(g, 50).time_to_train_s == 2000 + 40 * 1 + 20);
  GoodputInputs never = g;
  never.job_mtbf_s = 1e15;
  CHECK(monte_carlo(never, 50, 3, 1).mean_s == Approx(2000 + 40 + 20).epsilon(1e-12));
  double expected = expected_time(g, 50).time_to_train_s;
  MonteCarloResult m = monte_carlo(g, 50, 2000, 3);
  INFO("Monte-Carlo " << m.mean_s << " s, first order " << expected << " s");
  CHECK(std::abs(m.mean_s - expected) / expected < 0.05);
  // Synchronous saves of the same write cost more here: 40 × 20 s stalls.
  GoodputInputs sync = g;
  sync.async_checkpoint = false;
  CHECK(expected_time(sync, 50).time_to_train_s > expected);
}

TEST_CASE("goodput: failures at given steps, worked by hand", "[goodput]") {
  // 10 steps of 1 s, checkpoints after steps 4, 8 and 10 (0.5 s each), restart 2 s + reload 1 s.
  GoodputInputs g = inputs(10, 1, 0.5, 2, 1, 1e9);
  ScriptedRun none = scripted_failures(g, 4, {});
  CHECK(none.time.time_to_train_s == 10 + 3 * 0.5);
  CHECK(none.steps_run == 10);
  // Step 5 fails as it begins: step 4 (done after the checkpoint at 4) is lost, then the restart.
  ScriptedRun one = scripted_failures(g, 4, {5});
  CHECK(one.time.time_to_train_s == 10 + 1.5 + 1 + 3);
  CHECK(one.time.lost_s == 1);
  CHECK(one.time.restart_s == 3);
  CHECK(one.time.failures == 1);
  CHECK(one.steps_run == 11);
  CHECK(one.resumed_from_steps == std::vector<int64_t>{4});
  // Step 8 fails as it begins, just after the checkpoint at 8: nothing lost; step 3 loses 3 steps.
  ScriptedRun two = scripted_failures(g, 4, {8, 3});
  CHECK(two.time.time_to_train_s == 10 + 1.5 + 3 + 2 * 3);
  CHECK(two.steps_run == 13);
  CHECK(two.resumed_from_steps == std::vector<int64_t>{0, 8});
  // A failure is not repeated when its step comes round again after the restart.
  CHECK(scripted_failures(g, 4, {1}).resumed_from_steps == std::vector<int64_t>{0});
}
