// DeepSpeed's config for a plan; see deepspeed_export.hpp. Keys: train_batch_size,
// train_micro_batch_size_per_gpu, gradient_accumulation_steps (train_batch_size = micro ·
// accumulation · data-parallel ranks), bf16 / fp16 {enabled}, communication_data_type,
// zero_optimization {stage, overlap_comm, contiguous_gradients, reduce_scatter,
// reduce_bucket_size (elements), mics_shard_size} (deepspeed/runtime/zero/config.py,
// DeepSpeedZeroConfig).
#include "deepspeed_export.hpp"

#include <sstream>

namespace stepcast {

DeepSpeedConfig deepspeed_config(const Plan& p, const ModelConfig& model) {
  DeepSpeedConfig out;
  auto cannot = [&](const std::string& why) {
    out.runnable = false;
    out.notes.push_back("DeepSpeed cannot run this plan as simulated: " + why);
  };
  Json& c = out.config;
  c["train_batch_size"] = p.global_batch_size;
  c["train_micro_batch_size_per_gpu"] = p.micro_batch_size;
  c["gradient_accumulation_steps"] = p.num_microbatches();
  if (p.param_dtype == Dtype::bf16) c["bf16"] = {{"enabled", true}};
  if (p.param_dtype == Dtype::fp16) c["fp16"] = {{"enabled", true}};
  if (p.param_dtype != Dtype::bf16 && p.param_dtype != Dtype::fp16 && p.param_dtype != Dtype::fp32) {
    cannot(std::string("weights in ") + to_string(p.param_dtype));
  }
  if (p.grad_dtype == Dtype::fp32 && p.param_dtype != Dtype::fp32) c["communication_data_type"] = "fp32";
  Json zero = {{"stage", p.zero_stage}};
  if (p.zero_stage >= 1) {
    zero["overlap_comm"] = p.zero_stage >= 3 ? p.overlap_param_gather : p.overlap_grad_reduce;
    zero["contiguous_gradients"] = true;
  }
  if (p.zero_stage == 1 || p.zero_stage == 2) {
    zero["reduce_scatter"] = true;
    if (p.grad_bucket_bytes > 0) {
      zero["reduce_bucket_size"] = int64_t(p.grad_bucket_bytes / dtype_bytes(p.grad_dtype));
    }
  }
  if (p.num_distributed_optimizer_instances > 1) {
    if (p.zero_stage == 3) {
      // MiCS (every model state sharded inside groups of this many ranks, replicated across
      // them) was DeepSpeed's hybrid ZeRO-3 from 0.9.2; DeepSpeed 0.19.8 refuses the key.
      cannot("hybrid sharding: DeepSpeed 0.19.8 refuses zero_optimization.mics_shard_size (\"MiCS ZeRO-3 "
             "sharding has been removed\", deepspeedai/DeepSpeed#8489), so this config shards over all " +
             std::to_string(p.dp_size * p.cp_size) + " data-parallel ranks; a release that still has MiCS "
             "runs the plan with \"mics_shard_size\": " + std::to_string(p.dp_shard_size()) +
             " in zero_optimization");
    } else {
      cannot("hybrid sharding with ZeRO-" + std::to_string(p.zero_stage) +
             " (DeepSpeed's hierarchical sharding, MiCS, is ZeRO-3)");
    }
  }
  c["zero_optimization"] = zero;
  if (p.zero_stage == 0 && !p.overlap_grad_reduce && p.dp_size > 1) {
    out.notes.push_back("ZeRO-0: DeepSpeed reduces gradients after the backward pass, in buckets");
  }
  // What the config does not hold: the launch gives it.
  if (p.tp_size > 1 || p.pp_size > 1) {
    std::ostringstream why;
    why << "tensor parallelism " << p.tp_size << " and pipeline parallelism " << p.pp_size
        << " are not config keys: launch Megatron-DeepSpeed with --tensor-model-parallel-size " << p.tp_size
        << " --pipeline-model-parallel-size " << p.pp_size
        << " (a data-parallel world of world / (tp · pp) = " << p.dp_size * p.cp_size << ")";
    out.notes.push_back(why.str());
  }
  // deepspeed/runtime/pipe/engine.py: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism".
  if (p.pp_size > 1 && p.zero_stage >= 2) cannot("ZeRO-" + std::to_string(p.zero_stage) + " with pipeline parallelism");
  if (p.unequal_microbatches()) {
    cannot("microbatches_per_replica (unequal data-parallel replicas): DeepSpeed gives every replica "
           "train_batch_size / (train_micro_batch_size_per_gpu · data-parallel size) microbatches");
  }
  if (p.async_dp()) cannot("data_parallel_mode async: DeepSpeed's data parallelism is synchronous");
  if (p.pp_size > 1 && p.schedule != ScheduleKind::one_f_one_b) {
    cannot(std::string("the ") + to_string(p.schedule) + " schedule (DeepSpeed's PipelineEngine runs 1F1B)");
  }
  if (p.cp_size > 1) {
    if (p.cp_comm_type == CpCommType::a2a) {
      out.notes.push_back("context parallelism a2a is DeepSpeed-Ulysses: sequence_parallel_size " +
                          std::to_string(p.cp_size) + " in the model code's DistributedAttention");
    } else {
      cannot("context parallelism over a K/V ring or gather (DeepSpeed's sequence parallelism is Ulysses, a2a)");
    }
  }
  if (p.fp8.enabled()) cannot("FP8 (Transformer Engine's modules in the model code; no DeepSpeed config key)");
  if (model.is_moe()) {
    out.notes.push_back("experts: DeepSpeed-MoE's ep_size " + std::to_string(p.moe.ep_size) + " in the model code");
  }
  out.notes.push_back(std::string("recompute ") + to_string(p.recompute) +
                      ": the model code's activation checkpointing (Megatron-DeepSpeed --recompute-*), not this file");
  return out;
}

}  // namespace stepcast
