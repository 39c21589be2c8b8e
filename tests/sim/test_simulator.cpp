// The simulator against closed forms. Each TEST_CASE runs one SimGrid engine; ctest runs each
// case in its own process (SimGrid keeps one engine per process).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <optional>

#include "collective.hpp"
#include "collective_steps.hpp"
#include "pipeline_exchange.hpp"
#include "profile.hpp"
#include "sim_fixtures.hpp"
#include "simulator.hpp"

using namespace stepcast;
using namespace stepcast::test;

namespace {

SimulationOutput run(const StepProgram& p, const Topology& t, SimMode mode) {
  SimulateOptions o;
  o.mode = mode;
  return simulate_program(p, t, roofline_profile(t), o);
}

// One ring all_reduce of `bytes` over the tp group of a single node.
StepProgram one_all_reduce(int n, double bytes, Algorithm algorithm = Algorithm::ring) {
  StepProgram p = empty_program(n, 1, 1, n);
  push_op(p.roles[0], collective_op(OpKind::all_reduce, GroupKind::tp, algorithm, bytes, Stream::compute));
  return p;
}

// One role per pipeline stage running schedule_actions(kind, {p, v, m}, stage): each
// (microbatch, chunk) pass is one compute op of slot / v seconds. Virtual stage vs = chunk·p +
// stage; the forward of vs > 0 first receives from pp_prev, the backward of vs < S − 1 from
// pp_next (S = p·v), and each pass then sends on (wrapping from the last stage to the first
// between chunks). Tags are distinct per (microbatch, sending virtual stage, direction).
// Activation buffers are not modelled: only the order and the p2p pairing.
StepProgram pipeline_program(ScheduleKind kind, int64_t p, int64_t v, int64_t m, double slot) {
  const int64_t S = p * v;
  StepProgram program = empty_program(1, 1, p, p, m);
  auto tag = [S](int64_t microbatch, int64_t sender, bool forward) {
    return (microbatch * S + sender) * 2 + (forward ? 0 : 1);
  };
  for (int64_t stage = 0; stage < p; ++stage) {
    Role& role = program.roles[stage];
    role.chunks_virtual_stages.clear();
    for (int64_t chunk = 0; chunk < v; ++chunk) role.chunks_virtual_stages.push_back(chunk * p + stage);
    for (const PassAction& a : schedule_actions(kind, ScheduleShape{p, v, m}, stage)) {
      int64_t vs = a.chunk * p + stage;
      std::vector<int32_t> deps;
      bool receives = a.forward ? vs > 0 : vs < S - 1;
      if (receives) {
        Op recv;
        recv.kind = OpKind::recv;
        recv.stream = Stream::p2p;
        recv.peer = a.forward ? Peer::pp_prev : Peer::pp_next;
        recv.tag = tag(a.microbatch, a.forward ? vs - 1 : vs + 1, a.forward);
        deps.push_back(push_op(role, recv));
      }
      int32_t work = push_op(role, compute_op(slot / double(v), deps));
      bool sends = a.forward ? vs < S - 1 : vs > 0;
      if (sends) {
        Op send;
        send.kind = OpKind::send;
        send.stream = Stream::p2p;
        send.peer = a.forward ? Peer::pp_next : Peer::pp_prev;
        send.tag = tag(a.microbatch, vs, a.forward);
        send.deps = {work};
        push_op(role, send);
      }
    }
  }
  return program;
}

// The same passes in Megatron's blocking rounds (interleaved_exchanges): a round's compute ops,
// then its sends and receives, which the next round's first compute op waits for.
StepProgram exchange_program(int64_t p, int64_t v, int64_t m, double slot) {
  const int64_t S = p * v;
  StepProgram program = empty_program(1, 1, p, p, m);
  auto tag = [S](const PassAction& a, int64_t sender) { return (a.microbatch * S + sender) * 2 + (a.forward ? 0 : 1); };
  for (int64_t stage = 0; stage < p; ++stage) {
    Role& role = program.roles[stage];
    role.chunks_virtual_stages.clear();
    for (int64_t chunk = 0; chunk < v; ++chunk) role.chunks_virtual_stages.push_back(chunk * p + stage);
    std::vector<int32_t> batch, work;
    auto transfer = [&](OpKind kind, Peer peer, const std::optional<PassAction>& a, int64_t sender_offset) {
      if (!a) return;
      Op op;
      op.kind = kind;
      op.stream = Stream::p2p;
      op.peer = peer;
      op.tag = tag(*a, a->chunk * p + stage + sender_offset);
      op.deps = work;
      batch.push_back(push_op(role, op));
    };
    for (const PassExchange& x : interleaved_exchanges(ScheduleShape{p, v, m}, stage)) {
      work.clear();
      for (size_t i = 0; i < x.passes.size(); ++i) {
        work = {push_op(role, compute_op(slot / double(v), batch))};
        batch.clear();
      }
      transfer(OpKind::send, Peer::pp_prev, x.send_prev, 0);
      transfer(OpKind::send, Peer::pp_next, x.send_next, 0);
      transfer(OpKind::recv, Peer::pp_prev, x.recv_prev, -1);
      transfer(OpKind::recv, Peer::pp_next, x.recv_next, +1);
    }
  }
  return program;
}

// p devices on one NVSwitch with (practically) infinite bandwidth and no latency: p2p is free.
Topology free_p2p_topology(int64_t p) {
  return parse_test_topology(star_topology_json(1, int(p), 1e15, 0, 1, 1e15, 0));
}

}  // namespace

