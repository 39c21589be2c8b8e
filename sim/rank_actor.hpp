// The simulation's SimGrid actors: one per simulated rank, each interpreting its role's op list
// on the costs, groups and reductions of a SimPlan (sim_plan.hpp) and writing every op's start
// and end into a SimOutcome. Nothing here decides a cost; the engine is created in simulator.cpp.
#pragma once

#include <simgrid/s4u.hpp>

#include <array>
#include <map>
#include <unordered_map>
#include <utility>
#include <vector>

#include "sim_plan.hpp"

namespace stepcast::sim_detail {

// Where the actors run: per slot its device host and a delay host per stream (executions and
// analytic delays that must not share the device host's speed), and route latencies, cached.
struct SimHosts {
  std::vector<simgrid::s4u::Host*> host;                         // per slot
  std::vector<std::array<simgrid::s4u::Host*, kStreams>> delay;  // per slot, per stream
  std::unordered_map<int64_t, simgrid::s4u::Host*> mirror;        // per SimPlan::mirror_ranks rank
  std::map<std::pair<simgrid::s4u::Host*, simgrid::s4u::Host*>, double> route_latency;
  double latency(simgrid::s4u::Host* a, simgrid::s4u::Host* b);  // seconds
};

// Creates one actor per simulated rank in the current engine; they run with the engine and
// write `outcome` (sized here, one RankState per slot). `plan` and `hosts` must outlive the run.
void create_rank_actors(const SimPlan& plan, SimHosts& hosts, SimOutcome& outcome);

}  // namespace stepcast::sim_detail
