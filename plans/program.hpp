// The StepProgram: the ops of one training step, per role, that the simulator and the executor
// both interpret. A role is the op list shared by ranks that do the same work (one pipeline
// stage); groups and peers are relative (tp, dp, pp_next, ...) and resolved through the rank
// grid. `(rank, id)` joins prediction and measurement. Buffers come from alloc ops, so the
// memory of a rank is the walk over its role's alloc/free ops (memory.hpp). Plain data; the
// lowering that fills it is lower.hpp, the JSON text and program_sha256 are program_json.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "json_input.hpp"
#include "rank_grid.hpp"
#include "topology.hpp"

namespace stepcast {

// Values equal their JSON strings.
enum class OpKind {
  embedding, norm, gemm, attention, activation, loss, optimizer_step,          // compute
  all_reduce, reduce_scatter, all_gather, all_to_all, broadcast, send, recv,  // communication
  alloc, free                                                                // memory
};
enum class Stream { compute, comm, p2p };
enum class Phase { forward, backward, recompute, optimizer };
enum class Algorithm { none, ring, tree, hierarchical };
enum class Peer { none, pp_next, pp_prev };
// Memory classes of `stepcast memory` (memory_<class>_bytes).
enum class BufferClass { weights, grads, optimizer, activations, workspace, comm };

const char* to_string(OpKind kind);
const char* to_string(Stream stream);
const char* to_string(Phase phase);
const char* to_string(Algorithm algorithm);
const char* to_string(Peer peer);
const char* to_string(BufferClass buffer_class);
bool is_compute(OpKind kind);
bool is_collective(OpKind kind);
bool is_p2p(OpKind kind);
// Communication staging the lowering gives a collective (its last output) and a send (its only
// output): comm-class buffers named with this prefix, which carry no payload of the model.
const char* comm_scratch_prefix();  // "comm."
bool is_comm_scratch(const std::string& buffer);

// The data a microbatch reads, as buffers of the program: its token ids [s, b] int32 (on the
// ranks of the first virtual stage: embedding forward and backward read them), its targets
// [s, b] int32 (on the last: the loss reads them) and, with dropout, its samples' indices in the
// step [b] int64 (on every rank: the masks are keyed on them). Named "mb<K>.data.<what>"; an
// executor fills each at its alloc, as a data loader hands over a batch.
enum class DataBuffer { none, tokens, targets, samples };
std::string data_buffer_name(int32_t microbatch, DataBuffer what);
DataBuffer data_buffer_kind(const std::string& buffer);
int32_t data_buffer_microbatch(const std::string& buffer);  // K of "mb<K>.data.…"

// One op. Fields that do not apply to a kind keep their defaults and are omitted from JSON.
struct Op {
  int32_t id = 0;
  OpKind kind = OpKind::gemm;
  Stream stream = Stream::compute;
  Phase phase = Phase::forward;
  // What the op computes within its kind: gemm qkv|attn_out|mlp_up|mlp_gate|mlp_down|logits;
  // attention score|softmax|dropout|value|flash; activation gelu|swiglu|dropout_add;
  // norm input_norm|post_attn_norm|final_norm; optimizer_step grad_norm|adamw;
  // collectives: what is reduced (e.g. "tp_attn_out", "grad_bucket").
  std::string name;
  // gemm (backward only): "dgrad" or "wgrad".
  std::string grad;
  int32_t layer = -1;       // global layer index; -1 for embedding, loss, optimizer
  int32_t microbatch = -1;
  int32_t chunk = -1;       // model chunk (virtual stage index on this pipeline stage)
  std::vector<int32_t> deps;          // ids of ops in the same role that must finish first
  std::vector<std::string> inputs;    // buffers read
  std::vector<std::string> outputs;   // buffers written
  // gemm: m×k · k×n (batch 1); attention: batch = b·heads, m = n = s, k = head_dim.
  int64_t batch = 0, m = 0, n = 0, k = 0;
  double flops = 0;                   // floating-point operations executed
  double bytes = 0;                   // compute: bytes moved to/from memory; comm: payload bytes
  // communication
  GroupKind group = GroupKind::world;
  Algorithm algorithm = Algorithm::none;
  Peer peer = Peer::none;
  int64_t tag = -1;
  // alloc / free
  std::string buffer;
  BufferClass buffer_class = BufferClass::activations;
  Dtype dtype = Dtype::fp32;
  std::vector<int64_t> shape;
  bool persistent = false;  // lives across steps: allocated once before the first step, never freed
};

// Streams order the ops an interpreter issues: compute and comm ops run one after the other in
// list order; pipeline sends and receives are posted in list order (like MPI's Isend/Irecv) and
// complete on their own; alloc and free are not ordered by their stream — an alloc has no deps
// and precedes its first user, a free happens once its deps (every user) finished.
struct Role {
  int32_t index = 0;
  int64_t pp_stage = 0;
  std::vector<int64_t> chunks_virtual_stages;  // virtual stage of each chunk: chunk·pp_size + stage
  std::vector<Op> ops;
};

struct StepProgram {
  static constexpr int kSchemaVersion = 1;
  Json model;      // resolved inputs
  Json topology;
  Json plan;
  int64_t tp_size = 1, dp_size = 1, pp_size = 1;
  std::string order = "tp-dp-pp";
  int64_t devices_per_node = 1;
  int64_t num_microbatches = 1;
  int64_t tokens_per_step = 0;
  std::vector<Role> roles;  // roles[p] is pipeline stage p
  std::string program_sha256;

  int64_t world_size() const { return tp_size * dp_size * pp_size; }
  const Role& role_of_rank(int64_t rank) const;
  RankGrid grid() const { return RankGrid(tp_size, dp_size, pp_size, order); }
};

}  // namespace stepcast