TEST_CASE("sim: ring all_reduce on a star takes 2(n-1)/n·S/B + 2(n-1)·α (full mode)", "[sim]") {
  const int n = 8;
  const double S = 256e6, B = 100e9, alpha = 2e-6;
  Topology t = parse_test_topology(star_topology_json(1, n, B, alpha, n, 25e9, 1e-6));
  SimulationOutput out = run(one_all_reduce(n, S), t, SimMode::full);
  double expected = 2.0 * (n - 1) / n * S / B + 2.0 * (n - 1) * alpha;
  CHECK(out.step_time_s == Approx(expected).epsilon(0.01));
  CHECK(out.step_time_s == Approx(expected).epsilon(1e-6));  // exact under CM02
}

TEST_CASE("sim: the folded tensor-parallel all_reduce equals the flows (fast mode)", "[sim]") {
  const int n = 8;
  const double S = 256e6, B = 100e9, alpha = 2e-6;
  Topology t = parse_test_topology(star_topology_json(1, n, B, alpha, n, 25e9, 1e-6));
  SimulationOutput out = run(one_all_reduce(n, S), t, SimMode::fast);
  double expected = 2.0 * (n - 1) / n * S / B + 2.0 * (n - 1) * alpha;
  CHECK(out.step_time_s == Approx(expected).epsilon(1e-9));
  CHECK(out.simulated_ranks.size() == 1);
}

TEST_CASE("sim: phase flows give the step-by-step ring time without contention", "[sim]") {
  // dp ring across 4 nodes (one member per node) on the comm stream.
  StepProgram p = empty_program(1, 4, 1, 1);
  push_op(p.roles[0], collective_op(OpKind::all_reduce, GroupKind::dp, Algorithm::ring, 64e6, Stream::comm));
  Topology t = parse_test_topology(star_topology_json(4, 1, 100e9, 2e-6, 1, 25e9, 3e-6));
  SimulateOptions fast;
  fast.mode = SimMode::fast;
  SimulationOutput out = simulate_program(p, t, roofline_profile(t), fast);
  double alpha = 2 * 3e-6;  // NIC at both ends, no switch latency
  double expected = 2.0 * 3 / 4 * 64e6 / 25e9 + 2.0 * 3 * alpha;
  CHECK(out.step_time_s == Approx(expected).epsilon(1e-6));
}

