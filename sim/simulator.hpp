// The simulator: interprets a StepProgram on a SimGrid platform built from the topology and
// returns when every op of every simulated rank ran, with its start, end and ready times.
// Each simulated rank is one actor running its role's ops in stream order (compute, comm, p2p as
// activity chains inside the actor, joined by wait_any); compute ops are executions costed by the
// ComputeCostModel; collectives and pipeline transfers are flows between the ranks' hosts.
//
// Modes. full: every rank an actor, every ring/tree step a flow, nothing folded (the reference,
// up to 256 devices and 8 microbatches). fast: the reductions below, each behind its own switch:
//  - fold_tp: a tensor-parallel group inside one node is costed analytically on the compute
//    stream (only where no other group has two members on one node, so that no other traffic
//    shares its NVLink); with fold_rail_groups only its first rank (tp index 0) is simulated and
//    every group is restricted to these representatives;
//  - fold_rail_groups: the tp identical groups (dp, pp, embedding) of the folded ranks are
//    simulated once, with the capacity of links they would share divided by the fold count;
//  - phase_flows: a ring phase is one flow per neighbour pair plus its latency term;
//  - merge_compute: back-to-back compute ops whose inputs are ready run as one execution, its time
//    split back over the ops in proportion to their cost.
// Groups that span the folded ranks (model, world) keep their full size through an analytic
// correction of their latency; the exact reductions above are exact under CM02 without cross traffic.
// approx: fast, and fold_tp also where another group has members on the same node
// (fold_tp_shared_node). Their traffic then no longer shares a device's NVLink port with its tp
// collectives: approximate, and on the fast side (README: how far, measured). It lets the
// planner re-simulate tp 4 on 8-device nodes in seconds instead of minutes. approx also folds
// the data-parallel copies (fold_data_parallel: dp > 1, no experts, uniform devices, the streams
// concurrent, a NIC per device): only dp index 0 of each stage is simulated (its tp and cp ranks),
// and each step of a collective over the copies (dp, dp_shard, dp_replica, dp_cp) exchanges with
// simulated peers as usual and, with a copy, is its own flow plus the copy's flow to it, from the
// copy's device's host (the copies run the same ops at the same times). What it
// leaves out: the copies' other traffic on their own NICs and on shared links (their pipeline
// transfers, the collectives of other stages on a leaf's uplinks), and run-to-run variation
// between copies apart from their slowest device factor.
// automatic (simulate's default, --mode auto): fast mode, or approx where fast mode would simulate
// at least kAutoApproxRanks ranks and approx would simulate fewer (its data-parallel or shared-node
// tensor-parallel fold applies): there fast mode takes tens of seconds to minutes, approx seconds,
// within 1% of it where tested. The output says which mode ran and why.
//
// Costs. Compute ops: cost_model.hpp. Collectives: flows on the platform carrying the α-β model's
// bytes; where the profile has measured collective tables (collective_cost.hpp) the measured
// correction r at the op's size applies: r > 1 adds (r − 1) · the modelled time after the flows
// (protocol and launch time that occupies no link), r < 1 scales the flows' bytes by r (NVLink
// SHARP, trees); analytic collectives cost r · the model. Variability (variability.hpp):
// compute ops take their device's speed factor, and each segment of compute between two
// synchronisations of a folded group its drawn deviation; the breakdown reports the critical
// rank's share as `variability`.
//
// Execution. A profile whose execution is in_order (the CPU backend's: profile.hpp) runs each
// rank's ops on one queue in list order, one at a time, as the backend's single thread does: a
// collective or a receive blocks it; a send costs its staging copy (staged_sends) and is posted,
// its transfer completing on its own (waited for at the step's end). There a collective of a
// group inside one node that the profile measured (kind, algorithm, group size) takes its
// measured time: flows of no bytes synchronise the members, the measured time less their latency
// follows (a rank has one collective in flight, as when it was measured). Otherwise the streams
// (compute, comm, p2p) run concurrently as the program's dependencies allow.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "energy.hpp"
#include "profile.hpp"
#include "program.hpp"
#include "step_result.hpp"
#include "topology.hpp"

