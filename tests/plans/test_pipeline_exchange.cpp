// Megatron-LM's blocking interleaved exchanges (pipeline_exchange.hpp) against their oracles:
// the rounds compute the schedule's passes in order; every pass's input arrives in an earlier round
// than the pass, exactly once, and every output leaves in the round that computed it; and a worked
// example traced by hand through megatron/schedules.py (2021).
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "pipeline_exchange.hpp"
#include "schedule.hpp"

using namespace stepcast;

namespace {

using Key = std::tuple<bool, int64_t, int64_t>;  // forward, microbatch, chunk
Key key(const PassAction& a) { return {a.forward, a.microbatch, a.chunk}; }

}  // namespace

TEST_CASE("interleaved exchanges: passes in order, inputs before use, outputs when made", "[schedule]") {
  for (int64_t pp : {2, 3, 4}) {
    for (int64_t v : {2, 3}) {
      for (int64_t m : {pp, 2 * pp, 3 * pp}) {
        ScheduleShape shape{pp, v, m};
        const int64_t S = pp * v;
        for (int64_t stage = 0; stage < pp; ++stage) {
          INFO("pp " << pp << " v " << v << " m " << m << " stage " << stage);
          std::vector<PassExchange> rounds = interleaved_exchanges(shape, stage);
          std::vector<PassAction> passes;
          std::map<Key, size_t> computed, received, sent;
          for (size_t r = 0; r < rounds.size(); ++r) {
            for (const PassAction& a : rounds[r].passes) {
              passes.push_back(a);
              computed[key(a)] = r;
            }
            for (const auto& t : {rounds[r].recv_prev, rounds[r].recv_next}) {
              if (t) CHECK(received.emplace(key(*t), r).second);
            }
            for (const auto& t : {rounds[r].send_prev, rounds[r].send_next}) {
              if (t) CHECK(sent.emplace(key(*t), r).second);
            }
            if (rounds[r].recv_prev) CHECK(rounds[r].recv_prev->forward);
            if (rounds[r].send_next) CHECK(rounds[r].send_next->forward);
            if (rounds[r].recv_next) CHECK_FALSE(rounds[r].recv_next->forward);
            if (rounds[r].send_prev) CHECK_FALSE(rounds[r].send_prev->forward);
          }
          CHECK(passes == schedule_actions(ScheduleKind::interleaved_1f1b, shape, stage));
          for (const auto& [k, r] : computed) {
            auto [forward, mb, chunk] = k;
            int64_t vs = chunk * pp + stage;
            bool needs_input = forward ? vs > 0 : vs < S - 1;  // from a neighbour
            bool has_output = forward ? vs < S - 1 : vs > 0;   // for a neighbour
            INFO("pass forward " << forward << " mb " << mb << " chunk " << chunk);
            CHECK(received.count(k) == size_t(needs_input));
            if (needs_input) CHECK(received[k] < r);
            CHECK(sent.count(k) == size_t(has_output));
            if (has_output) CHECK(sent[k] == r);
          }
        }
      }
    }
  }
}

TEST_CASE("interleaved exchanges worked example: pp 2, vpp 2, m 4", "[schedule]") {
  // Stage 0 warms up with 4 forwards, stage 1 with 2 (2·(pp-stage-1) + (v-1)·pp). Traced by hand
  // through forward_backward_pipelining_with_interleaving: stage 0's first receive from the last
  // stage comes after its second forward (get_model_chunk_id(2) = 1), and the last warm-up round
  // also receives the first backward's gradient.
  ScheduleShape shape{2, 2, 4};
  auto F = [](int64_t mb, int64_t c) { return PassAction{true, mb, c}; };
  auto B = [](int64_t mb, int64_t c) { return PassAction{false, mb, c}; };
  std::vector<PassExchange> s0 = interleaved_exchanges(shape, 0);
  REQUIRE(s0.size() == 1 + 4 + 4 + 4);
  CHECK(s0[0].passes.empty());
  CHECK_FALSE(s0[0].recv_prev);
  CHECK(s0[1].passes == std::vector<PassAction>{F(0, 0)});
  CHECK(s0[1].send_next == F(0, 0));
  CHECK_FALSE(s0[1].recv_prev);
  CHECK(s0[2].recv_prev == F(0, 1));
  CHECK(s0[3].recv_prev == F(1, 1));
  CHECK(s0[4].passes == std::vector<PassAction>{F(1, 1)});
  CHECK_FALSE(s0[4].recv_prev);
  CHECK(s0[4].recv_next == B(0, 1));
  // Steady state: forward, backward, then one batch; the first stage's backward of chunk 0 sends
  // nothing (virtual stage 0), and the last steady round receives no forward input.
  CHECK(s0[5].passes == std::vector<PassAction>{F(2, 0), B(0, 1)});
  CHECK(s0[5].send_prev == B(0, 1));
  CHECK_FALSE(s0[5].recv_prev);
  CHECK(s0[5].recv_next == B(1, 1));
  CHECK(s0[6].recv_prev == F(2, 1));
  CHECK(s0[7].passes == std::vector<PassAction>{F(2, 1), B(0, 0)});
  CHECK_FALSE(s0[7].send_prev);
  CHECK(s0[7].recv_prev == F(3, 1));
  CHECK_FALSE(s0[8].recv_prev);
  CHECK(s0[8].recv_next == B(2, 1));
  CHECK(s0[12].passes == std::vector<PassAction>{B(3, 0)});
  CHECK_FALSE(s0[12].recv_next);
  CHECK_FALSE(s0[12].send_prev);
  std::vector<PassExchange> s1 = interleaved_exchanges(shape, 1);
  REQUIRE(s1.size() == 1 + 2 + 6 + 2);
  CHECK(s1[0].recv_prev == F(0, 0));  // recv_forward before the warm-up loop
  CHECK_FALSE(s1[2].recv_next);       // the last stage computes its first gradient itself
  CHECK(s1[3].passes == std::vector<PassAction>{F(0, 1), B(0, 1)});
  CHECK_FALSE(s1[3].send_next);       // virtual stage 3 is the last: the loss
  CHECK(s1[3].send_prev == B(0, 1));
  CHECK_FALSE(s1[3].recv_next);
  CHECK(s1[4].recv_next == B(0, 0));
}
