// Rank layout arithmetic (Megatron's RankGenerator): rank = Σ coordinate·stride, strides the
// running product of the sizes in `order`, innermost first. Groups fix every coordinate but one.
#include "rank_grid.hpp"

#include <algorithm>
#include <array>

#include "errors.hpp"

namespace stepcast {

const char* to_string(GroupKind kind) {
  switch (kind) {
    case GroupKind::tp: return "tp";
    case GroupKind::dp: return "dp";
    case GroupKind::pp: return "pp";
    case GroupKind::embedding: return "embedding";
    case GroupKind::model: return "model";
    case GroupKind::world: return "world";
    case GroupKind::dp_shard: return "dp_shard";
    case GroupKind::dp_replica: return "dp_replica";
    case GroupKind::instance: return "instance";
    case GroupKind::cp: return "cp";
    case GroupKind::dp_cp: return "dp_cp";
    case GroupKind::ep: return "ep";
    case GroupKind::etp: return "etp";
    case GroupKind::edp: return "edp";
    case GroupKind::edp_shard: return "edp_shard";
    case GroupKind::edp_replica: return "edp_replica";
  }
  return "?";
}

const std::vector<GroupKind>& all_group_kinds() {
  static const std::vector<GroupKind> kinds = {
      GroupKind::tp,    GroupKind::dp,       GroupKind::pp,         GroupKind::embedding, GroupKind::model,
      GroupKind::world, GroupKind::dp_shard, GroupKind::dp_replica, GroupKind::instance,
      GroupKind::cp,    GroupKind::dp_cp,    GroupKind::ep,         GroupKind::etp,       GroupKind::edp,
      GroupKind::edp_shard, GroupKind::edp_replica};
  return kinds;
}

namespace {

// Splits "a-b-c" (or "a-b-c-d" with cp) into its names; throws unless they are a permutation of
// tp, dp, pp (and cp). Without cp, cp is placed right after tp, as Megatron orders it.
std::vector<std::string> parse_order(const std::string& order) {
  std::vector<std::string> names;
  size_t start = 0;
  while (true) {
    size_t end = order.find('-', start);
    names.push_back(order.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  auto sorted = names;
  std::sort(sorted.begin(), sorted.end());
  bool three = sorted == std::vector<std::string>{"dp", "pp", "tp"};
  bool four = sorted == std::vector<std::string>{"cp", "dp", "pp", "tp"};
  if (!three && !four) {
    throw InputError("rank order '" + order +
                     "': not a permutation of tp, dp, pp (optionally with cp) joined by '-'; valid: "
                     "e.g. \"tp-dp-pp\", \"tp-pp-dp\", \"tp-cp-dp-pp\"");
  }
  if (three) names.insert(std::find(names.begin(), names.end(), "tp") + 1, "cp");
  return names;
}

}  // namespace

RankGrid::RankGrid(int64_t tp_size, int64_t dp_size, int64_t pp_size, const std::string& order,
                   int64_t dp_shard_size, int64_t cp_size, int64_t ep_size, int64_t etp_size)
    : tp_size_(tp_size), dp_size_(dp_size), pp_size_(pp_size), cp_size_(cp_size),
      dp_shard_size_(dp_shard_size == 0 ? dp_size * cp_size : dp_shard_size), ep_size_(ep_size),
      etp_size_(etp_size) {
  if (tp_size < 1 || dp_size < 1 || pp_size < 1 || cp_size < 1) {
    throw InputError("rank grid sizes tp=" + std::to_string(tp_size) + " cp=" + std::to_string(cp_size) +
                     " dp=" + std::to_string(dp_size) + " pp=" + std::to_string(pp_size) +
                     ": every size must be >= 1");
  }
  if (dp_shard_size_ < 1 || dp_cp_size() % dp_shard_size_ != 0) {
    throw InputError("rank grid dp_shard_size=" + std::to_string(dp_shard_size) + " with dp·cp=" +
                     std::to_string(dp_cp_size()) + ": the shard group size must divide dp·cp");
  }
  if (ep_size < 1 || etp_size < 1 || (tp_size * cp_size * dp_size) % (ep_size * etp_size) != 0) {
    throw InputError("rank grid ep=" + std::to_string(ep_size) + " etp=" + std::to_string(etp_size) +
                     " with tp·cp·dp=" + std::to_string(tp_size * cp_size * dp_size) +
                     ": ep · etp must divide the ranks of a pipeline stage");
  }
  if (edp_size() % instances() != 0) {
    throw InputError("rank grid with " + std::to_string(instances()) + " optimizer instances and edp=" +
                     std::to_string(edp_size()) + ": the instances must divide the expert data-parallel size");
  }
  int64_t stride = 1;
  for (const std::string& name : parse_order(order)) {
    if (name == "tp") {
      stride_tp_ = stride;
      stride *= tp_size_;
    } else if (name == "dp") {
      stride_dp_ = stride;
      stride *= dp_size_;
    } else if (name == "cp") {
      stride_cp_ = stride;
      stride *= cp_size_;
    } else {
      stride_pp_ = stride;
      stride *= pp_size_;
    }
  }
}

RankCoord RankGrid::coord(int64_t rank) const {
  if (rank < 0 || rank >= world_size()) {
    throw InputError("rank " + std::to_string(rank) + " outside [0, " +
                                std::to_string(world_size()) + ")");
  }
  return RankCoord{(rank / stride_tp_) % tp_size_, (rank / stride_dp_) % dp_size_,
                   (rank / stride_pp_) % pp_size_, (rank / stride_cp_) % cp_size_};
}

int64_t RankGrid::rank(const RankCoord& c) const {
  if (c.tp < 0 || c.tp >= tp_size_ || c.dp < 0 || c.dp >= dp_size_ || c.pp < 0 ||
      c.pp >= pp_size_ || c.cp < 0 || c.cp >= cp_size_) {
    throw InputError("rank coordinate (tp " + std::to_string(c.tp) + ", cp " + std::to_string(c.cp) + ", dp " +
                     std::to_string(c.dp) + ", pp " + std::to_string(c.pp) + ") outside the grid");
  }
  return c.tp * stride_tp_ + c.dp * stride_dp_ + c.pp * stride_pp_ + c.cp * stride_cp_;
}

std::vector<int64_t> RankGrid::group(GroupKind kind, int64_t r) const {
  RankCoord c = coord(r);
  std::vector<int64_t> ranks;
  switch (kind) {
    case GroupKind::tp:
      for (c.tp = 0; c.tp < tp_size_; ++c.tp) ranks.push_back(rank(c));
      break;
    case GroupKind::dp:
      for (c.dp = 0; c.dp < dp_size_; ++c.dp) ranks.push_back(rank(c));
      break;
    case GroupKind::pp:
      for (c.pp = 0; c.pp < pp_size_; ++c.pp) ranks.push_back(rank(c));
      break;
    case GroupKind::embedding:
      c.pp = 0;
      ranks.push_back(rank(c));
      if (pp_size_ > 1) {
        c.pp = pp_size_ - 1;
        ranks.push_back(rank(c));
      }
      break;
    case GroupKind::model:
      for (c.pp = 0; c.pp < pp_size_; ++c.pp) {
        for (c.tp = 0; c.tp < tp_size_; ++c.tp) ranks.push_back(rank(c));
      }
      break;
    case GroupKind::world:
      for (int64_t i = 0; i < world_size(); ++i) ranks.push_back(i);
      break;
    case GroupKind::cp:
      for (c.cp = 0; c.cp < cp_size_; ++c.cp) ranks.push_back(rank(c));
      break;
    case GroupKind::dp_cp:
      for (int64_t g = 0; g < dp_cp_size(); ++g) ranks.push_back(at_dp_cp(c, g));
      break;
    case GroupKind::dp_shard: {
      int64_t block = dp_cp_index(r) / dp_shard_size_ * dp_shard_size_;
      for (int64_t g = block; g < block + dp_shard_size_; ++g) ranks.push_back(at_dp_cp(c, g));
      break;
    }
    case GroupKind::dp_replica:
      for (int64_t g = dp_cp_index(r) % dp_shard_size_; g < dp_cp_size(); g += dp_shard_size_) {
        ranks.push_back(at_dp_cp(c, g));
      }
      break;
    case GroupKind::ep:
    case GroupKind::etp:
    case GroupKind::edp:
    case GroupKind::edp_shard:
    case GroupKind::edp_replica: {
      // Digits of the stage index: etp innermost, then ep, then edp.
      const int64_t index = stage_index(r);
      const int64_t e_tp = index % etp_size_, e_p = index / etp_size_ % ep_size_;
      const int64_t e_dp = index / (etp_size_ * ep_size_);
      auto at_edp = [&](int64_t j) { return stage_rank(c.pp, e_tp + etp_size_ * (e_p + ep_size_ * j)); };
      const int64_t shard = edp_shard_size();
      if (kind == GroupKind::etp) {
        for (int64_t j = 0; j < etp_size_; ++j) ranks.push_back(stage_rank(c.pp, index - e_tp + j));
      } else if (kind == GroupKind::ep) {
        for (int64_t j = 0; j < ep_size_; ++j) ranks.push_back(stage_rank(c.pp, e_tp + etp_size_ * (j + ep_size_ * e_dp)));
      } else if (kind == GroupKind::edp) {
        for (int64_t j = 0; j < edp_size(); ++j) ranks.push_back(at_edp(j));
      } else if (kind == GroupKind::edp_shard) {
        for (int64_t j = e_dp / shard * shard; j < e_dp / shard * shard + shard; ++j) ranks.push_back(at_edp(j));
      } else {
        for (int64_t j = e_dp % shard; j < edp_size(); j += shard) ranks.push_back(at_edp(j));
      }
      break;
    }
    case GroupKind::instance: {
      // Ordered by (pp, dp_cp, tp): a rank's position is its place in the instance.
      int64_t block = dp_cp_index(r) / dp_shard_size_ * dp_shard_size_;
      for (c.pp = 0; c.pp < pp_size_; ++c.pp) {
        for (int64_t g = block; g < block + dp_shard_size_; ++g) {
          RankCoord at = coord(at_dp_cp(c, g));
          for (at.tp = 0; at.tp < tp_size_; ++at.tp) ranks.push_back(rank(at));
        }
      }
      break;
    }
  }
  return ranks;
}

std::vector<std::vector<int64_t>> RankGrid::all_groups(GroupKind kind) const {
  std::vector<std::vector<int64_t>> groups;
  // A group is listed once, at the first of its members met in rank order; for embedding,
  // ranks of middle stages belong to no group.
  for (int64_t r = 0; r < world_size(); ++r) {
    if (kind == GroupKind::embedding) {
      int64_t pp = coord(r).pp;
      if (pp != 0 && pp != pp_size_ - 1) continue;
    }
    std::vector<int64_t> g = group(kind, r);
    if (*std::min_element(g.begin(), g.end()) == r) groups.push_back(std::move(g));
  }
  return groups;
}

int64_t RankGrid::pp_next(int64_t r) const {
  RankCoord c = coord(r);
  if (c.pp + 1 >= pp_size_) return -1;
  ++c.pp;
  return rank(c);
}

int64_t RankGrid::cp_next(int64_t r) const {
  RankCoord c = coord(r);
  c.cp = (c.cp + 1) % cp_size_;
  return rank(c);
}

int64_t RankGrid::cp_prev(int64_t r) const {
  RankCoord c = coord(r);
  c.cp = (c.cp + cp_size_ - 1) % cp_size_;
  return rank(c);
}

// The rank with its pp digit taken out of the mixed-radix number: order-preserving within a stage.
int64_t RankGrid::stage_index(int64_t r) const {
  (void)coord(r);  // range check
  return r % stride_pp_ + r / (stride_pp_ * pp_size_) * stride_pp_;
}

int64_t RankGrid::stage_rank(int64_t pp, int64_t index) const {
  return index % stride_pp_ + pp * stride_pp_ + index / stride_pp_ * stride_pp_ * pp_size_;
}

bool RankGrid::expert_shards_within_instances() const {
  // An instance's ranks on a stage are as many as a block of edp_shard groups (stage / instances),
  // so the two cuts of a stage are the same when every instance falls in one expert block. Every
  // stage is cut alike (stage indices and dp·cp coordinates do not depend on pp): stage 0 decides.
  const int64_t block = etp_size_ * ep_size_ * edp_shard_size();
  std::vector<int64_t> block_of_instance(static_cast<size_t>(instances()), -1);
  for (int64_t index = 0; index < tp_size_ * cp_size_ * dp_size_; ++index) {
    int64_t& seen = block_of_instance[size_t(dp_cp_index(stage_rank(0, index)) / dp_shard_size_)];
    if (seen >= 0 && seen != index / block) return false;
    seen = index / block;
  }
  return true;
}

bool RankGrid::etp_within_model_groups() const {
  for (int64_t r = 0; r < world_size(); ++r) {
    const RankCoord c = coord(r);
    for (int64_t s : group(GroupKind::etp, r)) {
      const RankCoord o = coord(s);
      if (o.dp != c.dp || o.cp != c.cp) return false;  // (an etp group lies in one stage)
    }
  }
  return true;
}

int64_t RankGrid::dp_cp_index(int64_t r) const {
  RankCoord c = coord(r);
  return c.cp + cp_size_ * c.dp;
}

int64_t RankGrid::at_dp_cp(RankCoord c, int64_t index) const {
  c.cp = index % cp_size_;
  c.dp = index / cp_size_;
  return rank(c);
}

int64_t RankGrid::pp_prev(int64_t r) const {
  RankCoord c = coord(r);
  if (c.pp == 0) return -1;
  --c.pp;
  return rank(c);
}

}  // namespace stepcast