TEST_CASE("sim: two all_reduces sharing one NIC take twice as long as one", "[sim]") {
  // tp 2 × dp 2 on 2 nodes of 2 devices: dp groups {0,2} and {1,3}. With one NIC per node both
  // dp rings cross the same NICs; with two, each has its own. Latencies 0: bandwidth only.
  StepProgram p = empty_program(2, 2, 1, 2);
  push_op(p.roles[0], collective_op(OpKind::all_reduce, GroupKind::dp, Algorithm::ring, 100e6, Stream::comm));
  Topology shared = parse_test_topology(star_topology_json(2, 2, 100e9, 0, 1, 10e9, 0));
  Topology own = parse_test_topology(star_topology_json(2, 2, 100e9, 0, 2, 10e9, 0));
  SimulateOptions full;
  full.mode = SimMode::full;
  double t_shared = simulate_program(p, shared, roofline_profile(shared), full).step_time_s;
  // A second engine in one process continues the first's clock (SIMGRID-NOTES): compare with the
  // closed form instead of a second simulation.
  double one = 100e6 / 10e9;  // 2(n−1)/n·S/B with n = 2
  CHECK(t_shared == Approx(2 * one).epsilon(1e-6));
  (void)own;
}

TEST_CASE("sim: hybrid sharding reduce_scatters inside the node, then all-reduces the shard across nodes",
          "[sim]") {
  // dp 4 on 2 nodes of 2, shard groups {0,1} and {2,3} (one per node), replica groups {0,2} and
  // {1,3} (across nodes, one NIC each). Latencies 0: the reduce_scatter of S in a group of 2 takes
  // S/2 / B_node, the all_reduce of the S/2 shard across 2 replicas 2·(1/2)·(S/2) / B_nic.
  const double S = 100e6, b_node = 100e9, b_nic = 10e9;
  StepProgram p = empty_program(1, 4, 1, 2);
  p.dp_shard_size = 2;
  push_op(p.roles[0], collective_op(OpKind::reduce_scatter, GroupKind::dp_shard, Algorithm::ring, S, Stream::comm));
  push_op(p.roles[0], collective_op(OpKind::all_reduce, GroupKind::dp_replica, Algorithm::ring, S / 2, Stream::comm));
  Topology t = parse_test_topology(star_topology_json(2, 2, b_node, 0, 2, b_nic, 0));
  SimulationOutput out = run(p, t, SimMode::full);
  CHECK(out.step_time_s == Approx(S / 2 / b_node + S / 2 / b_nic).epsilon(1e-6));
}

namespace {

// The context-parallel ring of one layer's forward (lower_cp.cpp's shape): cp ranks on one node;
// at step j a rank sends the K/V block it holds to cp_next and receives the next from cp_prev
// while it computes on the block it holds (c seconds); the next block's send waits for its
// receive. A transfer of S bytes takes S/B (no latency).
double ring_step_time(int64_t cp, double c, double S, double B, SimMode mode) {
  StepProgram p = empty_program(1, 1, 1, cp);
  p.cp_size = cp;
  Role& role = p.roles[0];
  int32_t held = -1;  // the receive that brought the block held at step j
  int32_t previous = -1;
  for (int64_t j = 0; j < cp; ++j) {
    int32_t received = -1;
    if (j + 1 < cp) {
      Op send;
      send.kind = OpKind::send;
      send.stream = Stream::p2p;
      send.peer = Peer::cp_next;
      send.tag = j;
      send.bytes = S;
      if (held >= 0) send.deps = {held};
      push_op(role, send);
      Op recv = send;
      recv.kind = OpKind::recv;
      recv.peer = Peer::cp_prev;
      recv.deps.clear();
      received = push_op(role, recv);
    }
    std::vector<int32_t> deps;
    if (held >= 0) deps.push_back(held);
    if (previous >= 0) deps.push_back(previous);
    previous = push_op(role, compute_op(c, deps));
    held = received;
  }
  Topology t = parse_test_topology(star_topology_json(1, int(cp), B, 0, 1, B, 0));
  return run(p, t, mode).step_time_s;
}

}  // namespace

