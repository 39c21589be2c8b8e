// The StepProgram interpreter on SimGrid; see simulator.hpp for the modes and their reductions.
// The one function that creates SimGrid's engine: set-up before it (sim_plan.cpp), the actors
// (rank_actor.cpp), reading the outcome after it (sim_outcome.cpp).
#include "simulator.hpp"

#include <simgrid/s4u.hpp>

#include <string>

#include "platform.hpp"
#include "rank_actor.hpp"
#include "sim_plan.hpp"
#include "variability.hpp"

namespace sg4 = simgrid::s4u;

namespace stepcast {

SimulationOutput simulate_program(const StepProgram& program, const Topology& topology_in,
                                  const DeviceProfile& profile, const SimulateOptions& options) {
  using namespace sim_detail;
  SimulationOutput out;
  const VariabilityDraws draws(profile.variability, options.seed);
  const SimPlan plan = plan_simulation(program, topology_in, profile, options, draws, out);
  SimHosts hosts;
  SimOutcome outcome;

  // The engine and the platform: one host per simulated rank (rank r on device r), and one
  // delay host per rank and stream for executions and analytic delays.
  int argc = 2;
  std::string arg0 = "stepcast", arg1 = "--log=root.thresh:critical";
  char* argv[] = {arg0.data(), arg1.data(), nullptr};
  sg4::Engine engine(&argc, argv);
  configure_engine(engine);
  PlatformOptions platform_options;
  platform_options.devices = plan.ranks;
  platform_options.shared_link_divisor = plan.shared_link_divisor;
  platform_options.delay_hosts = int64_t(plan.ranks.size() * kStreams);
  platform_options.delay_host_speeds = plan.overlap_speeds;
  Platform platform = build_platform(engine, plan.topology, platform_options);
  hosts.host = platform.hosts;
  hosts.delay.resize(plan.ranks.size());
  for (size_t slot = 0; slot < plan.ranks.size(); ++slot) {
    for (size_t stream = 0; stream < kStreams; ++stream) {
      hosts.delay[slot][stream] = platform.delay_hosts[slot * kStreams + stream];
    }
  }
  create_rank_actors(plan, hosts, outcome);
  engine.run();
  read_outcome(plan, outcome, out);
  return out;
}

}  // namespace stepcast
