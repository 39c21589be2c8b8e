// Pipeline schedules against their oracles: every pass exactly once, Megatron's warm-up counts,
// no deadlock when all stages run their lists in order, the closed-form bubble fraction under
// uniform costs, and activation sets in flight. Also the sample mapping and the layer split.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "errors.hpp"
#include "schedule.hpp"

using namespace stepcast;

namespace {

const char* name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::gpipe: return "gpipe";
    case ScheduleKind::one_f_one_b: return "1f1b";
    case ScheduleKind::interleaved_1f1b: return "interleaved_1f1b";
  }
  return "?";
}

struct Case {
  ScheduleKind kind;
  ScheduleShape shape;
};

// gpipe and 1f1b: pp 1..8, every m in 1..4·pp+1 (multiples and not); interleaved: vpp 1..3,
// m a multiple of pp up to 4·pp.
std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (int64_t pp = 1; pp <= 8; ++pp) {
    for (int64_t m = 1; m <= 4 * pp + 1; ++m) {
      cases.push_back({ScheduleKind::gpipe, {pp, 1, m}});
      cases.push_back({ScheduleKind::one_f_one_b, {pp, 1, m}});
    }
    for (int64_t vpp = 1; vpp <= 3; ++vpp) {
      for (int64_t m = pp; m <= 4 * pp; m += pp) {
        cases.push_back({ScheduleKind::interleaved_1f1b, {pp, vpp, m}});
      }
    }
  }
  return cases;
}

// Megatron's warm-up formulas, written out again from schedules.py.
int64_t megatron_warmup(ScheduleKind kind, const ScheduleShape& s, int64_t stage) {
  const int64_t p = s.pp_size, m = s.num_microbatches, v = s.virtual_pp_size;
  if (kind == ScheduleKind::gpipe) return m;
  if (kind == ScheduleKind::one_f_one_b) return std::min(p - stage - 1, m);
  if (m == p) return m * v;
  return std::min((p - stage - 1) * 2 + (v - 1) * p, m * v);
}

struct SimResult {
  bool finished = false;
  int64_t makespan = 0;  // in passes of one chunk, each costing 1
};

// Runs every stage's action list strictly in order. Forward (mb, vs) needs forward (mb, vs-1);
// backward (mb, vs) needs backward (mb, vs+1), or forward (mb, vs) on the last virtual stage
// (vs = chunk·pp + stage). Each round, every stage whose next action is ready runs it; an action
// starts when its stage is free and its dependency has ended (infinite bandwidth, zero latency).
SimResult simulate(const std::vector<std::vector<PassAction>>& lists, int64_t virtual_pp_size) {
  const int64_t pp = static_cast<int64_t>(lists.size());
  const int64_t last_vs = pp * virtual_pp_size - 1;
  std::map<std::tuple<bool, int64_t, int64_t>, int64_t> end;  // (forward, mb, vs) → end time
  std::vector<size_t> next(pp, 0);
  std::vector<int64_t> free_at(pp, 0);
  size_t remaining = 0;
  for (const auto& list : lists) remaining += list.size();
  while (remaining > 0) {
    std::vector<std::pair<std::tuple<bool, int64_t, int64_t>, int64_t>> finished_this_round;
    for (int64_t stage = 0; stage < pp; ++stage) {
      if (next[stage] == lists[stage].size()) continue;
      const PassAction& a = lists[stage][next[stage]];
      const int64_t vs = a.chunk * pp + stage;
      std::tuple<bool, int64_t, int64_t> dep;
      bool has_dep = true;
      if (a.forward) {
        has_dep = vs > 0;
        dep = {true, a.microbatch, vs - 1};
      } else {
        dep = vs < last_vs ? std::tuple{false, a.microbatch, vs + 1}
                           : std::tuple{true, a.microbatch, vs};
      }
      int64_t start = free_at[stage];
      if (has_dep) {
        auto it = end.find(dep);
        if (it == end.end()) continue;  // not ready this round
        start = std::max(start, it->second);
      }
      free_at[stage] = start + 1;
      finished_this_round.push_back({{a.forward, a.microbatch, vs}, start + 1});
      ++next[stage];
    }
    if (finished_this_round.empty()) return SimResult{false, 0};  // deadlock
    for (const auto& [key, t] : finished_this_round) end[key] = t;
    remaining -= finished_this_round.size();
  }
  return SimResult{true, *std::max_element(free_at.begin(), free_at.end())};
}

