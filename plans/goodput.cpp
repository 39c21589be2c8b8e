// goodput.hpp: the expectation, the intervals and the runs drawn or scripted. One timeline
// (run_timeline) serves both the Monte-Carlo draws and the scripted failures, so the two follow
// the same rules: a failure rolls the job back to its last durable checkpoint and costs a
// restart and a reload, which a later failure may interrupt in turn.
#include "goodput.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <sstream>

#include "errors.hpp"

namespace stepcast {

namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();

// Where failures come from: drawn times (Monte-Carlo) or steps (scripted).
class FailureSource {
 public:
  virtual ~FailureSource() = default;
  // The time of the failure that ends work begun at `start_s` with `steps_done` steps done and
  // `steps` to run (kNever when none does).
  virtual double during_work(double start_s, int64_t steps_done, int64_t steps, double step_time_s) = 0;
  // The same for a window with no step in it (a checkpoint, a restart, a wait).
  virtual double during_wait(double start_s, double duration_s) = 0;
  // Called once the failure at `time_s` happened.
  virtual void happened(double time_s) = 0;
};

class DrawnFailures : public FailureSource {
 public:
  DrawnFailures(double mtbf_s, uint64_t seed) : mtbf_s_(mtbf_s), generator_(seed) { next_s_ = draw(0); }
  double during_work(double start_s, int64_t, int64_t steps, double step_time_s) override {
    return next_s_ < start_s + double(steps) * step_time_s ? next_s_ : kNever;
  }
  double during_wait(double start_s, double duration_s) override {
    return next_s_ < start_s + duration_s ? next_s_ : kNever;
  }
  void happened(double time_s) override { next_s_ = draw(time_s); }

 private:
  // Inverse transform of a uniform in (0, 1) made from the top 53 bits: the same on every
  // machine (std::exponential_distribution is not specified bit for bit).
  double draw(double after_s) {
    double u = (double(generator_() >> 11) + 0.5) * 0x1.0p-53;
    return after_s - mtbf_s_ * std::log(u);
  }
  double mtbf_s_;
  std::mt19937_64 generator_;
  double next_s_ = 0;
};

class ScriptedFailures : public FailureSource {
 public:
  explicit ScriptedFailures(const std::vector<int64_t>& steps) : pending_(steps.begin(), steps.end()) {}
  double during_work(double start_s, int64_t steps_done, int64_t steps, double step_time_s) override {
    auto it = pending_.lower_bound(steps_done);
    if (it == pending_.end() || *it >= steps_done + steps) return kNever;
    double at = start_s + double(*it - steps_done) * step_time_s;
    pending_.erase(it);  // each failure happens once
    return at;
  }
  double during_wait(double, double) override { return kNever; }
  void happened(double) override {}

 private:
  std::set<int64_t> pending_;
};

struct Timeline {
  GoodputTime time;
  int64_t steps_run = 0;
  std::vector<int64_t> resumed_from_steps;
};

// One run to the end: the last step done and its checkpoint durable.
Timeline run_timeline(const GoodputInputs& in, int64_t k, FailureSource& failures) {
  Timeline out;
  const double T = in.step_time_s;
  const double recovery_s = in.restart_s + in.reload_s;
  double t = 0;
  int64_t done = 0, durable = 0;
  // Checkpoints in the run's history (step, stall): the ones a rollback has not undone.
  std::vector<std::pair<int64_t, double>> history;
  bool pending = false;  // an asynchronous write in flight
  int64_t pending_step = 0;
  double pending_durable_s = 0;
  double restart_total_s = 0;
  auto fail = [&](double at_s) {
    failures.happened(at_s);
    out.time.failures += 1;
    t = at_s;
    if (pending && pending_durable_s <= at_s) durable = pending_step;
    pending = false;
    done = durable;
    while (!history.empty() && history.back().first > durable) history.pop_back();
    out.resumed_from_steps.push_back(durable);
    for (;;) {  // the restart and reload, which a failure may interrupt
      double f = failures.during_wait(t, recovery_s);
      if (f == kNever) break;
      failures.happened(f);
      out.time.failures += 1;
      restart_total_s += f - t;
      t = f;
    }
    t += recovery_s;
    restart_total_s += recovery_s;
  };
  // Waits for the write in flight (asynchronous saves); false when a failure came first.
  auto wait_for_write = [&](double& stall_s) {
    if (!pending) return true;
    if (pending_durable_s > t) {
      double f = failures.during_wait(t, pending_durable_s - t);
      if (f != kNever) {
        fail(f);
        return false;
      }
      stall_s += pending_durable_s - t;
      t = pending_durable_s;
    }
    durable = pending_step;
    pending = false;
    return true;
  };
  for (;;) {
    if (done == in.steps) {
      if (!in.async_checkpoint || !pending) break;
      double stall = 0;
      if (!wait_for_write(stall)) continue;
      history.back().second += stall;
      break;
    }
    int64_t n = std::min(k, in.steps - done);
    double f = failures.during_work(t, done, n, T);
    if (f != kNever) {
      out.steps_run += int64_t(std::floor((f - t) / T + 1e-9));
      fail(f);
      continue;
    }
    t += double(n) * T;
    done += n;
    out.steps_run += n;
    if (!in.async_checkpoint) {
      double g = failures.during_wait(t, in.checkpoint_write_s);
      if (g != kNever) {
        fail(g);
        continue;
      }
      t += in.checkpoint_write_s;
      durable = done;
      history.push_back({done, in.checkpoint_write_s});
      continue;
    }
    double stall = 0;
    if (!wait_for_write(stall)) continue;
    double g = failures.during_wait(t, in.checkpoint_snapshot_s);
    if (g != kNever) {
      fail(g);
      continue;
    }
    t += in.checkpoint_snapshot_s;
    stall += in.checkpoint_snapshot_s;
    history.push_back({done, stall});
    pending = true;
    pending_step = done;
    pending_durable_s = t + in.checkpoint_write_s;
  }
  out.time.interval_steps = k;
  out.time.time_to_train_s = t;
  out.time.compute_s = double(in.steps) * T;
  for (const auto& [step, stall] : history) out.time.checkpoint_s += stall;
  out.time.checkpoints = int64_t(history.size());
  out.time.restart_s = restart_total_s;
  out.time.lost_s = t - out.time.compute_s - out.time.checkpoint_s - restart_total_s;
  return out;
}

void check_interval(int64_t interval_steps) {
  STEPCAST_CHECK(interval_steps >= 1, "checkpoint interval " + std::to_string(interval_steps) + " < 1");
}

}  // namespace

