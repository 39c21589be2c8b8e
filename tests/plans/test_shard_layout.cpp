// The ZeRO shard layout against worked examples and ZeRO's 2Ψ + 2Ψ + 12Ψ model states.
#include <catch2/catch.hpp>

#include "shard_layout.hpp"

using namespace stepcast;

TEST_CASE("ZeRO stages shard optimizer state, then gradients, then weights", "[shard_layout]") {
  for (int64_t stage = 0; stage <= 3; ++stage) {
    ShardLayout layout(stage, 4);
    INFO("ZeRO-" << stage);
    CHECK(layout.sharded(ShardedState::optimizer) == (stage >= 1));
    CHECK(layout.sharded(ShardedState::grads) == (stage >= 2));
    CHECK(layout.sharded(ShardedState::weights) == (stage >= 3));
  }
  // ZeRO-3 over one rank (dp 1, or an expert-data-parallel group of 1 under ep = dp): the weights
  // are whole, nothing is gathered before their use (a gather over one rank is no op).
  CHECK_FALSE(ShardLayout(3, 1).sharded(ShardedState::weights));
  CHECK_FALSE(ShardLayout(3, 4, 1).sharded(ShardedState::weights));
  CHECK(ShardLayout(3, 1).held(ShardedState::weights, 10, 0) == ShardRange{0, 10});
}

TEST_CASE("slices of 10 elements over 4 ranks: 3, 3, 3, 1", "[shard_layout]") {
  ShardLayout layout(1, 4);
  CHECK(layout.slice(10, 0) == ShardRange{0, 3});
  CHECK(layout.slice(10, 1) == ShardRange{3, 6});
  CHECK(layout.slice(10, 2) == ShardRange{6, 9});
  CHECK(layout.slice(10, 3) == ShardRange{9, 10});
  CHECK(layout.buffer_elements(ShardedState::optimizer, 10) == 3);  // every rank allocates 3
  CHECK(layout.buffer_elements(ShardedState::grads, 10) == 10);
  CHECK(layout.held(ShardedState::weights, 10, 2) == ShardRange{0, 10});
  CHECK(layout.owned(10, 2) == ShardRange{6, 9});
  // Fewer elements than ranks: the last ranks hold nothing.
  ShardLayout z3(3, 4);
  CHECK(z3.slice(2, 1) == ShardRange{1, 2});
  CHECK(z3.slice(2, 3).size() == 0);
  // ZeRO-0 owns the whole group on every rank.
  CHECK(ShardLayout(0, 4).owned(10, 3) == ShardRange{0, 10});
}

TEST_CASE("the slices of every rank partition the group", "[shard_layout]") {
  for (int64_t dp = 1; dp <= 8; ++dp) {
    ShardLayout layout(2, dp);
    for (int64_t elements = 0; elements <= 40; ++elements) {
      int64_t next = 0;
      for (int64_t r = 0; r < dp; ++r) {
        ShardRange s = layout.slice(elements, r);
        INFO("dp " << dp << ", " << elements << " elements, rank " << r);
        CHECK(s.first == next);
        CHECK(s.size() <= layout.buffer_elements(ShardedState::grads, elements));
        next = s.last;
      }
      CHECK(next == elements);
    }
  }
}

TEST_CASE("model states per rank follow ZeRO's 2Ψ + 2Ψ + 12Ψ", "[shard_layout]") {
  // bf16 weights and gradients; fp32 master, momentum and variance (Rajbhandari et al., fig. 1).
  const int64_t psi = 7'500'000'000 / 64 * 64, dp = 64;
  auto bytes = [&](int64_t stage) {
    ShardLayout layout(stage, dp);
    return 2 * layout.buffer_elements(ShardedState::weights, psi) +
           2 * layout.buffer_elements(ShardedState::grads, psi) +
           12 * layout.buffer_elements(ShardedState::optimizer, psi);
  };
  CHECK(bytes(0) == 16 * psi);
  CHECK(bytes(1) == 4 * psi + 12 * psi / dp);
  CHECK(bytes(2) == 2 * psi + 14 * psi / dp);
  CHECK(bytes(3) == 16 * psi / dp);
}

TEST_CASE("hybrid sharding: slices over the shard group, the same on every replica", "[shard_layout]") {
  // dp 4 as 2 replicas of a 2-rank shard group: dp ranks 0 and 2 hold the first half, 1 and 3
  // the second; buffers are half the group.
  ShardLayout layout(1, 4, 2);
  CHECK(layout.shard_size() == 2);
  CHECK(layout.buffer_elements(ShardedState::optimizer, 10) == 5);
  CHECK(layout.slice(10, 0) == ShardRange{0, 5});
  CHECK(layout.slice(10, 1) == ShardRange{5, 10});
  CHECK(layout.slice(10, 2) == layout.slice(10, 0));
  CHECK(layout.slice(10, 3) == layout.slice(10, 1));
  CHECK(ShardLayout(3, 8, 4).buffer_elements(ShardedState::weights, 100) == 25);
  CHECK(ShardLayout(3, 8).buffer_elements(ShardedState::weights, 100) == 13);
}
