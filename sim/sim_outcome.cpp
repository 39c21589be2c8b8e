// Reading a finished simulation back: the SimOutcome its actors left, as a SimulationOutput
// (step time, critical rank, op records of the detail ranks, breakdown); see sim_plan.hpp.
#include "sim_plan.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
#include <sstream>

#include "errors.hpp"

namespace stepcast::sim_detail {

namespace {

using Intervals = std::vector<std::pair<double, double>>;

// Sorts `intervals` unless they are already in order: a stream's ops mostly run in list order,
// so the check (linear) spares the sort.
void sort_if_needed(Intervals& intervals) {
  if (!std::is_sorted(intervals.begin(), intervals.end())) std::sort(intervals.begin(), intervals.end());
}

// The length of the union of [start, end) intervals, sorted by start.
double union_length(const Intervals& intervals) {
  double total = 0, open_start = 0, open_end = -1;
  for (const auto& [start, end] : intervals) {
    if (start > open_end) {
      if (open_end > open_start) total += open_end - open_start;
      open_start = start;
      open_end = end;
    } else {
      open_end = std::max(open_end, end);
    }
  }
  if (open_end > open_start) total += open_end - open_start;
  return total;
}

// Per slot: busy while a compute op runs, waiting while only other ops (collectives, transfers,
// analytic tp collectives) are in flight, idle for the rest of the step. Each stream's intervals
// are collected apart (each in order as its ops ran) and merged, not sorted together. The walk
// is over the timed ops in list order (timed_index order), from a packed copy of each role's
// stream and compute flag: 10^5 ops per slot, where the Op structs would be read from far apart.
std::vector<DeviceTime> device_times(const SimPlan& plan, const SimOutcome& outcome, double step_s) {
  const StepProgram& program = *plan.program;
  // Per role, per timed op: its stream, and whether it is a compute op.
  std::vector<std::vector<uint8_t>> timed_stream(program.roles.size());
  std::vector<std::vector<char>> timed_compute(program.roles.size());
  for (const Role& role : program.roles) {
    const SimRole& walk = plan.roles[size_t(role.index)];
    std::vector<uint8_t>& stream = timed_stream[size_t(role.index)];
    std::vector<char>& compute = timed_compute[size_t(role.index)];
    stream.resize(size_t(walk.timed_ops));
    compute.resize(size_t(walk.timed_ops));
    for (const Op& op : role.ops) {
      const int32_t t = walk.timed_index[op.id];
      if (t < 0) continue;
      stream[size_t(t)] = uint8_t(op.stream);
      compute[size_t(t)] = is_compute(op.kind);
    }
  }
  std::vector<DeviceTime> times;
  times.reserve(plan.ranks.size());
  std::array<Intervals, 3> by_stream;  // Stream::compute, comm, p2p
  Intervals busy, merged, active;
  for (size_t slot = 0; slot < plan.ranks.size(); ++slot) {
    const RankState& st = outcome.state[slot];
    const size_t role = size_t(program.role_of_rank(plan.ranks[slot]).index);
    const std::vector<uint8_t>& stream = timed_stream[role];
    const std::vector<char>& compute = timed_compute[role];
    busy.clear();
    for (Intervals& v : by_stream) v.clear();
    for (size_t t = 0; t < stream.size(); ++t) {
      if (!(st.end[t] > st.start[t])) continue;
      by_stream[stream[t]].emplace_back(st.start[t], st.end[t]);
      if (compute[t]) busy.emplace_back(st.start[t], st.end[t]);
    }
    sort_if_needed(busy);
    for (Intervals& v : by_stream) sort_if_needed(v);
    merged.clear();
    std::merge(by_stream[0].begin(), by_stream[0].end(), by_stream[1].begin(), by_stream[1].end(),
               std::back_inserter(merged));
    active.clear();
    std::merge(merged.begin(), merged.end(), by_stream[2].begin(), by_stream[2].end(), std::back_inserter(active));
    DeviceTime d;
    d.rank = plan.ranks[slot];
    d.devices = plan.slot_devices[slot];
    d.busy_s = union_length(busy);
    const double active_s = union_length(active);
    d.waiting_s = std::max(0.0, active_s - d.busy_s);
    d.idle_s = std::max(0.0, step_s - active_s);
    times.push_back(d);
  }
  return times;
}

}  // namespace

void read_outcome(const SimPlan& plan, SimOutcome& outcome, SimulationOutput& out) {
  const StepProgram& program = *plan.program;
  if (plan.start_s > 0) {  // onto the job's own clock
    for (RankState& st : outcome.state) {
      for (double& t : st.start) t -= plan.start_s;
      for (double& t : st.end) t -= plan.start_s;
      st.last_end -= plan.start_s;
    }
    for (auto& [key, t] : outcome.collective_issue) t -= plan.start_s;
    for (RankState& st : outcome.state) {
      for (double& t : st.send_posted) t -= plan.start_s;
    }
  }
  std::vector<char> detail = plan.detail;  // the critical rank joins it below
  // SimGrid ends a run whose actors all wait on each other; find who was left waiting.
  for (size_t slot = 0; slot < plan.ranks.size() && outcome.errors.size() < 8; ++slot) {
    const RankState& st = outcome.state[slot];
    if (st.finished) continue;
    const Role& role = program.role_of_rank(plan.ranks[slot]);
    std::string stuck;
    for (Stream stream : {Stream::compute, Stream::comm, Stream::p2p}) {
      for (const Op& op : role.ops) {
        if (op.stream != stream || st.done.empty() || st.done[op.id]) continue;
        stuck += std::string(stuck.empty() ? "" : "; ") + to_string(stream) + " at op " +
                 std::to_string(op.id) + " (" + to_string(op.kind) + " " + to_string(op.name) + ")";
        break;
      }
    }
    if (!stuck.empty()) {
      outcome.errors.push_back("rank " + std::to_string(plan.ranks[slot]) + " never finished: " + stuck);
    }
  }
  if (!outcome.errors.empty()) {
    std::string all;
    for (const auto& e : outcome.errors) all += "\n  " + e;
    STEPCAST_CHECK(false, "simulation did not finish:" + all);
  }

  out.simulated_ranks = plan.ranks;
  out.activities = outcome.activities;
  double step_end = 0;
  for (const RankState& st : outcome.state) step_end = std::max(step_end, st.last_end);
  out.step_time_s = step_end;
  // The critical rank: the one that ends the step; among ranks that end together, on unequal
  // devices the slowest (the others waited for it), then a detail rank (the first of its stage),
  // else the lowest. Its records are kept whatever the detail set.
  const std::vector<double>& slowness = plan.slot_time_factor;
  size_t critical_slot = 0;
  for (size_t slot = 0; slot < plan.ranks.size(); ++slot) {
    double end = outcome.state[slot].last_end, best = outcome.state[critical_slot].last_end;
    bool tie = std::abs(end - best) <= 1e-12 * std::max(1.0, best);
    bool slower = !slowness.empty() && slowness[slot] > slowness[critical_slot];
    bool as_slow = slowness.empty() || slowness[slot] == slowness[critical_slot];
    if ((!tie && end > best) || (tie && (slower || (as_slow && detail[slot] && !detail[critical_slot])))) {
      critical_slot = slot;
    }
  }
  out.device_time = device_times(plan, outcome, step_end);
  detail[critical_slot] = 1;
  out.critical_rank = plan.ranks[critical_slot];
  for (size_t slot = 0; slot < plan.ranks.size(); ++slot) {
    if (plan.representative[slot] || slot == critical_slot) out.representative_ranks.push_back(plan.ranks[slot]);
  }
  // The records of `slot`'s ops, appended to `into`: those that take time, and with
  // `memory_ops` the allocs and frees too (timed from their deps, recorded before them), so
  // that `into` from its first record of the slot is indexed by op id.
  auto append_records = [&](size_t slot, std::vector<OpRecord>& into, bool memory_ops) {
    const int64_t rank = plan.ranks[slot];
    const RankState& st = outcome.state[slot];
    const Role& role = program.role_of_rank(rank);
    const SimRole& walk = plan.roles[size_t(role.index)];
    const size_t first = into.size();
    for (const Op& op : role.ops) {
      const int32_t t = walk.timed_index[op.id];
      if (t < 0 && !memory_ops) continue;
      OpRecord rec{rank, op.id, 0, 0, 0};
      if (t >= 0) {
        rec.start_s = rec.end_s = rec.ready_s = st.start[t];
        rec.end_s = st.end[t];
      } else {
        // A memory op happens when its deps (earlier ops, recorded above) finished.
        for (int32_t d : op.deps) rec.end_s = std::max(rec.end_s, into[first + size_t(d)].end_s);
        rec.start_s = rec.ready_s = rec.end_s;
      }
      if (op.kind == OpKind::recv) {
        // Ready when the peer posted the send of this tag to this rank.
        const int64_t peer = plan.peer_of(slot, op.peer);
        auto peer_at = plan.slot_of_rank.find(peer);
        const size_t peer_slot = peer_at == plan.slot_of_rank.end() ? 0 : peer_at->second;
        const Role& peer_role = program.role_of_rank(peer);
        const SimRole& peer_walk = plan.roles[size_t(peer_role.index)];
        auto sends = peer_walk.sends_by_tag.find(op.tag);
        if (peer_at != plan.slot_of_rank.end() && sends != peer_walk.sends_by_tag.end()) {
          for (int32_t send : sends->second) {
            if (plan.peer_of(peer_slot, peer_role.ops[size_t(send)].peer) != rank) continue;
            const double posted = outcome.state[peer_slot].send_posted[size_t(peer_walk.p2p_index[send])];
            if (!std::isnan(posted)) rec.ready_s = posted;
          }
        }
      } else if (is_collective(op.kind)) {
        auto key = st.collective_key.find(op.id);
        if (key != st.collective_key.end()) rec.ready_s = outcome.collective_issue.at(key->second);
      }
      into.push_back(rec);
    }
  };
  // The detail ranks' records of the ops that take time (2/3 of a transformer's ops are allocs
  // and frees), and the breakdown of the critical rank from all of its own.
  if (plan.keep_records) {
    size_t count = 0;
    for (size_t slot = 0; slot < plan.ranks.size(); ++slot) {
      if (detail[slot]) count += size_t(plan.roles[size_t(program.role_of_rank(plan.ranks[slot]).index)].timed_ops);
    }
    out.records.reserve(count);
    for (size_t slot = 0; slot < plan.ranks.size(); ++slot) {
      if (!detail[slot]) continue;
      out.detail_ranks.push_back(plan.ranks[slot]);
      append_records(slot, out.records, false);
    }
  }
  const Role& critical_role = program.role_of_rank(out.critical_rank);
  std::vector<OpRecord> critical;
  critical.reserve(critical_role.ops.size());
  append_records(critical_slot, critical, true);
  out.breakdown = breakdown_of_rank(critical_role, critical, 0, out.step_time_s);
  // The critical rank's compute slowed by collectives beside it (overlap_speeds), out of compute.
  double interference = 0;
  const RankState& critical_state = outcome.state[critical_slot];
  if (!critical_state.interference.empty()) {
    const SimRole& walk = plan.roles[size_t(critical_role.index)];
    for (const Op& op : critical_role.ops) {
      if (!is_compute(op.kind) || in_optimizer_part(op)) continue;
      interference += critical_state.interference[size_t(walk.timed_index[op.id])];
    }
    out.breakdown.overlap_interference_s = interference;
    out.breakdown.compute_s -= interference;
  }
  if (plan.draws) {
    // The critical rank's compute above its nominal cost (on an unequal device, its speed
    // factor's): its own share of the variation.
    const auto& nominal = plan.op_cost_s[critical_role.index];
    const double time_factor = slowness.empty() ? 1.0 : slowness[critical_slot];
    double above = 0;
    for (const Op& op : critical_role.ops) {
      if (!is_compute(op.kind) || in_optimizer_part(op)) continue;
      above += (critical[op.id].end_s - critical[op.id].start_s) - nominal[op.id] * time_factor;
    }
    above -= interference;  // not variation: split out above
    out.breakdown.variability_s = above;
    out.breakdown.compute_s -= above;
  }
  std::ostringstream mode;
  if (plan.full) {
    mode << "full: every rank and ring step simulated";
  } else {
    mode << (plan.mode == SimMode::approx ? "approx:" : "fast:")
         << (plan.fold_tp_approximate ? " fold_tp (shared node: NVLink contention not simulated)"
                                      : plan.fold_tp ? " fold_tp" : "")
         << (plan.fold_rails ? " fold_rail_groups" : "")
         << (plan.fold_dp ? " fold_dp (one data-parallel copy; its peers' flows mirrored)" : "")
         << (plan.phase_flows ? " phase_flows" : "") << (plan.merge_compute ? " merge_compute" : "")
         << (plan.tp_fold_declined ? "; tp not folded (another group shares the node's NVLink; approx folds it)" : "");
  }
  out.mode_description = mode.str();
  out.tp_fold_declined = plan.tp_fold_declined;
  out.approx_ranks = plan.approx_ranks;
  out.approx_folds_dp = plan.approx_folds_dp;
}

}  // namespace stepcast::sim_detail
