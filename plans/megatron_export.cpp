// Megatron-LM's launch line for a plan; see megatron_export.hpp.
// Citations are file:line in Megatron-LM at commit d98e8a64ddf3 (megatron/training/arguments.py
// unless a file is named). Flags without an add_argument are generated from dataclass fields by
// ArgumentGroupFactory (training/argument_utils.py:45): field `a_b` is `--a-b`, a bool field
// that defaults to True is `--no-a-b` / `--disable-a-b` (argument_utils.py:189-196), unless the
// field's argparse_meta names the flag.
#include "megatron_export.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "lower.hpp"

namespace stepcast {

namespace {

// The shortest decimal that reads back as `value` ("1e-05", "0.1").
std::string format_number(double value) {
  char text[40];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(text, sizeof text, "%.*g", digits, value);
    if (std::strtod(text, nullptr) == value) break;
  }
  return text;
}

struct Builder {
  MegatronArguments out;
  void flag(const std::string& name) { out.arguments.push_back(name); }
  void flag(const std::string& name, const std::string& value) {
    out.arguments.push_back(name + " " + value);
  }
  void flag(const std::string& name, int64_t value) { flag(name, std::to_string(value)); }
  void note(const std::string& text) { out.notes.push_back(text); }
  void cannot(const std::string& why) {
    out.runnable = false;
    out.notes.push_back("Megatron-LM cannot run this plan as simulated: " + why);
  }
};

// The transformer's shape: TransformerConfig fields (core/transformer/transformer_config.py).
void add_model_shape(Builder& b, const ModelConfig& m, const Plan& plan) {
  b.flag("--num-layers", m.num_hidden_layers);              // transformer_config.py:65
  b.flag("--hidden-size", m.hidden_size);                   // transformer_config.py:145
  b.flag("--num-attention-heads", m.num_attention_heads);   // transformer_config.py:148
  if (m.head_dim_override > 0 && m.head_dim_override * m.num_attention_heads != m.hidden_size) {
    // A head width of its own (Qwen3's 128 at hidden 2048 and 32 heads, GPT-OSS's 64): without
    // it Megatron takes hidden / heads (arguments.py:1331-1333) and builds another model.
    b.flag("--kv-channels", m.head_dim_override);            // transformer_config.py:184
  } else if (m.hidden_size % m.num_attention_heads != 0) {
    b.cannot("hidden_size " + std::to_string(m.hidden_size) + " is not a multiple of " +
             std::to_string(m.num_attention_heads) + " heads (arguments.py:1332)");
  }
  if (m.num_key_value_heads != m.num_attention_heads) {
    // num_query_groups is read only under --group-query-attention (argument_utils.py:330-333).
    b.flag("--group-query-attention");                      // arguments.py:2382
    b.flag("--num-query-groups", m.num_key_value_heads);    // transformer_config.py:175
  }
  b.flag("--ffn-hidden-size", m.intermediate_size);         // transformer_config.py:180
  // Gated SiLU MLP: activation silu, gated_linear_unit (argument_utils.py:314-316).
  if (m.mlp == MlpKind::swiglu) b.flag("--swiglu");         // arguments.py:2450
  b.flag("--normalization", m.norm == NormKind::rmsnorm ? "RMSNorm" : "LayerNorm");  // :256
  b.flag("--norm-epsilon", format_number(m.norm_eps));      // transformer_config.py:201-202
  if (m.position == PositionKind::rotary) {
    b.flag("--position-embedding-type", "rope");            // arguments.py:2397
    // --rotary-base is an int (arguments.py:2418).
    if (m.rope_theta == std::floor(m.rope_theta) && m.rope_theta >= 1 &&
        m.rope_theta <= double(std::numeric_limits<int32_t>::max())) {
      b.flag("--rotary-base", int64_t(m.rope_theta));
    } else {
      b.cannot("rope_theta " + format_number(m.rope_theta) +
               " is not an integer; --rotary-base takes one (arguments.py:2418)");
    }
  } else {
    b.flag("--position-embedding-type", "learned_absolute");
  }
  // Required (arguments.py:1314-1317) and at least seq_length (arguments.py:1354).
  b.flag("--max-position-embeddings", m.max_position_embeddings);  // arguments.py:2394
  b.flag("--seq-length", m.seq_length);                              // arguments.py:3305
  if (m.max_position_embeddings < m.seq_length) {
    b.cannot("max_position_embeddings " + std::to_string(m.max_position_embeddings) +
             " < seq_length " + std::to_string(m.seq_length) + " (arguments.py:1354)");
  }
  if (!m.tie_word_embeddings) b.flag("--untie-embeddings-and-output-weights");  // :2460
  if (!m.use_bias) b.flag("--disable-bias-linear");        // transformer_config.py:212-213
  // The NullTokenizer has exactly --vocab-size tokens (core/tokenizers/text/libraries/
  // null_tokenizer.py:60-62); Megatron pads to a multiple of make_vocab_size_divisible_by · tp
  // (core/tokenizers/utils/build_tokenizer.py:133-139), so 1 pads to tp as the lowering does.
  b.flag("--tokenizer-type", "NullTokenizer");              // training_config.py:698
  b.flag("--vocab-size", m.vocab_size);                     // training_config.py:679
  b.flag("--make-vocab-size-divisible-by", 1);              // arguments.py:2441
  b.note("vocabulary: the NullTokenizer's " + std::to_string(m.vocab_size) + " tokens, padded to " +
         std::to_string(padded_vocab_size(m, plan.tp_size)) +
         " as simulated; a real tokenizer (--tokenizer-type, --tokenizer-model) brings its own "
         "size instead");
  // The whole model Megatron builds from these flags, every expert.
  b.note("parameters: " + std::to_string(simulated_parameter_count(m, plan.tp_size)) +
         " as simulated (the padded vocabulary; every layer and expert)");
  b.flag("--hidden-dropout", format_number(plan.dropout));     // transformer_config.py:188
  b.flag("--attention-dropout", format_number(plan.dropout));  // transformer_config.py:191
  // attention_backend (transformer_config.py:151) is an AttnBackend taken by name
  // (argument_utils.py:109-119; core/transformer/enums.py:51-58). The default, auto, lets
  // Transformer Engine pick a fused kernel; unfused materializes the s×s scores as simulated.
  b.flag("--attention-backend", plan.attention_impl == AttentionImpl::flash ? "flash" : "unfused");
}

// Layers over pipeline stages, the schedule and its transfers.
void add_pipeline(Builder& b, const Plan& plan, const ModelConfig& m) {
  const int64_t L = m.num_hidden_layers, pp = plan.pp_size, vpp = plan.virtual_pp_size;
  // Megatron runs 1F1B with a pipeline, interleaved when vpp > 1, and without one each
  // microbatch's forward then its backward (core/pipeline_parallel/schedules.py:161-167).
  if (plan.unequal_microbatches()) {
    b.cannot("microbatches_per_replica (unequal data-parallel replicas): Megatron-LM gives every replica "
             "global_batch_size / (micro_batch_size · data-parallel size) microbatches");
  }
  if (plan.async_dp()) {
    b.cannot("data_parallel_mode async (gradients applied " + std::to_string(plan.async_staleness) +
             " step(s) late): Megatron-LM's data parallelism is synchronous");
  }
  if (plan.schedule == ScheduleKind::gpipe && (pp > 1 || plan.num_microbatches() > 1)) {
    b.cannot("schedule gpipe (every forward before any backward) is not one of Megatron-LM's "
             "schedules (core/pipeline_parallel/schedules.py:161-167)");
  }
  const bool interleaved = plan.schedule == ScheduleKind::interleaved_1f1b && vpp > 1;
  if (pp > 1) {
    const int64_t S = pp * vpp;
    // validate_plan resolves the split; a plan not validated gets its default.
    const std::vector<int64_t> layers = plan.layers_per_stage.empty()
                                            ? default_layers_per_stage(L, S)
                                            : plan.layers_per_stage;
    bool even = L % S == 0;
    for (int64_t n : layers) even = even && n == L / S;
    if (even && interleaved) {
      // arguments.py:966-975: L % pp == 0 and (L/pp) % layers_per_chunk == 0; vpp is the ratio.
      b.flag("--num-layers-per-virtual-pipeline-stage", L / S);
    } else if (!even) {
      // Without a layout Megatron splits evenly (arguments.py:997-998) or by a first/last stage
      // count; a layout string places every virtual stage's layers (arguments.py:941-952).
      b.flag("--pipeline-model-parallel-layout", "'" + megatron_pipeline_layout(layers) + "'");
    }
  }
  if (plan.scatter_gather_tensors_in_pipeline && pp > 1 && plan.tp_size > 1) {
    b.cannot("scatter_gather_tensors_in_pipeline: Megatron-LM v2's --scatter-gather-tensors-in-pipeline "
             "(on by default in 2021, commit 72e4230bb5) is gone from today's Megatron-LM (commit "
             "10e7b74597 removed the unused argument); sequence_parallel splits pipeline transfers "
             "over tp instead");
  }
  if (interleaved) {
    if (!plan.overlap_p2p_comm) {
      b.flag("--no-overlap-p2p-communication");  // arguments.py:3118
      if (pp <= 2) {
        b.cannot("the interleaved schedule with blocking pipeline transfers needs pp_size > 2 "
                 "(arguments.py:1005-1009)");
      }
    }
  } else if (plan.overlap_p2p_comm) {
    b.cannot("overlap_p2p_comm without the interleaved schedule: Megatron-LM turns the overlap "
             "off there (arguments.py:1010-1012) and has no flag to keep it");
  }
}

// ZeRO stages, hybrid sharding and the data-parallel overlaps.
void add_data_parallel(Builder& b, const Plan& plan) {
  if (plan.zero_stage == 1) {
    b.flag("--use-distributed-optimizer");  // arguments.py:3156
  } else if (plan.zero_stage >= 2) {
    // Megatron-FSDP (training/config/common_config.py:92): optim_grads shards optimizer state
    // and gradients (ZeRO-2), optim_grads_params parameters too (ZeRO-3) (arguments.py:3190).
    b.flag("--use-megatron-fsdp");
    b.flag("--data-parallel-sharding-strategy",
           plan.zero_stage == 2 ? "optim_grads" : "optim_grads_params");
    // Megatron-FSDP v1 (the default) runs on the distributed optimizer (arguments.py:1124-1135)
    // and saves only fsdp_dtensor checkpoints (arguments.py:1169-1170).
    b.flag("--use-distributed-optimizer");
    b.flag("--ckpt-format", "fsdp_dtensor");  // training_config.py:486
    b.note("environment: Megatron-FSDP needs CUDA_DEVICE_MAX_CONNECTIONS unset or > 1 "
           "(arguments.py:1166-1167)");
  }
  if (plan.num_distributed_optimizer_instances > 1) {
    // Shards over dp / instances ranks (core/parallel_state.py:922-929), replicas across them.
    // With Megatron-FSDP the same count selects HSDP (core/distributed/fsdp/
    // mcore_fsdp_adapter.py:346), whose outer group replicates (--outer-dp-sharding-strategy
    // no_shard, the default, arguments.py:3193) as the plan does.
    b.flag("--num-distributed-optimizer-instances", plan.num_distributed_optimizer_instances);
  }
  if (plan.overlap_grad_reduce) b.flag("--overlap-grad-reduce");  // arguments.py:3121
  if (!plan.gradient_accumulation_fusion) b.flag("--no-gradient-accumulation-fusion");  // arguments.py:2944
  if (plan.cross_entropy_loss_fusion) b.flag("--cross-entropy-loss-fusion");  // model_parallel_config.py:320, default False
  if (plan.overlap_param_gather) {
    b.flag("--overlap-param-gather");  // arguments.py:3148
    if (!plan.overlap_grad_reduce) {
      b.cannot("overlap_param_gather needs overlap_grad_reduce (arguments.py:1028-1029)");
    }
  }
  // The bucket: max(4e7, 1e6 · dp) parameters unless given, one bucket without overlap
  // (core/distributed/distributed_data_parallel.py:132-137).
  const double grad_bytes = dtype_bytes(plan.grad_dtype);
  const double default_bucket =
      std::max(40'000'000.0, 1'000'000.0 * double(plan.dp_size)) * grad_bytes;
  if (plan.overlap_grad_reduce && plan.grad_bucket_bytes != default_bucket) {
    b.flag("--ddp-bucket-size", int64_t(std::llround(plan.grad_bucket_bytes / grad_bytes)));  // :3125
  }
}

void add_precision_and_recompute(Builder& b, const Plan& plan) {
  // bf16 weights accumulate and reduce gradients in fp32 unless --grad-reduce-in-bf16
  // (arguments.py:1204-1216); fp32 weights have fp32 gradients.
  if (plan.param_dtype == Dtype::bf16 && plan.grad_dtype == Dtype::fp32) {
    b.flag("--bf16");  // model_parallel_config.py:180
  } else if (plan.param_dtype == Dtype::bf16 && plan.grad_dtype == Dtype::bf16) {
    b.flag("--bf16");
    b.flag("--grad-reduce-in-bf16");  // arguments.py:3053
  } else if (!(plan.param_dtype == Dtype::fp32 && plan.grad_dtype == Dtype::fp32)) {
    b.cannot(std::string("param_dtype ") + to_string(plan.param_dtype) + " with grad_dtype " +
             to_string(plan.grad_dtype) + " is not exported (bf16/fp32, bf16/bf16, fp32/fp32 are)");
  }
  // transformer_config.py:532-551; selective takes no method (arguments.py:1425-1428) and
  // recomputes the core attention, full uniform with 1 layer recomputes every layer alone.
  if (plan.recompute == RecomputeKind::selective) b.flag("--recompute-granularity", "selective");
  if (plan.recompute == RecomputeKind::full) {
    b.flag("--recompute-granularity", "full");
    b.flag("--recompute-method", "uniform");
    b.flag("--recompute-num-layers", 1);
  }
}

// Mixture of experts: the MoE layer lower_moe.cpp lowers, in MoELayer's flags (TransformerConfig
// fields, core/transformer/transformer_config.py, and ModelParallelConfig's expert sizes).
void add_moe(Builder& b, const Plan& plan, const ModelConfig& m) {
  if (!m.is_moe()) return;
  const MoePlan& moe = plan.moe;
  const int64_t L = m.num_hidden_layers, dense = m.first_k_dense_replace;
  b.flag("--num-experts", m.num_experts);                    // arguments.py:3518
  b.flag("--moe-ffn-hidden-size", m.moe_intermediate_size);  // transformer_config.py:740
  if (m.n_shared_experts > 0) {
    // One MLP n_shared · f_e wide on every token (transformer_config.py:701-704).
    b.flag("--moe-shared-expert-intermediate-size", m.n_shared_experts * m.moe_intermediate_size);  // :701
  }
  if (dense > 0) {
    // 0 dense, 1 MoE, per layer: a Python list expression of digits, [], (), + and *
    // (arguments.py:245-253, 327-350), num_layers long (core/models/gpt/gpt_layer_specs.py:651-656).
    b.flag("--moe-layer-freq", "'([0]*" + std::to_string(dense) + "+[1]*" + std::to_string(L - dense) + ")'");  // :3520
  }
  b.flag("--moe-router-topk", moe.top_k);  // transformer_config.py:760 (default 2)
  // stepcast routes softmax over all experts, then the top k with those probabilities as weights
  // (exec/cpu_kernels_moe.cpp): Megatron's pre-softmax router (core/transformer/moe/
  // moe_utils.py:901-907). With the model's norm_topk_prob the k weights are divided by their sum:
  // the softmax over the top k logits, Megatron's default (moe_utils.py:908-914), which refuses
  // k = 1 (transformer_config.py:2661-2669: one weight of 1 leaves the router no gradient).
  if (!m.norm_topk_prob) {
    b.flag("--moe-router-pre-softmax");  // transformer_config.py:799
  } else if (moe.top_k == 1) {
    b.cannot("norm_topk_prob with top-1 routing (every weight 1): Megatron-LM's router refuses top-1 without "
             "--moe-router-pre-softmax (transformer_config.py:2661-2669)");
  }
  // Switch's load-balancing loss (moe_utils.py:63), the default type; coefficient default 0.0.
  b.flag("--moe-router-load-balancing-type", "aux_loss");  // arguments.py:3532
  if (m.router_aux_loss_coef != 0) {
    b.flag("--moe-aux-loss-coeff", format_number(m.router_aux_loss_coef));  // arguments.py:3536
  }
  b.flag("--expert-model-parallel-size", moe.ep_size);   // model_parallel_config.py:127
  // Default tp_size (arguments.py:587-588), as validate_moe_plan resolves it.
  b.flag("--expert-tensor-parallel-size", moe.etp_size);  // model_parallel_config.py:130
  // Megatron's default is allgather (transformer_config.py:891), stepcast's alltoall: always said.
  b.flag("--moe-token-dispatcher-type", to_string(moe.dispatcher));
  // The local experts as grouped GEMMs (TEGroupedMLP); without the flag Megatron runs them one
  // after another (SequentialMLP, core/extensions/transformer_engine_spec_provider.py:74-110).
  b.flag("--moe-grouped-gemm");  // transformer_config.py:850
  if (!moe.dropless()) {
    // Capacity ceil(T·k/E · factor) of a rank's T routed tokens (moe_utils.py:248-263, router.py:
    // 793-801), as expert_capacity; with moe_pad_expert_input_to_capacity each expert's input
    // padded to it (moe_utils.py:1074-1076, for either dispatcher), else the copies kept.
    b.flag("--moe-expert-capacity-factor", format_number(moe.capacity_factor));  // transformer_config.py:917
    if (moe.pad_to_capacity) b.flag("--moe-pad-expert-input-to-capacity");      // transformer_config.py:921
    // Which copies a capacity drops: the plan's moe_token_drop_policy, Megatron's vocabulary
    // (transformer_config.py:932-936, moe_utils.py:1062-1070; default "probs": the most probable kept).
    b.flag("--moe-token-drop-policy", moe.drop_by_probs ? "probs" : "position");
    const int64_t s_local = m.seq_length / plan.cp_size / (plan.sequence_parallel ? plan.tp_size : 1);
    const int64_t tokens = s_local * plan.micro_batch_size;
    const int64_t capacity = expert_capacity(tokens * moe.top_k, m.num_experts, moe.capacity_factor);
    if (capacity > tokens) {
      b.note("capacity: " + std::to_string(capacity) + " rows per expert exceed a rank's " + std::to_string(tokens) +
             " tokens; Megatron-LM then pads each expert's input to the " + std::to_string(tokens) +
             " tokens (moe_utils.py:1058-1060, 1074-1076), not to the capacity simulated");
    }
  }
  if (plan.tp_size > 1 && !plan.sequence_parallel) {
    b.cannot("a mixture of experts with tensor parallelism needs --sequence-parallel in training "
             "(core/transformer/moe/moe_layer.py:636-640)");
  }
  if (m.use_bias && moe.etp_size > 1) {
    b.cannot("expert biases (use_bias) with expert_tensor_parallel_size " + std::to_string(moe.etp_size) +
             ": Megatron-LM has them with etp 1 only (transformer_config.py:2612-2615)");
  }
  // Without pp last, the experts' data-parallel size must be dp: tp·cp = ep·etp.
  if (plan.order == "tp-pp-dp" && plan.pp_size > 1 &&
      plan.tp_size * plan.cp_size != moe.ep_size * moe.etp_size) {
    b.cannot("rank order tp-pp-dp with pp_size > 1 needs ep · etp = tp · cp (the experts' data-parallel "
             "size equal to dp, core/parallel_state.py:898-902); the plan has ep · etp = " +
             std::to_string(moe.ep_size * moe.etp_size) + ", tp · cp = " + std::to_string(plan.tp_size * plan.cp_size));
  }
  if (moe.routing == RoutingKind::skew) {
    b.note("routing: simulated with expert loads drawn from a Zipf skew of exponent " + format_number(moe.skew) +
           " (moe_routing_seed " + std::to_string(moe.seed) + "); Megatron-LM's loads are what its learned "
           "router gives, which no flag sets");
  } else if (moe.routing == RoutingKind::histogram) {
    b.note("routing: simulated with expert loads drawn from the histogram " + moe.histogram_file +
           " (moe_routing_seed " + std::to_string(moe.seed) + "); Megatron-LM's loads are what its learned "
           "router gives, which no flag sets");
  }
}

}  // namespace