namespace stepcast {

enum class SimMode { fast, full, approx, automatic };

// --mode auto's threshold: the ranks fast mode would simulate from which approx runs instead (full
// mode's largest plan; README `--mode approx`: within 1% of fast mode where tested).
inline constexpr int64_t kAutoApproxRanks = 256;

struct SimulateOptions {
  SimMode mode = SimMode::fast;  // approx sets fold_tp_shared_node
  bool fold_tp = true;
  bool fold_tp_shared_node = false;
  bool fold_rail_groups = true;
  bool fold_data_parallel = true;  // approx only
  bool phase_flows = true;
  bool merge_compute = true;
  // Ranks whose per-op records are kept (empty: the representative ranks — the first rank of
  // each pipeline stage, one per role, and in full mode every rank of a program with at most 64
  // ranks); with detail_all, every simulated rank (fast mode: tensor-parallel index 0 only).
  std::vector<int64_t> detail_ranks;
  bool detail_all = false;
  // false: no per-op records in the output (records and detail_ranks empty), for a caller that
  // wants the figures only (a reference run's step time); the breakdown is the same.
  bool keep_records = true;
  // A profile of another device than the topology's is refused unless this is set
  // (--allow-profile-mismatch).
  bool allow_profile_mismatch = false;
  // The profile's run-to-run variability (variability.hpp): drawn from `seed`; off gives the
  // nominal step.
  bool variability = true;
  uint64_t seed = 1;
  // The profile's overlap figures (profile.hpp OverlapInterference): compute beside a
  // collective on another stream runs on the SMs the collective leaves; off: at full speed.
  bool overlap_interference = true;
};

// Limits of full mode (the reference scale).
inline constexpr int64_t kFullModeMaxDevices = 256;
inline constexpr int64_t kFullModeMaxMicrobatches = 8;

struct SimulationOutput {
  double step_time_s = 0;
  int64_t critical_rank = 0;
  Breakdown breakdown;
  std::vector<OpRecord> records;       // detail ranks' ops that take time (no alloc or free), by (rank, id)
  std::vector<int64_t> simulated_ranks;
  std::vector<int64_t> detail_ranks;
  std::vector<int64_t> representative_ranks;  // the default detail ranks and the critical rank
  int64_t activities = 0;              // SimGrid activities started
  std::string mode_description;
  // --mode auto: the mode it chose (fast or approx) and the ranks each would simulate; false where
  // a mode was given.
  struct AutoMode {
    bool applied = false;
    SimMode chosen = SimMode::fast;
    int64_t fast_ranks = 0, approx_ranks = 0;
  } auto_mode;
  // Fast mode simulated every tensor-parallel rank because another group (dp, pp, ...) has members
  // on the same node and shares its NVLink with the tp collectives; --mode approx folds them.
  bool tp_fold_declined = false;
  // Fast mode: the ranks --mode approx would simulate where it folds more (0: it would not).
  int64_t approx_ranks = 0;
  bool approx_folds_dp = false;  // and whether it folds the data-parallel copies too
  bool variability = false;            // drawn (the profile has some and it was not turned off)
  bool overlap_interference = false;   // modelled (the profile has the figures, not turned off)
  // Collectives whose time the profile's measured tables corrected, and the range of the factor.
  int64_t corrected_collectives = 0;
  double correction_min = 1, correction_max = 1;
  // Mixture of experts: the routing draws of the step (one per microbatch and MoE layer an expert
  // block routes), the most loaded ep rank's tokens over the mean (the mean over the draws and
  // the largest), and the token copies over capacity, of the moe_routed_tokens the draws routed.
  int64_t moe_draws = 0;
  double moe_load_ratio_mean = 1, moe_load_ratio_max = 1;
  int64_t moe_dropped_tokens = 0, moe_routed_tokens = 0;
  // Unequal devices (the topology's heterogeneity): the simulated rank of the lowest compute speed
  // factor (ties: the lowest rank) and that factor; -1 and 1 on a uniform topology. Where fast
  // mode folds a tensor-parallel group, its stand-in takes the group's lowest factor.
  int64_t slowest_rank = -1;
  double slowest_speed_factor = 1;
  // Per simulated rank: how it spent the step (busy, waiting, idle), for energy.
  std::vector<DeviceTime> device_time;
  // Parameter servers (parameter_server_sim.hpp): the steps simulated, each worker's steady step,
  // the staleness (updates a server applied between a worker's pull and its push: mean and most
  // over the steady state) and the servers' busy share of the time.
  struct ParameterServers {
    int64_t servers = 0;  // 0: not a parameter-server program
    int64_t steps = 0;
    std::vector<double> worker_step_s;
    double staleness_updates_mean = 0;
    int64_t staleness_updates_max = 0;
    double server_busy_fraction = 0;
  } parameter_servers;
};

// What --mode auto chooses for `program` (SimMode::automatic above): `applied` false where
// options.mode is another mode.
SimulationOutput::AutoMode choose_auto_mode(const StepProgram& program, const Topology& topology,
                                            const DeviceProfile& profile, const SimulateOptions& options);

// Throws InputError for a full-mode request above its limits (suggesting fast mode).
// Runs one SimGrid engine: call once per process.
SimulationOutput simulate_program(const StepProgram& program, const Topology& topology,
                                  const DeviceProfile& profile, const SimulateOptions& options);

// One of several jobs sharing a cluster: its program, lowered on a topology of nodes.size() nodes
// (the shared one's node kind and fabric), and where those nodes sit: its node i is node nodes[i]
// of the shared topology. Its variability draws come from `seed`.
struct SharedJob {
  const StepProgram* program = nullptr;
  std::vector<int64_t> nodes;
  uint64_t seed = 1;
  double start_s = 0;  // when its step starts; its output is on its own clock (from its start)
};

// The jobs' steps, each from its start_s, on one platform of the shared topology: their flows
// share its NICs, leaf uplinks and router links (contention), each job's ranks on its own nodes
// (disjoint; InputError otherwise). They run under shared_job_options. A topology with
// heterogeneity is refused (its factors are per node of one job). --mode auto is fast mode for
// several jobs (the choice is per job; one engine runs one mode). Returns each job's output, in
// the job's own rank numbers. One SimGrid engine: call once per process.
std::vector<SimulationOutput> simulate_jobs(const std::vector<SharedJob>& jobs, const Topology& shared,
                                            const DeviceProfile& profile, const SimulateOptions& options);

// `options` where the jobs' folds divide the shared links' capacity by the same count (the folded
// rails, and approx's data-parallel copies, of every job stand for as many flows), else `options`
// without those two folds. A job simulated alone under them folds as it does among the others.
SimulateOptions shared_job_options(const std::vector<SharedJob>& jobs, const Topology& shared,
                                   const DeviceProfile& profile, const SimulateOptions& options);

}  // namespace stepcast
