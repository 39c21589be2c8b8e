// Rank layout as Megatron's RankGenerator computes it: ranks are points of an ordered grid
// ("tp-dp-pp": tp innermost, so a tensor-parallel group stays inside a node), and every group is
// the set of ranks that differ only in that group's coordinate. Pure arithmetic, no I/O.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace stepcast {

// model: the tp × pp ranks holding one model replica (same dp coordinate).
// Hybrid sharding (the plan's num_distributed_optimizer_instances > 1, Megatron's partial data
// parallel groups) cuts each dp group into blocks of dp_shard_size consecutive dp coordinates:
// dp_shard is a rank's block (Megatron's intra-partial dp group: ZeRO shards over it), dp_replica
// the ranks at the same place of every block (inter-instance group: the shards' all-reduce),
// instance every rank of the same block index (tp × pp × dp_shard: one optimizer instance, the
// gradient norm's group). Without hybrid sharding dp_shard is dp, dp_replica one rank, instance
// the world.
// Context parallelism (the plan's context_parallel_size) adds a cp coordinate: cp is the ranks
// that split one sequence (they differ in cp only), and gradients are reduced over dp_cp, the
// ranks that differ in dp or cp (Megatron's data-parallel group with context parallelism). The
// hybrid-sharding blocks above cut dp_cp, ordered by cp + cp_size·dp; model is the tp × pp ranks
// of one dp and cp coordinate. Without cp, dp_cp is dp.
// Expert parallelism (Megatron's expert rank generator): the tp·cp·dp ranks of a pipeline stage,
// in rank order, are regrouped as etp × ep × edp, etp innermost: etp splits an expert's width, ep
// the experts (the all-to-all group), edp the ranks holding the same experts (expert gradients are
// reduced over it). Without experts (ep = etp = 1) ep and etp are one rank, edp is dp_cp.
// Hybrid sharding cuts each edp group the same way (Megatron's intra- and inter-partial expert
// data parallel groups): edp_shard is a rank's block of edp / instances consecutive edp
// coordinates (expert ZeRO shards over it), edp_replica the ranks at the same place of every block
// (the expert shards' all-reduce). Without hybrid sharding edp_shard is edp, edp_replica one rank.
enum class GroupKind : uint8_t {
  tp, dp, pp, embedding, model, world, dp_shard, dp_replica, instance, cp, dp_cp, ep, etp, edp, edp_shard, edp_replica
};
const char* to_string(GroupKind kind);
// Every kind, in declaration order (for parsers and communicator setup).
const std::vector<GroupKind>& all_group_kinds();

struct RankCoord {
  int64_t tp = 0;
  int64_t dp = 0;
  int64_t pp = 0;
  int64_t cp = 0;
};

class RankGrid {
 public:
  // `order` is a permutation of "tp", "dp", "pp" (and optionally "cp") joined by '-', innermost
  // first; without "cp" in it, cp sits right after tp (Megatron's "tp-cp-ep-dp-pp").
  // Throws InputError for a bad order (plans validate it first).
  // `dp_shard_size` divides dp_size · cp_size (0: all of it, no hybrid sharding).
  // `ep_size` · `etp_size` divides tp · cp · dp (the experts' ranks of a stage).
  RankGrid(int64_t tp_size, int64_t dp_size, int64_t pp_size, const std::string& order,
           int64_t dp_shard_size = 0, int64_t cp_size = 1, int64_t ep_size = 1, int64_t etp_size = 1);

  int64_t world_size() const { return tp_size_ * cp_size_ * dp_size_ * pp_size_; }
  RankCoord coord(int64_t rank) const;
  int64_t rank(const RankCoord& coord) const;

  // Ranks of `kind`'s group containing `rank`, ordered by that group's coordinate.
  // embedding: the first and last pipeline stage's ranks with the same tp and dp coordinates
  // (one rank when pp_size == 1). model: same dp coordinate, ordered by (pp, tp).
  // world: every rank.
  std::vector<int64_t> group(GroupKind kind, int64_t rank) const;
  // All distinct groups of `kind`, each ordered as group() returns it, sorted by first rank.
  std::vector<std::vector<int64_t>> all_groups(GroupKind kind) const;
  // Rank holding the next/previous pipeline stage (same tp, dp); -1 past either end.
  int64_t pp_next(int64_t rank) const;
  int64_t pp_prev(int64_t rank) const;
  // Rank holding the next/previous piece of the sequence in the context-parallel ring (same tp,
  // dp, pp; wraps around; the rank itself when cp_size is 1).
  int64_t cp_next(int64_t rank) const;
  int64_t cp_prev(int64_t rank) const;
  // A rank's place in its dp_cp group: cp + cp_size · dp (the gradient-sharding coordinate).
  int64_t dp_cp_index(int64_t rank) const;

  int64_t tp_size() const { return tp_size_; }
  int64_t dp_size() const { return dp_size_; }
  int64_t pp_size() const { return pp_size_; }
  int64_t cp_size() const { return cp_size_; }
  int64_t dp_cp_size() const { return dp_size_ * cp_size_; }
  int64_t ep_size() const { return ep_size_; }
  int64_t etp_size() const { return etp_size_; }
  int64_t edp_size() const { return tp_size_ * cp_size_ * dp_size_ / (ep_size_ * etp_size_); }
  // A rank's place among the ranks of its pipeline stage in rank order, and back.
  int64_t stage_index(int64_t rank) const;
  int64_t stage_rank(int64_t pp, int64_t index) const;
  // A rank's expert-parallel coordinate: its experts are [ep_rank · E/ep, (ep_rank + 1) · E/ep).
  int64_t ep_rank(int64_t rank) const { return stage_index(rank) / etp_size_ % ep_size_; }
  int64_t dp_shard_size() const { return dp_shard_size_; }
  // Hybrid sharding's optimizer instances (dp·cp / dp_shard_size), and the experts' shard group.
  int64_t instances() const { return dp_cp_size() / dp_shard_size_; }
  int64_t edp_shard_size() const { return edp_size() / instances(); }
  // Whether every optimizer instance holds whole expert shard groups, one per expert slice: its
  // ranks of a stage are one block of edp_shard groups (so the instance's gradient norm counts each
  // expert element once). True for Megatron's orders (tp, then cp, innermost of dp).
  bool expert_shards_within_instances() const;
  // Whether every etp group lies inside its rank's model group (tp × pp): etp dividing tp under
  // Megatron's orders. Else an expert's slices sit on other dp or cp ranks too.
  bool etp_within_model_groups() const;

 private:
  int64_t at_dp_cp(RankCoord c, int64_t index) const;  // c with its dp and cp set from a dp_cp index
  int64_t tp_size_, dp_size_, pp_size_, cp_size_, dp_shard_size_, ep_size_, etp_size_;
  int64_t stride_tp_, stride_dp_, stride_pp_, stride_cp_;
};

}  // namespace stepcast
