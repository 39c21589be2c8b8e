// The alloc/free walk of memory.hpp and ZeRO's model-state formula.
#include "memory.hpp"

#include <algorithm>
#include <array>
#include <thread>
#include <unordered_map>

#include "arena_plan.hpp"
#include "errors.hpp"
#include "units.hpp"

namespace stepcast {

ModelStateBytes zero_model_state_bytes(double parameters, int zero_stage, int64_t dp_size,
                                       Dtype param_dtype, Dtype grad_dtype) {
  double dp = double(dp_size);
  double weight_bytes = dtype_bytes(param_dtype);
  double master = dtype_bytes(param_dtype) < 4 ? 4 : 0;
  double moment = param_dtype == Dtype::fp64 ? 8 : 4;
  ModelStateBytes out;
  out.weights = parameters * weight_bytes / (zero_stage >= 3 ? dp : 1);
  out.grads = parameters * dtype_bytes(grad_dtype) / (zero_stage >= 2 ? dp : 1);
  out.optimizer = parameters * (master + 2 * moment) / (zero_stage >= 1 ? dp : 1);
  return out;
}

RankMemory walk_role_memory(const Role& role) {
  constexpr size_t kClasses = 6;
  std::array<double, kClasses> live{};
  std::array<double, kClasses> at_peak{};
  double total = 0, peak = 0;
  int32_t peak_op = -1;
  for (const Op& op : role.ops) {
    if (op.kind == OpKind::alloc) {
      live[size_t(op.buffer_class)] += op.bytes;
      total += op.bytes;
      if (total > peak) {
        peak = total;
        at_peak = live;
        peak_op = op.id;
      }
    } else if (op.kind == OpKind::free) {
      live[size_t(op.buffer_class)] -= op.bytes;
      total -= op.bytes;
    }
  }
  RankMemory m;
  m.stage = role.pp_stage;
  m.weights_bytes = at_peak[size_t(BufferClass::weights)];
  m.grads_bytes = at_peak[size_t(BufferClass::grads)];
  m.optimizer_bytes = at_peak[size_t(BufferClass::optimizer)];
  m.activations_bytes = at_peak[size_t(BufferClass::activations)];
  m.workspace_bytes = at_peak[size_t(BufferClass::workspace)];
  m.comm_bytes = at_peak[size_t(BufferClass::comm)];
  m.peak_bytes = peak;
  m.peak_op = peak_op;
  return m;
}

namespace {

std::vector<std::pair<int64_t, int64_t>> rank_ranges(std::vector<int64_t> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t r : ranks) {
    if (!out.empty() && out.back().second + 1 == r) out.back().second = r;
    else out.push_back({r, r});
  }
  return out;
}

}  // namespace

MemoryReport memory_report(const StepProgram& program, const Topology& topology) {
  MemoryReport report;
  RankGrid grid = program.grid();
  std::unordered_map<int64_t, std::vector<int64_t>> ranks_of_role;  // role_of_rank, one grid for all
  for (int64_t r = 0; r < grid.world_size(); ++r) {
    RankCoord at = grid.coord(r);
    const int64_t replica_class = program.replica_class.empty() ? 0 : program.replica_class[size_t(at.dp)];
    ranks_of_role[replica_class * program.pp_size + at.pp].push_back(r);
  }
  for (int64_t j = 0; j < program.parameter_servers; ++j) {  // a parameter server's role is its own
    ranks_of_role[int64_t(program.role_of_rank(program.world_size() + j).index)].push_back(program.world_size() + j);
  }
  // The arenas' placements, a role per thread (the offline orders take up to 0.1 s a role:
  // Llama 3 405B's 16 stages).
  std::vector<double> extents(program.roles.size());
  parallel_for(int64_t(program.roles.size()), int(std::max(1u, std::thread::hardware_concurrency())),
               [&](int64_t i) { extents[size_t(i)] = double(plan_arena(program.roles[size_t(i)]).extent_bytes); });
  for (size_t i = 0; i < program.roles.size(); ++i) {
    const Role& role = program.roles[i];
    RankMemory m = walk_role_memory(role);
    m.ranks = rank_ranges(ranks_of_role[role.index]);
    m.placement_bytes = std::max(0.0, extents[i] - m.peak_bytes);
    m.runtime_bytes = topology.node.device.runtime_allowance_bytes;
    m.peak_bytes += m.placement_bytes + m.runtime_bytes;
    report.peak_bytes_max = std::max(report.peak_bytes_max, m.peak_bytes);
    report.ranks.push_back(std::move(m));
  }
  report.reserved_bytes = topology.node.device.memory_reserved_bytes;
  report.capacity_bytes = topology.node.device.memory_bytes;
  report.fits = report.peak_bytes_max + report.reserved_bytes <= report.capacity_bytes;
  return report;
}

Json memory_to_json(const MemoryReport& report) {
  Json ranks = Json::array();
  for (const RankMemory& m : report.ranks) {
    Json r;
    r["rank"] = m.ranks.front().first;
    Json ranges = Json::array();
    for (auto [lo, hi] : m.ranks) ranges.push_back({lo, hi});
    r["ranks"] = ranges;
    r["stage"] = m.stage;
    r["memory_weights_bytes"] = m.weights_bytes;
    r["memory_grads_bytes"] = m.grads_bytes;
    r["memory_optimizer_bytes"] = m.optimizer_bytes;
    r["memory_activations_bytes"] = m.activations_bytes;
    r["memory_workspace_bytes"] = m.workspace_bytes;
    r["memory_comm_bytes"] = m.comm_bytes;
    r["memory_placement_bytes"] = m.placement_bytes;
    r["memory_runtime_bytes"] = m.runtime_bytes;
    r["peak_bytes"] = m.peak_bytes;
    ranks.push_back(r);
  }
  Json out;
  out["ranks"] = ranks;
  out["peak_bytes_max"] = report.peak_bytes_max;
  out["reserved_bytes"] = report.reserved_bytes;
  out["capacity_bytes"] = report.capacity_bytes;
  out["fits"] = report.fits;
  return out;
}

}  // namespace stepcast
