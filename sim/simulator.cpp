// The StepProgram interpreter on SimGrid; see simulator.hpp for the modes and their reductions.
#include "simulator.hpp"

#include <simgrid/s4u.hpp>

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>

#include "collective.hpp"
#include "collective_cost.hpp"
#include "collective_steps.hpp"
#include "cost_model.hpp"
#include "errors.hpp"
#include "platform.hpp"
#include "variability.hpp"

namespace sg4 = simgrid::s4u;

namespace stepcast {

namespace {

// A group as the simulation sees it: its simulated members and where they sit.
struct SimGroup {
  std::vector<int64_t> members;  // ranks, in group order
  GroupLayout layout;
};

constexpr size_t kStreams = 3;

struct Plan {
  const StepProgram* program = nullptr;
  std::vector<int64_t> ranks;                       // simulated ranks
  std::unordered_map<int64_t, size_t> slot_of_rank;  // rank → index in ranks
  std::vector<char> detail;                          // per slot: keep records
  // groups[slot][GroupKind] → group shared with the other members
  std::vector<std::map<GroupKind, std::shared_ptr<SimGroup>>> groups;
  // per role, per op: compute time, analytic collective time, or for a simulated collective the
  // latency its folded members would add
  std::vector<std::vector<double>> op_cost_s;
  std::vector<std::vector<char>> analytic;           // per role, per op: collective costed analytically
  // per role, per op: an op of another stream waits for it, so a merged run must end with it
  std::vector<std::vector<char>> feeds_other_stream;
  // per role, per op: a simulated collective whose flows only synchronise its members (no
  // bytes); its measured time, less the flows' latency, follows as op_cost_s
  std::vector<std::vector<char>> sync_only;
  // per role, per op: a staged send's copy before it is posted (in_order with staged sends)
  std::vector<std::vector<double>> staging_s;
  // per role, per op: scale on the bytes a simulated collective's flows carry (the measured
  // correction where it is below 1)
  std::vector<std::vector<double>> flow_scale;
  // per role, per op: a collective of the folded tensor-parallel group (ends a compute segment)
  std::vector<std::vector<char>> tp_sync;
  bool phase_flows = false;
  bool merge_compute = false;
  bool in_order = false;  // the profile's execution.in_order: one queue, one op at a time
  // Variability: null when off. Per slot: the device factor and the rank its draws are keyed by
  // (the tp group's first member where tp is folded, so the group's members draw alike), and
  // the members a segment's deviation is the slowest of.
  const VariabilityDraws* draws = nullptr;
  std::vector<double> slot_factor;
  std::vector<int64_t> slot_draw_rank;
  int64_t segment_members = 1;
};

struct RankState {
  std::vector<double> start, end;
  std::vector<char> done;
  double last_end = 0;
  std::unordered_map<int32_t, std::tuple<int, int64_t, int, int64_t>> collective_key;
  std::unordered_map<int32_t, int64_t> recv_peer;
};

struct Shared {
  Plan plan;
  std::vector<sg4::Host*> host;                         // per slot
  std::vector<std::array<sg4::Host*, kStreams>> delay;  // per slot, per stream
  std::vector<RankState> state;                         // per slot
  std::map<std::tuple<int, int64_t, int, int64_t>, double> collective_issue;  // max start per instance
  std::map<std::tuple<int64_t, int64_t, int64_t>, double> send_start;        // (src, dst, tag)
  std::map<std::pair<sg4::Host*, sg4::Host*>, double> route_latency;
  int64_t activities = 0;
  std::vector<std::string> errors;

  double latency(sg4::Host* a, sg4::Host* b) {
    auto key = std::make_pair(a, b);
    auto it = route_latency.find(key);
    if (it != route_latency.end()) return it->second;
    std::vector<sg4::Link*> links;
    double lat = 0;
    a->route_to(b, links, &lat);
    route_latency[key] = lat;
    return lat;
  }
};

std::string mailbox_name(int64_t from, int64_t to, size_t stream) {
  std::string name = std::to_string(from);
  name += '>';
  name += std::to_string(to);
  name += '#';
  name += char('0' + stream);
  return name;
}

int dummy_payload = 0;

class RankActor {
 public:
  RankActor(Shared& shared, size_t slot) : s_(shared), slot_(slot) {}

