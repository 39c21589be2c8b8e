// The lowering of one pipeline stage's role (RoleLowering), internal to plans/: lower_role.cpp
// drives the step (parameter groups, persistent buffers, the schedule's chunk passes and their
// pipeline sends and receives), lower_embedding_loss.cpp emits the embedding and the loss,
// lower_grads.cpp the data-parallel gradient reduction in buckets, the optimizer step and the
// parameter gathers. Layer internals are in lower_layer.cpp.
#pragma once

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "lower_context.hpp"
#include "schedule.hpp"

namespace stepcast {

// Parameters that live together: one layer, the embeddings, the final norm, the output layer.
struct ParamGroup {
  std::string name;           // "L12", "embedding", "position", "final_norm", "output"
  int64_t elements = 0;       // per tensor-parallel rank, before ZeRO sharding
  int64_t sp_replicated = 0;  // elements whose gradients need a tp all_reduce under SP
  int64_t chunk = 0;
  bool tied_copy = false;     // output layer that is the last stage's copy of the embedding
  bool expert = false;        // a MoE layer's local experts ("X<l>"): sharded and reduced over edp
  // fp8_param_gather: the linear weights kept in FP8 only (in fp8w.<name>, gathered as codes); the
  // weights buffer holds the group's other elements, the optimizer state a master copy of all.
  int64_t fp8_elements = 0;
};

inline std::string expert_group_name(int64_t layer) {
  std::string name = "X";
  name += std::to_string(layer);
  return name;
}

inline std::string layer_group_name(int64_t layer) {
  std::string name = "L";  // appended, not "L" + ...: GCC 12 warns falsely (-Wrestrict) on that
  name += std::to_string(layer);
  return name;
}

class RoleLowering {
 public:
  RoleLowering(const LowerContext& ctx, Role& role, RoleDetail detail = RoleDetail::full)
      : c_(ctx), plan_(ctx.plan), role_(role), rb_(role, detail),
        e_(ctx, rb_, ctx.grid.rank(RankCoord{0, 0, role.pp_stage})) {}

  void lower();
  // A parameter server's role (plan parameter_servers): its slices of the weights and optimizer
  // state, and the handling of one worker's push (lower_ps.cpp).
  void lower_server(int32_t server);

 private:
  struct Bucket {
    std::vector<const ParamGroup*> groups;
    int32_t microbatch = -1;
    int64_t chunk = 0;
    double bytes = 0;
    bool last_pass = false;  // the chunk's last backward pass of the step: its gradients are final
    bool expert = false;     // expert groups' gradients, reduced over edp
  };

  void collect_param_groups();

  const ParamGroup& group(const std::string& name) const { return *group_index_.at(name); }

  // Elements of a group held by this rank for weights, gradients and optimizer state.
  const ShardLayout& shards_of(const ParamGroup& g) const { return g.expert ? c_.expert_shards : c_.shards; }
  // (fp8_param_gather: the tensors kept in the plan's dtype are whole on every rank, ZeRO-3's too.)
  int64_t weight_elements(const ParamGroup& g) const {
    if (g.fp8_elements > 0) return g.elements - g.fp8_elements;
    return shards_of(g).buffer_elements(ShardedState::weights, g.elements);
  }
  int64_t grad_elements(const ParamGroup& g) const {
    return shards_of(g).buffer_elements(ShardedState::grads, g.elements);
  }
  int64_t optimizer_elements(const ParamGroup& g) const {
    return shards_of(g).buffer_elements(ShardedState::optimizer, g.elements);
  }
  // Optimizer state per parameter: Adam's two moments, plus a master copy of the weights when
  // they are kept in a 16-bit dtype or in FP8 (fp8_param_gather); all in fp32 (fp64 for fp64 weights).
  int64_t optimizer_states(const ParamGroup& g) const { return dtype_bytes(c_.act) < 4 || g.fp8_elements > 0 ? 3 : 2; }
  Dtype optimizer_dtype() const { return c_.wide; }

