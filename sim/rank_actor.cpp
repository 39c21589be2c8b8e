// The SimGrid actors: one per simulated rank, running its role's ops in stream order (compute,
// comm, p2p as activity chains inside the actor, joined by wait_any) on the costs and groups of
// a SimPlan, and recording each op's times in a SimOutcome; see rank_actor.hpp.
#include "rank_actor.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <sstream>

#include "collective.hpp"
#include "errors.hpp"

namespace sg4 = simgrid::s4u;

namespace stepcast::sim_detail {

double SimHosts::latency(sg4::Host* a, sg4::Host* b) {
  auto key = std::make_pair(a, b);
  auto it = route_latency.find(key);
  if (it != route_latency.end()) return it->second;
  std::vector<sg4::Link*> links;
  double lat = 0;
  a->route_to(b, links, &lat);
  route_latency[key] = lat;
  return lat;
}

namespace {

std::string mailbox_name(const std::string& prefix, int64_t from, int64_t to, size_t stream) {
  std::string name = prefix;
  name += std::to_string(from);
  name += '>';
  name += std::to_string(to);
  name += '#';
  name += char('0' + stream);
  return name;
}

int dummy_payload = 0;

class RankActor {
 public:
  RankActor(const SimPlan& plan, SimHosts& hosts, SimOutcome& outcome, size_t slot)
      : plan_(plan), hosts_(hosts), out_(outcome), slot_(slot) {}

