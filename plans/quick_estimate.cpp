// The planner's quick estimate; the formula is in quick_estimate.hpp.
#include "quick_estimate.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "collective.hpp"
#include "collective_cost.hpp"
#include "moe.hpp"
#include "schedule.hpp"

namespace stepcast {

namespace {

// Whether the routing moves costs: unless every expert's input is padded to its capacity (then
// every ep rank computes and sends alike, as the simulator has it), with a share per expert.
bool routing_moves_costs(const ProgramMoe& moe) {
  return moe.num_experts > 0 && !moe.pad_to_capacity && int64_t(moe.routing_shares.size()) == moe.num_experts;
}

// Measured samples the estimate averages over, at most this many of a layer's (evenly spaced).
constexpr size_t kEstimateSamples = 64;

// The copies per expert of layer `layer`'s measured samples, each scaled to the copies routed
// as the simulation replays it (uncapped); empty where the layer draws from its shares.
std::vector<std::vector<int64_t>> sampled_counts(const ProgramMoe& moe, int64_t layer) {
  std::vector<std::vector<int64_t>> out;
  if (layer < 0 || size_t(layer) >= moe.routing_samples.size()) return out;
  const std::vector<std::vector<int64_t>>& samples = moe.routing_samples[size_t(layer)];
  const size_t n = std::min(samples.size(), kEstimateSamples);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(scale_routing(samples[i * samples.size() / n], moe.routed_tokens));
  }
  return out;
}

// The busiest expert-parallel rank's load over the mean (≥ 1): ep rank r holds experts
// [r·E/ep, (r+1)·E/ep) (Megatron's order).
double busiest_over_mean(const std::vector<double>& load_per_expert, int64_t ep) {
  const int64_t local = int64_t(load_per_expert.size()) / ep;
  double busiest = 0, total = 0;
  for (int64_t r = 0; r < ep; ++r) {
    double load = 0;
    for (int64_t e = r * local; e < (r + 1) * local; ++e) load += load_per_expert[size_t(e)];
    busiest = std::max(busiest, load);
    total += load;
  }
  return total > 0 ? std::max(1.0, busiest * double(ep) / total) : 1.0;
}

// The expected load of the busiest ep rank over the mean in layer `layer`: by the layer's
// routing shares, or averaged over the measured samples the simulation replays (their
// microbatches lean more than the shares say). 1 where the routing moves no costs.
double expert_imbalance(const ProgramMoe& moe, int64_t ep, int64_t layer) {
  if (!routing_moves_costs(moe) || ep < 1) return 1;
  const std::vector<std::vector<int64_t>> counts = sampled_counts(moe, layer);
  if (counts.empty()) return busiest_over_mean(moe.shares(layer), ep);
  double sum = 0;
  for (const std::vector<int64_t>& c : counts) sum += busiest_over_mean(std::vector<double>(c.begin(), c.end()), ep);
  return sum / double(counts.size());
}

// The rows each expert computes in layer `layer`: one set per measured sample replayed, else the
// routing's expectation of its draws; under a capacity at most its rows. Empty where the routing
// moves no costs.
std::vector<std::vector<int64_t>> expert_row_sets(const ProgramMoe& moe, int64_t layer) {
  if (!routing_moves_costs(moe)) return {};
  std::vector<std::vector<int64_t>> sets = sampled_counts(moe, layer);
  if (sets.empty()) {
    sets.emplace_back();
    for (double share : moe.shares(layer)) sets.back().push_back(std::llround(share * double(moe.routed_tokens)));
  }
  if (moe.expert_capacity_rows > 0) {
    for (std::vector<int64_t>& rows : sets) {
      for (int64_t& r : rows) r = std::min(r, moe.expert_capacity_rows);
    }
  }
  return sets;
}

// A grouped expert GEMM on the busiest ep rank, by the rows of its experts (each expert's GEMM
// with its own rows, as the simulator costs a draw), averaged over the row sets; `lowered_s`
// where the routing moves no costs.
double busiest_expert_gemm_s(const ComputeCostModel& cost, const Op& op, const std::vector<std::vector<int64_t>>& sets,
                             int64_t ep, double lowered_s, std::map<std::pair<int32_t, int64_t>, double>& memo) {
  if (sets.empty()) return lowered_s;
  double sum = 0;
  for (const std::vector<int64_t>& rows : sets) {
    const int64_t local = int64_t(rows.size()) / ep;
    double busiest = 0;
    for (int64_t r = 0; r < ep; ++r) {
      std::vector<int64_t> mine(rows.begin() + r * local, rows.begin() + (r + 1) * local);
      busiest = std::max(busiest, grouped_gemm_time_s(cost, op, mine, memo));
    }
    sum += busiest;
  }
  return sum / double(sets.size());
}

bool is_expert_gemm(const Op& op) {
  return op.name == OpName::expert_gate || op.name == OpName::expert_up || op.name == OpName::expert_down;
}

}  // namespace

