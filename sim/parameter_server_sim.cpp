// Parameter servers on SimGrid; see parameter_server_sim.hpp.
#include "parameter_server_sim.hpp"

#include <simgrid/s4u.hpp>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "cost_model.hpp"
#include "errors.hpp"
#include "parameter_server.hpp"
#include "platform.hpp"
#include "zero_fill.hpp"

namespace sg4 = simgrid::s4u;

namespace stepcast {

int64_t parameter_server_steps(int64_t staleness) { return std::clamp<int64_t>(4 * (staleness + 1), 16, 64); }

namespace {

struct Push {
  int64_t worker = 0;
  int64_t step = 0;
};

// What the actors read (costs, bytes, hosts) and write (when each worker's steps start, the
// staleness the servers saw, their busy time).
struct PsRun {
  int64_t workers = 0, servers = 0, steps = 0, staleness = 0;
  std::vector<sg4::Host*> host;            // per rank: workers, then servers
  std::vector<double> worker_compute_s;    // per worker, its speed applied
  std::vector<double> worker_norm_s;
  std::vector<double> server_update_s;     // per server, its speed applied
  std::vector<double> server_copy_s;       // per server: a reply's copy into its staging
  std::vector<double> push_bytes, pull_bytes;  // per server
  std::vector<std::vector<Push>> payload;  // [worker][step]
  std::vector<std::vector<double>> compute_start;  // [worker][step]
  std::vector<double> worker_end;
  std::vector<double> server_busy_s;
  std::vector<int64_t> ages;  // steady state: updates between a push's pull and its apply
  int64_t activities = 0;     // executions and transfers started (a transfer once, by its sender)
  int dummy = 0;