int64_t checkpoint_count(int64_t steps, int64_t interval_steps) {
  check_interval(interval_steps);
  return (steps + interval_steps - 1) / interval_steps;
}

double checkpoint_stall_s(const GoodputInputs& in, int64_t interval_steps) {
  if (!in.async_checkpoint) return in.checkpoint_write_s;
  double work_s = double(interval_steps) * in.step_time_s;
  return in.checkpoint_snapshot_s + std::max(0.0, in.checkpoint_write_s - work_s);
}

GoodputTime time_without_failures(const GoodputInputs& in, int64_t interval_steps) {
  GoodputTime g;
  g.interval_steps = interval_steps;
  g.checkpoints = checkpoint_count(in.steps, interval_steps);
  g.compute_s = double(in.steps) * in.step_time_s;
  // Asynchronous: the last write is waited for (its stall is the write beyond the snapshot).
  g.checkpoint_s = double(g.checkpoints) * checkpoint_stall_s(in, interval_steps);
  if (in.async_checkpoint) g.checkpoint_s += in.checkpoint_write_s;
  g.time_to_train_s = g.compute_s + g.checkpoint_s;
  return g;
}

GoodputTime expected_time(const GoodputInputs& in, int64_t interval_steps) {
  GoodputTime g = time_without_failures(in, interval_steps);
  const double M = in.job_mtbf_s;
  const double R = in.restart_s + in.reload_s;
  const double recovery_s = M * std::expm1(R / M);  // a restart to its end, failures in it included
  if (!in.async_checkpoint) {
    // Segments of k steps (the last may be shorter), each with its checkpoint.
    int64_t full = in.steps / interval_steps;
    int64_t rest = in.steps % interval_steps;
    g.time_to_train_s = 0;
    g.restart_s = 0;
    g.failures = 0;
    auto add_segment = [&](int64_t steps, double count) {
      double L = double(steps) * in.step_time_s + in.checkpoint_write_s;
      double attempts_failed = std::expm1(L / M);
      g.time_to_train_s += count * M * std::exp(R / M) * attempts_failed;
      g.restart_s += count * attempts_failed * recovery_s;
      g.failures += count * attempts_failed * std::exp(R / M);
    };
    add_segment(interval_steps, double(full));
    if (rest > 0) add_segment(rest, 1);
    g.lost_s = g.time_to_train_s - g.compute_s - g.checkpoint_s - g.restart_s;
    return g;
  }
  // First order: failures at rate 1/M over the whole run, each losing half a period and the
  // write in flight, then a restart.
  double period_s = double(interval_steps) * in.step_time_s + checkpoint_stall_s(in, interval_steps);
  double lost_per_failure_s = period_s / 2 + in.checkpoint_write_s;
  double fraction = (lost_per_failure_s + recovery_s) / M;
  double base_s = g.time_to_train_s;
  g.time_to_train_s = fraction < 1 ? base_s / (1 - fraction) : kNever;
  g.failures = g.time_to_train_s / M;
  g.lost_s = g.failures * lost_per_failure_s;
  g.restart_s = g.failures * recovery_s;
  return g;
}