// cp 4, c = 1 ms: transfers of 0.5 ms hide behind compute (4c); transfers of 2 ms set the pace
// ((cp − 1)·S/B + c). One SimGrid engine per test case.
TEST_CASE("sim: the context-parallel ring hides transfers shorter than a block's attention (full)", "[sim]") {
  CHECK(ring_step_time(4, 1e-3, 0.5e-3 * 100e9, 100e9, SimMode::full) == Approx(4e-3).epsilon(1e-6));
}

TEST_CASE("sim: the context-parallel ring hides transfers shorter than a block's attention (fast)", "[sim]") {
  CHECK(ring_step_time(4, 1e-3, 0.5e-3 * 100e9, 100e9, SimMode::fast) == Approx(4e-3).epsilon(1e-6));
}

TEST_CASE("sim: transfers longer than a block's attention pace the context-parallel ring (full)", "[sim]") {
  CHECK(ring_step_time(4, 1e-3, 2e-3 * 100e9, 100e9, SimMode::full) == Approx(3 * 2e-3 + 1e-3).epsilon(1e-6));
}

TEST_CASE("sim: transfers longer than a block's attention pace the context-parallel ring (fast)", "[sim]") {
  CHECK(ring_step_time(4, 1e-3, 2e-3 * 100e9, 100e9, SimMode::fast) == Approx(3 * 2e-3 + 1e-3).epsilon(1e-6));
}

TEST_CASE("sim: 1F1B with uniform costs and free communication takes 2(m+p-1) slots", "[sim]") {
  const int64_t p = 4, m = 8;
  const double slot = 1e-3;
  StepProgram program = empty_program(1, 1, p, p, m);
  ScheduleShape shape{p, 1, m};
  for (int64_t stage = 0; stage < p; ++stage) {
    Role& role = program.roles[stage];
    // Activation and gradient buffers are not modelled here: only the order and the p2p pairing.
    for (const PassAction& a : schedule_actions(ScheduleKind::one_f_one_b, shape, stage)) {
      int64_t tag = a.microbatch * 2 + (a.forward ? 0 : 1);
      std::vector<int32_t> deps;
      bool receives = a.forward ? stage > 0 : stage < p - 1;
      if (receives) {
        Op recv;
        recv.kind = OpKind::recv;
        recv.stream = Stream::p2p;
        recv.peer = a.forward ? Peer::pp_prev : Peer::pp_next;
        recv.tag = tag;
        deps.push_back(push_op(role, recv));
      }
      int32_t work = push_op(role, compute_op(slot, deps));
      bool sends = a.forward ? stage < p - 1 : stage > 0;
      if (sends) {
        Op send;
        send.kind = OpKind::send;
        send.stream = Stream::p2p;
        send.peer = a.forward ? Peer::pp_next : Peer::pp_prev;
        send.tag = tag;
        send.deps = {work};
        push_op(role, send);
      }
    }
  }
  Topology t = parse_test_topology(star_topology_json(1, int(p), 1e15, 0, 1, 1e15, 0));
  SimulationOutput out = run(program, t, SimMode::full);
  CHECK(out.step_time_s == Approx(2.0 * double(m + p - 1) * slot).epsilon(1e-9));
  double bubble_fraction = out.breakdown.bubble_s / out.step_time_s;
  CHECK(bubble_fraction == Approx(double(p - 1) / double(m + p - 1)).epsilon(1e-9));
  CHECK(out.breakdown.total() == Approx(out.step_time_s).epsilon(1e-12));
}

TEST_CASE("sim: GPipe with uniform costs takes 2(m+p-1) slots, bubble (p-1)/(m+p-1)", "[sim]") {
  const int64_t p = 4, m = 6;
  const double slot = 1e-3;
  SimulationOutput out =
      run(pipeline_program(ScheduleKind::gpipe, p, 1, m, slot), free_p2p_topology(p), SimMode::full);
  CHECK(out.step_time_s == Approx(2.0 * double(m + p - 1) * slot).epsilon(1e-9));
  CHECK(out.breakdown.bubble_s / out.step_time_s ==
        Approx(double(p - 1) / double(m + p - 1)).epsilon(1e-9));
  CHECK(out.breakdown.compute_s == Approx(2.0 * double(m) * slot).epsilon(1e-9));
  CHECK(out.breakdown.total() == Approx(out.step_time_s).epsilon(1e-12));
}

