// Rank grid against Megatron's worked example (initialize_model_parallel's docstring) and
// against its defining property: a group is the set of ranks that differ in one coordinate only.
#include <catch2/catch.hpp>

#include <array>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "errors.hpp"
#include "rank_grid.hpp"

using namespace stepcast;
using Groups = std::vector<std::vector<int64_t>>;

namespace {

const std::vector<std::string> kOrders = {"tp-dp-pp", "tp-pp-dp", "dp-tp-pp",
                                          "dp-pp-tp", "pp-tp-dp", "pp-dp-tp"};

int64_t coordinate(const RankCoord& c, GroupKind kind) {
  return kind == GroupKind::tp ? c.tp : kind == GroupKind::dp ? c.dp : c.pp;
}

}  // namespace

TEST_CASE("Megatron's 16-GPU example: tp 2, pp 4, dp 2, order tp-dp-pp", "[rank_grid]") {
  RankGrid grid(2, 2, 4, "tp-dp-pp");
  REQUIRE(grid.world_size() == 16);
  CHECK(grid.all_groups(GroupKind::tp) ==
        Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}});
  CHECK(grid.all_groups(GroupKind::pp) ==
        Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}});
  CHECK(grid.all_groups(GroupKind::dp) ==
        Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}});
  // Megatron's embedding groups: first and last stage of each pipeline.
  CHECK(grid.all_groups(GroupKind::embedding) == Groups{{0, 12}, {1, 13}, {2, 14}, {3, 15}});
  CHECK(grid.group(GroupKind::embedding, 13) == std::vector<int64_t>{1, 13});
  CHECK(grid.group(GroupKind::embedding, 6) == std::vector<int64_t>{2, 14});  // middle stage
  CHECK(grid.all_groups(GroupKind::world).size() == 1);
  CHECK(grid.group(GroupKind::world, 7).size() == 16);

  CHECK(grid.group(GroupKind::pp, 9) == std::vector<int64_t>{1, 5, 9, 13});
  CHECK(grid.coord(13).tp == 1);
  CHECK(grid.coord(13).dp == 0);
  CHECK(grid.coord(13).pp == 3);
  CHECK(grid.pp_next(1) == 5);
  CHECK(grid.pp_prev(5) == 1);
  CHECK(grid.pp_prev(1) == -1);
  CHECK(grid.pp_next(13) == -1);
}

TEST_CASE("order tp-pp-dp puts pipeline stages next to each other", "[rank_grid]") {
  RankGrid grid(2, 2, 4, "tp-pp-dp");  // rank = tp + 2·pp + 8·dp
  CHECK(grid.all_groups(GroupKind::tp) ==
        Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}});
  CHECK(grid.all_groups(GroupKind::pp) ==
        Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}});
  CHECK(grid.all_groups(GroupKind::dp) ==
        Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}});
  CHECK(grid.all_groups(GroupKind::embedding) == Groups{{0, 6}, {1, 7}, {8, 14}, {9, 15}});
}

TEST_CASE("coord and rank are inverse for every order", "[rank_grid]") {
  for (const auto& order : kOrders) {
    for (auto [tp, dp, pp] : std::vector<std::array<int64_t, 3>>{
             {1, 1, 1}, {2, 2, 4}, {3, 5, 2}, {8, 1, 4}, {1, 6, 1}, {4, 3, 5}}) {
      INFO(order << " tp " << tp << " dp " << dp << " pp " << pp);
      RankGrid grid(tp, dp, pp, order);
      REQUIRE(grid.world_size() == tp * dp * pp);
      std::map<std::array<int64_t, 3>, int64_t> seen;
      for (int64_t r = 0; r < grid.world_size(); ++r) {
        RankCoord c = grid.coord(r);
        CHECK(grid.rank(c) == r);
        CHECK((c.tp >= 0 && c.tp < tp && c.dp >= 0 && c.dp < dp && c.pp >= 0 && c.pp < pp));
        seen[{c.tp, c.dp, c.pp}] = r;
      }
      CHECK(static_cast<int64_t>(seen.size()) == grid.world_size());  // coord is injective
    }
  }
}