std::vector<std::vector<PassAction>> all_stages(ScheduleKind kind, const ScheduleShape& s) {
  std::vector<std::vector<PassAction>> lists;
  for (int64_t stage = 0; stage < s.pp_size; ++stage) {
    lists.push_back(schedule_actions(kind, s, stage));
  }
  return lists;
}

}  // namespace

TEST_CASE("every pass runs once, backward after its forward, Megatron's warm-up", "[schedule]") {
  for (const Case& c : all_cases()) {
    const ScheduleShape& s = c.shape;
    for (int64_t stage = 0; stage < s.pp_size; ++stage) {
      INFO(name(c.kind) << " pp " << s.pp_size << " vpp " << s.virtual_pp_size << " m "
                        << s.num_microbatches << " stage " << stage);
      const auto actions = schedule_actions(c.kind, s, stage);
      const int64_t total = s.num_microbatches * s.virtual_pp_size;
      REQUIRE(static_cast<int64_t>(actions.size()) == 2 * total);

      std::set<std::pair<int64_t, int64_t>> forwards, backwards;
      for (const PassAction& a : actions) {
        REQUIRE((a.microbatch >= 0 && a.microbatch < s.num_microbatches));
        REQUIRE((a.chunk >= 0 && a.chunk < s.virtual_pp_size));
        if (a.forward) {
          CHECK(forwards.insert({a.microbatch, a.chunk}).second);
        } else {
          CHECK(forwards.count({a.microbatch, a.chunk}) == 1);  // its forward came first
          CHECK(backwards.insert({a.microbatch, a.chunk}).second);
        }
      }
      CHECK(static_cast<int64_t>(forwards.size()) == total);
      CHECK(static_cast<int64_t>(backwards.size()) == total);

      const int64_t warmup = warmup_forwards(c.kind, s, stage);
      CHECK(warmup == megatron_warmup(c.kind, s, stage));
      // The list opens with the warm-up forwards, plus the steady state's first forward if any.
      auto first_backward = std::find_if(actions.begin(), actions.end(),
                                         [](const PassAction& a) { return !a.forward; });
      const int64_t leading = first_backward - actions.begin();
      CHECK(leading == (warmup < total ? warmup + 1 : warmup));
      // Forward passes run in the same order on every stage, and so do backward passes: that is
      // what lets neighbours exchange activations and gradients without tags.
      if (stage > 0) {
        auto prev = schedule_actions(c.kind, s, stage - 1);
        auto only = [](const std::vector<PassAction>& list, bool forward) {
          std::vector<PassAction> out;
          for (const auto& a : list) if (a.forward == forward) out.push_back(a);
          return out;
        };
        CHECK(only(prev, true) == only(actions, true));
        CHECK(only(prev, false) == only(actions, false));
      }
    }
  }
}

TEST_CASE("schedules finish when all stages run in order, with the ideal bubble", "[schedule]") {
  for (const Case& c : all_cases()) {
    const ScheduleShape& s = c.shape;
    INFO(name(c.kind) << " pp " << s.pp_size << " vpp " << s.virtual_pp_size << " m "
                      << s.num_microbatches);
    const SimResult result = simulate(all_stages(c.kind, s), s.virtual_pp_size);
    REQUIRE(result.finished);
    // Uniform costs: one chunk pass = 1/v of a full-stage pass, so per stage the work is 2·m·v
    // chunk passes and the ideal step is 2·(v·m + p - 1) of them.
    const int64_t v = s.virtual_pp_size, m = s.num_microbatches, p = s.pp_size;
    CHECK(result.makespan == 2 * (v * m + p - 1));
    const double bubble = static_cast<double>(result.makespan - 2 * v * m) / result.makespan;
    CHECK(bubble == Approx(ideal_bubble_fraction(c.kind, s)).margin(1e-12));
  }
}

