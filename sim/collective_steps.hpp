// How one member of a collective moves data, step by step: the sends and receives of each step
// for ring, binomial tree, hierarchical and pairwise (all_to_all) algorithms. Pure functions (no SimGrid): the simulator
// turns each step into flows; `phase_flows` (fast mode) folds each ring phase into one flow per
// neighbour carrying the phase's bytes, plus the phase's remaining latency as a delay — the same
// time as step by step on a network without contention (CM02, no cross traffic).
#pragma once

#include <cstdint>
#include <vector>

#include "program.hpp"

namespace stepcast {

struct Transfer {
  int64_t peer = 0;  // member index within the group
  double bytes = 0;
};

struct CollectiveStep {
  std::vector<Transfer> sends;
  std::vector<Transfer> recvs;
  // Latency steps folded into this step (phase_flows): the simulator adds
  // `folded_latency_steps` × (route latency to the first send's peer) after the flows.
  int64_t folded_latency_steps = 0;
};

// Members of a group laid out over nodes: member i is on node node_of[i].
struct GroupLayout {
  std::vector<int64_t> node_of;
};

std::vector<CollectiveStep> collective_steps(OpKind kind, Algorithm algorithm, double bytes,
                                             const GroupLayout& layout, int64_t member,
                                             bool phase_flows);

}  // namespace stepcast