double CpRingClock::ready_s(std::span<const BufferName> buffers) const {
  double ready = 0;
  for (const BufferName& b : buffers) {
    auto it = arriving_.find(b);
    if (it != arriving_.end()) ready = std::max(ready, it->second);
  }
  return ready;
}

void CpRingClock::compute(const Op& op, double seconds) {
  const double ready = ready_s(op.inputs);
  if (ready > now_) {
    exposed_ += ready - now_;
    now_ = ready;
  }
  now_ += seconds;
}

void CpRingClock::transfer(const Op& op) {
  if (op.kind == OpKind::send) {
    const double start = std::max({now_, link_free_, ready_s(op.inputs)});
    link_free_ = start + sends_->p2p_time_s(op.bytes, across_);
    sent_[op.tag] = link_free_;
    return;
  }
  auto it = sent_.find(op.tag);
  if (it == sent_.end() || op.outputs.empty()) return;  // (a receive whose send is not in the ops read)
  arriving_[op.outputs.front()] = it->second;
  sent_.erase(it);
}

bool is_cp_ring_transfer(const Op& op) {
  return (op.kind == OpKind::send && op.peer == Peer::cp_next) || (op.kind == OpKind::recv && op.peer == Peer::cp_prev);
}

CpRingClock cp_ring_clock(const RankGrid& grid, int64_t rank, int64_t devices_per_node,
                          const CollectiveCostModel& sends) {
  const bool one_node = grid.cp_size() <= 1 || group_shape(grid, GroupKind::cp, rank, devices_per_node).nodes <= 1;
  return CpRingClock(sends, !one_node);
}