TEST_CASE("the simulation catches deadlocks and slow schedules", "[schedule]") {
  // Two stages that each wait for the other: stage 0 starts with a backward.
  std::vector<std::vector<PassAction>> deadlocked = {
      {{false, 0, 0}, {true, 0, 0}},
      {{true, 0, 0}, {false, 0, 0}},
  };
  CHECK_FALSE(simulate(deadlocked, 1).finished);

  // F, B alternation from the start (no warm-up) finishes but serialises the pipeline.
  const int64_t p = 4, m = 8;
  std::vector<std::vector<PassAction>> no_warmup(p);
  for (auto& list : no_warmup) {
    for (int64_t j = 0; j < m; ++j) {
      list.push_back({true, j, 0});
      list.push_back({false, j, 0});
    }
  }
  const SimResult slow = simulate(no_warmup, 1);
  REQUIRE(slow.finished);
  CHECK(slow.makespan == m * 2 * p);
  CHECK(slow.makespan > 2 * (m + p - 1));
}

TEST_CASE("1f1b worked example: pp 4, m 8", "[schedule]") {
  const ScheduleShape s{4, 1, 8};
  auto F = [](int64_t j) { return PassAction{true, j, 0}; };
  auto B = [](int64_t j) { return PassAction{false, j, 0}; };
  CHECK(schedule_actions(ScheduleKind::one_f_one_b, s, 0) ==
        std::vector<PassAction>{F(0), F(1), F(2), F(3), B(0), F(4), B(1), F(5), B(2), F(6), B(3),
                                F(7), B(4), B(5), B(6), B(7)});
  CHECK(schedule_actions(ScheduleKind::one_f_one_b, s, 3) ==
        std::vector<PassAction>{F(0), B(0), F(1), B(1), F(2), B(2), F(3), B(3), F(4), B(4), F(5),
                                B(5), F(6), B(6), F(7), B(7)});
  CHECK(schedule_actions(ScheduleKind::gpipe, ScheduleShape{4, 1, 2}, 1) ==
        std::vector<PassAction>{F(0), F(1), B(0), B(1)});
}

TEST_CASE("interleaved worked example: pp 2, vpp 2, m 4", "[schedule]") {
  const ScheduleShape s{2, 2, 4};
  auto F = [](int64_t j, int64_t c) { return PassAction{true, j, c}; };
  auto B = [](int64_t j, int64_t c) { return PassAction{false, j, c}; };
  // Stage 0: warm-up (2-0-1)·2 + (2-1)·2 = 4 forwards.
  CHECK(schedule_actions(ScheduleKind::interleaved_1f1b, s, 0) ==
        std::vector<PassAction>{F(0, 0), F(1, 0), F(0, 1), F(1, 1), F(2, 0), B(0, 1), F(3, 0),
                                B(1, 1), F(2, 1), B(0, 0), F(3, 1), B(1, 0), B(2, 1), B(3, 1),
                                B(2, 0), B(3, 0)});
  // Stage 1: warm-up 2 forwards.
  CHECK(schedule_actions(ScheduleKind::interleaved_1f1b, s, 1) ==
        std::vector<PassAction>{F(0, 0), F(1, 0), F(0, 1), B(0, 1), F(1, 1), B(1, 1), F(2, 0),
                                B(0, 0), F(3, 0), B(1, 0), F(2, 1), B(2, 1), F(3, 1), B(3, 1),
                                B(2, 0), B(3, 0)});
  // m == pp: Megatron runs every forward first.
  const ScheduleShape all_warmup{2, 2, 2};
  CHECK(warmup_forwards(ScheduleKind::interleaved_1f1b, all_warmup, 1) == 4);
  CHECK(schedule_actions(ScheduleKind::interleaved_1f1b, all_warmup, 1) ==
        std::vector<PassAction>{F(0, 0), F(1, 0), F(0, 1), F(1, 1), B(0, 1), B(1, 1), B(0, 0),
                                B(1, 0)});
}

