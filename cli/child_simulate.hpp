// Simulations in child processes for the commands that compare many plans (plan,
// compare-strategies, scale, validate --sweep published, calibrate): each runs `stepcast simulate
// --mode MODE --no-scaling --no-records` through /proc/self/exe, since a process holds one SimGrid
// engine, on this machine or on another rank of an MPI job (the SimulationRunner's choice).
// Safe to call from several threads: one child each, results kept by a key the caller chooses.
#pragma once

#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "json_input.hpp"
#include "model.hpp"
#include "plan.hpp"
#include "simulation_request.hpp"
#include "topology.hpp"

namespace stepcast::cli {

// What the commands read back from prediction.json.
struct Simulated {
  double step_time_s = 0;
  double tokens_per_s = 0;
  double mfu = 0;
  double compute_s = 0;        // breakdown_s of the critical rank
  double exposed_comm_s = 0;
  double bubble_s = 0;
  double optimizer_s = 0;
  double variability_s = 0;    // the critical rank's share of run-to-run variation
  double overlap_interference_s = 0;  // its compute's slowdown by collectives beside it
  // Mixtures of experts: the busiest ep rank's expert load over the mean, averaged over the
  // routing draws, and the token copies a capacity dropped in the step (0 for a dense model).
  double moe_load_ratio_mean = 0;
  double moe_dropped_tokens = 0;
  std::optional<double> energy_per_step_j;  // where the topology gives the device's power
  bool fits = false;
  double peak_bytes_max = 0;
  Json memory;                 // prediction.json's "memory" (ranks by class, fits)
};

class ChildSimulator {
 public:
  // profile_arguments: " --profile ARG [...]" (child_profile_arguments); mode: simulate's
  // --mode, "fast" or "approx"; `jobs`: the command's --jobs, each rank's simulations at once.
  ChildSimulator(const ModelConfig& model, std::string profile_arguments, SimulationRunner& runner, int jobs,
                 std::string mode = "fast");
  const std::string& mode() const { return mode_; }
  ChildSimulator(const ChildSimulator&) = delete;
  ChildSimulator& operator=(const ChildSimulator&) = delete;

  // Simulates `plan` on `topology` (its file with --nodes num_nodes); throws std::runtime_error
  // with the child's output when it fails. The result is also kept under `key`.
  Simulated simulate(const std::string& key, const Plan& plan, const Topology& topology);
  std::optional<Simulated> result(const std::string& key) const;

 private:
  std::string model_json_;       // the model file's text, or a model without a file's config
  std::string model_arguments_;  // " --seq-length N" where the command line set it
  std::string profile_arguments_;
  SimulationRunner& runner_;
  int jobs_;
  std::string mode_;
  mutable std::mutex mutex_;
  std::map<std::string, Simulated> results_;
};

}  // namespace stepcast::cli