std::string megatron_pipeline_layout(const std::vector<int64_t>& layers_per_stage) {
  // Grammar of core/transformer/pipeline_parallel_layer_layout.py:283-321: '|' splits stages,
  // "x*n" repeats x; validate_layer_layout (:86-110) wants E first, L last, each once.
  std::string out;
  for (size_t i = 0; i < layers_per_stage.size(); ++i) {
    if (i > 0) out += "|";
    if (i == 0) out += "E";
    int64_t n = layers_per_stage[i];
    if (n == 1) out += "t";
    if (n > 1) out += "t*" + std::to_string(n);
    if (i + 1 == layers_per_stage.size()) out += "L";
  }
  return out;
}

MegatronArguments megatron_arguments(const Plan& plan, const ModelConfig& model) {
  Builder b;
  b.flag("--tensor-model-parallel-size", plan.tp_size);    // model_parallel_config.py:55
  b.flag("--pipeline-model-parallel-size", plan.pp_size);  // model_parallel_config.py:83
  // Megatron keeps sequence parallelism only with tp > 1 (arguments.py:1433-1439).
  if (plan.sequence_parallel) b.flag("--sequence-parallel");  // model_parallel_config.py:94
  if (plan.cp_size > 1) {
    b.flag("--context-parallel-size", plan.cp_size);             // model_parallel_config.py:100
    b.flag("--cp-comm-type", to_string(plan.cp_comm_type));      // arguments.py:3221 (p2p, allgather, a2a)
  }
  if (plan.fp8.enabled()) {  // Transformer Engine's FP8 (arguments.py, _add_transformer_engine_args)
    b.flag("--fp8-format", to_string(plan.fp8.format));
    b.flag("--fp8-recipe", to_string(plan.fp8.scaling));
    if (plan.fp8.blockwise() && !plan.fp8.power_of_two_scales) {  // an environment variable, no argument
      b.note("fp8_block_scales fp32: set NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1 in the launch environment "
             "(Transformer Engine's Float8BlockScaling reads it)");
    }
    if (plan.fp8.param_gather) b.flag("--fp8-param-gather");  // arguments.py:2016
    if (plan.fp8.delayed()) {
      b.flag("--fp8-amax-history-len", plan.fp8.amax_history_len);
      b.flag("--fp8-amax-compute-algo", to_string(plan.fp8.amax_compute_algo));
      b.flag("--fp8-margin", plan.fp8.margin);
    }
  }
  // Ranks: tp-cp-ep-dp-pp, or tp-cp-ep-pp-dp under --use-tp-pp-dp-mapping (initialize.py:395).
  if (plan.order == "tp-pp-dp") {
    b.flag("--use-tp-pp-dp-mapping");  // training/config/common_config.py:105
  } else if (plan.order != "tp-dp-pp") {
    b.cannot("rank order \"" + plan.order + "\": Megatron-LM lays ranks out tp-dp-pp, or "
             "tp-pp-dp with --use-tp-pp-dp-mapping (training/initialize.py:395)");
  }
  add_model_shape(b, model, plan);
  add_pipeline(b, plan, model);
  add_moe(b, plan, model);
  // global_batch_size % (micro_batch_size · dp) == 0 (core/num_microbatches_calculator.py:381).
  b.flag("--micro-batch-size", plan.micro_batch_size);    // training_config.py:11
  b.flag("--global-batch-size", plan.global_batch_size);  // training_config.py:15
  add_data_parallel(b, plan);
  add_precision_and_recompute(b, plan);
  if (plan.tp_size > 1 && plan.zero_stage < 2) {
    b.note("environment: CUDA_DEVICE_MAX_CONNECTIONS=1 with tensor parallelism before Blackwell "
           "(arguments.py:1476-1479)");
  }
  b.note("not part of the plan: data (--mock-data or --data-path), optimizer, learning rate, "
         "--train-iters");
  return b.out;
}

}  // namespace stepcast
