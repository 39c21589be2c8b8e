// The planner's path for mixtures of experts; see search.hpp (check_moe_candidate). A MoE layer is
// not the dense probe's layer (its experts are a parameter group of their own, sharded over edp,
// its buffers sized by the routing draws of every microbatch and layer), so a MoE candidate is
// judged on its own lowered program: the persistent bytes bound it first (no lowering), then the
// memory path's program (moe_path_plan) is lowered once, every stage walked (`memory`'s peak,
// exactly) and the quick estimate read from the same program. Many candidates: lowered in the
// order of a screen (the dense twin's probe) until enough fit.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>

#include "collective.hpp"
#include "collective_cost.hpp"
#include "lower.hpp"
#include "memory.hpp"
#include "quick_estimate.hpp"
#include "search.hpp"
#include "units.hpp"

namespace stepcast {

namespace {

bool keeps_send_staging(const StepProgram& program) {
  for (const Role& role : program.roles) {
    for (const Op& op : role.ops) {
      if (op.kind == OpKind::alloc && op.buffer.rfind("comm.send.", 0) == 0) return true;
    }
  }
  return false;
}

// The program the MoE path lowers: memory_path_plan's (at most 2·pp microbatches), with at least
// 3 where the plan has them, so that one microbatch is neither the first nor the last (the
// last carries the step's gradient reductions): its communication stands for every middle one.
Plan moe_path_plan(const Plan& plan) {
  Plan p = memory_path_plan(plan);
  if (p.num_microbatches() < 3 && plan.num_microbatches() >= 3) {
    p.global_batch_size = 3 * plan.micro_batch_size * plan.dp_size;  // (pp 1: any count is valid)
  }
  return p;
}

// Payload bytes one rank sends per step by group kind, the largest over stages (program_stats'
// reading), from the program of moe_path_plan: every lowered microbatch's and the step's bytes,
// and microbatch 1's for each microbatch the plan has beyond those lowered.
std::map<std::string, double> comm_bytes_per_rank_max(const StepProgram& program, int64_t plan_microbatches) {
  const double missing = double(plan_microbatches - program.num_microbatches);
  std::map<std::string, double> out;
  for (const Role& role : program.roles) {
    std::map<std::string, double> per_rank;
    for (const Op& op : role.ops) {
      const double times = 1 + (op.microbatch == 1 ? missing : 0.0);
      if (is_collective(op.kind)) per_rank[to_string(op.group)] += op.bytes * times;
      else if (op.kind == OpKind::send) per_rank[op.peer == Peer::cp_next ? "cp" : "pp"] += op.bytes * times;
    }
    for (const auto& [group, bytes] : per_rank) out[group] = std::max(out[group], bytes);
  }
  return out;
}

}  // namespace

void check_moe_candidate(Candidate& c, const ModelConfig& model, const Topology& topology,
                         const SearchSpace& space, const ComputeCostModel* cost_model) {
  if (!c.kept()) return;
  const Plan& plan = c.plan;
  const DeviceSpec& device = topology.node.device;
  const double runtime = device.runtime_allowance_bytes;
  c.memory_checked = true;
  c.reserved_bytes = device.memory_reserved_bytes;
  c.capacity_bytes = device.memory_bytes;
  const double allowed = space.max_memory_fraction * device.memory_bytes;
  const double limit = allowed - device.memory_reserved_bytes;  // on the peak
  c.stage_bounds.clear();
  c.peak_lower_bytes = 0;
  const std::vector<double> persistent = stage_persistent_bytes(plan, model, topology);
  for (size_t stage = 0; stage < persistent.size(); ++stage) {
    c.peak_lower_bytes = std::max(c.peak_lower_bytes, persistent[stage] + runtime);
  }
  if (c.peak_lower_bytes > limit) {
    prune_for_memory(c, c.peak_lower_bytes, allowed, "weights, gradients and optimizer state (experts included) need at least");
    return;
  }
  const Plan path = moe_path_plan(plan);
  StepProgram program = lower_program(model, topology, path);
  c.whole_step_walk = keeps_send_staging(program);
  if (cost_model) {
    c.estimate = quick_estimate(program, plan, plan.num_microbatches(), topology, *cost_model);
    c.estimate.comm_bytes_per_rank_max = comm_bytes_per_rank_max(program, plan.num_microbatches());
  }
  // Send staging copies live to the step's end: the peak grows with the step's microbatches.
  if (c.whole_step_walk && plan.num_microbatches() > path.num_microbatches()) {
    program = lower_program(model, topology, plan);
  }
  double peak = 0;
  int64_t worst = 0;
  for (const Role& role : program.roles) {
    const double stage_peak = walk_role_memory(role).peak_bytes + runtime;
    c.stage_bounds.push_back({role.pp_stage, persistent[size_t(role.pp_stage)], stage_peak, stage_peak});
    if (stage_peak > peak) worst = role.pp_stage;
    peak = std::max(peak, stage_peak);
  }
  c.walked_stages = int64_t(program.roles.size());
  c.peak_lower_bytes = c.peak_upper_bytes = c.peak_bytes_max = peak;
  c.peak_exact = true;
  if (peak > limit) prune_for_memory(c, peak, allowed, "stage " + std::to_string(worst) + " peaks at");
}

QuickEstimate candidate_estimate(const Plan& plan, const ModelConfig& model, const Topology& topology,
                                 ProbeCache& probes, const ComputeCostModel& cost_model) {
  if (!model.is_moe()) return probe_estimate(plan, model, topology, probes.get(plan), cost_model);
  StepProgram program = lower_program(model, topology, moe_path_plan(plan));
  QuickEstimate estimate = quick_estimate(program, plan, plan.num_microbatches(), topology, cost_model);
  estimate.comm_bytes_per_rank_max = comm_bytes_per_rank_max(program, plan.num_microbatches());
  return estimate;
}

namespace {

// The dense twin of a mixture of experts, for the screen: every layer's MLP as wide as what one
// token passes through (its k experts and the shared ones; the dense layers' width averaged in),
// a multiple of 64; no experts.
ModelConfig dense_twin(const ModelConfig& m) {
  ModelConfig twin = m;
  const double layers = double(m.num_hidden_layers), dense = double(m.first_k_dense_replace);
  const double moe_width = double((m.num_experts_per_tok + m.n_shared_experts) * m.moe_intermediate_size);
  const double width = (dense * double(m.intermediate_size) + (layers - dense) * moe_width) / layers;
  twin.intermediate_size = std::max<int64_t>(64, std::llround(width / 64) * 64);
  twin.num_experts = twin.num_experts_per_tok = twin.moe_intermediate_size = 0;
  twin.n_shared_experts = twin.first_k_dense_replace = 0;
  return twin;
}

// The screen's step time of a MoE candidate: the dense twin's probe estimate with the dispatch
// and combine of every MoE layer added (all_to_all over ep of a rank's T·k token copies, or the
// allgather dispatcher's gather and scatter of the ep group's tokens; twice forward, twice
// backward, twice more under full recompute), uncontended, on the slowest stage's layers.
double screen_estimate_s(const Plan& plan, const ModelConfig& model, const ModelConfig& twin,
                         const Topology& topology, ProbeCache& twin_probes, const ComputeCostModel& cost_model,
                         const CollectiveCostModel& collectives, const LinkFigures& links) {
  Plan dense = plan;
  dense.moe = MoePlan{};
  dense.moe.etp_size = 1;
  const double base = probe_estimate(dense, twin, topology, twin_probes.get(dense), cost_model).step_time_s;
  const int64_t ep = plan.moe.ep_size;
  if (ep <= 1) return base;
  RankGrid grid(plan.tp_size, plan.dp_size, plan.pp_size, plan.order, plan.dp_shard_size(), plan.cp_size, ep,
                std::max<int64_t>(1, plan.moe.etp_size));
  const GroupShape shape = group_shape(grid, GroupKind::ep, 0, topology.node.devices_per_node);
  const int64_t tokens = model.seq_length / plan.cp_size * plan.micro_batch_size /
                         (plan.sequence_parallel ? plan.tp_size : 1);
  const double row = double(model.hidden_size) * dtype_bytes(plan.param_dtype);
  auto cost = [&](OpKind kind, double bytes) {
    return uncontended_collective_s(cost_model, collectives, kind, choose_algorithm(kind, bytes, shape, links), bytes,
                                    shape);
  };
  double per_pass = 0;
  if (plan.moe.dispatcher == MoeDispatcher::alltoall) {
    per_pass = 2 * cost(OpKind::all_to_all, double(tokens * plan.moe.top_k) * row);
  } else {
    const double gathered = double(tokens * ep) * row;
    per_pass = cost(OpKind::all_gather, gathered) + cost(OpKind::reduce_scatter, gathered);
  }
  const double passes = plan.recompute == RecomputeKind::full ? 3 : 2;
  int64_t moe_layers_most = 0;
  for (int64_t stage = 0, layer = 0; stage < int64_t(plan.layers_per_stage.size()); ++stage) {
    int64_t moe = 0;
    for (int64_t l = 0; l < plan.layers_per_stage[size_t(stage)]; ++l, ++layer) moe += model.is_moe_layer(layer);
    moe_layers_most = std::max(moe_layers_most, moe);
  }
  // (virtual stages: a rank holds virtual_pp_size of them; the most a virtual stage holds, times that)
  moe_layers_most *= plan.virtual_pp_size;
  return base + per_pass * passes * double(moe_layers_most) * double(plan.num_microbatches());
}

// Takes a cost model from the pool (or a copy of `prototype`) for one task on one thread.
class CostModelPool {
 public:
  explicit CostModelPool(const ComputeCostModel& prototype) : prototype_(prototype) {}
  std::unique_ptr<ComputeCostModel> take() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (pool_.empty()) return std::make_unique<ComputeCostModel>(prototype_);
    auto mine = std::move(pool_.back());
    pool_.pop_back();
    return mine;
  }
  void give(std::unique_ptr<ComputeCostModel> mine) {
    std::lock_guard<std::mutex> lock(mutex_);
    pool_.push_back(std::move(mine));
  }