  void alloc_persistent();

  double act_bytes(const std::vector<int64_t>& shape) const {
    double n = 1;
    for (auto v : shape) n *= double(v);
    return n * dtype_bytes(c_.act);
  }

  // A use of a group's gathered weights (and of their FP8 copies): ".mb<microbatch>.<phase>".
  static std::string use_suffix(const OpSite& at) {
    return ".mb" + std::to_string(at.microbatch) + "." + to_string(at.phase);
  }
  // ZeRO-3: gather a group's full weights for a use (once: a prefetched gather is found live);
  // other stages read the persistent buffer.
  std::string weights_for(const ParamGroup& g, const OpSite& at);
  // A layer's groups for one use under ZeRO-3: Megatron-FSDP's unit is the whole layer
  // (fsdp_unit_modules TransformerLayer, MoETransformerLayer), so a MoE layer's experts are
  // gathered with it, and with overlap_param_gather the next layer's groups, its experts too,
  // are prefetched behind them. Fills lp's weights and expert weights; returns the experts' group
  // (nullptr for a dense layer).
  const ParamGroup* layer_weights_for(const ParamGroup& layer, const OpSite& lat, const ParamGroup* next,
                                      LayerParams& lp);

  void release_weights(const std::string& name, Phase phase) {
    if (name.rfind("wfull.", 0) == 0) rb_.free(name, phase);
  }

  // ZeRO-2/3: a group's full gradient for one microbatch lives in a transient buffer until its
  // bucket is reduce_scattered into the persistent shard.
  // Without gradient_accumulation_fusion (unsharded gradients), microbatches after the first
  // write a part "gradmb.GROUP.mbN" instead, added in by accumulate_unfused after the pass that
  // wrote it.
  std::string grads_for(const ParamGroup& g, int32_t microbatch);
  void accumulate_grads(const OpSite& at, const ParamGroup& g, const std::string& part);
  void accumulate_unfused();

  // A send's staging copy (comm class): the tensor it sends may be freed and reused at once,
  // while the send completes only when the peer receives. It lives to the end of the step, where
  // the executor completes every send, so no rank waits for a peer before freeing memory.
  // Only on a host topology, where the CPU backend needs it. On GPUs the CUDA backend copies into
  // staging of its own on its p2p stream (runtime memory, not the program's; see README).
  std::string send_staging(int32_t mb, int64_t chunk, const char* pass, std::vector<int64_t> shape,
                           Phase phase);

  std::string tag_name(const char* what, int32_t mb, int64_t chunk) const {
    return "mb" + std::to_string(mb) + ".c" + std::to_string(chunk) + "." + what;
  }
  // Hybrid sharding: ZeRO shards over dp_shard and the replicas all-reduce; else over all of dp.
  bool hybrid() const { return plan_.num_distributed_optimizer_instances > 1; }
  // Gradients reduce (and ZeRO shards spread) over dp × cp: dp_cp, which is dp without cp.
  GroupKind shard_group() const {
    return hybrid() ? GroupKind::dp_shard : plan_.cp_size > 1 ? GroupKind::dp_cp : GroupKind::dp;
  }
  // ... and expert gradients over the ranks holding the same experts (cut as dp is under hybrid
  // sharding).
  GroupKind shard_group(bool expert) const {
    return !expert ? shard_group() : hybrid() ? GroupKind::edp_shard : GroupKind::edp;
  }
  // Ranks of a group's shard group: one where hybrid sharding leaves each expert block one rank
  // (edp = instances), whose replicas still all-reduce.
  int64_t shard_ranks(bool expert) const { return expert ? c_.grid.edp_shard_size() : c_.grid.dp_shard_size(); }
  GroupKind shard_group(const ParamGroup& g) const { return shard_group(g.expert); }
  int64_t p2p_tag(int32_t mb, int64_t sender_vs, bool backward) const {
    return (int64_t(mb) * c_.num_virtual_stages + sender_vs) * 2 + (backward ? 1 : 0);
  }
  std::vector<const ParamGroup*> layer_groups(int64_t vs) const;

