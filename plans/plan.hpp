// A parallelization plan: how one training step of a model is split over devices.
// Names are Megatron's (tp_size, pp_size, dp_size, micro_batch_size, ...); defaults are
// Megatron's and are written into every output's resolved inputs. validate_plan checks a plan
// against a model and topology and throws InputError naming the file, key, value and what is valid.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fp8.hpp"
#include "json_input.hpp"
#include "model.hpp"
#include "moe.hpp"
#include "schedule.hpp"
#include "topology.hpp"

namespace stepcast {

enum class RecomputeKind { none, selective, full };
enum class AttentionImpl { materialized, flash };
// How context-parallel ranks exchange keys and values (Megatron's --cp-comm-type): p2p, a ring
// of K/V blocks overlapped with the attention blocks they feed; allgather, K/V gathered before
// attention and their gradients reduce-scattered after; a2a (DeepSpeed-Ulysses), q, k and v
// all-to-all exchanged so that each cp rank holds the whole sequence for 1/cp of the heads, and the
// attention output back.
enum class CpCommType { p2p, all_gather, a2a };
const char* to_string(CpCommType kind);
const char* to_string(ScheduleKind kind);  // "gpipe", "1f1b", "interleaved_1f1b"
const char* to_string(RecomputeKind kind);
const char* to_string(AttentionImpl kind);

struct Plan {
  std::string name;
  std::string file;
  int64_t tp_size = 1;
  int64_t pp_size = 1;
  int64_t dp_size = 1;
  // dp_size absent from the plan file: world / (tp·pp·cp), as Megatron-LM derives it. The world
  // is the topology's devices (validate_plan) unless resolve_dp_size gave another first;
  // dp_size_world is the world it came from (0: not resolved yet).
  bool dp_size_derived = false;
  int64_t dp_size_world = 0;
  bool global_batch_size_derived = false;  // absent: micro_batch_size · dp_size, once dp is known
  // Context parallelism (Megatron's context_parallel_size): cp ranks split every sequence into
  // 2·cp chunks, rank i holding chunks i and 2·cp−1−i (causal load balancing).
  int64_t cp_size = 1;
  CpCommType cp_comm_type = CpCommType::p2p;
  int zero_stage = 0;
  // Hybrid sharding (HSDP; Megatron's --num-distributed-optimizer-instances): ZeRO shards over
  // blocks of dp_size / instances consecutive dp ranks, and the blocks hold replicas whose
  // gradient shards are all-reduced across them. 1: shards over the whole dp group.
  int64_t num_distributed_optimizer_instances = 1;
  int64_t micro_batch_size = 1;
  int64_t global_batch_size = 1;
  // Microbatches of each data-parallel replica (plan microbatches_per_replica: dp_size entries
  // summing to global_batch_size / micro_batch_size), so that replicas on unequal devices finish
  // together (plan --heterogeneous). Empty: every replica runs global_batch_size /
  // (micro_batch_size · dp_size); validate_plan empties a list whose entries are all equal.
  std::vector<int64_t> microbatches_per_replica;
  ScheduleKind schedule = ScheduleKind::one_f_one_b;
  int64_t virtual_pp_size = 1;
  RecomputeKind recompute = RecomputeKind::none;
  bool sequence_parallel = false;
  Dtype param_dtype = Dtype::bf16;       // weights and activations
  Dtype grad_dtype = Dtype::fp32;        // gradient accumulation and reduction
  AttentionImpl attention_impl = AttentionImpl::materialized;
  // FP8 linear layers (Megatron-LM's fp8, fp8_recipe "delayed", fp8_amax_history_len,
  // fp8_amax_compute_algo, fp8_margin; fp8.hpp).
  Fp8Recipe fp8;
  // Mixture of experts (moe.hpp): expert and expert-tensor parallel sizes, top-k, capacity,
  // dispatcher, routing distribution; resolved against the model by validate_plan.
  MoePlan moe;
  double dropout = 0.1;                  // hidden and attention dropout probability
  bool overlap_grad_reduce = false;
  // Asynchronous data parallelism (plan data_parallel_mode "async", staleness k ≥ 1): each step's
  // gradient is all-reduced beside the next step's compute and applied k steps late (w_{t+1} =
  // w_t − update(g_{t−k}); no update in steps 0..k−1); ZeRO-0 or 1. 0: synchronous (the default).
  int64_t async_staleness = 0;
  // Parameter servers (plan parameter_servers S ≥ 1, with data_parallel_mode "async"): the dp
  // workers push each step's gradient to S server ranks, each holding 1/S of every parameter
  // group and its optimizer state, and pull the weights back, free-running under stale
  // synchronous parallelism — a worker starts step c once every worker has pushed step
  // c − async_staleness (parameter_server.hpp). 0: the workers reduce among themselves.
  int64_t parameter_servers = 0;
  bool overlap_param_gather = false;
  // Pipeline sends and receives run beside compute (true), or a stage's next compute waits until
  // its sends and receives are done, as Megatron-LM's batched p2p does (false). Megatron's rule is
  // the default: overlapped with the interleaved schedule only (--no-overlap-p2p-communication).
  bool overlap_p2p_comm = false;
  // Megatron-LM v2's --scatter-gather-tensors-in-pipeline (on by default in 2021, removed since):
  // a pipeline send carries this tp rank's 1/tp of the activation (split_tensor_into_1d_equal_chunks)
  // and the receiving stage all-gathers it over tp (gather_split_1d_tensor). Off by default.
  bool scatter_gather_tensors_in_pipeline = false;
  // Megatron-LM's --gradient-accumulation-fusion (its default): each weight-gradient GEMM adds into
  // the gradient buffer itself. False: the GEMM writes a fresh gradient for every microbatch after
  // the first and an elementwise add accumulates it (PyTorch autograd's AccumulateGrad, what 2021
  // Megatron-LM and `--no-gradient-accumulation-fusion` do): a read-read-write pass over the
  // gradients per microbatch, and the fresh gradient's memory while it lives. Sharded gradients
  // (ZeRO-2/3) always take a fresh per-microbatch gradient, so it changes nothing there.
  bool gradient_accumulation_fusion = true;
  // Megatron-LM's --cross-entropy-loss-fusion (off by default there): the loss in one pass over
  // the logits, as stepcast's executors compute it. False: Megatron's vocab-parallel cross entropy
  // as separate PyTorch ops (megatron/core/tensor_parallel/cross_entropy.py, and 2021's
  // megatron/mpu/cross_entropy.py): the logits cast to fp32, their max, the max subtracted, exp,
  // the sum, the division into the softmax, and backward the softmax scaled in place and cast
  // back; the loss ops then move those bytes (the executors compute the same loss either way).
  bool cross_entropy_loss_fusion = true;
  double grad_bucket_bytes = 0;          // resolved: Megatron's max(4e7, 1e6·dp) params × grad bytes
  std::vector<int64_t> layers_per_stage; // resolved: one entry per virtual stage (pp·vpp)
  std::string order = "tp-dp-pp";        // rank grid order, innermost first (cp after tp unless named)