 private:
  const ComputeCostModel& prototype_;
  std::mutex mutex_;
  std::vector<std::unique_ptr<ComputeCostModel>> pool_;
};

}  // namespace

void check_moe_candidates(const std::vector<Candidate*>& kept, const ModelConfig& model, const Topology& topology,
                          const SearchSpace& space, const ComputeCostModel& cost_model, int jobs,
                          const Progress& progress) {
  // The cost model caches the rates it interpolates: each thread takes a copy of its own.
  CostModelPool pool(cost_model);
  const DeviceSpec& device = topology.node.device;
  const double allowed = space.max_memory_fraction * device.memory_bytes;
  const double limit = allowed - device.memory_reserved_bytes;
  // Every candidate with every stage's layer count set: the persistent bound, then the screen.
  const ModelConfig twin = dense_twin(model);
  ProbeCache twin_probes(twin, topology);
  const CollectiveCostModel collectives = simulator_collective_model(cost_model.profile(), topology);
  const LinkFigures links = link_figures(topology);
  std::vector<double> screen(kept.size(), 0);
  std::vector<char> likely_misfit(kept.size(), 0);
  parallel_for(
      int64_t(kept.size()), jobs,
      [&](int64_t i) {
        Candidate& c = *kept[size_t(i)];
        c.memory_checked = true;
        c.reserved_bytes = device.memory_reserved_bytes;
        c.capacity_bytes = device.memory_bytes;
        c.peak_lower_bytes = 0;
        for (double bytes : stage_persistent_bytes(c.plan, model, topology)) {
          c.peak_lower_bytes = std::max(c.peak_lower_bytes, bytes + device.runtime_allowance_bytes);
        }
        if (c.peak_lower_bytes > limit) {
          prune_for_memory(c, c.peak_lower_bytes, allowed,
                       "weights, gradients and optimizer state (experts included) need at least");
          return;
        }
        auto mine = pool.take();
        screen[size_t(i)] = screen_estimate_s(c.plan, model, twin, topology, twin_probes, *mine, collectives, links);
        pool.give(std::move(mine));
        // Likely to fit: the experts' persistent bound plus the dense twin's kept activations
        // (not a bound on the MoE layers' own; it orders the lowering, it prunes nothing).
        Plan dense = c.plan;
        dense.moe = MoePlan{};
        dense.moe.etp_size = 1;
        for (const auto& b : stage_memory_bounds(dense, twin, topology, twin_probes.get(dense))) {
          if (c.peak_lower_bytes + b.lower_bytes - b.persistent_bytes > limit) likely_misfit[size_t(i)] = 1;
        }
      },
      nullptr);
  // Lowered exactly in the screen's order, a batch at a time, until enough fit.
  std::vector<size_t> order;
  for (size_t i = 0; i < kept.size(); ++i) {
    if (kept[i]->kept()) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (likely_misfit[a] != likely_misfit[b]) return likely_misfit[a] < likely_misfit[b];
    return screen[a] < screen[b];
  });
  const int64_t wanted = space.moe_lowered_plans > 0 ? space.moe_lowered_plans : int64_t(order.size());
  const int64_t batch = std::max<int64_t>(8, 4 * jobs);
  int64_t fit = 0;
  size_t next = 0;
  while (next < order.size() && fit < wanted) {
    const size_t end = std::min(order.size(), next + size_t(batch));
    parallel_for(
        int64_t(end - next), jobs,
        [&](int64_t i) {
          auto mine = pool.take();
          check_moe_candidate(*kept[order[next + size_t(i)]], model, topology, space, mine.get());
          pool.give(std::move(mine));
        },
        nullptr);
    for (size_t i = next; i < end; ++i) fit += kept[order[i]]->kept();
    next = end;
    if (progress) progress(int64_t(next), int64_t(order.size()));
  }
  for (size_t i = next; i < order.size(); ++i) {
    Candidate& c = *kept[order[i]];
    c.pruned = "not lowered: below the best the MoE screen ranks";
    c.pruned_detail = "ranked " + std::to_string(i + 1) + " of " + std::to_string(order.size()) +
                      " by the MoE screen (" + std::to_string(screen[order[i]]) + " s); " + std::to_string(fit) +
                      " candidates lowered before it fit (the search lowers until " + std::to_string(wanted) +
                      " fit; `plan --moe-lowered 0` lowers every one)";
  }
  if (progress) progress(int64_t(order.size()), int64_t(order.size()));
}

}  // namespace stepcast
