// TorchTitan's job config for a plan; see torchtitan_export.hpp. Keys and their values are
// JobConfig's fields (torchtitan/config/job_config.py of TorchTitan 0.2.2, the last release whose
// job config is a TOML file; 0.3 takes Python config functions): Training
// (local_batch_size, global_batch_size, seq_len, mixed_precision_param "bfloat16"|"float32",
// mixed_precision_reduce "float32"), Parallelism (data_parallel_replicate_degree,
// data_parallel_shard_degree, fsdp_reshard_after_forward "default"|"always"|"never",
// tensor_parallel_degree, pipeline_parallel_degree, module_fqns_per_model_part,
// pipeline_parallel_schedule, pipeline_parallel_microbatch_size, context_parallel_degree,
// context_parallel_rotate_method "allgather"|"alltoall", expert_parallel_degree),
// ActivationCheckpoint (mode "selective"|"full"|"none", selective_ac_option), Model (name,
// flavor, converters) and Float8 (recipe_name "tensorwise"|"rowwise"|"rowwise_with_gw_hp").
#include "torchtitan_export.hpp"

#include <sstream>

#include "lower.hpp"

namespace stepcast {

namespace {

// A TOML basic string.
std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

struct Builder {
  TorchTitanConfig out;
  std::ostringstream toml;
  void section(const std::string& name) { toml << (toml.tellp() > 0 ? "\n[" : "[") << name << "]\n"; }
  void key(const std::string& name, const std::string& value) { toml << name << " = " << value << "\n"; }
  void key(const std::string& name, int64_t value) { key(name, std::to_string(value)); }
  void note(const std::string& text) { out.notes.push_back(text); }
  void cannot(const std::string& why) {
    out.runnable = false;
    out.notes.push_back("TorchTitan cannot run this plan as simulated: " + why);
  }
};

// TorchTitan's llama3 flavors (torchtitan/models/llama3/__init__.py, llama3_configs): dim,
// n_layers, n_heads, n_kv_heads.
struct Flavor {
  const char* name;
  int64_t dim, layers, heads, kv_heads;
};
constexpr Flavor kLlama3Flavors[] = {{"8B", 4096, 32, 32, 8}, {"70B", 8192, 80, 64, 8}, {"405B", 16384, 126, 128, 8}};

void add_model(Builder& b, const ModelConfig& m) {
  b.section("model");
  b.key("name", toml_string("llama3"));
  const bool llama_shaped = m.norm == NormKind::rmsnorm && m.mlp == MlpKind::swiglu &&
                            m.position == PositionKind::rotary && !m.use_bias && !m.tie_word_embeddings;
  if (m.is_moe()) b.cannot("a mixture-of-experts model (" + m.name + "): TorchTitan's llama3 model is dense");
  if (!llama_shaped) {
    b.cannot(m.name + " is not Llama-shaped (TorchTitan's llama3: RMSNorm, SwiGLU, rotary positions, no biases, " +
             "untied embeddings)");
  }
  std::string flavor;
  for (const Flavor& f : kLlama3Flavors) {
    if (m.hidden_size == f.dim && m.num_hidden_layers == f.layers && m.num_attention_heads == f.heads &&
        m.num_key_value_heads == f.kv_heads) {
      flavor = f.name;
    }
  }
  if (flavor.empty()) {
    flavor = m.name;
    b.cannot("no llama3 flavor has " + m.name + "'s shape (dim " + std::to_string(m.hidden_size) + ", n_layers " +
             std::to_string(m.num_hidden_layers) + ", n_heads " + std::to_string(m.num_attention_heads) +
             ", n_kv_heads " + std::to_string(m.num_key_value_heads) + ", FFN " + std::to_string(m.intermediate_size) +
             ", vocabulary " + std::to_string(m.vocab_size) + "): register a flavor of that name with it");
  }
  b.key("flavor", toml_string(flavor));
}

void add_training(Builder& b, const Plan& p, const ModelConfig& m) {
  b.section("training");
  // local_batch_size is a dp rank's batch of one optimizer step's forward-backward: under
  // pipeline parallelism every microbatch of the step (split by pipeline_parallel_microbatch_size),
  // otherwise one microbatch, the rest gradient accumulation (global / (local · dp)).
  const int64_t local = p.pp_size > 1 ? p.micro_batch_size * p.num_microbatches() : p.micro_batch_size;
  b.key("local_batch_size", local);
  b.key("global_batch_size", p.global_batch_size);
  if (p.unequal_microbatches()) {
    b.cannot("microbatches_per_replica (unequal data-parallel replicas): TorchTitan splits the global batch "
             "evenly over the data-parallel ranks");
  }
  if (p.async_dp()) b.cannot("data_parallel_mode async: TorchTitan's data parallelism (FSDP2, DDP) is synchronous");
  b.key("seq_len", m.seq_length);
  if (p.param_dtype == Dtype::bf16 || p.param_dtype == Dtype::fp32) {
    b.key("mixed_precision_param", toml_string(p.param_dtype == Dtype::bf16 ? "bfloat16" : "float32"));
  } else {
    b.cannot(std::string("weights in ") + to_string(p.param_dtype) + " (mixed_precision_param is bfloat16 or float32)");
  }
  b.key("mixed_precision_reduce", toml_string("float32"));
  if (p.grad_dtype != Dtype::fp32) {
    b.cannot(std::string("gradients reduced in ") + to_string(p.grad_dtype) + " (mixed_precision_reduce is float32)");
  }
  if (p.dropout > 0) {
    std::ostringstream rate;
    rate << p.dropout;
    b.cannot("dropout " + rate.str() + " (the llama3 model has none)");
  }
}

void add_parallelism(Builder& b, const Plan& p) {
  b.section("parallelism");
  // Data parallelism: DDP (replicate) or FSDP2 (shard), HSDP both. TorchTitan shards parameters
  // over the dp_shard × cp mesh whenever either is above 1 (mixed_precision_param's doc).
  const int64_t shard = p.zero_stage >= 2 ? p.dp_shard_size() / p.cp_size : 1;
  const int64_t replicate = p.zero_stage >= 2 ? p.num_distributed_optimizer_instances : p.dp_size;
  b.key("data_parallel_replicate_degree", replicate);
  b.key("data_parallel_shard_degree", shard);
  if (p.zero_stage == 1) {
    b.cannot("ZeRO-1 (TorchTitan has DDP, which shards nothing, and FSDP2, which shards parameters too)");
  }
  if (p.zero_stage == 2) {
    b.key("fsdp_reshard_after_forward", toml_string("never"));
    b.note(
        "ZeRO-2 as FSDP2 with reshard_after_forward never: gradients and optimizer state sharded, "
        "parameters gathered once a step and kept until its backward ends");
  }
  if (p.zero_stage < 2 && p.cp_size > 1) {
    b.cannot("context parallelism with ZeRO-" + std::to_string(p.zero_stage) +
             " (TorchTitan applies FSDP over the cp ranks: ZeRO-3 there)");
  }
  if (p.zero_stage >= 2 && p.dp_shard_size() % p.cp_size != 0) {
    b.cannot("a sharding group that is not whole cp groups");
  }
  b.key("tensor_parallel_degree", p.tp_size);
  // TorchTitan's tensor parallelism shards the norms' activations over the sequence
  // (models/llama3/infra/parallelize.py apply_tp: SequenceParallel on attention_norm, ffn_norm).
  if (p.tp_size > 1 && !p.sequence_parallel) {
    b.cannot("tensor parallelism without sequence parallelism (TorchTitan's is always sequence-parallel)");
  }
  if (p.pp_size > 1) {
    b.key("pipeline_parallel_degree", p.pp_size);
    const char* schedule = p.schedule == ScheduleKind::gpipe         ? "GPipe"
                           : p.schedule == ScheduleKind::one_f_one_b ? "1F1B"
                                                                     : "Interleaved1F1B";
    b.key("pipeline_parallel_schedule", toml_string(schedule));
    // The modules of every (virtual) stage in model order, the embedding with the first and the
    // final norm and output layer with the last (the llama3 model's names, model.py).
    std::string parts;
    int64_t layer = 0;
    for (size_t s = 0; s < p.layers_per_stage.size(); ++s) {
      std::string part = s == 0 ? toml_string("tok_embeddings") : "";
      for (int64_t l = 0; l < p.layers_per_stage[s]; ++l, ++layer) {
        part += std::string(part.empty() ? "" : ", ") + toml_string("layers." + std::to_string(layer));
      }
      if (s + 1 == p.layers_per_stage.size()) part += ", " + toml_string("norm") + ", " + toml_string("output");
      parts += std::string(parts.empty() ? "" : ", ") + "[" + part + "]";
    }
    b.key("module_fqns_per_model_part", "[" + parts + "]");
    b.key("pipeline_parallel_microbatch_size", p.micro_batch_size);
    if (p.overlap_p2p_comm != (p.schedule == ScheduleKind::interleaved_1f1b)) {
      b.note("pipeline transfers: torch.distributed.pipelining posts them asynchronously under every schedule");
    }
  }
  if (p.cp_size > 1) {
    b.key("context_parallel_degree", p.cp_size);
    if (p.cp_comm_type == CpCommType::a2a) {
      b.cannot("context parallelism a2a (DeepSpeed-Ulysses): TorchTitan rotates K/V (allgather, alltoall)");
    } else {
      // p2p: K/V blocks passed around the ring, which torch's context_parallel does with its
      // alltoall rotation; allgather: every K/V shard gathered after the first block.
      b.key("context_parallel_rotate_method",
            toml_string(p.cp_comm_type == CpCommType::p2p ? "alltoall" : "allgather"));
    }
  }
  if (p.moe.ep_size > 1) b.key("expert_parallel_degree", p.moe.ep_size);
  if (p.zero_stage == 0 && !p.overlap_grad_reduce && p.dp_size > 1) {
    b.note("DDP reduces gradients in buckets during the backward pass (this plan reduces them after it)");
  }
}

void add_activation_checkpoint(Builder& b, const Plan& p) {
  b.section("activation_checkpoint");
  if (p.recompute == RecomputeKind::selective) {
    b.key("mode", toml_string("selective"));
    b.key("selective_ac_option", toml_string("op"));
    b.cannot(
        "Megatron's selective recompute (the attention core): TorchTitan's per-op policy saves other "
        "tensors, so memory and time differ");
  } else {
    b.key("mode", toml_string(p.recompute == RecomputeKind::full ? "full" : "none"));
  }
}

void add_float8(Builder& b, const Plan& p) {
  if (!p.fp8.enabled()) return;
  b.section("float8");
  b.key("recipe_name", toml_string("tensorwise"));
  if (p.fp8.mx()) {
    b.cannot("MXFP8 as simulated (Transformer Engine's MXFP8BlockScaling; TorchTitan's MX converter is torchao's "
             "[mx] section, not its [float8] one)");
  } else if (p.fp8.blockwise()) {
    b.cannot("FP8 blockwise scaling as simulated (Transformer Engine's Float8BlockScaling: 1x128 activation blocks, "
             "128x128 weight tiles; torchao's Float8 has tensorwise and rowwise recipes)");
  } else if (p.fp8.delayed()) {
    b.cannot("FP8 delayed scaling (torchao's Float8 has tensorwise and rowwise recipes)");
  } else {
    b.note("FP8 tensorwise through torchao's Float8Linear ([model] converters); torchao picks its own formats");
  }
  // fp8_param_gather under FSDP2 (ZeRO-2/3 here): torchao's FP8 all-gather, its amax over the whole
  // weight once a step (docs/float8.md); it casts the high-precision shard at each gather.
  if (p.fp8.param_gather && p.fp8.current() && p.zero_stage >= 2) {
    b.key("enable_fsdp_float8_all_gather", "true");
    b.key("precompute_float8_dynamic_scale_for_fsdp", "true");
    b.note("fp8_param_gather as torchao's FP8 all-gather: the same codes, cast from each rank's shard at every "
           "gather (the plan casts them once a step)");
  } else if (p.fp8.param_gather && p.fp8.current()) {
    b.cannot("fp8_param_gather with ZeRO-1 (torchao's FP8 all-gather is FSDP2's)");
  }
}

}  // namespace

TorchTitanConfig torchtitan_config(const Plan& plan, const ModelConfig& model) {
  Builder b;
  b.section("job");
  b.key("description", toml_string("stepcast plan " + plan.name + " of " + model.name));
  add_model(b, model);
  // The model as simulated, for the check that builds TorchTitan's.
  b.note("parameters: " + std::to_string(simulated_parameter_count(model, plan.tp_size)) +
         " as simulated (the padded vocabulary)");
  if (plan.fp8.enabled()) b.key("converters", "[" + toml_string("float8") + "]");
  add_training(b, plan, model);
  add_parallelism(b, plan);
  add_activation_checkpoint(b, plan);
  add_float8(b, plan);
  if (plan.attention_impl == AttentionImpl::materialized) {
    b.cannot("materialized attention (TorchTitan's attention is SDPA: flash or cuDNN kernels)");
  }
  b.out.toml = b.toml.str();
  return b.out;
}

}  // namespace stepcast
