// A validate sweep file (`stepcast validate --sweep S`): the points — (model, plan, ranks, steps)
// — to simulate, run and compare on one topology, with the device profile to predict them with.
// Reading only: every key is checked (file, key, value, what is valid) and every point's plan is
// validated against its model and the topology before anything runs. Relative paths in the file
// are relative to the file's own folder.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "json_input.hpp"
#include "model.hpp"
#include "plan.hpp"
#include "topology.hpp"

namespace stepcast {

// How validate gets the device profile the predictions use.
enum class SweepProfileSource {
  measure,        // "measure" (or no key): `stepcast profile --backend cpu` before the points
  measure_quick,  // "measure-quick": the same with --quick (a few seconds; CI)
  file,           // a path to a profile (profiles/*.json or an earlier `stepcast profile`)
  roofline,       // "roofline": no profile, the topology's datasheet peaks (simulate's default)
};

struct SweepPoint {
  std::string name;        // [A-Za-z0-9._-]+, unique in the sweep: names the point's folder
  std::string model_file;  // resolved path
  std::string plan_file;   // resolved path of a plan file; empty when the plan is inline
  Json plan_json;          // the plan as simulate and run will read it (overrides merged)
  ModelConfig model;
  Plan plan;               // validated against model and topology
  int64_t ranks = 0;       // = plan.world_size(), checked
  int64_t steps = 0;       // run --steps: 1 warm-up, the timed steps, 1 instrumented (>= 3)
  std::string link_rate;   // netns sweeps: the links' rate at this point (tc's form, "200mbit")
  std::string uplink_rate; // netns sweeps: the two leaves' uplink at this point; empty: none
  int64_t nics_per_node = 1;  // netns sweeps: NICs of each node at this point (up --nics-per-node)
  // "routing": "measured" (a mixture of experts): the executor runs the point once first, and the
  // prediction and the timed runs take the routing it measured (its moe-routing.json: a row per
  // layer and the samples the simulation replays) as the plan's histogram.
  bool measured_routing = false;
};

// The cluster on this machine a sweep runs on (scripts/netns-cluster.sh up --name NAME --nodes
// --ranks-per-node --link-rate): its topology must be the sweep's shape (num_nodes, devices per
// node); each point's prediction and run use the topology the cluster writes at its link rate.
struct SweepCluster {
  std::string name;
  int64_t nodes = 0, ranks_per_node = 0;
  std::string link_rate;   // the points' default
};

struct Sweep {
  std::string file;
  std::string name;        // [A-Za-z0-9._-]+
  std::string notes;
  std::string topology_file;  // resolved path
  Topology topology;
  SweepProfileSource profile_source = SweepProfileSource::measure;
  std::string profile_file;   // resolved path when profile_source is file
  std::optional<int64_t> repeats;  // the file's "repeats"; --repeats overrides it
  std::optional<SweepCluster> netns;  // the sweep's "netns": run across a netns cluster
  std::vector<SweepPoint> points;

  int64_t max_ranks() const;
};

inline constexpr int64_t kSweepMinSteps = 3;

// Reads and validates a sweep file. InputError naming the file and key ("points[2].plan.tp_size")
// for anything wrong: unknown keys, missing ones, bad values, plans invalid for their model or the
// topology, `ranks` that is not tp_size · pp_size · dp_size, duplicate point names.
Sweep load_sweep(const std::string& path);
Sweep parse_sweep(const Json& json, const std::string& file);

// Timing runs put one rank per core: InputError naming the first point that needs more ranks than
// `cores` (this machine's).
void check_sweep_fits_cores(const Sweep& sweep, int64_t cores);

// Whether `rate` is a rate as scripts/netns-cluster.sh takes it: NUMBER[k|m|g]bit.
bool is_link_rate(const std::string& rate);

const char* to_string(SweepProfileSource source);

}  // namespace stepcast