double young_interval_s(double checkpoint_cost_s, double mtbf_s) {
  return std::sqrt(2 * checkpoint_cost_s * mtbf_s);
}

double daly_interval_s(double checkpoint_cost_s, double mtbf_s) {
  if (checkpoint_cost_s >= 2 * mtbf_s) return mtbf_s;
  double x = checkpoint_cost_s / (2 * mtbf_s);
  return young_interval_s(checkpoint_cost_s, mtbf_s) * (1 + std::sqrt(x) / 3 + x / 9) - checkpoint_cost_s;
}

int64_t interval_steps_of(double interval_s, double step_time_s, int64_t steps) {
  double k = std::round(interval_s / step_time_s);
  if (!(k >= 1)) return 1;
  return k >= double(steps) ? steps : int64_t(k);
}

std::vector<int64_t> interval_grid(int64_t steps) {
  std::vector<int64_t> grid;
  for (double x = 1; x < double(steps) * kIntervalGridRatio; x *= kIntervalGridRatio) {
    int64_t k = std::min(steps, int64_t(std::llround(x)));
    if (grid.empty() || k != grid.back()) grid.push_back(k);
  }
  return grid;
}

std::optional<std::string> monte_carlo_refusal(const GoodputInputs& in, int64_t interval_steps) {
  GoodputTime expected = expected_time(in, interval_steps);
  if (std::isfinite(expected.time_to_train_s) && expected.failures <= kMaxDrawnFailures) return std::nullopt;
  std::ostringstream why;
  why.precision(2);
  why << "failures come faster than " << interval_steps << " steps and their checkpoint: the expected run ";
  if (std::isfinite(expected.time_to_train_s) && std::isfinite(expected.failures)) {
    why << "fails " << expected.failures << " times (over " << kMaxDrawnFailures << ")";
  } else {
    why << "never ends";
  }
  why << "; not drawn";
  return why.str();
}

MonteCarloResult monte_carlo(const GoodputInputs& in, int64_t interval_steps, int64_t runs, uint64_t seed) {
  check_interval(interval_steps);
  STEPCAST_CHECK(runs >= 1, "Monte-Carlo runs < 1");
  STEPCAST_CHECK(!monte_carlo_refusal(in, interval_steps), "Monte-Carlo draws of a run that does not end");
  MonteCarloResult r;
  r.runs = runs;
  r.seed = seed;
  // One stream per run, seeded from the run's index: a run's draws do not depend on the others.
  std::vector<double> totals;
  totals.reserve(size_t(runs));
  GoodputTime& sum = r.mean_parts;
  sum.interval_steps = interval_steps;
  for (int64_t i = 0; i < runs; ++i) {
    std::seed_seq seq{uint32_t(seed), uint32_t(seed >> 32), uint32_t(i), uint32_t(uint64_t(i) >> 32)};
    std::mt19937_64 seeder(seq);
    DrawnFailures failures(in.job_mtbf_s, seeder());
    GoodputTime g = run_timeline(in, interval_steps, failures).time;
    totals.push_back(g.time_to_train_s);
    sum.time_to_train_s += g.time_to_train_s;
    sum.compute_s += g.compute_s;
    sum.checkpoint_s += g.checkpoint_s;
    sum.lost_s += g.lost_s;
    sum.restart_s += g.restart_s;
    sum.failures += g.failures;
    sum.checkpoints += g.checkpoints;
  }
  double n = double(runs);
  for (double* v : {&sum.time_to_train_s, &sum.compute_s, &sum.checkpoint_s, &sum.lost_s, &sum.restart_s,
                    &sum.failures}) {
    *v /= n;
  }
  sum.checkpoints = int64_t(std::llround(double(sum.checkpoints) / n));
  r.mean_s = sum.time_to_train_s;
  r.mean_failures = sum.failures;
  double squares = 0;
  for (double v : totals) squares += (v - r.mean_s) * (v - r.mean_s);
  r.stddev_s = runs > 1 ? std::sqrt(squares / (n - 1)) : 0;
  std::sort(totals.begin(), totals.end());
  auto quantile = [&](double q) { return totals[size_t(std::llround(q * (n - 1)))]; };
  r.min_s = totals.front();
  r.p05_s = quantile(0.05);
  r.p50_s = quantile(0.5);
  r.p95_s = quantile(0.95);
  r.max_s = totals.back();
  return r;
}

ScriptedRun scripted_failures(const GoodputInputs& in, int64_t interval_steps,
                              const std::vector<int64_t>& failure_steps) {
  check_interval(interval_steps);
  ScriptedFailures failures(failure_steps);
  Timeline t = run_timeline(in, interval_steps, failures);
  return {t.time, t.steps_run, t.resumed_from_steps};
}

}  // namespace stepcast