TEST_CASE("sim: interleaved 1F1B takes 2(m+(p-1)/v) slots, bubble (p-1)/(v·m+p-1)", "[sim]") {
  // pp 4, vpp 2, m 8: each chunk pass costs 1/v slot, so a stage's work is 2m slots as in 1F1B
  // and only the bubble shrinks, by v.
  const int64_t p = 4, v = 2, m = 8;
  const double slot = 1e-3;
  ScheduleShape shape{p, v, m};
  SimulationOutput out = run(pipeline_program(ScheduleKind::interleaved_1f1b, p, v, m, slot),
                             free_p2p_topology(p), SimMode::full);
  CHECK(out.step_time_s == Approx(2.0 * (double(m) + double(p - 1) / double(v)) * slot).epsilon(1e-9));
  double bubble_fraction = out.breakdown.bubble_s / out.step_time_s;
  CHECK(bubble_fraction == Approx(double(p - 1) / double(v * m + p - 1)).epsilon(1e-9));
  CHECK(bubble_fraction ==
        Approx(ideal_bubble_fraction(ScheduleKind::interleaved_1f1b, shape)).epsilon(1e-9));
  CHECK(out.breakdown.compute_s == Approx(2.0 * double(m) * slot).epsilon(1e-9));
  CHECK(out.breakdown.total() == Approx(out.step_time_s).epsilon(1e-12));
}

TEST_CASE("sim: the blocking interleaved rounds keep the ideal bubble (p-1)/(v·m+p-1) when p2p is free", "[sim]") {
  // Megatron's warm-up depth 2·(p-stage-1) + (v-1)·p lets every stage find its neighbours' batch
  // posted when its own is: waiting for each round's transfers costs nothing when they are free.
  const int64_t p = 4, v = 2, m = 8;
  const double slot = 1e-3;
  SimulationOutput out = run(exchange_program(p, v, m, slot), free_p2p_topology(p), SimMode::full);
  CHECK(out.step_time_s == Approx(2.0 * (double(m) + double(p - 1) / double(v)) * slot).epsilon(1e-9));
  CHECK(out.breakdown.bubble_s / out.step_time_s == Approx(double(p - 1) / double(v * m + p - 1)).epsilon(1e-9));
  CHECK(out.breakdown.compute_s == Approx(2.0 * double(m) * slot).epsilon(1e-9));
}

TEST_CASE("sim: a collective's latency delay does not slow compute on another stream (fast)", "[sim]") {
  // A dp ring over 4 nodes on the comm stream (phase flows: one flow per neighbour pair, then
  // its folded latency as a delay) while the compute stream runs 10 ms of work. Each stream's
  // executions run on its own delay host, so neither slows the other and the step is the longer.
  StepProgram p = empty_program(1, 4, 1, 1);
  push_op(p.roles[0], collective_op(OpKind::all_reduce, GroupKind::dp, Algorithm::ring, 64e6, Stream::comm));
  push_op(p.roles[0], compute_op(10e-3));
  Topology t = parse_test_topology(star_topology_json(4, 1, 100e9, 2e-6, 1, 25e9, 3e-6));
  SimulationOutput out = run(p, t, SimMode::fast);
  double ring = 2.0 * 3 / 4 * 64e6 / 25e9 + 2.0 * 3 * (2 * 3e-6);  // 3.876 ms
  REQUIRE(ring < 10e-3);
  // Sharing one host, the 30 us of folded latency would stretch both by 15 us.
  CHECK(out.step_time_s == Approx(10e-3).epsilon(1e-9));
  REQUIRE(out.records.size() == 2);
  CHECK(out.records[0].end_s - out.records[0].start_s == Approx(ring).epsilon(1e-9));
  CHECK(out.records[1].end_s - out.records[1].start_s == Approx(10e-3).epsilon(1e-9));
}