  void operator()() {
    const Plan& plan = s_.plan;
    int64_t rank = plan.ranks[slot_];
    const Role& role = plan.program->role_of_rank(rank);
    role_ = &role;
    role_index_ = size_t(role.index);
    RankState& st = s_.state[slot_];
    size_t n = role.ops.size();
    st.start.assign(n, 0);
    st.end.assign(n, 0);
    st.done.assign(n, 0);
    // Memory ops take no time and are not ordered by their stream: an alloc is ready at once,
    // a free once its users finished (their times are filled in after the run).
    size_t remaining = n;
    // In order: every op on one queue in list order (stream 0 stands for the backend's thread).
    for (const Op& op : role.ops) {
      if (op.kind == OpKind::alloc || op.kind == OpKind::free) {
        st.done[op.id] = 1;
        --remaining;
      } else {
        queue_[plan.in_order ? 0 : size_t(op.stream)].push_back(op.id);
      }
    }
    while (true) {
      for (size_t stream = 0; stream < kStreams; ++stream) remaining -= start_ready(stream);
      if (remaining == 0) {
        // In order: sends posted and not yet received are waited for at the step's end.
        while (!pending_.empty()) {
          ssize_t index = sg4::Activity::wait_any(pending_);
          pending_.erase(pending_.begin() + index);
          pending_stream_.erase(pending_stream_.begin() + index);
          pending_posted_op_.erase(pending_posted_op_.begin() + index);
          st.last_end = std::max(st.last_end, now());
        }
        break;
      }
      if (pending_.empty()) {
        std::ostringstream out;
        out << "rank " << rank << " is stuck with " << remaining << " ops left";
        for (size_t stream = 0; stream < kStreams; ++stream) {
          if (head_[stream] < queue_[stream].size()) {
            const Op& op = role.ops[queue_[stream][head_[stream]]];
            out << "; " << to_string(op.stream) << " waits at op " << op.id << " ("
                << to_string(op.kind) << " " << op.name << ")";
          }
        }
        s_.errors.push_back(out.str());
        return;
      }
      ssize_t index = sg4::Activity::wait_any(pending_);
      size_t stream = pending_stream_[size_t(index)];
      int32_t posted = pending_posted_op_[size_t(index)];
      pending_.erase(pending_.begin() + index);
      pending_stream_.erase(pending_stream_.begin() + index);
      pending_posted_op_.erase(pending_posted_op_.begin() + index);
      if (posted >= 0) {
        // A pipeline send or receive: posted in stream order, completing on its own.
        if (plan.in_order) {
          // A send whose op ended when it was posted: its transfer ends the step at the latest.
          st.last_end = std::max(st.last_end, now());
          continue;
        }
        finish(posted, posted_at_[posted], now());
        remaining -= 1;
        continue;
      }
      remaining -= on_activity_done(stream);
    }
  }

 private:
  struct Running {
    int32_t op = -1;
    std::vector<int32_t> run;      // merged compute ops (first = op)
    std::vector<double> durations;  // of each op of `run`, with variability
    std::vector<CollectiveStep> steps;
    size_t step = 0;
    int outstanding = 0;
    bool delaying = false;
    bool folded_delay = false;  // the current step's folded latency is running
    bool staging = false;       // a staged send's copy is running
    double run_start = 0;
  };

  const Plan& plan() const { return s_.plan; }
  bool deps_done(const Op& op) const {
    const RankState& st = s_.state[slot_];
    for (int32_t d : op.deps) {
      if (!st.done[d]) return false;
    }
    return true;
  }
  double now() const { return sg4::Engine::get_clock(); }

  // An execution of `seconds` on this rank's delay host for `stream`. Not Host::exec_async: in
  // SimGrid 3.32 it runs on the calling actor's host whatever host it is called on, so a delay
  // on one stream would share the device host's speed with the compute of another.
  sg4::ExecPtr delay_on(size_t stream, double seconds) {
    sg4::ExecPtr exec = sg4::this_actor::exec_init(seconds);
    exec->set_host(s_.delay[slot_][stream]);
    exec->start();
    return exec;
  }

  void add(sg4::ActivityPtr activity, size_t stream, int32_t posted_op = -1) {
    pending_.push_back(std::move(activity));
    pending_stream_.push_back(stream);
    pending_posted_op_.push_back(posted_op);
    ++s_.activities;
  }

