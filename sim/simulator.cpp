// The StepProgram interpreter on SimGrid; see simulator.hpp for the modes and their reductions.
// simulate_jobs runs SimGrid's engine: set-up before it (sim_plan.cpp), the actors (rank_actor.cpp),
// reading the outcome after it (sim_outcome.cpp). A program with parameter servers runs in
// parameter_server_sim.cpp's engine instead.
#include "simulator.hpp"

#include <simgrid/s4u.hpp>

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>
#include <memory>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "errors.hpp"

#include "parameter_server_sim.hpp"
#include "platform.hpp"
#include "rank_actor.hpp"
#include "sim_plan.hpp"
#include "variability.hpp"

namespace sg4 = simgrid::s4u;

namespace stepcast {

SimulationOutput::AutoMode choose_auto_mode(const StepProgram& program, const Topology& topology,
                                            const DeviceProfile& profile, const SimulateOptions& options) {
  SimulationOutput::AutoMode choice;
  if (options.mode != SimMode::automatic) return choice;
  choice.applied = true;
  if (program.parameter_servers > 0) {  // their engine folds nothing: fast
    choice.fast_ranks = choice.approx_ranks = program.ranks();
    return choice;
  }
  auto simulated_ranks = [&](SimMode mode) {
    SimulateOptions o = options;
    o.mode = mode;
    return sim_detail::simulated_rank_count(program, sim_detail::choose_folds(program, topology, profile, o));
  };
  choice.fast_ranks = simulated_ranks(SimMode::fast);
  choice.approx_ranks = simulated_ranks(SimMode::approx);
  if (choice.fast_ranks >= kAutoApproxRanks && choice.approx_ranks < choice.fast_ranks) {
    choice.chosen = SimMode::approx;
  }
  return choice;
}

SimulationOutput simulate_program(const StepProgram& program, const Topology& topology_in,
                                  const DeviceProfile& profile, const SimulateOptions& options) {
  const SimulationOutput::AutoMode choice = choose_auto_mode(program, topology_in, profile, options);
  SimulateOptions resolved = options;
  if (choice.applied) resolved.mode = choice.chosen;
  SimulationOutput out;
  if (program.parameter_servers > 0) {
    out = simulate_parameter_servers(program, topology_in, profile, resolved);
  } else {
    SharedJob job;
    job.program = &program;
    job.seed = options.seed;
    for (int64_t n = 0; n < topology_in.num_nodes; ++n) job.nodes.push_back(n);
    out = std::move(simulate_jobs({job}, topology_in, profile, resolved).front());
  }
#ifdef __GLIBC__
  malloc_trim(0);  // the engine's and the plan's pages back to the system before the outputs are made
#endif
  out.auto_mode = choice;
  return out;
}

SimulateOptions shared_job_options(const std::vector<SharedJob>& jobs, const Topology& shared,
                                   const DeviceProfile& profile, const SimulateOptions& requested) {
  SimulateOptions options = requested;
  if (options.mode == SimMode::automatic) options.mode = SimMode::fast;  // simulate_program chooses for one
  // The rail and data-parallel folds divide the shared links' capacity by their count: valid only
  // where every job's simulated flows stand for that many copies.
  if (jobs.size() < 2) return options;
  std::vector<double> divisors;
  for (const SharedJob& job : jobs) {
    Topology own = shared;
    own.num_nodes = int(job.nodes.size());
    divisors.push_back(sim_detail::choose_folds(*job.program, own, profile, options).shared_link_divisor);
  }
  if (std::equal(divisors.begin() + 1, divisors.end(), divisors.begin())) return options;
  SimulateOptions unfolded = options;
  unfolded.fold_rail_groups = false;
  unfolded.fold_data_parallel = false;
  return unfolded;
}

std::vector<SimulationOutput> simulate_jobs(const std::vector<SharedJob>& jobs, const Topology& shared,
                                            const DeviceProfile& profile, const SimulateOptions& options) {
  using namespace sim_detail;
  STEPCAST_CHECK(!jobs.empty(), "simulate_jobs without a job");
  const int64_t per_node = shared.node.devices_per_node;
  std::vector<char> taken(size_t(std::max(0, shared.num_nodes)), 0);
  for (size_t j = 0; j < jobs.size(); ++j) {
    const SharedJob& job = jobs[j];
    STEPCAST_CHECK(job.program != nullptr, "a shared job without a program");
    if (job.program->parameter_servers > 0) {  // simulate_program simulates one alone
      throw_input_error(shared.file, "jobs[" + std::to_string(j) + "].plan", "parameter_servers",
                        "a job with parameter servers is not simulated among other jobs yet",
                        "jobs without parameter_servers");
    }
    STEPCAST_CHECK(std::isfinite(job.start_s) && job.start_s >= 0, "a shared job's start before time 0");
    for (int64_t node : job.nodes) {
      if (node < 0 || node >= shared.num_nodes || taken[size_t(node)]) {
        throw_input_error(shared.file, "jobs[" + std::to_string(j) + "].nodes", std::to_string(node),
                          node < 0 || node >= shared.num_nodes ? "no such node"
                                                               : "a node another job (or this one) already holds",
                          "distinct nodes 0 to " + std::to_string(shared.num_nodes - 1) + " across all jobs");
      }
      taken[size_t(node)] = 1;
    }
    if (job.program->world_size() > int64_t(job.nodes.size()) * per_node) {
      throw_input_error(shared.file, "jobs[" + std::to_string(j) + "].nodes",
                        std::to_string(job.nodes.size()) + " nodes",
                        "the job's program spans " + std::to_string(job.program->world_size()) + " devices",
                        "at least as many nodes as the program's devices fill");
    }
  }
  if (jobs.size() > 1 && !shared.heterogeneity.empty()) {
    throw_input_error(shared.file, "heterogeneity", "", "its factors are given per node of one job",
                      "a topology without heterogeneity when several jobs share it");
  }

  // Each job's plan on a topology of its own nodes; the platform is the shared one.
  std::vector<SimulationOutput> out(jobs.size());
  std::vector<VariabilityDraws> draws;
  draws.reserve(jobs.size());  // plans keep pointers to them
  for (const SharedJob& job : jobs) draws.emplace_back(profile.variability, job.seed);
  std::vector<SimPlan> plans;
  auto plan_jobs = [&](const SimulateOptions& o) {
    plans.clear();
    for (size_t j = 0; j < jobs.size(); ++j) {
      Topology own = shared;
      own.num_nodes = int(jobs[j].nodes.size());
      out[j] = SimulationOutput{};
      plans.push_back(plan_simulation(*jobs[j].program, own, profile, o, draws[j], out[j]));
      if (jobs.size() > 1) plans.back().mailbox_prefix = "j" + std::to_string(j) + ":";
      plans.back().start_s = jobs[j].start_s;
    }
  };
  plan_jobs(shared_job_options(jobs, shared, profile, options));

  // The engine and the platform: one host per simulated rank (a job's rank r on its node
  // nodes[r / devices_per_node]), and one delay host per rank and stream for executions and
  // analytic delays.
  std::unique_ptr<sg4::Engine> engine_owner = create_engine();
  sg4::Engine& engine = *engine_owner;
  // Then, per job, the hosts of the folded dp copies its mirrored flows reach (no actors).
  PlatformOptions platform_options;
  auto device_of = [&](size_t j, int64_t rank) {
    return jobs[j].nodes[size_t(rank / per_node)] * per_node + rank % per_node;
  };
  for (size_t j = 0; j < jobs.size(); ++j) {
    for (int64_t rank : plans[j].ranks) platform_options.devices.push_back(device_of(j, rank));
    platform_options.delay_hosts += int64_t(plans[j].ranks.size() * kStreams);
  }
  for (size_t j = 0; j < jobs.size(); ++j) {
    for (int64_t rank : plans[j].mirror_ranks) platform_options.devices.push_back(device_of(j, rank));
  }
  platform_options.shared_link_divisor = plans.front().shared_link_divisor;
  platform_options.delay_host_speeds = plans.front().overlap_speeds;
  Topology platform_topology = plans.front().topology;  // the profile's link fractions applied
  platform_topology.num_nodes = shared.num_nodes;
  Platform platform = build_platform(engine, platform_topology, platform_options);
  std::vector<SimHosts> hosts(jobs.size());
  std::vector<SimOutcome> outcomes(jobs.size());
  size_t first_host = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const size_t slots = plans[j].ranks.size();
    hosts[j].host.assign(platform.hosts.begin() + std::ptrdiff_t(first_host),
                         platform.hosts.begin() + std::ptrdiff_t(first_host + slots));
    hosts[j].delay.resize(slots);
    for (size_t slot = 0; slot < slots; ++slot) {
      for (size_t stream = 0; stream < kStreams; ++stream) {
        hosts[j].delay[slot][stream] = platform.delay_hosts[(first_host + slot) * kStreams + stream];
      }
    }
    first_host += slots;
  }
  for (size_t j = 0; j < jobs.size(); ++j) {
    for (int64_t rank : plans[j].mirror_ranks) hosts[j].mirror[rank] = platform.hosts[first_host++];
    create_rank_actors(plans[j], hosts[j], outcomes[j]);
  }
  engine.run();
  for (size_t j = 0; j < jobs.size(); ++j) release_walks(plans[j]);
#ifdef __GLIBC__
  malloc_trim(0);  // the walks' pages back to the system before the records take as many
#endif
  for (size_t j = 0; j < jobs.size(); ++j) read_outcome(plans[j], outcomes[j], out[j]);
  return out;
}

}  // namespace stepcast
