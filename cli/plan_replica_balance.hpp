// plan --heterogeneous, data-parallel replicas: on a topology of unequal devices, the search holds
// each data-parallel plan (ZeRO-0 or 1, no experts) also with its microbatches split over the
// replicas by their speeds (NAME-hm, plan microbatches_per_replica; a replica's speed: its
// slowest device's factor), so that the fast replicas take more of the global batch and all end
// their passes together. After the simulations each such plan's gain over its equal twin is
// reported, and a simulated plan without one has its split simulated and adopted where faster.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "child_simulate.hpp"
#include "json_input.hpp"
#include "model.hpp"
#include "plan.hpp"
#include "search.hpp"
#include "topology.hpp"

namespace stepcast::cli {

// The plan's microbatches split over its replicas by their speeds (speed_balanced_microbatches
// with the plan's pipeline fill); empty where the plan cannot take unequal replicas (dp 1,
// ZeRO-2/3, experts, equal devices) or the split is the equal one.
std::vector<int64_t> replica_balanced_microbatches(const Plan& plan, const ModelConfig& model,
                                                   const Topology& topology);

// Beside each valid candidate whose replicas' speeds differ: NAME-hm with the split, where it
// validates (the search's memory check and estimate, which takes each replica's own microbatches
// and stage speeds, then rank both).
void add_replica_balanced_candidates(std::vector<Candidate>& candidates, const ModelConfig& model,
                                     const Topology& topology);

struct ReplicaBalance {
  std::string equal_name;             // the plan with equal replicas
  std::vector<double> replica_speed;
  int64_t equal_microbatches = 0;     // per replica
  double equal_step_s = 0;            // simulated
  std::string balanced_name;          // NAME-hm
  std::vector<int64_t> balanced_microbatches;
  std::optional<double> balanced_step_s;
  bool adopted = false;  // the search ranked it, or it replaced the equal plan (fits and faster)
  std::string note;
};

// For each simulated plan of `ranked` (the simulated ones first): a NAME-hm plan the search made
// gets its equal twin's step (simulated where the search did not); another plan with replicas of
// unequal speeds and no simulated -hm twin has its split simulated and replaces it where it fits
// and is faster. The simulated plans are then ranked again by step time.
std::vector<ReplicaBalance> balance_replicas(std::vector<Candidate>& ranked, const ModelConfig& model,
                                             const Topology& topology, ChildSimulator& simulator, int threads);

void print_replica_balance(const std::vector<ReplicaBalance>& balanced);
Json replica_balance_json(const std::vector<ReplicaBalance>& balanced);

}  // namespace stepcast::cli