  int64_t world_size() const { return tp_size * cp_size * pp_size * dp_size; }
  // The ranks gradients are reduced over (dp × cp) and a ZeRO shard is spread over (the dp_shard
  // group of rank_grid.hpp).
  int64_t dp_cp_size() const { return dp_size * cp_size; }
  int64_t dp_shard_size() const { return dp_cp_size() / num_distributed_optimizer_instances; }
  // Microbatches per replica; with unequal replicas the most any runs (microbatches_of_replica
  // gives each).
  int64_t num_microbatches() const;
  int64_t microbatches_of_replica(int64_t dp_rank) const;
  bool unequal_microbatches() const { return !microbatches_per_replica.empty(); }
  Dtype activation_dtype() const { return param_dtype; }
  bool async_dp() const { return async_staleness > 0; }  // either form
  bool parameter_server() const { return parameter_servers > 0; }
  // The bounded-delay form: gradients all-reduced among the workers, applied exactly k steps late.
  bool bounded_delay() const { return async_dp() && !parameter_server(); }
};

// Megatron-LM's: pipeline transfers overlap compute under the interleaved schedule only.
inline bool default_overlap_p2p_comm(ScheduleKind schedule) {
  return schedule == ScheduleKind::interleaved_1f1b;
}

// Reads a plan file (no cross-checks: those need the model and topology).
Plan load_plan(const std::string& path);
Plan parse_plan(const Json& json, const std::string& file);

// Sets a derived dp_size to world_size / (tp·pp·cp) (no-op when the file gave dp_size or it is
// resolved); `world` says where the world size comes from, for the error when tp·pp·cp does not
// divide it.
void resolve_dp_size(Plan& plan, int64_t world_size, const std::string& world);

// Where a derived dp_size's world comes from when not the topology's devices (a sweep point's ranks).
struct PlanWorld {
  int64_t size = 0;
  std::string from;
};

// Checks the plan against the model and topology and resolves defaults that depend on them
// (dp_size when derived, layers_per_stage, grad_bucket_bytes). Throws InputError for every invalid combination.
// Memory is not checked here (see memory.hpp).
void validate_plan(Plan& plan, const ModelConfig& model, const Topology& topology,
                   const PlanWorld& world = {});

Json plan_to_json(const Plan& plan);

}  // namespace stepcast
