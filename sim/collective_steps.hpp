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
  // all_to_all across nodes as NCCL runs it on NVLink nodes since 2.12 (PXN): a chunk for a
  // member on another node first crosses NVLink to the member of the sender's node in the
  // destination's position (its rail), which sends what its node has for that destination in one
  // flow over its own NIC. Set where the group spans nodes with the same number of members on
  // each (the position of a member: its index among its node's members).
  bool rail_staged = false;
};

// Per-member factors on a pairwise all_to_all's chunks: the chunk from s to d is bytes / n ×
// factor[d] (of_destination) or × factor[s] — an ep all_to_all under drawn routing, where the
// bytes to an ep rank follow its experts' load (or the bytes from it, for the way back).
struct ChunkScale {
  const std::vector<double>* factor = nullptr;  // none: every chunk bytes / n
  bool of_destination = true;
  double at(int64_t source, int64_t destination) const {
    return factor ? (*factor)[size_t(of_destination ? destination : source)] : 1.0;
  }
};

std::vector<CollectiveStep> collective_steps(OpKind kind, Algorithm algorithm, double bytes,
                                             const GroupLayout& layout, int64_t member,
                                             bool phase_flows, const ChunkScale& chunks = {});

}  // namespace stepcast