  // A chunk's forward (backward) pass. Plain schedules receive its input (output gradient) first
  // and send its output (input gradient) last; with `exchanged` (the blocking interleaved
  // schedule) the input was received in an earlier round and the pass returns what it would send
  // ("" when nothing: the last virtual stage's forward, the first's backward).
  std::string emit_chunk_forward(int32_t mb, int64_t chunk, bool exchanged);
  std::string emit_chunk_backward(int32_t mb, int64_t chunk, bool last_for_chunk, bool exchanged);
  // Megatron-LM's blocking interleaved schedule: rounds of passes, each closed by one batch of
  // transfers (pipeline_exchange.hpp) that the next compute op waits for.
  void emit_exchanges(const ScheduleShape& shape, const std::vector<PassAction>& actions,
                      const std::map<int64_t, size_t>& last_backward);
  // A pipeline transfer of a chunk pass's activation (forward) or gradient (backward); a receive
  // allocates the buffer it fills and returns its name, a send frees what it sent.
  bool scatter_gather() const { return plan_.scatter_gather_tensors_in_pipeline && c_.t > 1; }
  void recv_activation(const OpSite& at, const std::string& name, Peer peer, int64_t tag);
  void send_activation(const OpSite& at, const std::string& name, Peer peer, int64_t tag, const char* pass);
  // Emits the tp all_gathers (pp_gather) of the slices received since the last call.
  void gather_received();
  struct PendingGather {
    OpSite at;
    std::string part, full;
  };
  std::vector<PendingGather> pending_gathers_;
  std::string recv_forward(int32_t mb, int64_t chunk);
  void send_forward(int32_t mb, int64_t chunk, const std::string& x);
  std::string recv_backward(int32_t mb, int64_t chunk);
  void send_backward(int32_t mb, int64_t chunk, const std::string& g);
  // FP8: a layer's FP8 weight copy, and the end-of-step amax reduction and scale update.
  static std::string fp8_weights_name(const ParamGroup& g) { return "fp8w." + g.name; }
  static std::string fp8_weights_t_name(const ParamGroup& g) { return fp8_transposed_copy_name(g.name); }
  void emit_fp8_scale_update();
  void emit_fp8_param_casts();
  // The FP8 copies of group g's weights `w` a pass of layer lat reads: w8, and on a device that
  // reads FP8 row-wise only w8t (its transpose, which the backward's dgrads read). Persistent
  // copies, cast at the step's first forward of the layer (Transformer Engine caches them); under
  // ZeRO-3 (weights sharded) transient ones cast from the gathered weights at every use and freed
  // with them (release_fp8_weights), as Transformer Engine casts weights it cannot cache
  // (Megatron-FSDP without fp8_param_gather: the parameters gathered in the plan's dtype).
  struct Fp8Copies {
    std::string w8, w8t;
    bool transient = false;  // ZeRO-3's, freed by release_fp8_weights
  };
  Fp8Copies fp8_weights_for(const OpSite& lat, const ParamGroup& g, const std::string& w, double linear);
  void release_fp8_weights(const Fp8Copies& copies, Phase phase);
  // fp8_param_gather under ZeRO-3: a layer's FP8 codes gathered from the shards for a use
  // ("fp8w.L3.mb0.forward"), or the live ones a prefetch gathered.
  std::string gather_fp8_params(const ParamGroup& g, const OpSite& at);
  void cast_fp8_weights(const OpSite& lat, const ParamGroup& g, const std::string& w, double linear,
                        const Fp8Copies& into);
  std::set<std::string> fp8_weights_cast_;  // groups whose persistent FP8 copy this step already cast

  // ---- embedding and loss (lower_embedding_loss.cpp) ----