TEST_CASE("groups partition the ranks and vary exactly one coordinate", "[rank_grid]") {
  for (const auto& order : kOrders) {
    for (auto [tp, dp, pp] : std::vector<std::array<int64_t, 3>>{
             {2, 2, 4}, {3, 5, 2}, {4, 3, 5}, {1, 4, 1}, {2, 1, 3}}) {
      INFO(order << " tp " << tp << " dp " << dp << " pp " << pp);
      RankGrid grid(tp, dp, pp, order);
      const std::map<GroupKind, int64_t> sizes = {
          {GroupKind::tp, tp}, {GroupKind::dp, dp}, {GroupKind::pp, pp}};
      for (auto [kind, size] : sizes) {
        Groups groups = grid.all_groups(kind);
        CHECK(static_cast<int64_t>(groups.size()) == grid.world_size() / size);
        std::vector<int> count(grid.world_size(), 0);
        for (size_t g = 0; g < groups.size(); ++g) {
          if (g > 0) CHECK(groups[g - 1].front() < groups[g].front());
          REQUIRE(static_cast<int64_t>(groups[g].size()) == size);
          const RankCoord first = grid.coord(groups[g].front());
          for (size_t i = 0; i < groups[g].size(); ++i) {
            const int64_t r = groups[g][i];
            ++count[r];
            RankCoord c = grid.coord(r);
            CHECK(coordinate(c, kind) == static_cast<int64_t>(i));  // ordered by coordinate
            // Every other coordinate equals the first member's.
            for (GroupKind other : {GroupKind::tp, GroupKind::dp, GroupKind::pp}) {
              if (other != kind) CHECK(coordinate(c, other) == coordinate(first, other));
            }
            CHECK(grid.group(kind, r) == groups[g]);
          }
        }
        for (int64_t r = 0; r < grid.world_size(); ++r) CHECK(count[r] == 1);
      }

      // Embedding: ranks of the first and last stage each in exactly one group, others in none.
      std::vector<int> count(grid.world_size(), 0);
      for (const auto& g : grid.all_groups(GroupKind::embedding)) {
        REQUIRE(static_cast<int64_t>(g.size()) == (pp == 1 ? 1 : 2));
        CHECK(grid.coord(g.front()).pp == 0);
        CHECK(grid.coord(g.back()).pp == pp - 1);
        CHECK(grid.group(GroupKind::pp, g.front()).back() == g.back());
        for (int64_t r : g) ++count[r];
      }
      for (int64_t r = 0; r < grid.world_size(); ++r) {
        const int64_t stage = grid.coord(r).pp;
        CHECK(count[r] == (stage == 0 || stage == pp - 1 ? 1 : 0));
      }

      // pp_next / pp_prev walk each pipeline group.
      for (const auto& g : grid.all_groups(GroupKind::pp)) {
        for (size_t i = 0; i < g.size(); ++i) {
          CHECK(grid.pp_next(g[i]) == (i + 1 < g.size() ? g[i + 1] : -1));
          CHECK(grid.pp_prev(g[i]) == (i > 0 ? g[i - 1] : -1));
        }
      }
    }
  }
}

TEST_CASE("invalid orders, sizes and ranks throw", "[rank_grid]") {
  for (const std::string order : {"", "tp-dp", "tp-dp-dp", "tp-dp-pp-ep", "tp_dp_pp", "tp-dp-pp-",
                                  "-tp-dp", "TP-DP-PP", "tp-dp-ep"}) {
    INFO(order);
    CHECK_THROWS_AS(RankGrid(2, 2, 2, order), InputError);
  }
  CHECK_THROWS_AS(RankGrid(0, 2, 2, "tp-dp-pp"), InputError);
  RankGrid grid(2, 2, 2, "tp-dp-pp");
  CHECK_THROWS_AS(grid.coord(8), InputError);
  CHECK_THROWS_AS(grid.coord(-1), InputError);
  CHECK_THROWS_AS(grid.rank(RankCoord{2, 0, 0}), InputError);
  CHECK_THROWS_AS(grid.group(GroupKind::tp, 8), InputError);
}

TEST_CASE("group kinds print as their JSON names", "[rank_grid]") {
  CHECK(std::string(to_string(GroupKind::tp)) == "tp");
  CHECK(std::string(to_string(GroupKind::dp)) == "dp");
  CHECK(std::string(to_string(GroupKind::pp)) == "pp");
  CHECK(std::string(to_string(GroupKind::embedding)) == "embedding");
  CHECK(std::string(to_string(GroupKind::world)) == "world");
}