TEST_CASE("activation sets in flight", "[schedule]") {
  for (const Case& c : all_cases()) {
    const ScheduleShape& s = c.shape;
    const int64_t p = s.pp_size, m = s.num_microbatches, total = m * s.virtual_pp_size;
    for (int64_t stage = 0; stage < p; ++stage) {
      INFO(name(c.kind) << " pp " << p << " vpp " << s.virtual_pp_size << " m " << m
                        << " stage " << stage);
      const int64_t peak = max_in_flight(schedule_actions(c.kind, s, stage));
      switch (c.kind) {
        case ScheduleKind::gpipe: CHECK(peak == m); break;
        case ScheduleKind::one_f_one_b: CHECK(peak == std::min(p - stage, m)); break;
        case ScheduleKind::interleaved_1f1b:
          CHECK(peak == std::min(megatron_warmup(c.kind, s, stage) + 1, total));
          break;
      }
    }
  }
  // Interleaving holds more than 1F1B's pp on stage 0: pp 4, vpp 2, m 8 → 2·3 + 4 + 1 = 11.
  CHECK(max_in_flight(schedule_actions(ScheduleKind::interleaved_1f1b, {4, 2, 8}, 0)) == 11);
  CHECK(max_in_flight({}) == 0);
}

TEST_CASE("ideal bubble fractions", "[schedule]") {
  CHECK(ideal_bubble_fraction(ScheduleKind::one_f_one_b, {4, 1, 8}) == Approx(3.0 / 11.0));
  CHECK(ideal_bubble_fraction(ScheduleKind::gpipe, {4, 1, 8}) == Approx(3.0 / 11.0));
  CHECK(ideal_bubble_fraction(ScheduleKind::interleaved_1f1b, {4, 2, 8}) == Approx(3.0 / 19.0));
  CHECK(ideal_bubble_fraction(ScheduleKind::one_f_one_b, {1, 1, 8}) == 0.0);
}

TEST_CASE("bad schedule shapes throw", "[schedule]") {
  CHECK_THROWS_AS(schedule_actions(ScheduleKind::interleaved_1f1b, {4, 2, 6}, 0),
                  InputError);
  CHECK_THROWS_AS(schedule_actions(ScheduleKind::one_f_one_b, {4, 2, 8}, 0),
                  InputError);
  CHECK_THROWS_AS(schedule_actions(ScheduleKind::gpipe, {4, 1, 8}, 4), InputError);
  CHECK_THROWS_AS(schedule_actions(ScheduleKind::gpipe, {4, 1, 0}, 0), InputError);
  CHECK_THROWS_AS(warmup_forwards(ScheduleKind::one_f_one_b, {0, 1, 1}, 0),
                  InputError);
}

TEST_CASE("sample mapping is a bijection over a step", "[schedule]") {
  for (int64_t mbs : {1, 2, 3}) {
    for (int64_t dp : {1, 2, 4}) {
      for (int64_t m : {1, 3, 4}) {
        const int64_t gbs = mbs * dp * m;
        INFO("micro_batch_size " << mbs << " dp " << dp << " m " << m);
        std::set<std::tuple<int64_t, int64_t, int64_t>> slots;
        for (int64_t sample = 0; sample < gbs; ++sample) {
          const SampleSlot slot = sample_slot(sample, mbs, dp);
          CHECK((slot.dp_rank >= 0 && slot.dp_rank < dp));
          CHECK((slot.microbatch >= 0 && slot.microbatch < m));
          CHECK((slot.offset >= 0 && slot.offset < mbs));
          slots.insert({slot.dp_rank, slot.microbatch, slot.offset});
          CHECK(global_sample_index(0, gbs, slot, mbs, dp) == sample);
          CHECK(global_sample_index(5, gbs, slot, mbs, dp) == 5 * gbs + sample);
        }
        CHECK(static_cast<int64_t>(slots.size()) == gbs);
      }
    }
  }
}

TEST_CASE("sample mapping examples", "[schedule]") {
  // micro_batch_size 2, dp 4: microbatch 0 is samples 0..7 (rank d holds 2d, 2d+1),
  // microbatch 1 is samples 8..15.
  SampleSlot slot = sample_slot(13, 2, 4);
  CHECK(slot.dp_rank == 2);
  CHECK(slot.microbatch == 1);
  CHECK(slot.offset == 1);
  slot = sample_slot(6, 2, 4);
  CHECK(slot.dp_rank == 3);
  CHECK(slot.microbatch == 0);
  CHECK(slot.offset == 0);
  // Step 3 of global_batch_size 32: dp rank 1, microbatch 2, offset 1 → 3·32 + (2·4+1)·2 + 1.
  CHECK(global_sample_index(3, 32, SampleSlot{1, 2, 1}, 2, 4) == 115);
  CHECK_THROWS_AS(sample_slot(-1, 2, 4), InputError);
  CHECK_THROWS_AS(sample_slot(0, 0, 4), InputError);
}