  void finish(int32_t id, double start, double end) {
    RankState& st = s_.state[slot_];
    st.start[id] = start;
    st.end[id] = end;
    st.done[id] = 1;
    st.last_end = std::max(st.last_end, end);
  }

  // Starts what can start on `stream`; returns how many ops completed at once (memory ops).
  size_t start_ready(size_t stream) {
    size_t completed = 0;
    Running& run = running_[stream];
    auto& queue = queue_[stream];
    while (run.op < 0 && head_[stream] < queue.size()) {
      const Op& op = role_->ops[queue[head_[stream]]];
      if (!deps_done(op)) break;
      if (op.kind == OpKind::alloc || op.kind == OpKind::free) {
        finish(op.id, now(), now());
        ++head_[stream];
        ++completed;
        continue;
      }
      run = Running{};
      run.op = op.id;
      run.run_start = now();
      if (is_compute(op.kind) || plan().analytic[role_index_][op.id]) {
        start_compute(stream);
      } else if (is_collective(op.kind)) {
        start_collective(stream, op);
      } else if (plan().in_order && op.kind == OpKind::send) {
        // In order: copy to the staging buffer (when staged), then post; the op ends when
        // posted, the thread moves on and the transfer completes on its own.
        double copy_s = plan().staging_s[role_index_][op.id];
        if (copy_s > 0) {
          run.staging = true;
          add(delay_on(stream, copy_s), stream);
          break;
        }
        start_p2p(stream, op, true);
        finish(op.id, now(), now());
        run.op = -1;
        ++head_[stream];
        ++completed;
        continue;
      } else if (plan().in_order && op.kind == OpKind::recv) {
        // In order: the receive blocks the thread until its data arrived.
        start_p2p(stream, op, false);
        break;
      } else if (op.kind == OpKind::send || op.kind == OpKind::recv) {
        // Posted like MPI's Isend/Irecv: the stream moves on, the op completes when its
        // transfer does (matched in posting order per pair of ranks).
        start_p2p(stream, op, true);
        run.op = -1;
        ++head_[stream];
        continue;
      }
      if (run.op >= 0) break;  // started an activity
      ++completed;             // finished at once (zero time)
      ++head_[stream];
    }
    return completed;
  }

  void start_compute(size_t stream) {
    Running& run = running_[stream];
    auto& queue = queue_[stream];
    run.run.push_back(run.op);
    if (plan().merge_compute) {
      // Extend the run while the next op of this stream is compute-like and its inputs are
      // ready now or produced inside the run.
      std::set<int32_t> in_run = {run.op};
      for (size_t i = head_[stream] + 1; i < queue.size(); ++i) {
        const Op& next = role_->ops[queue[i]];
        bool compute_like = is_compute(next.kind) || plan().analytic[role_index_][next.id] ||
                            next.kind == OpKind::alloc || next.kind == OpKind::free;
        if (!compute_like) break;
        bool ready = true;
        for (int32_t d : next.deps) {
          ready = ready && (s_.state[slot_].done[d] || in_run.count(d));
        }
        if (!ready) break;
        if (plan().feeds_other_stream[role_index_][run.run.back()]) break;
        run.run.push_back(next.id);
        in_run.insert(next.id);
      }
    }
    double duration = run_durations(run);
    if (duration <= 0) {
      complete_run(stream);
      return;
    }
    add(delay_on(stream, duration), stream);
  }

  // The duration of each op of a run: its cost, and with variability its device factor, and
  // each segment's deviation added to the segment's last compute op. A segment ends at a folded
  // tensor-parallel collective and at the end of the run.
  double run_durations(Running& run) {
    const auto& cost = plan().op_cost_s[role_index_];
    run.durations.assign(run.run.size(), 0);
    const VariabilityDraws* draws = plan().draws;
    double total = 0, squares = 0;
    int64_t last_compute = -1;
    auto close_segment = [&] {
      if (!draws || last_compute < 0 || squares <= 0) return;
      double deviation = draws->segment_deviation_s(plan().slot_draw_rank[slot_], segment_++,
                                                    squares, plan().segment_members);
      double& d = run.durations[size_t(last_compute)];
      deviation = std::max(deviation, -d);  // an op never takes less than no time
      d += deviation;
      total += deviation;
      squares = 0;
      last_compute = -1;
    };
    for (size_t i = 0; i < run.run.size(); ++i) {
      const Op& op = role_->ops[run.run[i]];
      if (op.kind == OpKind::alloc || op.kind == OpKind::free) continue;
      double d = cost[op.id];
      if (draws && is_compute(op.kind)) {
        d *= plan().slot_factor[slot_];
        squares += d * d;
        last_compute = int64_t(i);
      } else if (draws && plan().tp_sync[role_index_][op.id]) {
        close_segment();
      }
      run.durations[i] = d;
      total += d;
    }
    close_segment();
    return total;
  }

