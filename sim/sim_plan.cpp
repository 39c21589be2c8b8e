// Setting a simulation up before SimGrid starts: which ranks are simulated, their groups, the
// reductions of fast mode and every op's cost; see sim_plan.hpp and simulator.hpp (the modes).
#include "sim_plan.hpp"

#include <algorithm>
#include <optional>
#include <set>
#include <sstream>
#include <type_traits>

#include "collective.hpp"
#include "collective_cost.hpp"
#include "cost_model.hpp"
#include "errors.hpp"
#include "operand_reuse.hpp"
#include "zero_fill.hpp"

namespace stepcast::sim_detail {

namespace {

// Longer than any training step: a cost beyond it comes from an implausible figure.
constexpr double kMaxOpTimeS = 1e7;

// Every node of the group holds as many of its members, more than one (rail staging pairs them by
// their position on their node).
bool same_count_per_node(const GroupLayout& layout) {
  std::map<int64_t, int64_t> count;
  for (int64_t node : layout.node_of) ++count[node];
  for (const auto& [node, c] : count) {
    if (c != count.begin()->second) return false;
  }
  return count.begin()->second > 1;
}

bool group_spans_folded_ranks(GroupKind kind) {
  return kind == GroupKind::model || kind == GroupKind::world || kind == GroupKind::instance;
}

// The packed walk of `role` (SimRole), once its collectives' analytic flags are known.
SimRole walk_of_role(const SimPlan& plan, const Role& role) {
  const size_t n = role.ops.size();
  SimRole walk;
  walk.op_class.assign(n, SimRole::memory);
  walk.queue_of.assign(n, 0);
  walk.queue_pos.assign(n, 0);
  walk.initially_done.assign(n, false);
  walk.timed_index.assign(n, -1);
  walk.p2p_index.assign(n, -1);
  walk.deps_begin.reserve(n + 1);
  for (const Op& op : role.ops) {
    walk.deps_begin.push_back(uint32_t(walk.deps.size()));
    if (op.kind == OpKind::alloc || op.kind == OpKind::free) {
      walk.initially_done[op.id] = true;
      continue;
    }
    SimRole::Class c = is_compute(op.kind) || plan.analytic[role.index][op.id] ? SimRole::compute_like
                       : is_collective(op.kind)                                ? SimRole::collective
                       : op.kind == OpKind::send                               ? SimRole::send
                                                                               : SimRole::recv;
    walk.op_class[op.id] = c;
    size_t queue = plan.in_order ? 0 : size_t(op.stream);
    walk.queue_of[op.id] = uint8_t(queue);
    walk.queue_pos[op.id] = uint32_t(walk.queue[queue].size());
    walk.queue[queue].push_back(op.id);
    walk.timed_index[op.id] = int32_t(walk.timed_ops++);
    if (op.kind == OpKind::send || op.kind == OpKind::recv) walk.p2p_index[op.id] = walk.p2p_ops++;
    if (op.kind == OpKind::send) walk.sends_by_tag[op.tag].push_back(op.id);
    for (int32_t d : op.deps) {
      const OpKind kind = role.ops[d].kind;
      if (kind != OpKind::alloc && kind != OpKind::free) walk.deps.push_back(d);
    }
  }
  walk.deps_begin.push_back(uint32_t(walk.deps.size()));
  return walk;
}

// Unequal devices: each slot's compute takes 1 / its speed factor, a folded tensor-parallel
// group's stand-in its slowest member's (the group synchronises every layer); the program's
// slowest device is named in `out`.
void plan_heterogeneity(SimPlan& plan, const StepProgram& program, const Heterogeneity& h,
                        SimulationOutput& out) {
  const RankGrid grid = program.grid();
  const int64_t per_node = program.devices_per_node;
  plan.slot_devices.assign(plan.ranks.size(),
                          (plan.fold_rails ? program.tp_size : 1) * (plan.fold_dp ? program.dp_size : 1));
  if (h.empty()) return;
  for (int64_t rank : plan.ranks) {
    double speed = h.compute_speed_factor(rank, per_node);
    if (plan.fold_tp) {
      for (int64_t m : grid.group(GroupKind::tp, rank)) speed = std::min(speed, h.compute_speed_factor(m, per_node));
    }
    plan.slot_time_factor.push_back(1.0 / speed);
  }
  for (int64_t rank = 0; rank < program.world_size(); ++rank) {
    const double speed = h.compute_speed_factor(rank, per_node);
    if (speed < out.slowest_speed_factor || out.slowest_rank < 0) {
      out.slowest_rank = rank;
      out.slowest_speed_factor = speed;
    }
  }
}

}  // namespace

Folds choose_folds(const StepProgram& program, const Topology& topology, const DeviceProfile& profile,
                   const SimulateOptions& options) {
  const bool full = options.mode == SimMode::full;
  const RankGrid grid = program.grid();
  const int64_t per_node = topology.node.devices_per_node;
  GroupShape tp_shape = group_shape(grid, GroupKind::tp, 0, per_node);
  bool tp_in_node = tp_shape.nodes == 1 && per_node % program.tp_size == 0;
  // Costing tp collectives analytically is exact only when nothing else uses the node's NVLink
  // at the same time: every other group (dp, pp, embedding, cp) must have one member per node, so its
  // traffic leaves through the NICs.
  bool nvlink_to_itself = true;
  for (GroupKind other : {GroupKind::dp, GroupKind::pp, GroupKind::embedding, GroupKind::cp, GroupKind::dp_cp}) {
    GroupShape shape = group_shape(grid, other, 0, per_node);
    if (shape.size > 1 && shape.members_per_node > 1) nvlink_to_itself = false;
  }
  const bool shared_node_fold = options.mode == SimMode::approx || options.fold_tp_shared_node;
  // Expert groups regroup a stage's ranks across tp coordinates (rank_grid.hpp): folding tp would
  // drop members of them, so plans with experts simulate every tp rank.
  const bool experts_span_tp = program.moe.num_experts > 0 && program.ep_size * program.etp_size > 1;
  const bool tp_foldable = !full && options.fold_tp && program.tp_size > 1 && tp_in_node && !experts_span_tp;
  const bool fold_tp = tp_foldable && (nvlink_to_itself || shared_node_fold);
  const bool fold_tp_approximate = fold_tp && !nvlink_to_itself;
  const bool tp_fold_declined = tp_foldable && !fold_tp;
  // Folding the rail-aligned groups keeps one rank per tp group. Ranks sharing a NIC would lose
  // that sharing, so fold only where every device has its own NIC.
  const bool own_nic = topology.fabric.nics_per_node >= per_node;
  const bool fold_rails = fold_tp && options.fold_rail_groups && own_nic;
  // The folded rails' flows take the same node-to-node paths: the links they would share (a fat
  // tree's leaf uplinks, a torus's or a dragonfly's router links) get 1/tp of their capacity. A
  // rail-optimised leaf holds one rail, so its uplink carries no folded rail's traffic.
  double divisor = 1;
  if (fold_rails && topology.fabric.kind != FabricKind::rail_optimized) divisor = double(program.tp_size);

  // approx: the data-parallel copies of a stage run the same ops on the same kind of device at
  // the same times, so one stands in for them (simulator.hpp). Not where experts lay out over dp
  // (their groups regroup a stage's ranks across copies), on unequal devices, in order (a CPU
  // profile's measured collectives), or where devices share a NIC (the copies beside the
  // stand-in would load its NIC).
  const bool dp_foldable = !full && options.fold_data_parallel && program.dp_size > 1 &&
                           program.moe.num_experts == 0 && program.microbatches_per_replica.empty() &&
                           topology.heterogeneity.empty() &&
                           !profile.execution_in_order && own_nic;
  const bool fold_dp = dp_foldable && options.mode == SimMode::approx;

  // The copies on the stand-in's node send where it sends (the pipeline's next node, the cross-node
  // phase of a hierarchical collective at their own position): on the shared links, as the rails.
  if (fold_dp && topology.fabric.kind != FabricKind::rail_optimized) {
    divisor *= double(group_shape(grid, GroupKind::dp, 0, per_node).members_per_node);
  }

  return {.fold_tp = fold_tp, .fold_tp_approximate = fold_tp_approximate, .tp_fold_declined = tp_fold_declined,
          .own_nic = own_nic, .fold_rails = fold_rails, .dp_foldable = dp_foldable, .fold_dp = fold_dp,
          .shared_link_divisor = divisor};
}

int64_t simulated_rank_count(const StepProgram& program, const Folds& folds) {
  return program.world_size() / (folds.fold_rails ? program.tp_size : 1) / (folds.fold_dp ? program.dp_size : 1);
}

SimPlan plan_simulation(const StepProgram& program, const Topology& topology_in,
                        const DeviceProfile& profile, const SimulateOptions& options,
                        const VariabilityDraws& draws, SimulationOutput& out) {
  check_profile_matches(profile, topology_in, options.allow_profile_mismatch);
  const bool full = options.mode == SimMode::full;
  if (full && (program.world_size() > kFullModeMaxDevices ||
               program.num_microbatches > kFullModeMaxMicrobatches)) {
    std::ostringstream why;
    why << "the plan has " << program.world_size() << " devices and " << program.num_microbatches
        << " microbatches; full mode simulates at most " << kFullModeMaxDevices << " devices and "
        << kFullModeMaxMicrobatches << " microbatches";
    throw_input_error("--mode", "mode", "\"full\"", why.str(), "--mode fast for this plan");
  }
  Topology topology = apply_link_fractions(topology_in, profile);
  RankGrid grid = program.grid();
  const int64_t per_node = topology.node.devices_per_node;
  const Folds folds = choose_folds(program, topology_in, profile, options);
  const bool fold_tp = folds.fold_tp, fold_rails = folds.fold_rails, fold_dp = folds.fold_dp;
  const bool dp_foldable = folds.dp_foldable, tp_fold_declined = folds.tp_fold_declined;
  GroupShape tp_shape = group_shape(grid, GroupKind::tp, 0, per_node);

  SimPlan plan;
  plan.program = &program;
  plan.mode = options.mode;
  plan.full = full;
  plan.fold_tp = fold_tp;
  plan.fold_tp_approximate = folds.fold_tp_approximate;
  plan.tp_fold_declined = tp_fold_declined;
  if (options.mode == SimMode::fast && (tp_fold_declined || dp_foldable)) {  // what approx would simulate
    SimulateOptions approx = options;
    approx.mode = SimMode::approx;
    plan.approx_ranks = simulated_rank_count(program, choose_folds(program, topology_in, profile, approx));
    plan.approx_folds_dp = dp_foldable;
  }
  plan.fold_rails = fold_rails;
  plan.shared_link_divisor = folds.shared_link_divisor;
  plan.fold_dp = fold_dp;
  plan.phase_flows = !full && options.phase_flows;
  plan.merge_compute = !full && options.merge_compute;
  plan.in_order = profile.execution_in_order;
  for (int64_t r = 0; r < program.world_size(); ++r) {
    if (fold_rails && grid.coord(r).tp != 0) continue;
    if (fold_dp && grid.coord(r).dp != 0) continue;
    plan.slot_of_rank[r] = plan.ranks.size();
    plan.ranks.push_back(r);
  }
  for (int64_t rank : plan.ranks) {  // indexed by peer_index(Peer)
    plan.peers.push_back({peer_rank(grid, rank, Peer::pp_prev), peer_rank(grid, rank, Peer::pp_next),
                          peer_rank(grid, rank, Peer::cp_prev), peer_rank(grid, rank, Peer::cp_next)});
  }
  // Representative ranks: the first of each pipeline stage (one per role), and in full mode
  // every rank of a program with at most 64.
  std::set<int64_t> representative;
  for (int64_t p = 0; p < program.pp_size; ++p) representative.insert(grid.rank(RankCoord{0, 0, p}));
  if (full && program.world_size() <= 64) {
    for (int64_t r = 0; r < program.world_size(); ++r) representative.insert(r);
  }
  plan.representative.assign(plan.ranks.size(), 0);
  for (int64_t r : representative) plan.representative[plan.slot_of_rank.at(r)] = 1;
  std::set<int64_t> detail(options.detail_ranks.begin(), options.detail_ranks.end());
  if (detail.empty()) detail = representative;
  if (options.detail_all) detail.insert(plan.ranks.begin(), plan.ranks.end());
  plan.detail.assign(plan.ranks.size(), 0);
  plan.keep_records = options.keep_records;
  for (int64_t r : detail) {
    auto it = plan.slot_of_rank.find(r);
    if (it == plan.slot_of_rank.end()) {
      throw InputError("detail rank " + std::to_string(r) + " is not simulated in this mode " +
                       "(fast mode folds tensor-parallel ranks: use tp index 0" +
                       std::string(fold_dp ? "; approx also folds data-parallel copies: use dp index 0" : "") + ")");
    }
    plan.detail[it->second] = 1;
  }

  // Groups, shared by their members.
  std::map<std::pair<int, int64_t>, std::shared_ptr<SimGroup>> groups;
  plan.groups.resize(plan.ranks.size());
  std::vector<std::set<GroupKind>> kinds_of_role(program.roles.size());  // its collectives' groups
  for (const Role& role : program.roles) {
    for (const Op& op : role.ops) {
      if (is_collective(op.kind)) kinds_of_role[size_t(role.index)].insert(op.group);
    }
  }
  std::set<int64_t> mirror_ranks;
  for (size_t slot = 0; slot < plan.ranks.size(); ++slot) {
    int64_t rank = plan.ranks[slot];
    for (GroupKind kind : kinds_of_role[size_t(grid.coord(rank).pp)]) {
      std::vector<int64_t> members, whole = grid.group(kind, rank);
      for (int64_t m : whole) {
        if (plan.slot_of_rank.count(m)) members.push_back(m);
      }
      // A group over the folded dp copies keeps them all, its flows mirrored (SimGroup); groups
      // that span every fold (model, world) are corrected analytically below, a folded tp
      // group is costed analytically, and the other groups (pp, embedding) lie inside one copy.
      const bool mirrored = fold_dp && members.size() < whole.size() &&
                            (kind == GroupKind::dp || kind == GroupKind::dp_cp || kind == GroupKind::dp_shard ||
                             kind == GroupKind::dp_replica);
      if (mirrored) {
        members = whole;
        for (int64_t m : whole) {
          if (!plan.slot_of_rank.count(m)) mirror_ranks.insert(m);
        }
      }
      auto key = std::make_pair(int(kind), members.front());
      auto& g = groups[key];
      if (!g) {
        g = std::make_shared<SimGroup>();
        g->members = members;
        g->mirrored = mirrored;
        for (int64_t m : members) g->layout.node_of.push_back(m / per_node);
        for (int64_t node : g->layout.node_of) g->spans_nodes |= node != g->layout.node_of.front();
        g->layout.rail_staged = g->spans_nodes && rail_staged_all_to_all(topology) && same_count_per_node(g->layout);
      }
      plan.groups[slot][kind] = g;
    }
  }
  plan.mirror_ranks.assign(mirror_ranks.begin(), mirror_ranks.end());

  // Costs per role.
  Dtype dtype = *parse_dtype(program.plan.at("param_dtype").get<std::string>());
  ComputeCostModel cost(topology.node.device, dtype, profile, topology.file,
                        program.model.is_object()
                            ? program.model.value("norm_type", std::string("rmsnorm"))
                            : std::string("rmsnorm"),
                        program.plan.value("cross_entropy_loss_fusion", true));
  if (program.fp8.enabled()) cost.use_fp8(topology.node.device, topology.file);
  LinkFigures links = link_figures(topology);
  // Measured collective tables correct the α-β model where the streams run concurrently (GPU
  // profiles); an in-order profile's measured collectives take their measured time (below).
  const CollectiveCostModel collective_cost = simulator_collective_model(profile, topology_in);
  auto note_correction = [&](double r) {
    if (r == 1) return;
    if (out.corrected_collectives++ == 0) out.correction_min = out.correction_max = r;
    out.correction_min = std::min(out.correction_min, r);
    out.correction_max = std::max(out.correction_max, r);
  };
  plan.op_cost_s.resize(program.roles.size());
  plan.analytic.resize(program.roles.size());
  plan.sync_only.resize(program.roles.size());
  plan.staging_s.resize(program.roles.size());
  plan.feeds_other_stream.resize(program.roles.size());
  plan.flow_scale.resize(program.roles.size());
  plan.tp_sync.resize(program.roles.size());
  for (const Role& role : program.roles) {
    auto& feeds = plan.feeds_other_stream[role.index];
    feeds.assign(role.ops.size(), 0);
    for (const Op& op : role.ops) {
      if (op.kind == OpKind::alloc || op.kind == OpKind::free) continue;
      for (int32_t d : op.deps) {
        if (role.ops[d].stream != op.stream) feeds[d] = 1;
      }
    }
  }
  // In order, a rank has one collective in flight at a time, as when the profile measured it.
  // With the profile's collective reuse points, at the reuse distances of the op's operands.
  auto measured_in_order_time_s = [&](const Op& op, int64_t first,
                                      const std::vector<OperandReuse>& reuse) -> std::optional<double> {
    if (!plan.in_order) return std::nullopt;  // (no group shapes to list then)
    return in_order_measured_collective_s(cost, op.kind, op.algorithm, op.bytes,
                                          group_shape(grid, op.group, first, per_node),
                                          reuse.empty() ? nullptr : &reuse[size_t(op.id)]);
  };
  for (const Role& role : program.roles) {
    auto& costs = plan.op_cost_s[role.index];
    auto& analytic = plan.analytic[role.index];
    auto& sync_only = plan.sync_only[role.index];
    auto& staging = plan.staging_s[role.index];
    costs.assign(role.ops.size(), 0);
    analytic.assign(role.ops.size(), 0);
    sync_only.assign(role.ops.size(), 0);
    if (plan.in_order && profile.execution_staged_sends) staging.assign(role.ops.size(), 0);
    plan.tp_sync[role.index].assign(role.ops.size(), 0);
    int64_t first = grid.rank(RankCoord{0, 0, role.pp_stage});
    // In order, the collectives' and GEMMs' operands where the profile measured them so.
    std::vector<OperandReuse> reuse;
    if (plan.in_order && (cost.has_collective_reuse() || cost.has_gemm_reuse())) {
      std::vector<char> wanted(role.ops.size(), 0);
      for (const Op& op : role.ops) {
        wanted[size_t(op.id)] = (is_collective(op.kind) && cost.has_collective_reuse()) ||
                                (op.kind == OpKind::gemm && cost.has_gemm_reuse());
      }
      reuse = operand_reuse(role, wanted);
    }
    const ZeroFills fills = zero_fills(role);
    for (const Op& op : role.ops) {
      std::optional<double> measured;
      if (is_collective(op.kind)) measured = measured_in_order_time_s(op, first, reuse);
      if (is_compute(op.kind)) {
        costs[op.id] = cost.op_time_s(op, reuse.empty() ? nullptr : &reuse[size_t(op.id)]);
      } else if (op.kind == OpKind::send && plan.in_order && profile.execution_staged_sends) {
        staging[op.id] = cost.staging_copy_time_s(op.bytes);
      } else if (is_collective(op.kind) && op.group == GroupKind::tp && fold_tp) {
        analytic[op.id] = 1;
        plan.tp_sync[role.index][op.id] = 1;
        double r = measured ? 1 : collective_cost.correction(op.kind, op.algorithm, op.bytes, tp_shape);
        note_correction(r);
        costs[op.id] = measured ? *measured
                                : r * collective_time_s(op.kind, op.algorithm, op.bytes, tp_shape, links);
      } else if (measured) {
        // Flows of no bytes make the members wait for each other; the measured time, less
        // the latency those flows take, follows.
        sync_only[op.id] = 1;
        GroupShape shape = group_shape(grid, op.group, first, per_node);
        double sync_s = collective_time_s(op.kind, op.algorithm, 0.0, shape, links);
        costs[op.id] = std::max(0.0, *measured - sync_s);
      } else if (is_collective(op.kind) && (fold_rails || fold_dp) && group_spans_folded_ranks(op.group)) {
        GroupShape whole = group_shape(grid, op.group, first, per_node);
        std::vector<int64_t> kept;
        for (int64_t m : grid.group(op.group, first)) {
          if (plan.slot_of_rank.count(m)) kept.push_back(m);
        }
        std::set<int64_t> nodes;
        for (int64_t m : kept) nodes.insert(m / per_node);
        GroupShape folded{int64_t(kept.size()), int64_t(nodes.size()),
                          int64_t(kept.size()) / std::max<int64_t>(1, int64_t(nodes.size()))};
        double t_whole = collective_time_s(op.kind, op.algorithm, op.bytes, whole, links);
        double t_folded = collective_time_s(op.kind, op.algorithm, op.bytes, folded, links);
        costs[op.id] = std::max(0.0, t_whole - t_folded);
      }
      // The measured correction of a collective simulated with flows, for its whole group.
      if (is_collective(op.kind) && !analytic[op.id] && !sync_only[op.id] && collective_cost.corrects()) {
        GroupShape whole = group_shape(grid, op.group, first, per_node);
        double r = collective_cost.correction(op.kind, op.algorithm, op.bytes, whole);
        note_correction(r);
        if (r < 1) {
          auto& scale = plan.flow_scale[role.index];
          if (scale.empty()) scale.assign(role.ops.size(), 1.0);  // the role's first
          scale[op.id] = r;
        } else {
          costs[op.id] += (r - 1) * collective_time_s(op.kind, op.algorithm, op.bytes, whole, links);
        }
      }
      // A send's measured point-to-point table (GPU profiles): its flow's bytes scaled so that,
      // uncontended, it takes the table's time (CollectiveCostModel::p2p_time_s).
      if (op.kind == OpKind::send && !plan.in_order && collective_cost.has_p2p_tables() &&
          (op.peer == Peer::pp_next || op.peer == Peer::pp_prev || op.peer == Peer::cp_next)) {
        const bool across = peer_rank(grid, first, op.peer) / per_node != first / per_node;
        if (const double k = collective_cost.p2p_flow_scale(op.bytes, across); k != 1) {
          auto& scale = plan.flow_scale[role.index];
          if (scale.empty()) scale.assign(role.ops.size(), 1.0);
          scale[op.id] = k;
        }
      }
      // In order (a host backend), the executor's copy or add around the transfer
      // (collective_local_work) follows it, measured table or flows.
      if (plan.in_order && is_collective(op.kind)) {
        costs[op.id] += collective_local_work_s(cost, op, group_shape(grid, op.group, first, per_node).size);
      }
      // The every-step zero fills of the buffers this op is the first to touch run just before
      // it, as the executor runs them (zero_fill.hpp): part of a compute op's time, of a
      // collective's correction delay, of an in-order send's staging copy.
      if (const double fill = cost.fills_time_s(role, fills.step_fills_before[size_t(op.id)]); fill > 0) {
        if (is_compute(op.kind) || is_collective(op.kind)) {
          costs[op.id] += fill;
        } else if (op.kind == OpKind::send && !staging.empty()) {
          staging[op.id] += fill;
        }
      }
      // A figure that makes one op last longer than a training run ever does (a peak of 1e-300
      // flop/s) would stall SimGrid's clock: refused here, naming what it came from.
      if (!(costs[op.id] >= 0 && costs[op.id] < kMaxOpTimeS)) {
        std::ostringstream why;
        why << "op " << op.id << " (" << to_string(op.kind) << " " << to_string(op.name) << ") of rank "
            << first << " would take " << costs[op.id] << " s";
        throw_input_error(topology.file, "node", "", why.str(),
                          "peaks, bandwidths and latencies (and the profile " + profile.file +
                              ") that give every op less than " + std::to_string(int64_t(kMaxOpTimeS)) +
                              " s");
      }
    }
  }

  plan_moe_imbalance(plan, program, cost, out);
  for (const Role& role : program.roles) plan.roles.push_back(walk_of_role(plan, role));

  // Variability: draws keyed by the tp group's first rank where tp is folded (its members are
  // one), which is also the slowest of their device factors. Where dp is folded, the stand-in is
  // the copy whose pipeline the device factors make slowest, by the estimate Σ_p t_p + (m − 1) ·
  // max_p t_p, t_p the stage's compute (its role's compute ops) times the copy's slowest factor
  // in that stage: fill and drain pass every stage once, the m − 1 other microbatches go at the
  // slowest stage's pace.
  if (options.variability && draws.enabled()) {
    out.variability = true;
    plan.draws = &draws;
    plan.segment_members = fold_tp ? program.tp_size : 1;
    int64_t copy = 0;
    if (fold_dp) {
      std::vector<double> compute_s;  // per stage
      for (int64_t p = 0; p < program.pp_size; ++p) {
        const Role& role = program.role_of_rank(grid.rank({0, 0, p, 0}));
        double sum = 0;
        for (const Op& op : role.ops) sum += is_compute(op.kind) ? plan.op_cost_s[role.index][op.id] : 0.0;
        compute_s.push_back(sum);
      }
      double worst = -1;
      for (int64_t k = 0; k < program.dp_size; ++k) {
        double sum = 0, top = 0;
        for (int64_t p = 0; p < program.pp_size; ++p) {
          double f = 0;
          for (int64_t t = 0; t < program.tp_size; ++t) {
            for (int64_t c = 0; c < program.cp_size; ++c) f = std::max(f, draws.device_factor(grid.rank({t, k, p, c})));
          }
          sum += f * compute_s[size_t(p)];
          top = std::max(top, f * compute_s[size_t(p)]);
        }
        const double estimate = sum + double(program.num_microbatches - 1) * top;
        if (estimate > worst) worst = estimate, copy = k;
      }
    }
    for (int64_t simulated : plan.ranks) {
      RankCoord c = grid.coord(simulated);
      c.dp = fold_dp ? copy : c.dp;
      const int64_t rank = grid.rank(c);
      double factor = draws.device_factor(rank);
      int64_t key = rank;
      if (fold_tp) {
        std::vector<int64_t> members = grid.group(GroupKind::tp, rank);
        key = *std::min_element(members.begin(), members.end());
        factor = 0;
        for (int64_t m : members) factor = std::max(factor, draws.device_factor(m));
      }
      plan.slot_factor.push_back(factor);
      plan.slot_draw_rank.push_back(key);
    }
  }
  plan_heterogeneity(plan, program, topology_in.heterogeneity, out);
  if (options.overlap_interference && profile.overlap.modelled() && !plan.in_order) {
    plan.overlap_speeds = {1.0, profile.overlap.compute_speed(false), profile.overlap.compute_speed(true)};
    out.overlap_interference = true;
  }
  plan.topology = topology;
  return plan;
}

void release_walks(SimPlan& plan) {
  auto release = [](auto& v) { std::remove_reference_t<decltype(v)>().swap(v); };
  release(plan.analytic);
  release(plan.feeds_other_stream);
  release(plan.sync_only);
  release(plan.staging_s);
  release(plan.flow_scale);
  release(plan.tp_sync);
  for (SimRole& walk : plan.roles) {
    for (auto& queue : walk.queue) release(queue);
    release(walk.op_class);
    release(walk.queue_of);
    release(walk.queue_pos);
    release(walk.deps_begin);
    release(walk.deps);
    release(walk.initially_done);
  }
}

}  // namespace stepcast::sim_detail
