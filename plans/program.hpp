// The StepProgram: the ops of one training step, per role, that the simulator and the executor
// both interpret. A role is the op list shared by ranks that do the same work (one pipeline
// stage); groups and peers are relative (tp, dp, pp_next, ...) and resolved through the rank
// grid. `(rank, id)` joins prediction and measurement. Buffers come from alloc ops, so the
// memory of a rank is the walk over its role's alloc/free ops (memory.hpp). Plain data; the
// lowering that fills it is lower.hpp, the JSON text and program_sha256 are program_json.hpp.
#pragma once

#include <array>
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "buffer_name.hpp"
#include "fp8.hpp"
#include "json_input.hpp"
#include "op_shape.hpp"
#include "rank_grid.hpp"
#include "small_vector.hpp"
#include "topology.hpp"

namespace stepcast {

// Values equal their JSON strings.
enum class OpKind : uint8_t {
  embedding, norm, gemm, attention, activation, loss, optimizer_step,          // compute
  all_reduce, reduce_scatter, all_gather, all_to_all, broadcast, send, recv,  // communication
  alloc, free                                                                // memory
};
enum class Stream : uint8_t { compute, comm, p2p };
enum class Phase : uint8_t { forward, backward, recompute, optimizer };
// pairwise: all_to_all's exchange, every member sending each other member its chunk, all posted
// at once (NCCL's grouped send/recv).
enum class Algorithm : uint8_t { none, ring, tree, hierarchical, pairwise };
// Point-to-point peers: the next/previous pipeline stage (wrapping), or the next/previous rank of
// the context-parallel ring (rank_grid.hpp); with parameter servers (parameter_server.hpp), a
// worker's server (Op::server) and a server's worker (the one whose push it handles).
enum class Peer : uint8_t { none, pp_next, pp_prev, cp_next, cp_prev, ps_server, ps_worker };
// What an op computes within its kind; values equal their JSON strings ("" for none: alloc and
// free). The operands of each (kind, name, grad, pass) are its signature (op_signature.hpp).
enum class OpName : uint8_t {
  none,
  word, position_dropout,                                               // embedding
  input_norm, post_attn_norm, final_norm,                               // norm
  qkv, attn_out, mlp_up, mlp_gate, mlp_down, logits,                    // gemm
  score, softmax, dropout, value, flash,                                // attention
  rotary, gelu, swiglu, dropout_add, mlp_bias_grad, attn_bias_grad,     // activation
  cross_entropy_stats, cross_entropy,                                   // loss
  grad_accumulate, grad_norm, adamw,                                    // optimizer_step
  grad_stash,  // asynchronous data parallelism: a gradient copied into its next stale slot
  // parameter servers: a group's weights slice sent to a worker (param_pull), its gradient slice
  // and the gradient norm's square pushed to a server (grad_push, norm_push)
  param_pull, grad_push, norm_push,
  // collectives: what they reduce or gather (grad_norm also names its all_reduce)
  tp_embedding, tp_attn_out, tp_mlp_down, tp_mlp_up, tp_qkv, tp_logits, tp_cross_entropy,
  sp_embedding, sp_ln1, sp_ln2, sp_d_attn, sp_d_mlp, sp_final_norm,
  grad_bucket, tied_embedding_grads, sp_replicated_grads, param_gather, zero3_param_gather,
  replica_grads,  // hybrid sharding: a bucket's reduced shards all-reduced across the replicas
  // context parallelism: K and V packed from qkv (and their gradients added back), exchanged
  // around the cp ring or gathered (cp_kv), partial attention outputs merged (cp_merge)
  cp_kv_pack, cp_kv, cp_dkv, cp_merge,
  cp_score, cp_value,  // materialized attention over the gathered K/V
  // a2a (DeepSpeed-Ulysses): qkv and d_ctx re-laid from [this rank's tokens, all local heads] to
  // [the whole sequence, 1/cp of the heads] (split_heads, the all_to_all cp_a2a, join_seq), ctx and
  // d_qkv back (split_seq, cp_a2a, join_heads)
  cp_a2a_split_heads, cp_a2a_join_seq, cp_a2a_split_seq, cp_a2a_join_heads, cp_a2a,
  // FP8 (Transformer Engine's delayed scaling): an activation or gradient cast to FP8 with its
  // slot's scale (fp8_cast), a layer's linear weights cast once per step (fp8_weights), the
  // step's amax maximised over every rank (fp8_amax, an all_reduce) and the scales recomputed
  // from the amax history (fp8_scale_update); current scaling: a tensor's amax taken before its
  // cast (fp8_absmax), maximised over tp for a sequence-parallel input (fp8_amax of one slot);
  // on a device whose fp8_columnwise is transposed: a wgrad's FP8 input transposed for it
  // (fp8_transpose), a gradient cast to FP8 written row-wise and transposed at once
  // (fp8_cast_transpose, Transformer Engine's), and a layer's FP8 weight codes transposed for the
  // dgrad GEMMs (fp8_weights_transpose: once a step, or at each use under ZeRO-3). MXFP8 (fp8.hpp):
  // no scales, amax or transposes; fp8_cast writes x's row-wise MX copy, fp8_cast_transpose its
  // row-wise and column-wise copies, fp8_weights and fp8_weights_transpose a layer's row-wise and
  // column-wise copies, each from the high-precision values. fp8_param_gather (fp8.hpp): after the
  // optimizer step the FP8 weights cast from this rank's master shard (fp8_param_cast; under current
  // scaling after the shards' amax, fp8_param_absmax, maximised over the shard group by fp8_amax)
  fp8_cast, fp8_weights, fp8_amax, fp8_scale_update, fp8_absmax, fp8_transpose, fp8_cast_transpose,
  fp8_weights_transpose, fp8_param_absmax, fp8_param_cast,
  // mixture of experts (lower_moe.cpp): the router GEMM, the local experts' grouped GEMMs (batch =
  // local experts), softmax/top-k, the permutation into expert order and back (weighted by the
  // routing probabilities), the shared experts' output added, the load-balancing loss (its
  // per-expert token counts summed over the ranks that split the sequence: moe_aux_counts); the
  // dispatch and combine over the ep group, and the gather and scatter over the etp group; with
  // the allgather dispatcher the routing's top-k weights and experts gathered over ep and etp (and
  // the weights' gradient reduce_scattered back): moe_route_gather
  router, expert_gate, expert_up, expert_down, moe_route, moe_permute, moe_unpermute, moe_add, moe_aux_loss,
  moe_aux_counts, ep_dispatch, ep_combine, etp_gather, etp_scatter, moe_route_gather,
  pp_gather,  // scatter_gather_tensors_in_pipeline: a received 1/tp slice gathered over tp
  send, recv  // pipeline; keep last (parse_op_name walks up to it)
};
// The gradient a backward gemm computes: of its input (dgrad) or of its weight (wgrad).
enum class Grad : uint8_t { none, dgrad, wgrad };
// Memory classes of `stepcast memory` (memory_<class>_bytes).
enum class BufferClass : uint8_t { weights, grads, optimizer, activations, workspace, comm };

const char* to_string(OpKind kind);
const char* to_string(Stream stream);
const char* to_string(Phase phase);
const char* to_string(Algorithm algorithm);
const char* to_string(Peer peer);
const char* to_string(BufferClass buffer_class);
const char* to_string(OpName name);  // op_names.cpp
const char* to_string(Grad grad);
std::optional<OpName> parse_op_name(const std::string& text);  // nullopt for "" and unknown text
std::optional<Grad> parse_grad(const std::string& text);        // nullopt for "" and unknown text
std::string valid_op_names();  // "word, position_dropout, ..." for messages
std::ostream& operator<<(std::ostream& out, OpName name);
std::ostream& operator<<(std::ostream& out, Grad grad);
// The rank a send or receive of `rank` talks to.
int64_t peer_rank(const RankGrid& grid, int64_t rank, Peer peer);
bool is_compute(OpKind kind);
bool is_collective(OpKind kind);
bool is_p2p(OpKind kind);
// Communication staging the lowering gives a collective (its last output) and a send (its only
// output): comm-class buffers named with this prefix, which carry no payload of the model.
const char* comm_scratch_prefix();  // "comm."
bool is_comm_scratch(const std::string& buffer);
// Asynchronous data parallelism's persistent gradient slots, "stale_grads<slot>.GROUP".
bool is_stale_grads(const std::string& buffer);

struct Op;
// What a checkpoint saves of a rank: its persistent allocs of weights and optimizer state, and
// the stale gradients asynchronous data parallelism has still to apply.
bool is_checkpointed_state(const Op& alloc);

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
// Ordered for size (a 1T-parameter plan holds about 10^7 ops): the one-byte fields together.
// The largest tag of a send or receive: MPI's and the executors' tags are int.
inline constexpr int64_t kMaxTag = 2147483647;

struct Op {
  int32_t id = 0;
  OpKind kind = OpKind::gemm;
  Stream stream = Stream::compute;
  Phase phase = Phase::forward;
  OpName name = OpName::none;
  Grad grad = Grad::none;  // gemm in backward only
  // communication
  GroupKind group = GroupKind::world;
  Algorithm algorithm = Algorithm::none;
  Peer peer = Peer::none;
  // alloc / free
  BufferClass buffer_class = BufferClass::activations;
  Dtype dtype = Dtype::fp32;
  bool persistent = false;  // lives across steps: allocated once before the first step, never freed
  int32_t layer = -1;       // global layer index; -1 for embedding, loss, optimizer
  int32_t microbatch = -1;
  int32_t chunk = -1;       // model chunk (virtual stage index on this pipeline stage)
  // Context-parallel flash attention: the ring step whose K/V block the op reads (that of cp rank
  // (own − cp_step) mod cp_size); −1: every rank's block, gathered in cp rank order, or no cp.
  int32_t cp_step = -1;
  int32_t server = -1;  // Peer::ps_server: the server (0 … parameter_servers − 1)
  // FP8 (fp8.hpp): the slot of an fp8_cast's tensor, the first slot of an fp8_weights' layer, the
  // slots of an FP8 gemm's two FP8 operands (x or d_y, then w or d_y) — their scales are
  // fp8.scale[slot]; −1: not FP8. Under current scaling a grouped GEMM's, an expert buffer's cast
  // and amax, and an expert group's fp8_weights take local expert 0's slots, expert l's l after
  // (lower_context.hpp's Fp8SlotLayout).
  std::array<int32_t, 2> fp8_slots = {-1, -1};
  BufferName buffer;  // alloc / free
  OpShape shape;      // alloc (interned: op_shape.hpp)
  int32_t tag = -1;   // send / recv: 0 … kMaxTag
  SmallVector<int32_t, 4> deps;       // ids of ops in the same role that must finish first
  // Buffers read and written, in the order of the slots of the op's signature.
  SmallVector<BufferName, 4> inputs;
  SmallVector<BufferName, 2> outputs;
  // gemm: m×k · k×n (batch 1); attention: batch = b·heads, m = n = s, k = head_dim (under
  // context parallelism m = the local tokens, n = the key/value rows of the op's block).
  int64_t batch = 0, m = 0, n = 0, k = 0;
  double flops = 0;                   // floating-point operations executed
  double bytes = 0;                   // compute: bytes moved to/from memory; comm: payload bytes
};

// Streams order the ops an interpreter issues: compute and comm ops run one after the other in
// list order; pipeline sends and receives are posted in list order (like MPI's Isend/Irecv) and
// complete on their own; alloc and free are not ordered by their stream — an alloc has no deps
// and precedes its first user, a free happens once its deps (every user) finished.
struct Role {
  int32_t index = 0;
  int64_t pp_stage = 0;
  // Microbatches this role's schedule runs: the program's num_microbatches unless the replicas
  // are unequal (StepProgram::microbatches_per_replica), where each count has its roles.
  int64_t num_microbatches = 1;
  // A parameter server's role (0 … parameter_servers − 1; −1: a worker's). Its ops handle one
  // push: an interpreter runs them once per worker step pushed, Peer::ps_worker that worker, and
  // its sends alone once per worker as the run starts (the initial weights).
  int32_t server = -1;
  std::vector<int64_t> chunks_virtual_stages;  // virtual stage of each chunk: chunk·pp_size + stage
  std::vector<Op> ops;
};

// A mixture of experts' routing as the program carries it: what an interpreter needs to cost or
// run the expert ops without the plan (experts, top-k, capacity, the routing shares the simulator
// draws each (microbatch, layer)'s tokens per expert from, with the seed; moe.hpp's draw_routing).
struct ProgramMoe {
  int64_t num_experts = 0;        // 0: no experts
  int64_t top_k = 0;
  double capacity_factor = 0;     // 0: dropless
  std::vector<double> routing_shares;  // [num_experts], summing to 1: every MoE layer's
  uint64_t routing_seed = 1;
  // Token copies an expert block (the ep·etp ranks whose tokens meet at the experts) routes in one
  // (microbatch, layer): tokens a rank holds · top_k · ep · etp; and the rows an expert computes
  // at most under a capacity (its capacity from each of the ep·etp ranks; 0: dropless).
  int64_t routed_tokens = 0;
  int64_t expert_capacity_rows = 0;
  // Under a capacity, whether each expert computes its capacity rows padded (the plan's
  // moe_pad_expert_input_to_capacity) or the copies the routing keeps, at most the capacity.
  bool pad_to_capacity = false;
  // Under a capacity, which copies an expert keeps: those of highest routing weight (the plan's
  // moe_token_drop_policy "probs") or its first in token order ("position"; programs from before
  // the key). False dropless.
  bool drop_by_probs = false;
  // Where the routing differs by layer (a histogram with a row per MoE layer): [layer][num_experts]
  // over the model's layers, each MoE layer's shares (a dense layer's row empty); empty: every
  // layer draws from routing_shares.
  std::vector<std::vector<double>> layer_routing_shares;
  // Where a measured routing is replayed (a histogram file's "samples"): [layer][sample][expert],
  // the copies per expert of each microbatch a run routed (a dense layer's empty); empty: draws.
  std::vector<std::vector<std::vector<int64_t>>> routing_samples;
  // The token copies per expert of (microbatch, layer): replayed from the layer's samples where it
  // has them, else drawn from its shares (moe.hpp's replay_routing, draw_routing).
  std::vector<int64_t> routing_counts(int64_t microbatch, int64_t layer) const;
  // The shares layer `layer`'s draws come from.
  const std::vector<double>& shares(int64_t layer) const {
    const bool own = layer >= 0 && size_t(layer) < layer_routing_shares.size() &&
                     !layer_routing_shares[size_t(layer)].empty();
    return own ? layer_routing_shares[size_t(layer)] : routing_shares;
  }
};

struct StepProgram {
  static constexpr int kSchemaVersion = 2;  // 2: operands by slot, with dtype and shape
  Json model;      // resolved inputs
  Json topology;
  Json plan;
  int64_t tp_size = 1, dp_size = 1, pp_size = 1;
  int64_t cp_size = 1;        // context parallelism (grid.cp_size; absent in older programs: 1)
  int64_t dp_shard_size = 0;  // ranks a ZeRO shard spreads over: dp·cp (also written 0) unless hybrid
  int64_t ep_size = 1, etp_size = 1;  // expert and expert-tensor parallel sizes (rank_grid.hpp)
  ProgramMoe moe;
  std::string order = "tp-dp-pp";
  int64_t devices_per_node = 1;
  int64_t num_microbatches = 1;  // per replica; with unequal replicas, the most any runs
  // Unequal replicas (plan microbatches_per_replica): replica d runs microbatches_per_replica[d].
  // Each distinct count is a replica class (in order of first appearance) with roles of its own:
  // class c's stage p is roles[c · pp_size + p]; replica_class[d] is replica d's class (filled by
  // index_replica_classes). Empty: every replica runs num_microbatches and roles[p] is stage p.
  std::vector<int64_t> microbatches_per_replica;
  std::vector<int32_t> replica_class;
  int64_t tokens_per_step = 0;
  // Asynchronous data parallelism (plan data_parallel_mode "async"): the gradient of step t is
  // applied at the end of step t + async_staleness (the roles keep it in persistent stale_grads
  // buffers); an interpreter running steps skips the update (adamw) in steps 0..staleness−1 and
  // counts Adam's steps from the first update. 0: synchronous.
  int64_t async_staleness = 0;
  // Parameter servers (parameter_server.hpp): ranks world_size() … world_size() + parameter_servers
  // − 1, their roles after the workers' (roles[classes · pp_size + server]); async_staleness is
  // then stale synchronous parallelism's bound. 0: none.
  int64_t parameter_servers = 0;
  // FP8 recipe (off unless the plan has fp8); fp8_slots: the length of the persistent buffers
  // fp8.scale, fp8.amax [slots] and fp8.history [slots, amax_history_len] every rank holds
  // (kFp8SlotsPerLayer per transformer layer of the model; under current scaling also the slots of
  // the inputs kept for the backward, a microbatch's on the layer's m mod (the microbatches a
  // chunk holds at once), and with experts each local expert's, as lower_context.hpp's
  // Fp8SlotLayout lays them out). Under MXFP8 the slots only label each FP8 tensor kind: no
  // fp8.scale, fp8.amax or fp8.history buffer exists.
  Fp8Recipe fp8;
  int64_t fp8_slots = 0;
  std::vector<Role> roles;  // roles[p] is pipeline stage p (see microbatches_per_replica)
  std::string program_sha256;

  int64_t world_size() const { return tp_size * cp_size * dp_size * pp_size; }  // the workers
  int64_t ranks() const { return world_size() + parameter_servers; }              // and the servers
  const Role& role_of_rank(int64_t rank) const;
  // The microbatch count of each replica class, in class order ({num_microbatches} when equal).
  std::vector<int64_t> class_microbatches() const;
  // Fills replica_class from microbatches_per_replica (after lowering or reading).
  void index_replica_classes();
  RankGrid grid() const {
    return RankGrid(tp_size, dp_size, pp_size, order, dp_shard_size, cp_size, ep_size, etp_size);
  }
};

}  // namespace stepcast