  std::string emit_embedding_forward(const OpSite& at);
  void emit_embedding_backward(const OpSite& at, const std::string& g);
  // Final norm, logits (vocab-parallel) and cross-entropy. The tp ranks exchange per-token
  // (max, sum of exp, target logit) of their vocabulary shard with one all_gather, so the
  // loss needs no MAX reduction.
  void emit_loss_forward(const OpSite& at, const std::string& x);
  // Bytes the unfused loss moves (plan cross_entropy_loss_fusion false) over `logits` elements:
  // the forward's, the division's share of them (the last op under tp > 1), the backward's.
  struct UnfusedLossBytes {
    double forward = 0, division = 0, backward = 0;
  };
  UnfusedLossBytes unfused_loss_bytes(double logits) const;
  void emit_loss_backward(const OpSite& at, const std::string& g);
  std::string gather_sequence(const OpSite& at, const std::string& local_name,
                              const std::string& full_name, OpName what);

  const ParamGroup& output_group() const {
    return group(group_index_.count("output") ? "output" : "embedding");
  }
  std::string output_grads(int32_t mb) { return grads_for(output_group(), mb); }

  // ---- data-parallel gradient reduction, optimizer (lower_grads.cpp) ----

  void grads_ready(const ParamGroup& g, int32_t mb, int64_t chunk, bool last_pass);
  void flush_bucket();
  void emit_bucket(const Bucket& bucket, const std::vector<int32_t>& extra_deps);
  // Hybrid sharding: the shards of a bucket's final reduction, all-reduced across the replicas.
  void emit_replica_reduction(const Bucket& bucket);
  void emit_finalize_grads();
  // Whether g's SP-replicated gradients are all-reduced over tp in each microbatch's full
  // gradient (sharded gradients: grads_ready) rather than once in the step's (emit_finalize_grads).
  bool sp_reduced_per_microbatch(const ParamGroup& g) const;
  void emit_optimizer();
  // Asynchronous data parallelism (plan async_staleness k): slot j of a group's stale gradients
  // ("stale_grads<j>.GROUP", persistent) holds the gradient of step t − 1 − j at the start of
  // step t. The previous step's (slot 0) is all-reduced over dp as the step starts, beside its
  // compute; the optimizer applies slot k − 1; then each slot moves one up and this step's
  // gradient goes into slot 0 (grad_stash copies).
  std::string stale_grads(const ParamGroup& g, int64_t slot) const {
    return "stale_grads" + std::to_string(slot) + "." + g.name;
  }
  std::string optimizer_grads(const ParamGroup& g) const {
    return plan_.bounded_delay() ? stale_grads(g, plan_.async_staleness - 1) : "grads." + g.name;
  }
  void emit_async_reductions();
  void emit_async_stash();
  // Parameter servers (lower_ps.cpp): a worker's step starts by pulling every group's slices of
  // the weights from the servers and ends by pushing its gradient's norm and slices to them.
  bool ps() const { return plan_.parameter_server(); }
  static std::string reply_staging(const ParamGroup& g) { return "comm.ps_reply." + g.name; }
  void emit_param_pulls();
  void emit_pushes();
  void emit_param_gathers(Phase phase);

  const LowerContext& c_;
  const Plan& plan_;
  Role& role_;
  RoleBuilder rb_;
  OpEmitter e_;
  std::vector<ParamGroup> groups_;
  std::map<std::string, const ParamGroup*> group_index_;
  std::map<std::pair<int32_t, int64_t>, std::string> chunk_input_;
  std::vector<BufferName> send_staging_;  // freed at the end of the step
  std::map<int32_t, std::string> loss_input_;
  Bucket current_;
  Bucket current_expert_;  // expert groups fill buckets of their own
  std::vector<Bucket> deferred_buckets_;
  std::vector<Bucket> deferred_pass_buckets_;
  std::vector<std::pair<const ParamGroup*, int32_t>> pending_full_;
  std::vector<std::pair<const ParamGroup*, int32_t>> unfused_;  // parts of unfused accumulation
};

}  // namespace stepcast