TEST_CASE("collective steps move the ring's bytes and the tree's rounds", "[sim_steps]") {
  GroupLayout layout{{0, 0, 0, 0, 1, 1, 1, 1}};
  auto ring = collective_steps(OpKind::all_reduce, Algorithm::ring, 800, layout, 3, false);
  CHECK(ring.size() == 14);
  CHECK(ring[0].sends[0].peer == 4);
  CHECK(ring[0].recvs[0].peer == 2);
  CHECK(ring[0].sends[0].bytes == 100);
  auto phase = collective_steps(OpKind::all_reduce, Algorithm::ring, 800, layout, 3, true);
  REQUIRE(phase.size() == 1);
  CHECK(phase[0].sends[0].bytes == 1400);
  CHECK(phase[0].folded_latency_steps == 13);
  // Tree: the root receives in every up round and sends in every down round.
  auto root = collective_steps(OpKind::all_reduce, Algorithm::tree, 8, layout, 0, false);
  CHECK(root.size() == 6);
  auto leaf = collective_steps(OpKind::all_reduce, Algorithm::tree, 8, layout, 7, false);
  CHECK(leaf.size() == 2);
  // Hierarchical: local reduce_scatter (3 steps), cross all_reduce over 2 nodes (2 steps),
  // local all_gather (3 steps).
  auto hier = collective_steps(OpKind::all_reduce, Algorithm::hierarchical, 800, layout, 5, false);
  CHECK(hier.size() == 8);
  CHECK(hier[3].sends[0].peer == 1);  // cross ring partner: local index 1 on node 0
  // Pairwise (all_to_all): one step, 1/n of the buffer to and from every other member.
  auto pairwise = collective_steps(OpKind::all_to_all, Algorithm::pairwise, 800, layout, 3, true);
  REQUIRE(pairwise.size() == 1);
  REQUIRE(pairwise[0].sends.size() == 7);
  REQUIRE(pairwise[0].recvs.size() == 7);
  CHECK(pairwise[0].sends[0].peer == 4);
  CHECK(pairwise[0].recvs[0].peer == 2);
  for (const Transfer& t : pairwise[0].sends) CHECK(t.bytes == 100);
  CHECK(pairwise[0].folded_latency_steps == 0);
}

namespace {

// The roofline profile with the CPU backend's execution: one thread, ops in list order.
// Stage 0's send to stage 1 (kind send) or stage 1's receive from stage 0 (recv), tag 1.
Op pipeline_op(OpKind kind, double bytes) {
  Op op;
  op.kind = kind;
  op.stream = Stream::p2p;
  op.peer = kind == OpKind::send ? Peer::pp_next : Peer::pp_prev;
  op.tag = 1;
  op.bytes = bytes;
  return op;
}

DeviceProfile in_order_profile(const Topology& t, bool staged_sends = false) {
  DeviceProfile p = roofline_profile(t);
  p.execution_in_order = true;
  p.execution_staged_sends = staged_sends;
  return p;
}

// Rank 0's records (full mode keeps every rank's).
std::vector<OpRecord> rank0(const SimulationOutput& out) {
  std::vector<OpRecord> mine;
  for (const OpRecord& r : out.records) {
    if (r.rank == 0) mine.push_back(r);
  }
  return mine;
}

SimulationOutput run_with(const StepProgram& p, const Topology& t, const DeviceProfile& profile,
                          SimMode mode = SimMode::fast) {
  SimulateOptions o;
  o.mode = mode;
  return simulate_program(p, t, profile, o);
}

}  // namespace