namespace {

StageTimes stage_times(const Role& role, const StepProgram& program, const Topology& topology,
                       const ComputeCostModel& cost_model, const CollectiveCostModel& collectives) {
  // By layer (the routing's shares may differ by layer).
  using LayerRouting = std::pair<double, std::vector<std::vector<int64_t>>>;  // imbalance, row sets
  std::map<int32_t, LayerRouting> routing;
  auto layer_routing = [&](int32_t layer) -> const LayerRouting& {
    auto [it, fresh] = routing.emplace(layer, LayerRouting{});
    if (fresh) it->second = {expert_imbalance(program.moe, program.ep_size, layer), expert_row_sets(program.moe, layer)};
    return it->second;
  };
  std::map<std::pair<int32_t, int64_t>, double> expert_memo;
  RankGrid grid = program.grid();
  int64_t rank = grid.rank(RankCoord{0, 0, role.pp_stage});
  int64_t per_node = topology.node.devices_per_node;
  int32_t last_microbatch = 0;
  for (const Op& op : role.ops) last_microbatch = std::max(last_microbatch, op.microbatch);
  StageTimes t;
  t.stage = role.pp_stage;
  double dp_last_s = 0;
  int64_t dp_last_ops = 0;
  CpRingClock ring = cp_ring_clock(grid, rank, per_node, collectives);
  for (const Op& op : role.ops) {
    if (is_cp_ring_transfer(op)) {
      if (op.microbatch == 0) ring.transfer(op);
    } else if (is_compute(op.kind)) {
      double s = cost_model.op_time_s(op);
      if (is_expert_gemm(op)) {  // the busiest ep rank sets the pace
        const double busiest =
            busiest_expert_gemm_s(cost_model, op, layer_routing(op.layer).second, program.ep_size, s, expert_memo);
        if (op.microbatch == 0) t.imbalance_mb_s += busiest - s;
        s = busiest;
      }
      if (op.microbatch == 0) {
        ring.compute(op, s);
        t.compute_mb_s += s;
        if (op.phase == Phase::backward) t.backward_mb_s += s;
      } else if (op.microbatch < 0) {
        t.step_level_s += s;
      }
    } else if (is_collective(op.kind)) {
      GroupShape shape = group_shape(grid, op.group, rank, per_node);
      double s = uncontended_collective_op_s(cost_model, collectives, op, shape);
      // The dispatch and combine: the busiest ep rank's messages set the pace.
      if (op.kind == OpKind::all_to_all && op.group == GroupKind::ep) s *= layer_routing(op.layer).first;
      if (op.group == GroupKind::dp_replica || op.group == GroupKind::edp_replica) {
        // Hybrid sharding's all_reduce across replicas: once per bucket per step.
        t.dp_step_s += s;
        ++t.dp_step_ops;
      } else if (op.group == GroupKind::dp || op.group == GroupKind::dp_shard || op.group == GroupKind::dp_cp ||
                 op.group == GroupKind::edp || op.group == GroupKind::edp_shard ||
                 (op.name == OpName::sp_replicated_grads && op.microbatch >= 0)) {
        // (edp, edp_shard: the expert groups' reductions and gathers, dp's and dp_shard's for the
        // experts; dp_cp: dp's under context parallelism; a microbatch's SP gradient all_reduce
        // over tp with sharded gradients, on the comm stream before its bucket)
        if (op.microbatch == 0) t.dp_mb_s += s;
        if (op.microbatch == 0 && op.name == OpName::zero3_param_gather) t.zero3_mb_s += s;
        if (op.microbatch < 0) { t.dp_step_s += s; ++t.dp_step_ops; }
        if (op.microbatch == last_microbatch && last_microbatch > 0) { dp_last_s += s; ++dp_last_ops; }
      } else if (op.microbatch == 0) {
        t.tp_mb_s += s;
        ring.compute(op, s);  // (collectives on the compute stream hold it too)
        if (op.group == GroupKind::ep || op.group == GroupKind::etp) t.ep_mb_s += s;
        if (op.group == GroupKind::cp) t.cp_mb_s += s;
      } else if (op.microbatch < 0) {
        t.step_level_s += s;
      }
    } else if (op.kind == OpKind::send && op.microbatch == 0) {
      int64_t peer = op.peer == Peer::pp_next ? grid.pp_next(rank) : grid.pp_prev(rank);
      t.pp_mb_s += collectives.p2p_time_s(op.bytes, rank / per_node != peer / per_node);
    }
  }
  t.tp_mb_s += ring.exposed_s();
  t.cp_mb_s += ring.exposed_s();
  // With one microbatch in the program, microbatch 0 is also the last: its dp ops are the
  // step's reduction, not a per-pass one.
  if (last_microbatch == 0) {
    t.dp_step_s += t.dp_mb_s;
    t.dp_step_ops += 1;
    t.dp_mb_s = 0;
    t.zero3_mb_s = 0;
  } else if (t.dp_mb_s == 0) {
    t.dp_step_s += dp_last_s;
    t.dp_step_ops += dp_last_ops;
  }
  return t;
}

}  // namespace

std::vector<double> stage_speeds(const Plan& plan, const Topology& topology) { return stage_speeds(plan, topology, -1); }

std::vector<double> stage_speeds(const Plan& plan, const Topology& topology, int64_t dp_rank) {
  if (topology.heterogeneity.empty()) return {};
  RankGrid grid(plan.tp_size, plan.dp_size, plan.pp_size, plan.order, plan.dp_shard_size(), plan.cp_size);
  std::vector<double> speed(size_t(plan.pp_size), kMaxSpeedFactor);
  const int64_t per_node = topology.node.devices_per_node;
  for (int64_t rank = 0; rank < grid.world_size(); ++rank) {
    const RankCoord at = grid.coord(rank);
    if (dp_rank >= 0 && at.dp != dp_rank) continue;
    double& s = speed[size_t(at.pp)];
    s = std::min(s, topology.heterogeneity.compute_speed_factor(rank, per_node));
  }
  return speed;
}