TEST_CASE("hybrid sharding: dp blocks of dp_shard_size, replicas across them (Megatron's partial dp groups)",
          "[rank_grid]") {
  // tp 2, dp 8 in shard blocks of 4, pp 1: rank = tp + 2·dp. Megatron's intra-partial groups are
  // consecutive slices of each dp group (parallel_state.py), the inter-instance groups the ranks at
  // the same place of every slice.
  RankGrid grid(2, 8, 1, "tp-dp-pp", 4);
  CHECK(grid.dp_shard_size() == 4);
  CHECK(grid.all_groups(GroupKind::dp_shard) ==
        Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}});
  CHECK(grid.group(GroupKind::dp_shard, 13) == std::vector<int64_t>{9, 11, 13, 15});
  CHECK(grid.all_groups(GroupKind::dp_replica) ==
        Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}});
  // One optimizer instance: every tp and pp rank of one dp block (the gradient norm's group).
  CHECK(grid.all_groups(GroupKind::instance) == Groups{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}});
  // Without hybrid sharding: dp_shard is dp, a replica group is one rank, an instance the world.
  RankGrid plain(2, 8, 2, "tp-dp-pp");
  for (int64_t r = 0; r < plain.world_size(); ++r) {
    CHECK(plain.group(GroupKind::dp_shard, r) == plain.group(GroupKind::dp, r));
    CHECK(plain.group(GroupKind::dp_replica, r) == std::vector<int64_t>{r});
    CHECK(plain.group(GroupKind::instance, r).size() == size_t(plain.world_size()));
  }
  // Every order: the shard and replica groups partition each dp group, crossing once.
  for (const std::string& order : kOrders) {
    RankGrid g(2, 6, 2, order, 3);
    for (int64_t r = 0; r < g.world_size(); ++r) {
      INFO(order << " rank " << r);
      auto shard = g.group(GroupKind::dp_shard, r), replica = g.group(GroupKind::dp_replica, r);
      CHECK(shard.size() == 3);
      CHECK(replica.size() == 2);
      for (int64_t m : shard) CHECK(g.coord(m).dp / 3 == g.coord(r).dp / 3);
      for (int64_t m : replica) CHECK(g.coord(m).dp % 3 == g.coord(r).dp % 3);
      CHECK(g.group(GroupKind::instance, r).size() == 12);
    }
  }
  CHECK_THROWS_AS(RankGrid(1, 6, 1, "tp-dp-pp", 4), InputError);
}

TEST_CASE("context parallelism: cp right after tp (Megatron's tp-cp-ep-dp-pp), gradients over dp × cp",
          "[rank_grid]") {
  // tp 2, cp 2, dp 2, pp 2: rank = tp + 2·cp + 4·dp + 8·pp.
  RankGrid grid(2, 2, 2, "tp-dp-pp", 0, 2);
  REQUIRE(grid.world_size() == 16);
  CHECK(grid.coord(6).cp == 1);
  CHECK(grid.coord(6).dp == 1);
  CHECK(grid.all_groups(GroupKind::cp) == Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}});
  CHECK(grid.group(GroupKind::dp, 0) == std::vector<int64_t>{0, 4});
  CHECK(grid.group(GroupKind::dp_cp, 0) == std::vector<int64_t>{0, 2, 4, 6});
  CHECK(grid.dp_cp_index(6) == 3);
  CHECK(grid.group(GroupKind::model, 0) == std::vector<int64_t>{0, 1, 8, 9});  // one dp and cp coordinate
  CHECK(grid.cp_next(0) == 2);
  CHECK(grid.cp_next(2) == 0);  // the ring wraps
  CHECK(grid.cp_prev(0) == 2);
  CHECK(grid.pp_next(2) == 10);
  // Named in the order: cp outermost.
  RankGrid outer(2, 2, 1, "tp-dp-pp-cp", 0, 2);
  CHECK(outer.group(GroupKind::cp, 0) == std::vector<int64_t>{0, 4});
  // Hybrid sharding cuts dp × cp: shard blocks of 2 consecutive dp_cp indices (the cp pair).
  RankGrid hybrid(1, 2, 1, "tp-dp-pp", 2, 2);
  CHECK(hybrid.all_groups(GroupKind::dp_shard) == Groups{{0, 1}, {2, 3}});
  CHECK(hybrid.all_groups(GroupKind::dp_replica) == Groups{{0, 2}, {1, 3}});
  CHECK_THROWS_AS(RankGrid(1, 2, 1, "tp-dp-pp", 3, 2), InputError);
  CHECK_THROWS_AS(RankGrid(1, 2, 1, "tp-cp-dp", 0, 2), InputError);
}