// The overlap test's program (a dp ring on the comm stream, 10 ms of compute): the streams overlap
// (10 ms, the test above) unless the profile says the backend runs its ops in list order on one
// thread; then the step is the ring, then the compute.
namespace {

void check_in_order_does_not_overlap(SimMode mode) {
  StepProgram p = empty_program(1, 4, 1, 1);
  push_op(p.roles[0], collective_op(OpKind::all_reduce, GroupKind::dp, Algorithm::ring, 64e6, Stream::comm));
  push_op(p.roles[0], compute_op(10e-3));
  Topology t = parse_test_topology(star_topology_json(4, 1, 100e9, 2e-6, 1, 25e9, 3e-6));
  double ring = 2.0 * 3 / 4 * 64e6 / 25e9 + 2.0 * 3 * (2 * 3e-6);
  SimulationOutput out = run_with(p, t, in_order_profile(t), mode);
  CHECK(out.step_time_s == Approx(ring + 10e-3).epsilon(1e-9));
  std::vector<OpRecord> records = rank0(out);
  REQUIRE(records.size() == 2);
  CHECK(records[1].start_s == Approx(ring).epsilon(1e-9));
}

}  // namespace

TEST_CASE("sim: in order communication does not overlap compute (fast)", "[sim]") {
  check_in_order_does_not_overlap(SimMode::fast);
}

TEST_CASE("sim: in order communication does not overlap compute (full)", "[sim]") {
  check_in_order_does_not_overlap(SimMode::full);
}

namespace {

// 2 devices on one node; the profile measured ring all_reduce over 2 ranks at 1 kB and 1 MB.
// The program: 1 ms of compute, an all_reduce of 100 kB, 1 ms of compute.
struct MeasuredCollectiveCase {
  Topology topology = parse_test_topology(star_topology_json(1, 2, 100e9, 2e-6, 1, 25e9, 3e-6));
  DeviceProfile profile;
  StepProgram program = empty_program(1, 2, 1, 2);
  // The log-log interpolation between the two points (not the link's α-β time).
  double measured_s = 10e-6 * std::pow(100.0, std::log(100.0) / std::log(1000.0));
  MeasuredCollectiveCase() {
    profile = in_order_profile(topology);
    MeasuredTables tables;
    tables.dtype = Dtype::fp32;
    tables.collectives.push_back({"all_reduce", "ring", 2, 1e3, 10e-6, 0, 0, "", 1});
    tables.collectives.push_back({"all_reduce", "ring", 2, 1e6, 1e-3, 0, 0, "", 1});
    profile.measured = tables;
    push_op(program.roles[0], compute_op(1e-3));
    push_op(program.roles[0], collective_op(OpKind::all_reduce, GroupKind::dp, Algorithm::ring, 1e5, Stream::comm));
    push_op(program.roles[0], compute_op(1e-3));
  }
};

void check_measured_collective(SimMode mode) {
  MeasuredCollectiveCase c;
  SimulationOutput out = run_with(c.program, c.topology, c.profile, mode);
  std::vector<OpRecord> records = rank0(out);
  REQUIRE(records.size() == 3);
  CHECK(records[1].end_s - records[1].start_s == Approx(c.measured_s).epsilon(1e-9));
  CHECK(out.step_time_s == Approx(2e-3 + c.measured_s).epsilon(1e-9));
}

}  // namespace

TEST_CASE("sim: in order a collective inside a node takes the measured time (fast)", "[sim]") {
  check_measured_collective(SimMode::fast);
}

TEST_CASE("sim: in order a collective inside a node takes the measured time (full)", "[sim]") {
  check_measured_collective(SimMode::full);
}

TEST_CASE("sim: without in-order execution a measured collective takes the link's flows", "[sim]") {
  MeasuredCollectiveCase c;
  c.profile.execution_in_order = false;
  SimulationOutput out = run_with(c.program, c.topology, c.profile, SimMode::full);
  double alpha_beta = 2 * (2e-6 + 0.5e5 / 100e9);
  std::vector<OpRecord> records = rank0(out);
  REQUIRE(records.size() == 3);
  CHECK(records[1].end_s - records[1].start_s == Approx(alpha_beta).epsilon(1e-6));
}

