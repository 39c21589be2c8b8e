// What a simulation decides before SimGrid starts (SimPlan: the ranks simulated, their groups,
// every op's cost, the folds of fast mode, the variability draws) and what its actors leave
// behind (SimOutcome: each op's start and end, ready-time bookkeeping), turned into the
// SimulationOutput after the run. No SimGrid here: simulator.cpp owns the engine, rank_actor.cpp
// the actors. Times in seconds of simulated time.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "collective_steps.hpp"
#include "cost_model.hpp"
#include "profile.hpp"
#include "program.hpp"
#include "simulator.hpp"
#include "topology.hpp"
#include "variability.hpp"

namespace stepcast::sim_detail {

// A group as the simulation sees it: its simulated members and where they sit.
struct SimGroup {
  std::vector<int64_t> members;  // ranks, in group order
  GroupLayout layout;
  bool spans_nodes = false;
  // approx's data-parallel fold: `members` is the whole group, of which the copies of dp index 0
  // are simulated (one, or its cp ranks). A simulated member's step sends its flows to simulated
  // peers as usual and, with a copy, its own flow and the copy's flow to it (the copies run the
  // same ops at the same times).
  bool mirrored = false;
};

constexpr size_t kStreams = 3;

// A role's ops as the actors walk them, packed apart from the Op structs (a few hundred bytes of
// names and operands each, which a walk over 10^5 ops per rank would otherwise read through):
// the queue of each stream, each op's class, and its dependencies on ops that take time.
// Memory ops are left out: they are done before the step starts (their times are read back
// from their deps after the run).
struct SimRole {
  enum Class : uint8_t { memory, compute_like, collective, send, recv };
  std::array<std::vector<int32_t>, kStreams> queue;  // op ids per stream, in list order
  std::vector<uint8_t> op_class;                     // per op: Class
  std::vector<uint8_t> queue_of;                     // per op: its queue (in order: 0)
  std::vector<uint32_t> queue_pos;                   // per op: its index in that queue
  std::vector<uint32_t> deps_begin;                  // per op, and one past: its range in deps
  std::vector<int32_t> deps;                         // deps that are not memory ops
  std::vector<bool> initially_done;                  // per op: true for memory ops
  std::vector<int32_t> timed_index;                  // per op: its slot in RankState's times, or -1
  int64_t timed_ops = 0;                             // ops that are not memory ops
  std::vector<int32_t> p2p_index;                    // per op: its index among the sends and receives, or -1
  int32_t p2p_ops = 0;
  // Per tag: the role's sends with that tag (a receive's ready time is its matching send's post).
  std::unordered_map<int64_t, std::vector<int32_t>> sends_by_tag;
};

struct SimPlan {
  const StepProgram* program = nullptr;
  Topology topology;                                 // after the profile's link fractions
  std::vector<int64_t> ranks;                        // simulated ranks
  std::unordered_map<int64_t, size_t> slot_of_rank;  // rank → index in ranks
  std::vector<char> detail;                          // per slot: keep records
  std::vector<char> representative;                  // per slot: SimulateOptions' default detail
  bool keep_records = true;                          // SimulateOptions::keep_records
  // Per slot: the ranks of its pp_prev, pp_next, cp_prev and cp_next peers (peer_index).
  std::vector<std::array<int64_t, 4>> peers;
  int64_t peer_of(size_t slot, Peer peer) const {
    return peers[slot][peer == Peer::pp_prev ? 0 : peer == Peer::pp_next ? 1 : peer == Peer::cp_prev ? 2 : 3];
  }
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
  // per role, per op: a staged send's copy before it is posted (in_order with staged sends; empty
  // for a role without one: 0 s)
  std::vector<std::vector<double>> staging_s;
  double staging_s_of(size_t role, int32_t id) const {
    return staging_s[role].empty() ? 0.0 : staging_s[role][size_t(id)];
  }
  // per role, per op: scale on the bytes a simulated collective's flows carry (the measured
  // correction where it is below 1), and a send's flow (its measured point-to-point table:
  // CollectiveCostModel::p2p_flow_scale); empty for a role without one: 1
  std::vector<std::vector<double>> flow_scale;
  double flow_scale_of(size_t role, int32_t id) const {
    return flow_scale[role].empty() ? 1.0 : flow_scale[role][size_t(id)];
  }
  // per role, per op: a collective of the folded tensor-parallel group (ends a compute segment)
  std::vector<std::vector<char>> tp_sync;
  std::vector<SimRole> roles;                         // per role: the actors' walk
  // Mixture of experts (moe_imbalance.cpp): the routing of each (microbatch, layer) drawn from the
  // program's shares. Per role, per op: a grouped GEMM's cost on each ep rank (its experts' drawn
  // rows), or the factor on an ep all_to_all's bytes to or from each ep rank (its drawn load over
  // the mean); absent for other ops. Per slot: its ep rank.
  std::vector<std::unordered_map<int32_t, std::vector<double>>> ep_cost_s;
  std::vector<std::unordered_map<int32_t, std::vector<double>>> ep_load;
  std::vector<int64_t> slot_ep_rank;
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
  // Unequal devices (topology heterogeneity): per slot, the factor on its compute ops' time,
  // 1 / its speed factor (a folded tp group's stand-in: its slowest member's); empty on a
  // uniform topology. Per slot: the devices it stands for.
  std::vector<double> slot_time_factor;
  std::vector<int64_t> slot_devices;
  // Compute beside a collective (the profile's overlap): the speeds of the compute stream's delay
  // host, {alone, beside a collective inside a node, beside one across nodes}, its pstates 0, 1
  // and 2; empty where not modelled (no figure, or in order: no collective runs beside compute).
  std::vector<double> overlap_speeds;
  // The reductions chosen (simulator.hpp), for the platform and the mode description.
  SimMode mode = SimMode::fast;
  bool full = false;
  bool fold_tp = false;
  bool fold_tp_approximate = false;  // folded although another group shares the node's NVLink
  // Fast mode kept every tp rank because another group shares the node's NVLink: --mode approx
  // would fold them (what the planner re-simulates with).
  bool tp_fold_declined = false;
  int64_t approx_ranks = 0;  // fast mode: the ranks --mode approx would simulate (0: no fewer)
  bool approx_folds_dp = false;  // and whether it folds the dp copies
  bool fold_rails = false;
  double shared_link_divisor = 1;
  // approx: only data-parallel index 0 is simulated; the devices of the other copies that
  // mirrored groups' flows reach (hosts without actors).
  bool fold_dp = false;
  std::vector<int64_t> mirror_ranks;
  // Names this job's mailboxes apart from other jobs' on one platform (simulate_jobs); empty alone.
  std::string mailbox_prefix;
  // When this job's step starts (simulate_jobs): its ranks wait that long, and read_outcome takes
  // it off every time, so the outputs are on the job's own clock.
  double start_s = 0;
};

// One simulated rank's op times, as its actor records them: start and end of the ops that take
// time, by SimRole::timed_index (memory ops' times follow from their deps after the run).
struct RankState {
  std::vector<double> start, end;
  std::vector<bool> done;  // per op
  std::vector<double> send_posted;  // per p2p index (SimRole): when a send was posted; NaN for the rest
  bool finished = false;   // every op done
  double last_end = 0;
  // With overlap_speeds: per timed op, the time a collective beside it added (by timed_index).
  std::vector<double> interference;
  std::unordered_map<int32_t, std::tuple<int, int64_t, int, int64_t>> collective_key;
};

// What the actors leave behind.
struct SimOutcome {
  std::vector<RankState> state;  // per slot
  std::map<std::tuple<int, int64_t, int, int64_t>, double> collective_issue;  // max start per instance
  int64_t activities = 0;
  std::vector<std::string> errors;
};

// The reductions a simulation makes (simulator.hpp): which folds apply to `program` on
// `topology` under `options`, and the capacity divisor of the shared links they imply.
struct Folds {
  bool fold_tp = false;
  bool fold_tp_approximate = false;  // folded although another group shares the node's NVLink
  bool tp_fold_declined = false;     // fast mode kept every tp rank for that reason
  bool own_nic = false;              // every device has a NIC of its own
  bool fold_rails = false;
  bool dp_foldable = false;          // the dp copies are alike (approx folds them)
  bool fold_dp = false;
  double shared_link_divisor = 1;
};
Folds choose_folds(const StepProgram& program, const Topology& topology, const DeviceProfile& profile,
                   const SimulateOptions& options);
// The ranks a simulation under `folds` simulates: tensor-parallel index 0 where the rails fold,
// data-parallel index 0 where the copies fold (plan_simulation's ranks).
int64_t simulated_rank_count(const StepProgram& program, const Folds& folds);

// Checks the request (profile against topology, full mode's limits, detail ranks), chooses the
// reductions, and costs every op; InputError for a request or a figure it cannot simulate.
// `draws` must outlive the plan; `out` gets the variability flag and the measured corrections.
// The routing draws and the per-ep-rank costs they give (moe_imbalance.cpp).
void plan_moe_imbalance(SimPlan& plan, const StepProgram& program, const ComputeCostModel& cost,
                        SimulationOutput& out);

SimPlan plan_simulation(const StepProgram& program, const Topology& topology_in,
                        const DeviceProfile& profile, const SimulateOptions& options,
                        const VariabilityDraws& draws, SimulationOutput& out);

// After the run, before read_outcome: frees what only the actors read (the per-op costs' flags,
// the walks' queues, classes and dependencies): a deep pipeline's are hundreds of
// megabytes, and read_outcome's records are as many again.
void release_walks(SimPlan& plan);

// After the run: names ranks that never finished (an invariant failure), times memory ops,
// finds the critical rank, and fills `out`'s step time, records, breakdown and mode.
void read_outcome(const SimPlan& plan, SimOutcome& outcome, SimulationOutput& out);

}  // namespace stepcast::sim_detail