  void operator()() {
    const SimPlan& plan = plan_;
    int64_t rank = plan.ranks[slot_];
    const Role& role = plan.program->role_of_rank(rank);
    role_ = &role;
    role_index_ = size_t(role.index);
    walk_ = &plan.roles[role_index_];
    RankState& st = out_.state[slot_];
    st.start.assign(size_t(walk_->timed_ops), 0);
    st.end.assign(size_t(walk_->timed_ops), 0);
    if (!plan.overlap_speeds.empty()) st.interference.assign(size_t(walk_->timed_ops), 0);
    if (plan.start_s > 0) sg4::this_actor::sleep_for(plan.start_s);  // a shared job's later start
    // Memory ops take no time and are not ordered by their stream: done from the start (their
    // times follow from their deps after the run).
    st.done = walk_->initially_done;
    st.send_posted.assign(size_t(walk_->p2p_ops), std::nan(""));
    posted_at_.assign(size_t(walk_->p2p_ops), 0);
    size_t remaining = size_t(walk_->timed_ops);
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
        st.finished = true;
        break;
      }
      if (pending_.empty()) {
        std::ostringstream out;
        out << "rank " << rank << " is stuck with " << remaining << " ops left";
        for (size_t stream = 0; stream < kStreams; ++stream) {
          if (head_[stream] < walk_->queue[stream].size()) {
            const Op& op = role.ops[walk_->queue[stream][head_[stream]]];
            out << "; " << to_string(op.stream) << " waits at op " << op.id << " ("
                << to_string(op.kind) << " " << to_string(op.name) << ")";
          }
        }
        out_.errors.push_back(out.str());
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
        if (plan.in_order && st.done[posted]) {
          // A send whose op ended when it was posted: its transfer ends the step at the latest.
          st.last_end = std::max(st.last_end, now());
          continue;
        }
        finish(posted, posted_at_[size_t(walk_->p2p_index[posted])], now());
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

  const SimPlan& plan() const { return plan_; }
  // The mailbox of transfers from rank `from` to rank `to` on `stream`, looked up by name once.
  sg4::Mailbox* mailbox(int64_t from, int64_t to, size_t stream) {
    const uint64_t key = (uint64_t(from) << 34) ^ (uint64_t(to) << 2) ^ uint64_t(stream);
    auto [it, added] = mailboxes_.try_emplace(key, nullptr);
    if (added) it->second = sg4::Mailbox::by_name(mailbox_name(plan_.mailbox_prefix, from, to, stream));
    return it->second;
  }
  bool deps_done(int32_t id) const {
    const std::vector<bool>& done = out_.state[slot_].done;
    for (uint32_t i = walk_->deps_begin[id]; i < walk_->deps_begin[id + 1]; ++i) {
      if (!done[walk_->deps[i]]) return false;
    }
    return true;
  }
  SimRole::Class op_class(int32_t id) const { return SimRole::Class(walk_->op_class[id]); }
  double now() const { return sg4::Engine::get_clock(); }
  // In order, a send ends when posted unless a later op waits for it (a plan without
  // overlap_p2p_comm): then, like a posted receive, it ends when its transfer does.
  bool waited(const Op& op) const { return plan().feeds_other_stream[role_index_][op.id] != 0; }

  // An execution of `seconds` on this rank's delay host for `stream`. Not Host::exec_async: in
  // SimGrid 3.32 it runs on the calling actor's host whatever host it is called on, so a delay
  // on one stream would share the device host's speed with the compute of another.
  sg4::ExecPtr delay_on(size_t stream, double seconds) {
    sg4::ExecPtr exec = sg4::this_actor::exec_init(seconds);
    exec->set_host(hosts_.delay[slot_][stream]);
    exec->start();
    return exec;
  }

  void add(sg4::ActivityPtr activity, size_t stream, int32_t posted_op = -1) {
    pending_.push_back(std::move(activity));
    pending_stream_.push_back(stream);
    pending_posted_op_.push_back(posted_op);
    ++out_.activities;
  }

  void finish(int32_t id, double start, double end) {
    RankState& st = out_.state[slot_];
    const int32_t t = walk_->timed_index[id];
    st.start[t] = start;
    st.end[t] = end;
    st.done[id] = true;
    st.last_end = std::max(st.last_end, end);
  }

  // Starts what can start on `stream`; returns how many ops completed at once (zero time).
  size_t start_ready(size_t stream) {
    size_t completed = 0;
    Running& run = running_[stream];
    const auto& queue = walk_->queue[stream];
    // Each pass starts the head op; a run of no time or a posted transfer lets the next start.
    while (run.op < 0 && head_[stream] < queue.size()) {
      const int32_t id = queue[head_[stream]];
      if (!deps_done(id)) break;
      const SimRole::Class c = op_class(id);
      run = Running{};
      run.op = id;
      run.run_start = now();
      if (c == SimRole::compute_like) {
        completed += start_compute(stream);
        continue;
      }
      const Op& op = role_->ops[id];
      if (c == SimRole::collective) {
        completed += start_collective(stream, op);
        continue;
      }
      if (plan().in_order && c == SimRole::send) {
        // In order: copy to the staging buffer (when staged), then post; the op ends when
        // posted, the thread moves on and the transfer completes on its own.
        double copy_s = plan().staging_s_of(role_index_, op.id);
        if (copy_s > 0) {
          run.staging = true;
          add(delay_on(stream, copy_s), stream);
          break;
        }
        start_p2p(stream, op, true);
        run.op = -1;
        ++head_[stream];
        if (!waited(op)) {
          finish(op.id, now(), now());
          ++completed;
        }
        continue;
      }
      if (plan().in_order && c == SimRole::recv) {
        // In order: the receive blocks the thread until its data arrived.
        start_p2p(stream, op, false);
        break;
      }
      // A send or receive, posted like MPI's Isend/Irecv: the stream moves on, the op completes
      // when its transfer does (matched in posting order per pair of ranks).
      start_p2p(stream, op, true);
      run.op = -1;
      ++head_[stream];
    }
    return completed;
  }

  // Starts the compute run at the stream's head; returns how many ops completed at once (a run
  // of no time), else 0 and the run's execution is pending.
  size_t start_compute(size_t stream) {
    Running& run = running_[stream];
    const auto& queue = walk_->queue[stream];
    const std::vector<bool>& done = out_.state[slot_].done;
    run.run.push_back(run.op);
    if (plan().merge_compute) {
      // Extend the run while the next op of this stream is compute-like and its inputs are
      // ready now or produced inside the run (queue positions [head, i) of this stream).
      const size_t head = head_[stream];
      for (size_t i = head + 1; i < queue.size(); ++i) {
        const int32_t next = queue[i];
        if (op_class(next) != SimRole::compute_like) break;
        bool ready = true;
        for (uint32_t k = walk_->deps_begin[next]; ready && k < walk_->deps_begin[next + 1]; ++k) {
          const int32_t d = walk_->deps[k];
          ready = done[d] || (walk_->queue_of[d] == stream && walk_->queue_pos[d] >= head &&
                              walk_->queue_pos[d] < i);
        }
        if (!ready) break;
        if (plan().feeds_other_stream[role_index_][run.run.back()]) break;
        run.run.push_back(next);
      }
    }
    double duration = run_durations(run);
    if (duration <= 0) {
      size_t count = run.run.size();
      complete_run(stream);
      return count;
    }
    add(delay_on(stream, duration), stream);
    return 0;
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
    const auto& analytic = plan().analytic[role_index_];
    const auto& ep_cost = plan().ep_cost_s[role_index_];
    for (size_t i = 0; i < run.run.size(); ++i) {
      const int32_t id = run.run[i];
      double d = cost[id];
      if (!ep_cost.empty()) {  // a grouped GEMM: this ep rank's experts' drawn rows
        auto it = ep_cost.find(id);
        if (it != ep_cost.end()) d = it->second[size_t(plan().slot_ep_rank[slot_])];
      }
      // A compute op (a run's other ops: analytic collectives) on an unequal device.
      if (!analytic[id] && !plan().slot_time_factor.empty()) d *= plan().slot_time_factor[slot_];
      if (draws && !analytic[id]) {  // a compute op (a run's other ops: analytic collectives)
        d *= plan().slot_factor[slot_];
        squares += d * d;
        last_compute = int64_t(i);
      } else if (draws && plan().tp_sync[role_index_][id]) {
        close_segment();
      }
      run.durations[i] = d;
      total += d;
    }
    close_segment();
    return total;
  }

  // Finishes every op of the current run, each taking its duration; where a collective beside
  // it slowed the run (overlap_speeds), each op's share of the added time, in proportion.
  void complete_run(size_t stream) {
    Running& run = running_[stream];
    RankState& st = out_.state[slot_];
    double stretch = 1;  // beyond rounding: the run was slowed
    if (!st.interference.empty()) {
      double nominal = 0;
      for (double d : run.durations) nominal += d;
      const double elapsed = now() - run.run_start;
      if (nominal > 0 && elapsed > nominal * (1 + 1e-9)) stretch = elapsed / nominal;
    }
    double t = run.run_start;
    for (size_t i = 0; i < run.run.size(); ++i) {
      double d = i < run.durations.size() ? run.durations[i] : 0;
      if (stretch > 1) st.interference[size_t(walk_->timed_index[run.run[i]])] = d * (stretch - 1);
      d *= stretch;
      finish(run.run[i], t, t + d);
      t += d;
    }
    head_[stream] += run.run.size();
    run.op = -1;
  }

  const Op& op_of(int32_t id) const { return role_->ops[size_t(id)]; }
  // A collective that runs beside the compute stream and slows it (overlap_speeds): one on
  // another stream.
  bool beside_compute(const Op& op) const {
    return !plan().overlap_speeds.empty() && op.stream != Stream::compute;
  }
  // A collective beside compute starts (+1) or ends (-1): the compute stream's delay host runs
  // at the lowest speed the running ones leave (pstate 1: inside a node, 2: across nodes).
  void slow_compute(bool spans_nodes, int change) {
    beside_[spans_nodes ? 1 : 0] += change;
    unsigned long pstate = 0;
    for (unsigned long k = 1; k <= 2; ++k) {
      if (beside_[k - 1] > 0 && plan().overlap_speeds[k] < plan().overlap_speeds[pstate]) pstate = k;
    }
    hosts_.delay[slot_][size_t(Stream::compute)]->set_pstate(pstate);
  }

  // The host of a simulated rank, or of a folded dp copy a mirrored group reaches.
  sg4::Host* host_of(int64_t rank) const {
    auto it = plan_.slot_of_rank.find(rank);
    return it != plan_.slot_of_rank.end() ? hosts_.host[it->second] : hosts_.mirror.at(rank);
  }

  std::shared_ptr<SimGroup> group_of(const Op& op) const {
    return plan().groups[slot_].at(op.group);
  }

  // Starts a collective's first step; returns 1 when it completed at once (no steps, no
  // correction), else 0.
  size_t start_collective(size_t stream, const Op& op) {
    Running& run = running_[stream];
    auto group = group_of(op);
    int64_t rank = plan().ranks[slot_];
    int64_t member = 0;
    while (group->members[member] != rank) ++member;
    // Ready time bookkeeping: the instance is (group kind, first member, stream, sequence).
    int64_t sequence = sequence_[{int(op.group), size_t(op.stream)}]++;
    auto key = std::make_tuple(int(op.group), group->members.front(), int(op.stream), sequence);
    auto [it, inserted] = out_.collective_issue.emplace(key, now());
    if (!inserted) it->second = std::max(it->second, now());
    out_.state[slot_].collective_key[op.id] = key;
    run.steps = collective_steps(op.kind, op.algorithm, op.bytes * plan().flow_scale_of(role_index_, op.id),
                                 group->layout, member, plan().phase_flows, ep_chunks(op));
    if (beside_compute(op)) slow_compute(group->spans_nodes, +1);
    run.step = 0;
    run.run = {op.id};
    if (start_step(stream)) return 0;
    after_steps(stream);
    return run.op < 0 ? 1 : 0;
  }

  // An ep all_to_all under drawn routing: the bytes to an ep rank scale with its experts' load
  // (the dispatch forward and the combine's backward carry tokens to their experts), the bytes
  // from it with its own (the combine, and the dispatch's backward).
  ChunkScale ep_chunks(const Op& op) const {
    const auto& loads = plan().ep_load[role_index_];
    auto it = loads.find(op.id);
    if (it == loads.end()) return {};
    const bool to_experts = (op.name == OpName::ep_dispatch) == (op.phase != Phase::backward);
    return {&it->second, to_experts};
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
    // A mirrored group's folded copies (SimGroup): its own flow to one, and the one's flow to it
    // (never sync_only: no dp fold in order).
    auto copy = [&](int64_t peer) { return group->mirrored && !plan_.slot_of_rank.count(peer); };
    sg4::Host* own = hosts_.host[slot_];
    for (const Transfer& t : step.sends) {
      int64_t peer = group->members[t.peer];
      if (copy(peer)) {
        add(sg4::Comm::sendto_async(own, host_of(peer), uint64_t(std::llround(t.bytes))), stream);
        ++run.outstanding;
        continue;
      }
      auto* box = mailbox(me, peer, box_stream);
      add(box->put_async(&dummy_payload, sync_only ? 0 : uint64_t(std::llround(t.bytes))), stream);
      ++run.outstanding;
    }
    for (const Transfer& t : step.recvs) {
      int64_t peer = group->members[t.peer];
      if (copy(peer)) {
        add(sg4::Comm::sendto_async(host_of(peer), own, uint64_t(std::llround(t.bytes))), stream);
        ++run.outstanding;
        continue;
      }
      auto* box = mailbox(peer, me, box_stream);
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
    if (beside_compute(op_of(run.op))) slow_compute(group_of(op_of(run.op))->spans_nodes, -1);
    finish(run.op, run.run_start, now());
    ++head_[stream];
    run.op = -1;
  }

  // `posted`: the op completes on its own when its transfer does (else it is the stream's
  // running op and blocks it).
  void start_p2p(size_t stream, const Op& op, bool posted) {
    int64_t me = plan().ranks[slot_];
    int64_t peer = plan().peer_of(slot_, op.peer);
    const size_t p2p = size_t(walk_->p2p_index[op.id]);
    posted_at_[p2p] = now();
    if (op.kind == OpKind::send) {
      out_.state[slot_].send_posted[p2p] = now();
      auto* box = mailbox(me, peer, size_t(op.stream));
      add(box->put_async(&dummy_payload, uint64_t(std::llround(op.bytes * plan().flow_scale_of(role_index_, op.id)))),
          stream,
          posted ? op.id : -1);
    } else {
      auto* box = mailbox(peer, me, size_t(op.stream));
      slots_.push_back(nullptr);
      add(box->get_async<int>(&slots_.back()), stream, posted ? op.id : -1);
    }
  }

  // Returns the number of ops completed.
  size_t on_activity_done(size_t stream) {
    Running& run = running_[stream];
    STEPCAST_CHECK(run.op >= 0, "an activity finished on an idle stream");
    const Op& op = role_->ops[run.op];
    const SimRole::Class c = op_class(run.op);
    if (c == SimRole::compute_like) {
      size_t count = run.run.size();
      complete_run(stream);
      return count;
    }
    if (c == SimRole::send) {  // in order: the staging copy ended; post the send
      start_p2p(stream, op, true);
      run.staging = false;
      run.op = -1;
      ++head_[stream];
      if (waited(op)) {
        posted_at_[size_t(walk_->p2p_index[op.id])] = run.run_start;  // the op ends with its transfer
        return 0;
      }
      finish(op.id, run.run_start, now());
      return 1;
    }
    if (c == SimRole::recv) {  // in order: the blocking receive ended
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
        double lat = hosts_.latency(hosts_.host[slot_], host_of(peer));
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

  const SimPlan& plan_;
  SimHosts& hosts_;
  SimOutcome& out_;
  size_t slot_;
  const Role* role_ = nullptr;
  size_t role_index_ = 0;
  const SimRole* walk_ = nullptr;
  std::array<size_t, kStreams> head_{};  // per stream: the next op of walk_->queue
  std::array<Running, kStreams> running_;
  std::vector<sg4::ActivityPtr> pending_;
  std::vector<size_t> pending_stream_;
  std::vector<int32_t> pending_posted_op_;  // pipeline op of each pending activity, or -1
  std::vector<double> posted_at_;  // per p2p index (SimRole): when the op was posted
  std::unordered_map<uint64_t, sg4::Mailbox*> mailboxes_;  // by (from, to, stream): mailbox()
  std::deque<int*> slots_;
  std::map<std::pair<int, size_t>, int64_t> sequence_;
  int64_t segment_ = 0;  // segments drawn so far (the draw index)
  std::array<int, 2> beside_{};  // collectives beside compute running now: inside a node, across
};

}  // namespace

void create_rank_actors(const SimPlan& plan, SimHosts& hosts, SimOutcome& outcome) {
  outcome.state.resize(plan.ranks.size());
  for (size_t slot = 0; slot < plan.ranks.size(); ++slot) {
    sg4::Actor::create(plan.mailbox_prefix + "rank" + std::to_string(plan.ranks[slot]), hosts.host[slot],
                       RankActor(plan, hosts, outcome, slot));
  }
}

}  // namespace stepcast::sim_detail
