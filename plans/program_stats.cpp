// Totals of a StepProgram; see program_stats.hpp.
#include "program_stats.hpp"

#include <algorithm>

namespace stepcast {

ProgramStats program_stats(const StepProgram& program) {
  ProgramStats stats;
  RankGrid grid = program.grid();
  stats.ranks = grid.world_size();
  for (const Role& role : program.roles) {
    // Every stage has tp·cp·dp ranks; a parameter server is one, running its role once per
    // worker step: dp_size times a step (counted as many ranks for the step's totals).
    const int64_t runs = role.server >= 0 ? program.dp_size : 1;
    int64_t ranks = role.server >= 0 ? runs : stats.ranks / program.pp_size;
    stats.ops_per_role.push_back(int64_t(role.ops.size()));
    stats.ranks_per_role.push_back(role.server >= 0 ? 1 : ranks);
    std::map<std::string, double> per_rank;
    for (const Op& op : role.ops) {
      if (is_compute(op.kind)) {
        stats.flops_per_step += op.flops * ranks;
        // Matrix products only: GEMMs and the attention score and value products.
        bool forward_work = op.kind == OpKind::gemm ||
                            (op.kind == OpKind::attention &&
                             (op.name == OpName::score || op.name == OpName::value || op.name == OpName::flash ||
                              op.name == OpName::cp_score || op.name == OpName::cp_value));
        if (forward_work && op.phase == Phase::forward) stats.forward_flops_per_step += op.flops * ranks;
        if (forward_work) stats.matrix_flops_per_step += op.flops * ranks;
        if (op.phase == Phase::recompute) stats.recompute_flops_per_step += op.flops * ranks;
      } else if (is_collective(op.kind)) {
        per_rank[to_string(op.group)] += op.bytes;
        stats.collective_ops_by_algorithm[to_string(op.algorithm)] += ranks;
      } else if (op.kind == OpKind::send) {  // the pipeline's, the context-parallel ring's, the servers'
        const bool ps = op.peer == Peer::ps_server || op.peer == Peer::ps_worker;
        per_rank[ps ? "ps" : op.peer == Peer::cp_next ? "cp" : "pp"] += op.bytes;
      }
    }
    for (const auto& [group, bytes] : per_rank) {
      stats.comm_bytes_per_step[group] += bytes * ranks;
      stats.comm_bytes_per_rank_max[group] = std::max(stats.comm_bytes_per_rank_max[group], bytes * double(runs));
    }
  }
  return stats;
}

}  // namespace stepcast