  // Finishes every op of the current run, each taking its duration.
  void complete_run(size_t stream) {
    Running& run = running_[stream];
    double t = run.run_start;
    for (size_t i = 0; i < run.run.size(); ++i) {
      double d = i < run.durations.size() ? run.durations[i] : 0;
      finish(run.run[i], t, t + d);
      t += d;
    }
    head_[stream] += run.run.size();
    run.op = -1;
  }

  std::shared_ptr<SimGroup> group_of(const Op& op) const {
    return plan().groups[slot_].at(op.group);
  }

  void start_collective(size_t stream, const Op& op) {
    Running& run = running_[stream];
    auto group = group_of(op);
    int64_t rank = plan().ranks[slot_];
    int64_t member = 0;
    while (group->members[member] != rank) ++member;
    // Ready time bookkeeping: the instance is (group kind, first member, stream, sequence).
    int64_t sequence = sequence_[{int(op.group), size_t(op.stream)}]++;
    auto key = std::make_tuple(int(op.group), group->members.front(), int(op.stream), sequence);
    auto [it, inserted] = s_.collective_issue.emplace(key, now());
    if (!inserted) it->second = std::max(it->second, now());
    s_.state[slot_].collective_key[op.id] = key;
    run.steps = collective_steps(op.kind, op.algorithm, op.bytes * plan().flow_scale[role_index_][op.id],
                                 group->layout, member, plan().phase_flows);
    run.step = 0;
    run.run = {op.id};
    if (!start_step(stream)) after_steps(stream);
  }

  // Starts the current step's flows; false when no steps are left.
  bool start_step(size_t stream) {
    Running& run = running_[stream];
    if (run.step >= run.steps.size()) return false;
    const CollectiveStep& step = run.steps[run.step];
    const Op& op = role_->ops[run.op];
    auto group = group_of(op);
    int64_t me = plan().ranks[slot_];
    const bool sync_only = plan().sync_only[role_index_][op.id];
    // Mailboxes by the op's own stream: in order, one queue carries every stream's ops, and a
    // posted pipeline send must not match a collective's receive.
    const size_t box_stream = size_t(op.stream);
    for (const Transfer& t : step.sends) {
      int64_t peer = group->members[t.peer];
      auto* box = sg4::Mailbox::by_name(mailbox_name(me, peer, box_stream));
      add(box->put_async(&dummy_payload, sync_only ? 0 : uint64_t(std::llround(t.bytes))), stream);
      ++run.outstanding;
    }
    for (const Transfer& t : step.recvs) {
      int64_t peer = group->members[t.peer];
      auto* box = sg4::Mailbox::by_name(mailbox_name(peer, me, box_stream));
      slots_.push_back(nullptr);
      add(box->get_async<int>(&slots_.back()), stream);
      ++run.outstanding;
    }
    return true;
  }

  // All steps done: the folded members' latency correction, then the op ends.
  void after_steps(size_t stream) {
    Running& run = running_[stream];
    double correction = plan().op_cost_s[role_index_][run.op];
    if (correction > 0 && !run.delaying) {
      run.delaying = true;
      add(delay_on(stream, correction), stream);
      return;
    }
    finish(run.op, run.run_start, now());
    ++head_[stream];
    run.op = -1;
  }

