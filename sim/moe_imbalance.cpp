// Routing imbalance of a mixture of experts in the simulation: each (microbatch, MoE layer)'s
// tokens per expert drawn from the program's routing shares (the layer's own where it has them)
// with its seed (moe.hpp's draw_routing), or replayed from a run's measured samples, the same
// draw for every rank, so an ep rank whose experts drew more tokens computes longer grouped
// GEMMs (each expert's GEMM through the GEMM model with its own rows) and receives (sends back)
// more of the all_to_all, whose largest message sets its pace. Under a capacity an expert keeps
// at most its capacity of copies (the rest dropped and counted), and computes those, or with
// moe_pad_expert_input_to_capacity its whole capacity padded (Megatron's pad_to_capacity), when
// costs do not move. See sim_plan.hpp (SimPlan::ep_cost_s, ep_load).
#include <algorithm>
#include <map>

#include "cost_model.hpp"
#include "moe.hpp"
#include "rank_grid.hpp"
#include "sim_plan.hpp"

namespace stepcast::sim_detail {

namespace {

bool is_grouped_gemm(const Op& op) {
  return op.kind == OpKind::gemm &&
         (op.name == OpName::expert_gate || op.name == OpName::expert_up || op.name == OpName::expert_down);
}

bool is_ep_all_to_all(const Op& op) {
  return op.kind == OpKind::all_to_all && op.group == GroupKind::ep &&
         (op.name == OpName::ep_dispatch || op.name == OpName::ep_combine);
}

}  // namespace

void plan_moe_imbalance(SimPlan& plan, const StepProgram& program, const ComputeCostModel& cost,
                        SimulationOutput& out) {
  const ProgramMoe& moe = program.moe;
  plan.ep_cost_s.assign(program.roles.size(), {});
  plan.ep_load.assign(program.roles.size(), {});
  const RankGrid grid = program.grid();
  plan.slot_ep_rank.clear();
  for (int64_t rank : plan.ranks) plan.slot_ep_rank.push_back(grid.ep_rank(rank));
  if (moe.num_experts == 0) return;
  const int64_t ep = program.ep_size, local = moe.num_experts / ep;
  const bool dropless = moe.expert_capacity_rows == 0;
  // The draws of the step, by (microbatch, layer): every layer any role lowers.
  std::map<std::pair<int32_t, int32_t>, std::vector<int64_t>> draws;
  auto draw = [&](int32_t mb, int32_t layer) -> const std::vector<int64_t>& {
    auto [it, fresh] = draws.emplace(std::make_pair(mb, layer), std::vector<int64_t>{});
    if (fresh) it->second = moe.routing_counts(mb, layer);
    return it->second;
  };
  double ratio_sum = 0, ratio_max = 0;
  int64_t dropped = 0, draws_counted = 0;
  for (const Role& role : program.roles) {
    std::map<std::pair<int32_t, int64_t>, double> memo;
    for (const Op& op : role.ops) {
      if (op.microbatch < 0 || op.layer < 0 || (!is_grouped_gemm(op) && !is_ep_all_to_all(op))) continue;
      std::vector<int64_t> counts = draw(op.microbatch, op.layer);
      if (moe.pad_to_capacity) continue;  // padded to capacity: every rank alike
      if (!dropless) {  // the copies each expert keeps
        for (int64_t& c : counts) c = std::min(c, moe.expert_capacity_rows);
      }
      if (is_grouped_gemm(op)) {
        std::vector<double>& per_rank = plan.ep_cost_s[size_t(role.index)][op.id];
        for (int64_t r = 0; r < ep; ++r) {
          std::vector<int64_t> rows(counts.begin() + r * local, counts.begin() + (r + 1) * local);
          per_rank.push_back(grouped_gemm_time_s(cost, op, rows, memo));
        }
      } else {
        // The rows the op's bytes are of, a rank's: the mean load dropless; under a capacity its
        // experts' capacity (the buffers' rows).
        const double mean =
            dropless ? double(moe.routed_tokens) / double(ep) : double(moe.expert_capacity_rows * local);
        std::vector<double>& per_rank = plan.ep_load[size_t(role.index)][op.id];
        for (int64_t r = 0; r < ep; ++r) {
          int64_t load = 0;
          for (int64_t e = r * local; e < (r + 1) * local; ++e) load += counts[size_t(e)];
          per_rank.push_back(mean > 0 ? double(load) / mean : 1.0);
        }
      }
    }
  }
  // What the draws did: the slowest ep rank's load over the mean, and the token copies over capacity.
  for (const auto& [key, counts] : draws) {
    double mean = double(moe.routed_tokens) / double(ep), worst = 0;
    for (int64_t r = 0; r < ep; ++r) {
      int64_t load = 0;
      for (int64_t e = r * local; e < (r + 1) * local; ++e) load += counts[size_t(e)];
      worst = std::max(worst, double(load));
    }
    double ratio = mean > 0 ? worst / mean : 1.0;
    ratio_sum += ratio;
    ratio_max = std::max(ratio_max, ratio);
    if (!dropless) {
      for (int64_t c : counts) dropped += std::max<int64_t>(0, c - moe.expert_capacity_rows);
    }
    ++draws_counted;
  }
  out.moe_draws = draws_counted;
  out.moe_load_ratio_mean = draws_counted ? ratio_sum / double(draws_counted) : 1.0;
  out.moe_load_ratio_max = ratio_max;
  out.moe_dropped_tokens = dropped;
  out.moe_routed_tokens = moe.routed_tokens * draws_counted;
}

}  // namespace stepcast::sim_detail
