// Names of the StepProgram's enums (equal to their JSON strings) and small queries.
#include "program.hpp"

#include <algorithm>

#include "errors.hpp"
#include "moe.hpp"

namespace stepcast {

const char* to_string(OpKind kind) {
  switch (kind) {
    case OpKind::embedding: return "embedding";
    case OpKind::norm: return "norm";
    case OpKind::gemm: return "gemm";
    case OpKind::attention: return "attention";
    case OpKind::activation: return "activation";
    case OpKind::loss: return "loss";
    case OpKind::optimizer_step: return "optimizer_step";
    case OpKind::all_reduce: return "all_reduce";
    case OpKind::reduce_scatter: return "reduce_scatter";
    case OpKind::all_gather: return "all_gather";
    case OpKind::all_to_all: return "all_to_all";
    case OpKind::broadcast: return "broadcast";
    case OpKind::send: return "send";
    case OpKind::recv: return "recv";
    case OpKind::alloc: return "alloc";
    case OpKind::free: return "free";
  }
  return "?";
}

const char* to_string(Stream stream) {
  switch (stream) {
    case Stream::compute: return "compute";
    case Stream::comm: return "comm";
    case Stream::p2p: return "p2p";
  }
  return "?";
}

const char* to_string(Phase phase) {
  switch (phase) {
    case Phase::forward: return "forward";
    case Phase::backward: return "backward";
    case Phase::recompute: return "recompute";
    case Phase::optimizer: return "optimizer";
  }
  return "?";
}

const char* to_string(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::none: return "none";
    case Algorithm::ring: return "ring";
    case Algorithm::tree: return "tree";
    case Algorithm::hierarchical: return "hierarchical";
    case Algorithm::pairwise: return "pairwise";
  }
  return "?";
}

const char* to_string(Peer peer) {
  switch (peer) {
    case Peer::none: return "none";
    case Peer::pp_next: return "pp_next";
    case Peer::pp_prev: return "pp_prev";
    case Peer::cp_next: return "cp_next";
    case Peer::cp_prev: return "cp_prev";
    case Peer::ps_server: return "ps_server";
    case Peer::ps_worker: return "ps_worker";
  }
  return "?";
}

int64_t peer_rank(const RankGrid& grid, int64_t rank, Peer peer) {
  switch (peer) {
    case Peer::cp_next: return grid.cp_next(rank);
    case Peer::cp_prev: return grid.cp_prev(rank);
    case Peer::pp_next:
    case Peer::pp_prev: {
      RankCoord c = grid.coord(rank);
      const int64_t pp = grid.pp_size();
      c.pp = peer == Peer::pp_next ? (c.pp + 1) % pp : (c.pp + pp - 1) % pp;
      return grid.rank(c);
    }
    case Peer::ps_server:
    case Peer::ps_worker:
    case Peer::none: break;
  }
  STEPCAST_CHECK(false, "peer_rank: an op without a peer");
  return -1;
}

const char* to_string(BufferClass c) {
  switch (c) {
    case BufferClass::weights: return "weights";
    case BufferClass::grads: return "grads";
    case BufferClass::optimizer: return "optimizer";
    case BufferClass::activations: return "activations";
    case BufferClass::workspace: return "workspace";
    case BufferClass::comm: return "comm";
  }
  return "?";
}

bool is_compute(OpKind kind) { return kind <= OpKind::optimizer_step; }
bool is_collective(OpKind kind) { return kind >= OpKind::all_reduce && kind <= OpKind::broadcast; }
bool is_p2p(OpKind kind) { return kind == OpKind::send || kind == OpKind::recv; }
const char* comm_scratch_prefix() { return "comm."; }
bool is_comm_scratch(const std::string& buffer) { return buffer.rfind(comm_scratch_prefix(), 0) == 0; }

bool is_stale_grads(const std::string& buffer) { return buffer.rfind("stale_grads", 0) == 0; }

bool is_checkpointed_state(const Op& alloc) {
  if (alloc.kind != OpKind::alloc || !alloc.persistent) return false;
  return alloc.buffer_class == BufferClass::weights || alloc.buffer_class == BufferClass::optimizer ||
         is_stale_grads(alloc.buffer);
}

namespace {
const char* data_suffix(DataBuffer what) {
  switch (what) {
    case DataBuffer::tokens: return ".data.tokens";
    case DataBuffer::targets: return ".data.targets";
    case DataBuffer::samples: return ".data.samples";
    case DataBuffer::none: break;
  }
  fail_invariant(__FILE__, __LINE__, "no name for DataBuffer::none");
}
}  // namespace

std::string data_buffer_name(int32_t microbatch, DataBuffer what) {
  return "mb" + std::to_string(microbatch) + data_suffix(what);
}

DataBuffer data_buffer_kind(const std::string& buffer) {
  if (buffer.rfind("mb", 0) != 0) return DataBuffer::none;
  for (DataBuffer what : {DataBuffer::tokens, DataBuffer::targets, DataBuffer::samples}) {
    std::string tail = data_suffix(what);
    if (buffer.size() > tail.size() &&
        buffer.compare(buffer.size() - tail.size(), tail.size(), tail) == 0) {
      return what;
    }
  }
  return DataBuffer::none;
}

int32_t data_buffer_microbatch(const std::string& buffer) {
  STEPCAST_CHECK(data_buffer_kind(buffer) != DataBuffer::none, buffer + " is not a data buffer");
  return int32_t(std::stol(buffer.substr(2, buffer.find('.') - 2)));
}

std::vector<int64_t> ProgramMoe::routing_counts(int64_t microbatch, int64_t layer) const {
  const bool replay = layer >= 0 && size_t(layer) < routing_samples.size() && !routing_samples[size_t(layer)].empty();
  return replay ? replay_routing(routing_samples[size_t(layer)], routed_tokens, routing_seed, microbatch, layer)
                : draw_routing(shares(layer), routed_tokens, routing_seed, microbatch, layer);
}

const Role& StepProgram::role_of_rank(int64_t rank) const {
  if (rank >= world_size()) {  // a parameter server
    const size_t index = class_microbatches().size() * size_t(pp_size) + size_t(rank - world_size());
    STEPCAST_CHECK(rank < ranks() && index < roles.size(), "rank outside the program's roles");
    return roles[index];
  }
  RankCoord at = grid().coord(rank);
  int64_t index = at.pp;
  if (!replica_class.empty()) index += int64_t(replica_class.at(size_t(at.dp))) * pp_size;
  STEPCAST_CHECK(index < int64_t(roles.size()), "rank outside the program's roles");
  return roles[size_t(index)];
}

std::vector<int64_t> StepProgram::class_microbatches() const {
  std::vector<int64_t> counts;
  for (int64_t m : microbatches_per_replica) {
    if (std::find(counts.begin(), counts.end(), m) == counts.end()) counts.push_back(m);
  }
  if (counts.empty()) counts.push_back(num_microbatches);
  return counts;
}

void StepProgram::index_replica_classes() {
  replica_class.clear();
  const std::vector<int64_t> counts = class_microbatches();
  for (int64_t m : microbatches_per_replica) {
    replica_class.push_back(int32_t(std::find(counts.begin(), counts.end(), m) - counts.begin()));
  }
}

}  // namespace stepcast