TEST_CASE("layers per stage balanced by stage speed", "[schedule]") {
  // 32 layers on 4 stages, the last at half speed: a layer costs 1/speed, so the slow stage
  // takes about half a fast stage's share: 10, 9, 9, 4 (largest layers / speed: 10, as 9, 9, 9,
  // 5 would give; ties go to the earlier stage; not 16 as the even split 8 each would give).
  CHECK(speed_balanced_layers_per_stage(32, 1, {1, 1, 1, 0.5}) == std::vector<int64_t>{10, 9, 9, 4});
  // Equal speeds: the even split, the remainder to the earlier stages.
  CHECK(speed_balanced_layers_per_stage(10, 1, {1, 1, 1}) == std::vector<int64_t>{4, 3, 3});
  // Two chunks a stage (virtual stage c·pp + p): stage 0 (speed 2) holds 16 of 24 layers, 8 a
  // chunk; stage 1 holds 8, 4 a chunk.
  CHECK(speed_balanced_layers_per_stage(24, 2, {2, 1}) == std::vector<int64_t>{8, 4, 8, 4});
  // An odd count over the chunks: the earlier chunk takes the extra layer.
  CHECK(speed_balanced_layers_per_stage(7, 2, {1, 1}) == std::vector<int64_t>{2, 2, 2, 1});
  // Every chunk keeps a layer however slow its stage.
  CHECK(speed_balanced_layers_per_stage(6, 1, {1, 1, 0.01}) == std::vector<int64_t>{3, 2, 1});
  // The minimax property against every split, on a small case.
  const std::vector<double> speed{1.0, 0.7, 1.3};
  const auto best = speed_balanced_layers_per_stage(20, 1, speed);
  double best_max = 0;
  for (size_t p = 0; p < 3; ++p) best_max = std::max(best_max, double(best[p]) / speed[p]);
  for (int64_t a = 1; a <= 18; ++a) {
    for (int64_t b = 1; a + b <= 19; ++b) {
      const int64_t c = 20 - a - b;
      CHECK(std::max({double(a) / speed[0], double(b) / speed[1], double(c) / speed[2]}) >= best_max - 1e-12);
    }
  }
  CHECK_THROWS_AS(speed_balanced_layers_per_stage(3, 2, {1, 1}), InputError);
  CHECK_THROWS_AS(speed_balanced_layers_per_stage(8, 1, {1, 0}), InputError);
}

TEST_CASE("default layers per stage", "[schedule]") {
  // Llama 3 405B: 126 layers on 16 stages.
  std::vector<int64_t> llama(16, 8);
  llama.front() = 7;
  llama.back() = 7;
  CHECK(default_layers_per_stage(126, 16) == llama);
  CHECK(default_layers_per_stage(96, 8) == std::vector<int64_t>(8, 12));
  CHECK(default_layers_per_stage(32, 3) == std::vector<int64_t>{10, 11, 11});
  CHECK(default_layers_per_stage(31, 3) == std::vector<int64_t>{10, 11, 10});
  CHECK(default_layers_per_stage(13, 5) == std::vector<int64_t>{2, 3, 3, 3, 2});
  CHECK(default_layers_per_stage(12, 5) == std::vector<int64_t>{2, 2, 3, 3, 2});
  CHECK(default_layers_per_stage(4, 4) == std::vector<int64_t>{1, 1, 1, 1});
  for (int64_t L = 1; L <= 40; ++L) {
    for (int64_t S = 1; S <= L; ++S) {
      const auto layers = default_layers_per_stage(L, S);
      int64_t sum = 0;
      for (int64_t n : layers) {
        sum += n;
        CHECK((n == (L + S - 1) / S || n == L / S));
        CHECK(n >= 1);
      }
      CHECK(sum == L);
    }
  }
  CHECK_THROWS_AS(default_layers_per_stage(3, 4), InputError);
  CHECK_THROWS_AS(default_layers_per_stage(4, 0), InputError);
}
