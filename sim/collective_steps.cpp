// Step-by-step data movement of each collective algorithm; see collective_steps.hpp.
#include "collective_steps.hpp"

#include <map>

#include "collective.hpp"
#include "errors.hpp"

namespace stepcast {

namespace {

// A ring phase of `steps` steps over `members` (member indices in ring order), each step moving
// `chunk_bytes` to the next member and from the previous one.
void append_ring_phase(std::vector<CollectiveStep>& out, const std::vector<int64_t>& members,
                       int64_t position, int64_t steps, double chunk_bytes, bool phase_flows) {
  int64_t n = int64_t(members.size());
  if (n <= 1 || steps <= 0) return;
  int64_t next = members[(position + 1) % n];
  int64_t prev = members[(position + n - 1) % n];
  if (phase_flows) {
    CollectiveStep step;
    step.sends.push_back({next, chunk_bytes * double(steps)});
    step.recvs.push_back({prev, chunk_bytes * double(steps)});
    step.folded_latency_steps = steps - 1;
    out.push_back(step);
    return;
  }
  for (int64_t s = 0; s < steps; ++s) {
    CollectiveStep step;
    step.sends.push_back({next, chunk_bytes});
    step.recvs.push_back({prev, chunk_bytes});
    out.push_back(step);
  }
}

int64_t ring_steps(OpKind kind, int64_t n) { return kind == OpKind::all_reduce ? 2 * (n - 1) : n - 1; }

// A pairwise all_to_all's one step under rail staging (GroupLayout::rail_staged): member m of
// node a at position p sends each member q of its node the chunks m has for position q on every
// node (q's own and those q forwards), and, for position p, sends each other node's member p what
// node a has for it; it receives likewise.
CollectiveStep rail_staged_step(double chunk, const GroupLayout& layout, int64_t member, const ChunkScale& chunks) {
  std::map<int64_t, std::vector<int64_t>> by_node;  // node → its members, in member order
  for (int64_t i = 0; i < int64_t(layout.node_of.size()); ++i) by_node[layout.node_of[i]].push_back(i);
  const int64_t my_node = layout.node_of[member];
  const std::vector<int64_t>& mine = by_node.at(my_node);
  int64_t position = 0;
  while (mine[position] != member) ++position;
  CollectiveStep step;
  for (int64_t q = 0; q < int64_t(mine.size()); ++q) {  // NVLink: to my node's member q
    if (q == position) continue;
    double out = 0, in = 0;
    for (const auto& [node, members] : by_node) {
      STEPCAST_CHECK(members.size() == mine.size(), "rail staging needs as many members on every node");
      out += chunk * chunks.at(member, members[q]);
      in += chunk * chunks.at(mine[q], members[position]);
    }
    step.sends.push_back({mine[q], out});
    step.recvs.push_back({mine[q], in});
  }
  for (const auto& [node, members] : by_node) {  // NIC: position p of every other node
    if (node == my_node) continue;
    const int64_t peer = members[position];
    double out = 0, in = 0;
    for (int64_t source : mine) out += chunk * chunks.at(source, peer);
    for (int64_t source : members) in += chunk * chunks.at(source, member);
    step.sends.push_back({peer, out});
    step.recvs.push_back({peer, in});
  }
  return step;
}

}  // namespace

std::vector<CollectiveStep> collective_steps(OpKind kind, Algorithm algorithm, double bytes,
                                             const GroupLayout& layout, int64_t member,
                                             bool phase_flows, const ChunkScale& chunks) {
  int64_t n = int64_t(layout.node_of.size());
  std::vector<CollectiveStep> out;
  if (n <= 1) return out;
  std::vector<int64_t> everyone(n);
  for (int64_t i = 0; i < n; ++i) everyone[i] = i;
  switch (algorithm) {
    case Algorithm::none:
      return out;
    case Algorithm::pairwise: {  // one step: a chunk to and from every other member, all at once
      if (layout.rail_staged) {
        out.push_back(rail_staged_step(bytes / double(n), layout, member, chunks));
        return out;
      }
      CollectiveStep step;
      for (int64_t k = 1; k < n; ++k) {
        const int64_t to = (member + k) % n, from = (member + n - k) % n;
        step.sends.push_back({to, bytes / double(n) * chunks.at(member, to)});
        step.recvs.push_back({from, bytes / double(n) * chunks.at(from, member)});
      }
      out.push_back(step);
      return out;
    }
    case Algorithm::ring:
      append_ring_phase(out, everyone, member, ring_steps(kind, n), bytes / double(n), phase_flows);
      return out;
    case Algorithm::tree: {
      STEPCAST_CHECK(kind == OpKind::all_reduce, "tree is an all_reduce algorithm");
      int64_t depth = tree_depth(n);
      // Reduce up: in round k, members at odd multiples of 2^k send to member − 2^k.
      for (int64_t k = 0; k < depth; ++k) {
        int64_t span = int64_t(1) << k;
        CollectiveStep step;
        if (member % (2 * span) == span) step.sends.push_back({member - span, bytes});
        else if (member % (2 * span) == 0 && member + span < n) step.recvs.push_back({member + span, bytes});
        if (!step.sends.empty() || !step.recvs.empty()) out.push_back(step);
      }
      // Broadcast down, mirrored.
      for (int64_t k = depth - 1; k >= 0; --k) {
        int64_t span = int64_t(1) << k;
        CollectiveStep step;
        if (member % (2 * span) == 0 && member + span < n) step.sends.push_back({member + span, bytes});
        else if (member % (2 * span) == span) step.recvs.push_back({member - span, bytes});
        if (!step.sends.empty() || !step.recvs.empty()) out.push_back(step);
      }
      return out;
    }
    case Algorithm::hierarchical: {
      // Local group: members on my node (in member order); cross group: members with my local
      // index on every node.
      std::map<int64_t, std::vector<int64_t>> by_node;
      for (int64_t i = 0; i < n; ++i) by_node[layout.node_of[i]].push_back(i);
      const std::vector<int64_t>& local = by_node[layout.node_of[member]];
      int64_t local_index = 0;
      while (local[local_index] != member) ++local_index;
      int64_t k = int64_t(local.size());
      std::vector<int64_t> cross;
      for (const auto& [node, members] : by_node) {
        STEPCAST_CHECK(int64_t(members.size()) == k, "hierarchical needs as many members per node");
        cross.push_back(members[local_index]);
      }
      int64_t nodes = int64_t(cross.size());
      int64_t cross_position = 0;
      while (cross[cross_position] != member) ++cross_position;
      double shard = bytes / double(k);
      if (kind == OpKind::all_reduce || kind == OpKind::reduce_scatter) {
        append_ring_phase(out, local, local_index, k - 1, bytes / double(k), phase_flows);
      }
      if (kind == OpKind::all_gather) {
        append_ring_phase(out, cross, cross_position, nodes - 1, shard / double(nodes), phase_flows);
      } else {
        append_ring_phase(out, cross, cross_position, ring_steps(kind, nodes),
                          shard / double(nodes), phase_flows);
      }
      if (kind == OpKind::all_reduce || kind == OpKind::all_gather) {
        append_ring_phase(out, local, local_index, k - 1, bytes / double(k), phase_flows);
      }
      return out;
    }
  }
  return out;
}

}  // namespace stepcast
