// Collectives as pure functions: where a group's members sit (its shape over nodes), the α-β
// time of each algorithm on the topology, and the algorithm lowering records for a collective —
// chosen the way NCCL's tuner does, by taking the algorithm whose modelled time is smallest for
// this message size and group shape. Bus-bandwidth factors are nccl-tests' (busbw = algbw ·
// 2(n−1)/n for all_reduce, (n−1)/n for reduce_scatter and all_gather).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "program.hpp"
#include "rank_grid.hpp"
#include "topology.hpp"

namespace stepcast {

struct GroupShape {
  int64_t size = 1;            // members
  int64_t nodes = 1;           // distinct nodes spanned
  int64_t members_per_node = 1;  // size / nodes (groups of a regular grid are uniform)
};

// Shape of the group of `kind` containing `rank`, with rank r on node r / devices_per_node.
GroupShape group_shape(const RankGrid& grid, GroupKind kind, int64_t rank,
                       int64_t devices_per_node);

// Bandwidth (bytes/s per direction) and latency (s) of one step between two members: intra-node
// when the group stays in a node, otherwise the NIC path and its hops, by fabric kind:
//  - fat_tree, rail_optimized: a device's share of the node's NICs, derated by the leaf's
//    oversubscription; 2·nic_latency + (2·levels − 1)·switch_latency, the tree's top and back;
//  - torus: a device's share of min(node's NICs, one torus link) (a ring step crosses at least
//    one link, which the node's rail-aligned rings share); 2·nic_latency + h·link_latency with h
//    the mean dimension-order hop count over node pairs (Σ floor(d²/4)/d · N/(N − 1)): a ring of
//    neighbours pays less (1 hop a step), a pattern between far nodes more;
//  - dragonfly: a device's share of min(node's NICs, local link, global link) (the links a ring
//    over routers and groups crosses); latency of the longest minimal route, router – local –
//    router – global – router – local – router: 2·nic_latency + 4·switch_latency +
//    2·local_link_latency + global_link_latency (less where there is one group or one router
//    per group). Routes inside a group are shorter: an upper bound on the latency term.
struct LinkFigures {
  double intra_bandwidth_bytes_per_s = 0;
  double intra_latency_s = 0;
  double inter_bandwidth_bytes_per_s = 0;
  double inter_latency_s = 0;
  // all_to_all across nodes staged over NVLink to the destination's rail (rail_staged_all_to_all)
  bool rail_staged = false;
};
LinkFigures link_figures(const Topology& topology);

// NCCL (2.12 on, PXN, on by default) moves an all_to_all chunk for another node's device over
// NVLink to the device of its own node on the destination's rail, whose NIC sends it: the
// all_to_all's inter-node traffic stays on rails, one message per (node, destination) (NVIDIA,
// "Doubling all2all Performance with NVIDIA Collective Communication Library 2.12", 2022). True
// where the node's devices share NVLink (nvswitch, nvlink); MPI over PCIe or shared memory sends
// directly.
bool rail_staged_all_to_all(const Topology& topology);

// Modelled time of one collective of `bytes` payload per rank (the buffer size) with `algorithm`.
// ring: 2(n−1) steps for all_reduce, n−1 for reduce_scatter / all_gather, each at the slowest
// link the ring crosses; tree (all_reduce only): a binomial tree, reduce up then broadcast down,
// the whole message on each edge, 2·⌈log2 n⌉·(α + S/B) — what the simulator runs step by step,
// and the choice only small messages make (NCCL pipelines its trees; their large-message time
// is not modelled); hierarchical: intra-node reduce_scatter, inter-node ring on S/k per
// local rank (k NIC paths in parallel), intra-node all_gather; pairwise (all_to_all only): every
// member sends each other member 1/n of S at once, the (k−1)/n on its node over the intra-node
// link and the (n−k)/n elsewhere over its NIC share concurrently, α + the larger; rail-staged
// (links.rail_staged), the intra-node link also carries the (n−k)/n·(k−1)/k bound for other
// rails.
double collective_time_s(OpKind kind, Algorithm algorithm, double bytes, const GroupShape& shape,
                         const LinkFigures& links);

// NCCL's ring as its tuner models it, to transfer a measured table between systems and group
// shapes (collective_cost.hpp): every rank moves V = busbw factor · S (2(n−1)/n·S for
// all_reduce, (n−1)/n·S for reduce_scatter and all_gather) through its NVLink, and
// across nodes the rings (NCCL's channels) leave each node through all of the group's k members'
// NICs, V / k each; the two pipeline, so the time is the larger plus the ring's latency as the
// tuner counts it for its LL protocol: a base of 6.6 µs, 0.6 µs a step inside a node (1.8 times
// that once the group spans nodes) and 2.7 µs for each of the N crossings (the links' bandwidths,
// NCCL's latencies: a topology's latency_s is a wire's, where NCCL's steps are its protocol's).
// One member per node: the plain ring over the NICs. all_to_all: its pairwise time
// (collective_time_s).
double nccl_ring_time_s(OpKind kind, double bytes, const GroupShape& shape, const LinkFigures& links);
// NCCL's tree all_reduce as its tuner models it (src/graph/tuning.cc, ncclTopoTuneModel and
// ncclTopoGetAlgoTime): the bus volume of the ring at 1/0.92 of its bandwidth (the tuner's tree
// factor; its algorithm bandwidth is half the bus bandwidth, so the volume is 2S rather than
// 2(n−1)/n·S), times the tuner's correction at mid sizes (treeCorrectionFactor, Simple: 0.5 from
// 128 KiB to 2 MiB, 0.8 at 64 MiB, 1 from 512 MiB), and a
// latency that grows with the log of the nodes, 6.8 µs + 2·((k − 1)·intra + ⌊log2 N⌋·5.0 µs)
// (intra as the ring's), where the ring's grows with the ranks. Across nodes only.
double nccl_tree_time_s(double bytes, const GroupShape& shape, const LinkFigures& links);
// NCCL's own choice as its tuner makes it: an all_reduce across nodes takes the faster of ring
// and tree ("ring is superior in terms of peak bandwidth, tree in terms of base latency,
// especially as we scale", NCCL's maintainer, NVIDIA/nccl #790); everything else the ring. What
// a measured table is transferred by to other group shapes (collective_cost.hpp).
double nccl_time_s(OpKind kind, double bytes, const GroupShape& shape, const LinkFigures& links);

// The algorithm with the smallest modelled time among those the kind supports (all_reduce: ring,
// tree, hierarchical; reduce_scatter and all_gather: ring, hierarchical; all_to_all: pairwise;
// others: ring). Ties go to
// the earlier in that list. A group of one member gets Algorithm::none.
Algorithm choose_algorithm(OpKind kind, double bytes, const GroupShape& shape,
                           const LinkFigures& links);

// Elements of the staging scratch a host backend packs a collective's buffers into: one
// send and one receive segment of the largest piece a step exchanges — ring (all_reduce,
// reduce_scatter, all_gather): a chunk, ⌈E/n⌉; tree: the whole message, E; hierarchical: the
// intra-node chunk ⌈E/k⌉ (⌈E/nodes⌉ with one member per node). The executor runs a collective
// in segments of at most half this scratch, so any size is correct; this one needs no more
// than one segment per step (plus a few elements where ⌈⌉ of several buffers adds up).
int64_t collective_scratch_elements(OpKind kind, Algorithm algorithm, const GroupShape& shape,
                                    int64_t payload_elements);

// What an executor does around a collective besides the in-place transfer a profile's collective
// points time (exec/interpreter_comm.cpp): an all_gather with a separate input (a ZeRO-3 shard,
// a sequence-parallel chunk) first copies it to its place in the full buffer, a reduce_scatter
// with a separate output copies its chunk out after, and a gradient bucket's reduce_scatter
// with sharded gradients adds its chunk into the shard. Bytes of the copied part and of the
// added chunk: the payload over the group (op.bytes / group_size); 0 for the rest (all_reduce,
// all_to_all, the in-place param_gather and bucket, the MoE gathers, an op whose operands do not
// fit its signature).
struct CollectiveLocalWork {
  double copy_bytes = 0;
  double add_bytes = 0;
};
CollectiveLocalWork collective_local_work(const Op& op, int64_t group_size);

// Rounds of a binomial tree over `group_size` members: ⌈log2 n⌉.
int64_t tree_depth(int64_t group_size);

// nccl-tests' bus bandwidth factor for the kind: busbw = algbw · factor.
double bus_bandwidth_factor(OpKind kind, int64_t group_size);
// A profile's collective kind name ("all_reduce", …) as an op kind; nullopt for another name.
std::optional<OpKind> collective_kind(const std::string& name);

}  // namespace stepcast