TEST_CASE("sim: in order a staged send costs its copy and the receive waits for it", "[sim]") {
  // Stage 0 sends 8 MB, then computes 1 ms; stage 1 receives it, then computes 1 ms, on a link
  // with no latency and practically infinite bandwidth. The copy (read and write at the device's
  // 1e12 B/s: 16 us) comes first on stage 0 and delays stage 1's receive: 1 ms without it.
  Topology t = free_p2p_topology(2);
  StepProgram p = empty_program(1, 1, 2, 2);
  Op send = pipeline_op(OpKind::send, 8e6);
  push_op(p.roles[0], send);
  push_op(p.roles[0], compute_op(1e-3));
  Op recv = pipeline_op(OpKind::recv, 8e6);
  int32_t got = push_op(p.roles[1], recv);
  push_op(p.roles[1], compute_op(1e-3, {got}));
  const double copy = 2 * 8e6 / 1e12;
  const double transfer = 8e6 / 1e15;
  SimulationOutput staged = run_with(p, t, in_order_profile(t, true), SimMode::full);
  CHECK(staged.step_time_s == Approx(copy + transfer + 1e-3).epsilon(1e-9));
  int checked = 0;
  for (const OpRecord& r : staged.records) {
    if (r.rank == 0 && r.id == 0) {
      CHECK(r.end_s - r.start_s == Approx(copy).epsilon(1e-9));
      ++checked;
    }
    if (r.rank == 1 && r.id == 1) {
      CHECK(r.start_s == Approx(copy + transfer).epsilon(1e-9));
      ++checked;
    }
  }
  CHECK(checked == 2);
}

namespace {

// Stage 0 sends 8 MB and then computes 1 ms; stage 1 computes 2 ms before it posts the receive,
// then computes 1 ms. When stage 0's compute waits for its send (a plan without
// overlap_p2p_comm), it starts when the transfer ends, after stage 1 posted the receive at 2 ms;
// otherwise at once. Either way the receive completes at 2 ms + the transfer.
void check_blocking_send(bool in_order, bool blocking) {
  Topology t = free_p2p_topology(2);
  StepProgram p = empty_program(1, 1, 2, 2);
  Op send = pipeline_op(OpKind::send, 8e6);
  int32_t sent = push_op(p.roles[0], send);
  push_op(p.roles[0], compute_op(1e-3, blocking ? std::vector<int32_t>{sent} : std::vector<int32_t>{}));
  int32_t first = push_op(p.roles[1], compute_op(2e-3));
  Op recv = pipeline_op(OpKind::recv, 8e6);
  recv.deps = {first};
  int32_t got = push_op(p.roles[1], recv);
  push_op(p.roles[1], compute_op(1e-3, {got}));
  DeviceProfile profile = in_order_profile(t);
  profile.execution_in_order = in_order;
  SimulationOutput out = run_with(p, t, profile, SimMode::full);
  const double transfer = 8e6 / 1e15;
  int checked = 0;
  for (const OpRecord& r : out.records) {
    if (r.rank == 0 && r.id == 1) {
      CHECK(r.start_s == Approx(blocking ? 2e-3 + transfer : 0.0).margin(1e-9));
      ++checked;
    }
    if (r.rank == 0 && r.id == 0 && blocking) {  // the waited send ends with its transfer
      CHECK(r.end_s == Approx(2e-3 + transfer).margin(1e-9));
      ++checked;
    }
    if (r.rank == 1 && r.id == 2) {
      CHECK(r.start_s == Approx(2e-3 + transfer).margin(1e-9));
      ++checked;
    }
  }
  CHECK(checked == (blocking ? 3 : 2));
  CHECK(out.step_time_s == Approx(3e-3 + transfer).margin(1e-9));  // stage 1's, either way
}

}  // namespace

TEST_CASE("sim: a compute op that waits for a send starts when the transfer ends (in order)", "[sim]") {
  check_blocking_send(true, true);
}

TEST_CASE("sim: a compute op that does not wait for a send starts at once (in order)", "[sim]") {
  check_blocking_send(true, false);
}

TEST_CASE("sim: a compute op that waits for a send starts when the transfer ends (streams)", "[sim]") {
  check_blocking_send(false, true);
}

TEST_CASE("sim: a compute op that does not wait for a send starts at once (streams)", "[sim]") {
  check_blocking_send(false, false);
}