  std::string weights_box(int64_t worker, int64_t server) const {
    return "ps-weights-" + std::to_string(worker) + "-" + std::to_string(server);
  }
  std::string push_box(int64_t server) const { return "ps-push-" + std::to_string(server); }
};

void run_worker(PsRun& run, int64_t w) {
  std::vector<sg4::CommPtr> pushes;
  for (int64_t c = 0; c < run.steps; ++c) {
    for (int64_t j = 0; j < run.servers; ++j) sg4::Mailbox::by_name(run.weights_box(w, j))->get<int>();
    run.compute_start[size_t(w)][size_t(c)] = sg4::Engine::get_clock();
    sg4::this_actor::execute(run.worker_compute_s[size_t(w)] + run.worker_norm_s[size_t(w)]);
    run.activities += 1 + run.servers;
    Push* push = &run.payload[size_t(w)][size_t(c)];
    for (int64_t j = 0; j < run.servers; ++j) {
      pushes.push_back(sg4::Mailbox::by_name(run.push_box(j))->put_async(push, uint64_t(run.push_bytes[size_t(j)])));
    }
  }
  sg4::Comm::wait_all(pushes);
  run.worker_end[size_t(w)] = sg4::Engine::get_clock();
}

void run_server(PsRun& run, int64_t j) {
  std::vector<int64_t> pushed(size_t(run.workers), 0), version(size_t(run.workers), 0);
  std::vector<char> waiting(size_t(run.workers), 0);
  std::vector<sg4::CommPtr> replies;
  int64_t updates = 0;
  auto reply = [&](int64_t v) {
    sg4::this_actor::execute(run.server_copy_s[size_t(j)]);
    run.server_busy_s[size_t(j)] += run.server_copy_s[size_t(j)];
    run.activities += 2;  // the copy and the transfer
    replies.push_back(sg4::Mailbox::by_name(run.weights_box(v, j))
                          ->put_async(&run.dummy, uint64_t(run.pull_bytes[size_t(j)])));
    version[size_t(v)] = updates;
    waiting[size_t(v)] = 0;
  };
  for (int64_t v = 0; v < run.workers; ++v) reply(v);  // the initial weights
  sg4::Mailbox* box = sg4::Mailbox::by_name(run.push_box(j));
  for (int64_t k = 0; k < run.workers * run.steps; ++k) {
    const Push* push = box->get<Push>();
    const int64_t w = push->worker;
    if (push->step >= run.steps / 2) run.ages.push_back(updates - version[size_t(w)]);
    sg4::this_actor::execute(run.server_update_s[size_t(j)]);
    run.server_busy_s[size_t(j)] += run.server_update_s[size_t(j)];
    ++run.activities;
    ++updates;
    ++pushed[size_t(w)];
    if (push->step + 1 < run.steps) waiting[size_t(w)] = 1;
    for (int64_t v = 0; v < run.workers; ++v) {
      if (waiting[size_t(v)] && ssp_may_start(pushed, pushed[size_t(v)], run.staleness)) reply(v);
    }
  }
  sg4::Comm::wait_all(replies);
}

}  // namespace

SimulationOutput simulate_parameter_servers(const StepProgram& program, const Topology& topology_in,
                                            const DeviceProfile& profile, const SimulateOptions& options) {
  STEPCAST_CHECK(program.parameter_servers > 0 && program.pp_size == 1 && program.tp_size == 1 &&
                     program.cp_size == 1 && program.microbatches_per_replica.empty(),
                 "simulate_parameter_servers: a program of one-rank workers and parameter servers");
  check_profile_matches(profile, topology_in, options.allow_profile_mismatch);
  const Topology topology = apply_link_fractions(topology_in, profile);
  PsRun run;
  run.workers = program.world_size();
  run.servers = program.parameter_servers;
  run.staleness = program.async_staleness;
  run.steps = parameter_server_steps(run.staleness);
  const int64_t ranks = program.ranks();
  const int64_t per_node = topology.node.devices_per_node;
  STEPCAST_CHECK(ranks <= topology.num_devices(), "parameter servers: more ranks than the topology's devices");

  // Costs: the worker's role (every worker's), and each server's role.
  Dtype dtype = *parse_dtype(program.plan.at("param_dtype").get<std::string>());
  ComputeCostModel cost(topology.node.device, dtype, profile, topology.file,
                        program.model.is_object() ? program.model.value("norm_type", std::string("rmsnorm"))
                                                  : std::string("rmsnorm"),
                        program.plan.value("cross_entropy_loss_fusion", true));
  const Role& worker = program.roles.front();
  double compute_s = 0, norm_s = 0;
  run.push_bytes.assign(size_t(run.servers), 0);
  run.pull_bytes.assign(size_t(run.servers), 0);
  const ZeroFills worker_fills = zero_fills(worker);  // (zero_fill.hpp: with the op that first touches each)
  for (const Op& op : worker.ops) {
    if (is_compute(op.kind)) {
      (in_optimizer_part(op) ? norm_s : compute_s) +=
          cost.op_time_s(op) + cost.fills_time_s(worker, worker_fills.step_fills_before[size_t(op.id)]);
    }
    if (is_p2p(op.kind) && op.server >= 0) {
      (op.kind == OpKind::send ? run.push_bytes : run.pull_bytes)[size_t(op.server)] += op.bytes;
    }
  }
  auto speed = [&](int64_t rank) { return topology.heterogeneity.compute_speed_factor(rank, per_node); };
  for (int64_t w = 0; w < run.workers; ++w) {
    run.worker_compute_s.push_back(compute_s / speed(w));
    run.worker_norm_s.push_back(norm_s / speed(w));
  }
  for (int64_t j = 0; j < run.servers; ++j) {
    double update_s = 0;
    const Role& server = program.role_of_rank(run.workers + j);
    const ZeroFills server_fills = zero_fills(server);
    for (const Op& op : server.ops) {
      if (!is_compute(op.kind)) continue;
      update_s += cost.op_time_s(op) + cost.fills_time_s(server, server_fills.step_fills_before[size_t(op.id)]);
    }
    run.server_update_s.push_back(update_s / speed(run.workers + j));
    run.server_copy_s.push_back(cost.staging_copy_time_s(run.pull_bytes[size_t(j)]) / speed(run.workers + j));
  }
  run.payload.assign(size_t(run.workers), std::vector<Push>(size_t(run.steps)));
  for (int64_t w = 0; w < run.workers; ++w) {
    for (int64_t c = 0; c < run.steps; ++c) run.payload[size_t(w)][size_t(c)] = {w, c};
  }
  run.compute_start.assign(size_t(run.workers), std::vector<double>(size_t(run.steps), 0));
  run.worker_end.assign(size_t(run.workers), 0);
  run.server_busy_s.assign(size_t(run.servers), 0);

  std::unique_ptr<sg4::Engine> engine_owner = create_engine();
  sg4::Engine& engine = *engine_owner;
  PlatformOptions platform_options;
  for (int64_t rank = 0; rank < ranks; ++rank) platform_options.devices.push_back(rank);
  Platform platform = build_platform(engine, topology, platform_options);
  run.host = platform.hosts;
  for (int64_t w = 0; w < run.workers; ++w) {
    sg4::Actor::create("worker" + std::to_string(w), run.host[size_t(w)], [&run, w] { run_worker(run, w); });
  }
  for (int64_t j = 0; j < run.servers; ++j) {
    sg4::Actor::create("server" + std::to_string(j), run.host[size_t(run.workers + j)],
                       [&run, j] { run_server(run, j); });
  }
  engine.run();

  // The steady state: each worker's steps over the second half.
  SimulationOutput out;
  auto& ps = out.parameter_servers;
  ps.servers = run.servers;
  ps.steps = run.steps;
  const int64_t first = run.steps / 2, last = run.steps - 1;
  double rate = 0;
  int64_t critical = 0;
  for (int64_t w = 0; w < run.workers; ++w) {
    const auto& start = run.compute_start[size_t(w)];
    const double step = (start[size_t(last)] - start[size_t(first)]) / double(last - first);
    ps.worker_step_s.push_back(step);
    rate += 1 / step;
    if (step > ps.worker_step_s[size_t(critical)]) critical = w;
  }
  out.step_time_s = double(run.workers) / rate;
  out.critical_rank = critical;
  const double critical_step = ps.worker_step_s[size_t(critical)];
  out.breakdown.compute_s = run.worker_compute_s[size_t(critical)];
  out.breakdown.optimizer_s = run.worker_norm_s[size_t(critical)];
  out.breakdown.exposed_comm_s = std::max(0.0, critical_step - out.breakdown.compute_s - out.breakdown.optimizer_s);
  double age_sum = 0;
  for (int64_t age : run.ages) {
    age_sum += double(age);
    ps.staleness_updates_max = std::max(ps.staleness_updates_max, age);
  }
  ps.staleness_updates_mean = run.ages.empty() ? 0 : age_sum / double(run.ages.size());
  const double end = *std::max_element(run.worker_end.begin(), run.worker_end.end());
  double busy = 0;
  for (double b : run.server_busy_s) busy += b;
  ps.server_busy_fraction = end > 0 ? busy / (end * double(run.servers)) : 0;
  // Per rank, over one global batch (out.step_time_s): a worker computes in its share of its
  // steps and waits for its weights otherwise; a server updates once per worker step.
  for (int64_t w = 0; w < run.workers; ++w) {
    const double steps_in = out.step_time_s / ps.worker_step_s[size_t(w)];
    const double busy_s = std::min(out.step_time_s, (run.worker_compute_s[size_t(w)] + run.worker_norm_s[size_t(w)]) * steps_in);
    out.device_time.push_back({w, 1, busy_s, out.step_time_s - busy_s, 0});
  }
  for (int64_t j = 0; j < run.servers; ++j) {
    const double busy_s = std::min(out.step_time_s, run.server_update_s[size_t(j)] * double(run.workers));
    out.device_time.push_back({run.workers + j, 1, busy_s, 0, out.step_time_s - busy_s});
  }
  for (int64_t rank = 0; rank < ranks; ++rank) out.simulated_ranks.push_back(rank);
  out.representative_ranks = {critical};
  if (!topology.heterogeneity.empty()) {
    for (int64_t rank = 0; rank < ranks; ++rank) {
      if (out.slowest_rank < 0 || speed(rank) < out.slowest_speed_factor) {
        out.slowest_rank = rank;
        out.slowest_speed_factor = speed(rank);
      }
    }
  }
  out.activities = run.activities;
  out.mode_description = "parameter servers: " + std::to_string(run.workers) + " free-running workers and " +
                         std::to_string(run.servers) + " servers, " + std::to_string(run.steps) +
                         " steps each (the steady state from the second half), staleness bound " +
                         std::to_string(run.staleness);
  return out;
}

}  // namespace stepcast
