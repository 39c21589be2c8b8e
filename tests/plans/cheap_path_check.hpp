// The planner's cheap path checked against lowering (tests/plans/test_search.cpp, and
// test_search_moe.cpp for mixtures of experts): check_cheap_path.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "lower.hpp"
#include "memory.hpp"
#include "profile.hpp"
#include "program_stats.hpp"
#include "quick_estimate.hpp"
#include "search.hpp"
#include "test_support.hpp"

namespace stepcast::test {

// Every valid candidate of a case, with `stepcast memory`'s report on its whole program.
struct Checked {
  Candidate candidate;
  MemoryReport full;
  StepProgram program;
};

// Checks the planner's cheap path against lowering on one (model, topology, space): at several
// memory limits (quantiles of the exact peaks, so some plans fit and some do not) the verdict is
// memory's, each stage's bounds hold memory's live peak (memory's report less the arena's
// placement, which the screen leaves to simulate), resolve_peak gives it exactly; the probe
// estimate is quick_estimate's on the lowered program and the communication volume is
// program_stats'. Returns how many stages the screen walked (to show the walk ran).
// `estimate` false: the memory checks only.
inline int64_t check_cheap_path(const ModelConfig& model, const Topology& topology, SearchSpace space,
                         int64_t stride, const std::string& profile_file = "", bool estimate = true) {
  auto candidates = enumerate_candidates(model, topology, space);
  DeviceProfile profile = profile_file.empty() ? roofline_profile(topology) : load_profile(source_path(profile_file));
  auto costs = ComputeCostModel(topology.node.device, candidates.front().plan.param_dtype, profile, topology.file);
  if (space.fp8.enabled()) costs.use_fp8(topology.node.device, topology.file);
  std::vector<Checked> checked;
  int64_t index = 0;
  for (const auto& c : candidates) {
    if (!c.kept() || index++ % stride != 0) continue;
    StepProgram program = lower_program(model, topology, c.plan);
    MemoryReport live = memory_report(program, topology);
    live.peak_bytes_max = 0;
    for (RankMemory& m : live.ranks) {
      m.peak_bytes -= m.placement_bytes;
      live.peak_bytes_max = std::max(live.peak_bytes_max, m.peak_bytes);
    }
    checked.push_back({c, live, std::move(program)});
  }
  REQUIRE(checked.size() > 10);
  std::vector<double> peaks;
  for (const auto& k : checked) peaks.push_back(k.full.peak_bytes_max + k.full.reserved_bytes);
  std::sort(peaks.begin(), peaks.end());
  int64_t walked = 0, fit = 0, too_big = 0;
  const double capacity = topology.node.device.memory_bytes;
  for (double quantile : {0.1, 0.5, 0.9, 1.0}) {
    double limit = peaks[std::min(peaks.size() - 1, size_t(quantile * double(peaks.size())))];
    space.max_memory_fraction = limit / capacity;
    std::vector<Candidate> batch;
    for (const auto& k : checked) batch.push_back(k.candidate);
    check_candidates(batch, model, topology, space, costs, 2, nullptr);
    for (size_t i = 0; i < batch.size(); ++i) {
      Candidate& c = batch[i];
      const MemoryReport& full = checked[i].full;
      INFO(c.plan.name << " at " << space.max_memory_fraction << " of the device");
      bool full_fits = full.peak_bytes_max + full.reserved_bytes <= space.max_memory_fraction * capacity;
      REQUIRE(full_fits == c.kept());
      if (!c.kept()) {
        CHECK(c.pruned == "does not fit in memory");
        CHECK(c.peak_bytes_max <= full.peak_bytes_max * (1 + 1e-12));
        ++too_big;
      } else {
        ++fit;
      }
      walked += c.walked_stages;
      for (const auto& b : c.stage_bounds) {
        double exact = full.ranks[size_t(b.stage)].peak_bytes;
        CHECK(b.lower_bytes <= exact * (1 + 1e-12));
        CHECK(b.upper_bytes >= exact * (1 - 1e-12));
      }
      if (c.kept()) {
        resolve_peak(c, model, topology);
        CHECK(c.peak_exact);
        CHECK(c.peak_bytes_max == Approx(full.peak_bytes_max).epsilon(1e-12));
        if (!estimate) continue;
        QuickEstimate e = quick_estimate(lower_program(model, topology, memory_path_plan(c.plan)),
                                         c.plan, c.plan.num_microbatches(), topology, costs);
        CHECK(c.estimate.step_time_s == Approx(e.step_time_s).epsilon(1e-9));
        CHECK(c.estimate.critical_stage == e.critical_stage);
        ProgramStats stats = program_stats(checked[i].program);
        CHECK(c.estimate.comm_bytes_per_rank_max.size() == stats.comm_bytes_per_rank_max.size());
        for (const auto& [kind, bytes] : stats.comm_bytes_per_rank_max) {
          INFO(kind);
          CHECK(c.estimate.comm_bytes_per_rank_max[kind] == Approx(bytes).epsilon(1e-12));
        }
      }
    }
  }
  CHECK(fit > 0);
  CHECK(too_big > 0);
  return walked;
}


}  // namespace stepcast::test