  // `posted`: the op completes on its own when its transfer does (else it is the stream's
  // running op and blocks it).
  void start_p2p(size_t stream, const Op& op, bool posted) {
    int64_t me = plan().ranks[slot_];
    const StepProgram& p = *plan().program;
    int64_t stage = p.grid().coord(me).pp;
    int64_t peer_stage = op.peer == Peer::pp_next ? (stage + 1) % p.pp_size
                                                  : (stage + p.pp_size - 1) % p.pp_size;
    RankCoord c = p.grid().coord(me);
    c.pp = peer_stage;
    int64_t peer = p.grid().rank(c);
    posted_at_[op.id] = now();
    if (op.kind == OpKind::send) {
      s_.send_start[{me, peer, op.tag}] = now();
      auto* box = sg4::Mailbox::by_name(mailbox_name(me, peer, size_t(op.stream)));
      add(box->put_async(&dummy_payload, uint64_t(std::llround(op.bytes))), stream,
          posted ? op.id : -1);
    } else {
      auto* box = sg4::Mailbox::by_name(mailbox_name(peer, me, size_t(op.stream)));
      slots_.push_back(nullptr);
      add(box->get_async<int>(&slots_.back()), stream, posted ? op.id : -1);
      s_.state[slot_].recv_peer[op.id] = peer;
    }
  }

  // Returns the number of ops completed.
  size_t on_activity_done(size_t stream) {
    Running& run = running_[stream];
    STEPCAST_CHECK(run.op >= 0, "an activity finished on an idle stream");
    const Op& op = role_->ops[run.op];
    if (is_compute(op.kind) || plan().analytic[role_index_][op.id]) {
      size_t count = run.run.size();
      complete_run(stream);
      return count;
    }
    if (op.kind == OpKind::send) {  // in order: the staging copy ended; post the send
      start_p2p(stream, op, true);
      finish(op.id, run.run_start, now());
      run.staging = false;
      run.op = -1;
      ++head_[stream];
      return 1;
    }
    if (op.kind == OpKind::recv) {  // in order: the blocking receive ended
      finish(op.id, run.run_start, now());
      run.op = -1;
      ++head_[stream];
      return 1;
    }
    if (run.delaying) {
      after_steps(stream);
      return 1;
    }
    if (--run.outstanding > 0) return 0;
    {
      const CollectiveStep& step = run.steps[run.step];
      if (step.folded_latency_steps > 0 && !run.folded_delay) {
        // Latency of the folded ring steps, per the route to the first send's peer.
        auto group = group_of(op);
        int64_t peer = group->members[step.sends.front().peer];
        double lat = s_.latency(s_.host[slot_], s_.host[s_.plan.slot_of_rank.at(peer)]);
        run.folded_delay = true;
        run.outstanding = 1;
        add(delay_on(stream, double(step.folded_latency_steps) * lat), stream);
        return 0;
      }
      run.folded_delay = false;
      ++run.step;
      if (start_step(stream)) return 0;
      after_steps(stream);
      return run.op < 0 ? 1 : 0;
    }
  }