std::vector<double> replica_speeds(const Plan& plan, const Topology& topology) {
  if (topology.heterogeneity.empty()) return {};
  std::vector<double> out;
  for (int64_t d = 0; d < plan.dp_size; ++d) {
    const std::vector<double> stages = stage_speeds(plan, topology, d);
    out.push_back(*std::min_element(stages.begin(), stages.end()));
  }
  return out;
}

QuickEstimate combine_replica_times(const std::vector<StageTimes>& stages, const Plan& plan, const Topology& topology) {
  if (!plan.unequal_microbatches()) {
    return combine_stage_times(stages, plan, plan.num_microbatches(), stage_speeds(plan, topology));
  }
  QuickEstimate slowest;
  for (int64_t d = 0; d < plan.dp_size; ++d) {
    QuickEstimate e = combine_stage_times(stages, plan, plan.microbatches_of_replica(d), stage_speeds(plan, topology, d));
    if (e.step_time_s > slowest.step_time_s) slowest = e;
  }
  return slowest;
}

QuickEstimate combine_stage_times(const std::vector<StageTimes>& stages, const Plan& plan,
                                  int64_t num_microbatches, const std::vector<double>& stage_speed) {
  double m = double(num_microbatches);
  double f = ideal_bubble_fraction(
      plan.schedule, ScheduleShape{plan.pp_size, plan.virtual_pp_size, num_microbatches});
  QuickEstimate best;
  for (StageTimes t : stages) {
    if (!stage_speed.empty()) {
      const double slow = 1 / stage_speed.at(size_t(t.stage));
      t.compute_mb_s *= slow;
      t.backward_mb_s *= slow;
      t.imbalance_mb_s *= slow;
    }
    // Overlapped, a microbatch's gradient reductions (ZeRO-2) run on the comm stream beside its
    // backward and go on beside the next microbatch: only what exceeds a whole microbatch's
    // compute stays exposed, and the last one's what exceeds its backward (averaged over the m
    // microbatches). ZeRO-3's gathers are needed within their microbatch: with them, what exceeds
    // the backward, each microbatch.
    const double mb_compute_s = t.compute_mb_s + t.tp_mb_s;
    double dp_mb_exposed = t.dp_mb_s;
    if (plan.overlap_grad_reduce) {
      const double last_s = std::max(0.0, t.dp_mb_s - t.backward_mb_s);
      dp_mb_exposed = t.zero3_mb_s > 0 ? last_s : ((m - 1) * std::max(0.0, t.dp_mb_s - mb_compute_s) + last_s) / m;
    }
    double mb_s = t.compute_mb_s + t.tp_mb_s + t.pp_mb_s + dp_mb_exposed;
    double pipeline_s = mb_s * m / (1.0 - f);
    double dp_step_exposed = t.dp_step_s;
    if (plan.overlap_grad_reduce && t.dp_step_ops > 0) {
      dp_step_exposed = std::max(t.dp_step_s / double(t.dp_step_ops), t.dp_step_s - t.backward_mb_s);
    }
    QuickEstimate e;
    e.compute_s = t.compute_mb_s * m;
    e.tp_comm_s = t.tp_mb_s * m;
    e.pp_comm_s = t.pp_mb_s * m;
    e.bubble_s = pipeline_s - mb_s * m;
    e.dp_comm_s = dp_mb_exposed * m + dp_step_exposed;
    e.optimizer_s = t.step_level_s;
    e.step_time_s = pipeline_s + dp_step_exposed + t.step_level_s;
    e.critical_stage = t.stage;
    e.ep_comm_s = t.ep_mb_s * m;
    e.cp_comm_s = t.cp_mb_s * m;
    e.expert_imbalance_s = t.imbalance_mb_s * m;
    if (e.step_time_s > best.step_time_s) best = e;
  }
  return best;
}

QuickEstimate quick_estimate(const StepProgram& program, const Plan& plan,
                             int64_t num_microbatches, const Topology& topology,
                             const ComputeCostModel& cost_model) {
  CollectiveCostModel collectives = simulator_collective_model(cost_model.profile(), topology);
  std::vector<StageTimes> stages;
  for (const Role& role : program.roles) {
    stages.push_back(stage_times(role, program, topology, cost_model, collectives));
  }
  return combine_stage_times(stages, plan, num_microbatches, stage_speeds(plan, topology));
}

}  // namespace stepcast