  Shared& s_;
  size_t slot_;
  const Role* role_ = nullptr;
  size_t role_index_ = 0;
  std::array<std::vector<int32_t>, kStreams> queue_;
  std::array<size_t, kStreams> head_{};
  std::array<Running, kStreams> running_;
  std::vector<sg4::ActivityPtr> pending_;
  std::vector<size_t> pending_stream_;
  std::vector<int32_t> pending_posted_op_;  // pipeline op of each pending activity, or -1
  std::unordered_map<int32_t, double> posted_at_;
  std::deque<int*> slots_;
  std::map<std::pair<int, size_t>, int64_t> sequence_;
  int64_t segment_ = 0;  // segments drawn so far (the draw index)
};

}  // namespace

namespace {

// Longer than any training step: a cost beyond it comes from an implausible figure.
constexpr double kMaxOpTimeS = 1e7;

bool group_spans_folded_ranks(GroupKind kind) {
  return kind == GroupKind::model || kind == GroupKind::world;
}

}  // namespace

SimulationOutput simulate_program(const StepProgram& program, const Topology& topology_in,
                                  const DeviceProfile& profile, const SimulateOptions& options) {
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
  GroupShape tp_shape = group_shape(grid, GroupKind::tp, 0, per_node);
  bool tp_in_node = tp_shape.nodes == 1 && per_node % program.tp_size == 0;
  // Costing tp collectives analytically is exact only when nothing else uses the node's NVLink
  // at the same time: every other group (dp, pp, embedding) must have one member per node, so its
  // traffic leaves through the NICs.
  bool nvlink_to_itself = true;
  for (GroupKind other : {GroupKind::dp, GroupKind::pp, GroupKind::embedding}) {
    GroupShape shape = group_shape(grid, other, 0, per_node);
    if (shape.size > 1 && shape.members_per_node > 1) nvlink_to_itself = false;
  }
  const bool shared_node_fold = options.mode == SimMode::approx || options.fold_tp_shared_node;
  const bool fold_tp = !full && options.fold_tp && program.tp_size > 1 && tp_in_node &&
                       (nvlink_to_itself || shared_node_fold);
  const bool fold_tp_approximate = fold_tp && !nvlink_to_itself;
  // Folding the rail-aligned groups keeps one rank per tp group. Ranks sharing a NIC would lose
  // that sharing, so fold only where every device has its own NIC.
  const bool own_nic = topology.fabric.nics_per_node >= per_node;
  const bool fold_rails = fold_tp && options.fold_rail_groups && own_nic;
  double divisor = 1;
  if (fold_rails && topology.fabric.kind == FabricKind::fat_tree) divisor = double(program.tp_size);

  auto shared = std::make_unique<Shared>();
  Plan& plan = shared->plan;
  plan.program = &program;
  plan.phase_flows = !full && options.phase_flows;
  plan.merge_compute = !full && options.merge_compute;
  plan.in_order = profile.execution_in_order;
  for (int64_t r = 0; r < program.world_size(); ++r) {
    if (fold_rails && grid.coord(r).tp != 0) continue;
    plan.slot_of_rank[r] = plan.ranks.size();
    plan.ranks.push_back(r);
  }
  std::set<int64_t> detail(options.detail_ranks.begin(), options.detail_ranks.end());
  if (detail.empty()) {
    for (int64_t p = 0; p < program.pp_size; ++p) detail.insert(grid.rank(RankCoord{0, 0, p}));
    if (full && program.world_size() <= 64) {
      for (int64_t r = 0; r < program.world_size(); ++r) detail.insert(r);
    }
  }
  plan.detail.assign(plan.ranks.size(), 0);
  for (int64_t r : detail) {
    auto it = plan.slot_of_rank.find(r);
    if (it == plan.slot_of_rank.end()) {
      throw InputError("detail rank " + std::to_string(r) + " is not simulated in this mode " +
                       "(fast mode folds tensor-parallel ranks: use tp index 0)");
    }
    plan.detail[it->second] = 1;
  }

  // Groups, shared by their members.
  std::map<std::pair<int, int64_t>, std::shared_ptr<SimGroup>> groups;
  plan.groups.resize(plan.ranks.size());
  for (size_t slot = 0; slot < plan.ranks.size(); ++slot) {
    int64_t rank = plan.ranks[slot];
    std::set<GroupKind> kinds;
    for (const Op& op : program.role_of_rank(rank).ops) {
      if (is_collective(op.kind)) kinds.insert(op.group);
    }
    for (GroupKind kind : kinds) {
      std::vector<int64_t> members;
      for (int64_t m : grid.group(kind, rank)) {
        if (plan.slot_of_rank.count(m)) members.push_back(m);
      }
      auto key = std::make_pair(int(kind), members.front());
      auto& g = groups[key];
      if (!g) {
        g = std::make_shared<SimGroup>();
        g->members = members;
        for (int64_t m : members) g->layout.node_of.push_back(m / per_node);
      }
      plan.groups[slot][kind] = g;
    }
  }

  // Costs per role.
  Dtype dtype = *parse_dtype(program.plan.at("param_dtype").get<std::string>());
  ComputeCostModel cost(topology.node.device, dtype, profile, topology.file,
                        program.model.is_object()
                            ? program.model.value("norm_type", std::string("rmsnorm"))
                            : std::string("rmsnorm"));
  LinkFigures links = link_figures(topology);
  // Measured collective tables correct the α-β model where the streams run concurrently (GPU
  // profiles); an in-order profile's measured collectives take their measured time (below).
  const CollectiveCostModel collective_cost(plan.in_order ? DeviceProfile{} : profile, topology_in);
  SimulationOutput out;
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
  // In order, a rank has one collective in flight at a time, as when the profile measured it:
  // a group inside one node takes the measured time of its kind, algorithm and size.
  auto measured_in_order_time_s = [&](const Op& op, int64_t first) -> std::optional<double> {
    if (!plan.in_order) return std::nullopt;
    GroupShape shape = group_shape(grid, op.group, first, per_node);
    if (shape.nodes != 1) return std::nullopt;
    return cost.measured_collective_time_s(op.kind, op.algorithm, shape.size, op.bytes);
  };
  for (const Role& role : program.roles) {
    auto& costs = plan.op_cost_s[role.index];
    auto& analytic = plan.analytic[role.index];
    auto& sync_only = plan.sync_only[role.index];
    auto& staging = plan.staging_s[role.index];
    costs.assign(role.ops.size(), 0);
    analytic.assign(role.ops.size(), 0);
    sync_only.assign(role.ops.size(), 0);
    staging.assign(role.ops.size(), 0);
    plan.flow_scale[role.index].assign(role.ops.size(), 1.0);
    plan.tp_sync[role.index].assign(role.ops.size(), 0);
    int64_t first = grid.rank(RankCoord{0, 0, role.pp_stage});
    for (const Op& op : role.ops) {
      std::optional<double> measured;
      if (is_collective(op.kind)) measured = measured_in_order_time_s(op, first);
      if (is_compute(op.kind)) {
        costs[op.id] = cost.op_time_s(op);
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
      } else if (is_collective(op.kind) && fold_rails && group_spans_folded_ranks(op.group)) {
        GroupShape whole = group_shape(grid, op.group, first, per_node);
        std::vector<int64_t> kept;
        for (int64_t m : grid.group(op.group, first)) {
          if (grid.coord(m).tp == 0) kept.push_back(m);
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
      if (is_collective(op.kind) && !analytic[op.id] && !sync_only[op.id] && collective_cost.has_tables()) {
        GroupShape whole = group_shape(grid, op.group, first, per_node);
        double r = collective_cost.correction(op.kind, op.algorithm, op.bytes, whole);
        note_correction(r);
        if (r < 1) {
          plan.flow_scale[role.index][op.id] = r;
        } else {
          costs[op.id] += (r - 1) * collective_time_s(op.kind, op.algorithm, op.bytes, whole, links);
        }
      }
      // A figure that makes one op last longer than a training run ever does (a peak of 1e-300
      // flop/s) would stall SimGrid's clock: refused here, naming what it came from.
      if (!(costs[op.id] >= 0 && costs[op.id] < kMaxOpTimeS)) {
        std::ostringstream why;
        why << "op " << op.id << " (" << to_string(op.kind) << " " << op.name << ") of rank "
            << first << " would take " << costs[op.id] << " s";
        throw_input_error(topology.file, "node", "", why.str(),
                          "peaks, bandwidths and latencies (and the profile " + profile.file +
                              ") that give every op less than " + std::to_string(int64_t(kMaxOpTimeS)) +
                              " s");
      }
    }
  }

  // Variability: draws keyed by the tp group's first rank where tp is folded (its members are
  // one), which is also the slowest of their device factors.
  VariabilityDraws draws(profile.variability, options.seed);
  if (options.variability && draws.enabled()) {
    out.variability = true;
    plan.draws = &draws;
    plan.segment_members = fold_tp ? program.tp_size : 1;
    for (int64_t rank : plan.ranks) {
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

  // The engine and the platform: one host per simulated rank (rank r on device r), and one
  // delay host per rank and stream for executions and analytic delays.
  int argc = 2;
  std::string arg0 = "stepcast", arg1 = "--log=root.thresh:critical";
  char* argv[] = {arg0.data(), arg1.data(), nullptr};
  sg4::Engine engine(&argc, argv);
  configure_engine(engine);
  PlatformOptions platform_options;
  platform_options.devices = plan.ranks;
  platform_options.shared_link_divisor = divisor;
  platform_options.delay_hosts = int64_t(plan.ranks.size() * kStreams);
  Platform platform = build_platform(engine, topology, platform_options);
  shared->host = platform.hosts;
  shared->delay.resize(plan.ranks.size());
  for (size_t slot = 0; slot < plan.ranks.size(); ++slot) {
    for (size_t stream = 0; stream < kStreams; ++stream) {
      shared->delay[slot][stream] = platform.delay_hosts[slot * kStreams + stream];
    }
  }
  shared->state.resize(plan.ranks.size());
  for (size_t slot = 0; slot < plan.ranks.size(); ++slot) {
    sg4::Actor::create("rank" + std::to_string(plan.ranks[slot]), shared->host[slot],
                       RankActor(*shared, slot));
  }
  engine.run();
  // SimGrid ends a run whose actors all wait on each other; find who was left waiting.
  for (size_t slot = 0; slot < plan.ranks.size() && shared->errors.size() < 8; ++slot) {
    const RankState& st = shared->state[slot];
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
      shared->errors.push_back("rank " + std::to_string(plan.ranks[slot]) + " never finished: " + stuck);
    }
  }
  if (!shared->errors.empty()) {
    std::string all;
    for (const auto& e : shared->errors) all += "\n  " + e;
    STEPCAST_CHECK(false, "simulation did not finish:" + all);
  }

  // Memory ops happen when their deps finished.
  for (size_t slot = 0; slot < plan.ranks.size(); ++slot) {
    RankState& st = shared->state[slot];
    const Role& role = program.role_of_rank(plan.ranks[slot]);
    for (const Op& op : role.ops) {
      if (op.kind != OpKind::alloc && op.kind != OpKind::free) continue;
      double t = 0;
      for (int32_t d : op.deps) t = std::max(t, st.end[d]);
      st.start[op.id] = st.end[op.id] = t;
    }
  }

  out.simulated_ranks = plan.ranks;
  out.activities = shared->activities;
  double step_end = 0;
  for (const RankState& st : shared->state) step_end = std::max(step_end, st.last_end);
  out.step_time_s = step_end;
  // The critical rank: the one that ends the step; among ranks that end together, a detail
  // rank (the first of its stage), else the lowest. Its records are kept whatever the detail set.
  size_t critical_slot = 0;
  for (size_t slot = 0; slot < plan.ranks.size(); ++slot) {
    double end = shared->state[slot].last_end, best = shared->state[critical_slot].last_end;
    bool tie = std::abs(end - best) <= 1e-12 * std::max(1.0, best);
    if ((!tie && end > best) || (tie && plan.detail[slot] && !plan.detail[critical_slot])) {
      critical_slot = slot;
    }
  }
  plan.detail[critical_slot] = 1;
  out.critical_rank = plan.ranks[critical_slot];
  for (size_t slot = 0; slot < plan.ranks.size(); ++slot) {
    if (!plan.detail[slot]) continue;
    int64_t rank = plan.ranks[slot];
    out.detail_ranks.push_back(rank);
    const RankState& st = shared->state[slot];
    const Role& role = program.role_of_rank(rank);
    for (const Op& op : role.ops) {
      OpRecord rec{rank, op.id, st.start[op.id], st.end[op.id], st.start[op.id]};
      if (op.kind == OpKind::recv) {
        auto peer = st.recv_peer.find(op.id);
        if (peer != st.recv_peer.end()) {
          auto sent = shared->send_start.find({peer->second, rank, op.tag});
          if (sent != shared->send_start.end()) rec.ready_s = sent->second;
        }
      } else if (is_collective(op.kind)) {
        auto key = st.collective_key.find(op.id);
        if (key != st.collective_key.end()) rec.ready_s = shared->collective_issue.at(key->second);
      }
      out.records.push_back(rec);
    }
  }
  // Breakdown of the critical rank.
  const Role& critical_role = program.role_of_rank(out.critical_rank);
  std::vector<OpRecord> critical(critical_role.ops.size());
  for (const OpRecord& r : out.records) {
    if (r.rank == out.critical_rank) critical[r.id] = r;
  }
  out.breakdown = breakdown_of_rank(critical_role, critical, 0, out.step_time_s);
  if (plan.draws) {
    // The critical rank's compute above its nominal cost: its own share of the variation.
    const auto& nominal = plan.op_cost_s[critical_role.index];
    double above = 0;
    for (const Op& op : critical_role.ops) {
      if (!is_compute(op.kind) || op.kind == OpKind::optimizer_step) continue;
      above += (critical[op.id].end_s - critical[op.id].start_s) - nominal[op.id];
    }
    out.breakdown.variability_s = above;
    out.breakdown.compute_s -= above;
  }
  std::ostringstream mode;
  if (full) {
    mode << "full: every rank and ring step simulated";
  } else {
    mode << (options.mode == SimMode::approx ? "approx:" : "fast:")
         << (fold_tp_approximate ? " fold_tp (shared node: NVLink contention not simulated)"
                                 : fold_tp ? " fold_tp" : "")
         << (fold_rails ? " fold_rail_groups" : "")
         << (plan.phase_flows ? " phase_flows" : "") << (plan.merge_compute ? " merge_compute" : "");
  }
  out.mode_description = mode.str();
  return out;
}

}  // namespace stepcast
