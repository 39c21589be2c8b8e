// Plan loading, defaults (Megatron's) and validation against a model and a topology.
#include "plan.hpp"

#include <algorithm>
#include <limits>
#include <numeric>
#include <set>
#include <sstream>

#include "errors.hpp"
#include "parameter_server.hpp"
#include "plan_fp8.hpp"
#include "replica_microbatches.hpp"
#include "schedule.hpp"

namespace stepcast {

const char* to_string(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::gpipe: return "gpipe";
    case ScheduleKind::one_f_one_b: return "1f1b";
    case ScheduleKind::interleaved_1f1b: return "interleaved_1f1b";
  }
  return "?";
}

const char* to_string(RecomputeKind kind) {
  switch (kind) {
    case RecomputeKind::none: return "none";
    case RecomputeKind::selective: return "selective";
    case RecomputeKind::full: return "full";
  }
  return "?";
}

const char* to_string(AttentionImpl kind) {
  return kind == AttentionImpl::flash ? "flash" : "materialized";
}

const char* to_string(CpCommType kind) {
  switch (kind) {
    case CpCommType::p2p: return "p2p";
    case CpCommType::all_gather: return "allgather";
    case CpCommType::a2a: return "a2a";
  }
  return "?";
}

namespace {

const std::vector<std::string> kDataParallelModes = {"sync", "async"};
const std::vector<std::string> kCpCommNames = {"p2p", "allgather", "a2a"};  // Megatron-LM's (arguments.py)
const std::vector<std::string> kScheduleNames = {"gpipe", "1f1b", "interleaved_1f1b"};
const std::vector<std::string> kRecomputeNames = {"none", "selective", "full"};
const std::vector<std::string> kAttentionNames = {"materialized", "flash"};
const std::vector<std::string> kDtypeNames = {"fp64", "fp32", "bf16", "fp16"};
bool valid_order(const std::string& order) {
  std::set<std::string> parts;
  std::stringstream in(order);
  std::string part;
  while (std::getline(in, part, '-')) parts.insert(part);
  return (parts == std::set<std::string>{"tp", "dp", "pp"} && order.size() == 8) ||
         (parts == std::set<std::string>{"tp", "cp", "dp", "pp"} && order.size() == 11);
}

// Sizes come from files and may be anything up to 2^63 - 1. Their products saturate instead of
// wrapping, so a huge size fails the range check that follows rather than passing it as 0.
int64_t saturating_product(int64_t a, int64_t b) {
  int64_t product = 0;
  return __builtin_mul_overflow(a, b, &product) ? std::numeric_limits<int64_t>::max() : product;
}

int64_t saturating_sum(int64_t a, int64_t b) {
  int64_t sum = 0;
  return __builtin_add_overflow(a, b, &sum) ? std::numeric_limits<int64_t>::max() : sum;
}

Dtype read_dtype(ObjectReader& reader, const std::string& key, Dtype fallback) {
  std::string name = reader.get_enum_or(key, kDtypeNames, to_string(fallback));
  return *parse_dtype(name);
}

// Megatron-LM's argument names (megatron/training/arguments.py, as its config prints them) for
// stepcast's keys: accepted as aliases; given together with stepcast's key they must agree.
const std::vector<std::pair<std::string, std::string>> kMegatronAliases = {
    {"tensor_model_parallel_size", "tp_size"},
    {"pipeline_model_parallel_size", "pp_size"},
    {"data_parallel_size", "dp_size"},
    {"virtual_pipeline_model_parallel_size", "virtual_pp_size"},
    {"recompute_granularity", "recompute"},
    {"hidden_dropout", "dropout"},
};

// The plan with Megatron's names mapped to stepcast's: the aliases above, and the switches
// bf16 / fp16 (dtype) and use_distributed_optimizer (zero_stage 1 unless zero_stage says more).
Json with_megatron_names(const Json& json, const std::string& file) {
  if (!json.is_object()) return json;
  Json out = json;
  auto move = [&](const std::string& from, const std::string& to, const Json& value) {
    if (out.contains(to) && out.at(to) != value) {
      throw_input_error(file, from, value.dump(),
                        "contradicts '" + to + "' = " + out.at(to).dump() + " (Megatron-LM's name for the same setting)",
                        "one of the two keys, or the same value");
    }
    out.erase(from);
    out[to] = value;
  };
  for (const auto& [megatron, key] : kMegatronAliases) {
    if (json.contains(megatron)) move(megatron, key, json.at(megatron));
  }
  for (const char* flag : {"bf16", "fp16", "use_distributed_optimizer"}) {
    if (!json.contains(flag)) continue;
    const Json& value = json.at(flag);
    if (!value.is_boolean()) {
      throw_input_error(file, flag, value.dump(), "not a boolean (a Megatron-LM switch)", "true or false");
    }
    out.erase(flag);
    if (!value.get<bool>()) continue;
    if (std::string(flag) == "use_distributed_optimizer") {
      if (!out.contains("zero_stage")) out["zero_stage"] = 1;
    } else {
      move(flag, "dtype", flag);
    }
  }
  return out;
}

}  // namespace

Plan parse_plan(const Json& json_in, const std::string& file) {
  Json json = with_megatron_names(json_in, file);
  ObjectReader reader(json, file);
  Plan plan;
  plan.file = file;
  plan.name = reader.get_string_or("name", file);
  reader.get_string_or("notes", "");  // text for people: read to check its type
  plan.tp_size = reader.get_int_or("tp_size", 1, 1);
  plan.pp_size = reader.get_int_or("pp_size", 1, 1);
  plan.dp_size_derived = !reader.has("dp_size");  // resolved against the world by validate_plan
  plan.dp_size = reader.get_int_or("dp_size", 1, 1);
  plan.cp_size = reader.get_int_or("context_parallel_size", 1, 1);
  std::string cp_comm = reader.get_enum_or("cp_comm_type", kCpCommNames, "p2p");
  plan.cp_comm_type = cp_comm == "p2p"         ? CpCommType::p2p
                      : cp_comm == "allgather" ? CpCommType::all_gather
                                               : CpCommType::a2a;
  int64_t zero_stage = reader.get_int_or("zero_stage", 0, 0);  // checked before it narrows
  if (zero_stage > 3) reader.fail("zero_stage", "out of range", "0, 1, 2 or 3");
  plan.zero_stage = static_cast<int>(zero_stage);
  plan.num_distributed_optimizer_instances = reader.get_int_or("num_distributed_optimizer_instances", 1, 1);
  plan.micro_batch_size = reader.get_int("micro_batch_size", 1);
  // Megatron: global_batch_size defaults to micro_batch_size · data-parallel size.
  int64_t samples_per_step = saturating_product(plan.micro_batch_size, plan.dp_size);
  if (samples_per_step == std::numeric_limits<int64_t>::max()) {
    reader.fail("micro_batch_size",
                "times dp_size = " + std::to_string(plan.dp_size) + " overflows 64-bit integers",
                "micro_batch_size · dp_size < 2^63 - 1");
  }
  plan.global_batch_size_derived = !reader.has("global_batch_size");
  plan.global_batch_size = reader.get_int_or("global_batch_size", 1, samples_per_step);
  read_microbatches_per_replica(reader, plan);

  std::string schedule = reader.get_enum_or("schedule", kScheduleNames, "1f1b");
  plan.schedule = schedule == "gpipe"  ? ScheduleKind::gpipe
                  : schedule == "1f1b" ? ScheduleKind::one_f_one_b
                                       : ScheduleKind::interleaved_1f1b;
  plan.virtual_pp_size = reader.get_int_or("virtual_pp_size", 1, 1);
  std::string recompute = reader.get_enum_or("recompute", kRecomputeNames, "none");
  plan.recompute = recompute == "none"        ? RecomputeKind::none
                   : recompute == "selective" ? RecomputeKind::selective
                                              : RecomputeKind::full;
  plan.sequence_parallel = reader.get_bool_or("sequence_parallel", false);

  // `dtype` sets parameter and activation dtype at once; `param_dtype` may not contradict it.
  Dtype dtype = read_dtype(reader, "dtype", Dtype::bf16);
  plan.param_dtype = read_dtype(reader, "param_dtype", dtype);
  if (reader.has("dtype") && reader.has("param_dtype") && plan.param_dtype != dtype) {
    reader.fail("param_dtype", "contradicts 'dtype' = \"" + std::string(to_string(dtype)) + "\"",
                "the same dtype, or only one of the two keys");
  }
  // Megatron accumulates and reduces gradients in fp32 under bf16 (accumulate_allreduce_grads_in_fp32).
  Dtype grad_default = plan.param_dtype == Dtype::fp64 ? Dtype::fp64 : Dtype::fp32;
  plan.grad_dtype = read_dtype(reader, "grad_dtype", grad_default);

  std::string attention = reader.get_enum_or("attention_impl", kAttentionNames, "materialized");
  plan.attention_impl = attention == "flash" ? AttentionImpl::flash : AttentionImpl::materialized;
  plan.fp8 = read_fp8(reader);
  plan.dropout = reader.get_number_in("dropout", 0.0, 0.99, 0.1);
  plan.overlap_grad_reduce = reader.get_bool_or("overlap_grad_reduce", false);
  const bool async_dp = reader.get_enum_or("data_parallel_mode", kDataParallelModes, "sync") == "async";
  if (!async_dp && reader.has("staleness")) {
    reader.fail("staleness", "is given, but data_parallel_mode is \"sync\" (gradients applied in their own step)",
                "no staleness, or data_parallel_mode \"async\"");
  }
  if (async_dp) plan.async_staleness = reader.get_int_or("staleness", 1, 1);
  read_parameter_servers(reader, plan);
  plan.overlap_param_gather = reader.get_bool_or("overlap_param_gather", false);
  plan.overlap_p2p_comm = reader.get_bool_or("overlap_p2p_comm", default_overlap_p2p_comm(plan.schedule));
  plan.scatter_gather_tensors_in_pipeline = reader.get_bool_or("scatter_gather_tensors_in_pipeline", false);
  plan.gradient_accumulation_fusion = reader.get_bool_or("gradient_accumulation_fusion", true);
  plan.cross_entropy_loss_fusion = reader.get_bool_or("cross_entropy_loss_fusion", true);
  plan.grad_bucket_bytes = reader.get_number_or("grad_bucket_bytes", 0, true, 0);
  if (reader.has("layers_per_stage")) {
    plan.layers_per_stage = reader.get_int_list("layers_per_stage", 1);
    if (plan.layers_per_stage.empty()) {
      reader.fail("layers_per_stage", "is empty",
                  "the layers of each (virtual) pipeline stage, in order, or no key for an even split");
    }
  }
  plan.order = reader.get_string_or("order", "tp-dp-pp");
  if (!valid_order(plan.order)) {
    reader.fail("order", "not a permutation of tp, dp, pp (optionally with cp)",
                "\"tp-dp-pp\" (Megatron's, tp innermost, cp right after tp) or another order of tp, dp, pp "
                "(and cp) joined by '-'");
  }
  plan.moe = read_moe_plan(reader, file);
  reader.finish();
  return plan;
}

Plan load_plan(const std::string& path) { return parse_plan(load_json_file(path), path); }

void resolve_dp_size(Plan& plan, int64_t world_size, const std::string& world) {
  if (!plan.dp_size_derived || plan.dp_size_world != 0) return;
  const int64_t model_ranks = saturating_product(saturating_product(plan.tp_size, plan.pp_size), plan.cp_size);
  if (world_size % model_ranks != 0) {
    throw_input_error(plan.file, "dp_size", "(absent)",
                      "would be the world's " + std::to_string(world_size) + " devices (" + world +
                          ") over tp_size · pp_size · context_parallel_size = " +
                          std::to_string(model_ranks) + ", which does not divide them",
                      "dp_size in the plan, or a world that " + std::to_string(model_ranks) +
                          " divides (--nodes)");
  }
  plan.dp_size = world_size / model_ranks;
  plan.dp_size_world = world_size;
  if (plan.global_batch_size_derived) {
    plan.global_batch_size = saturating_product(plan.micro_batch_size, plan.dp_size);
  }
}

namespace {

// Asynchronous data parallelism reduces whole gradients a step late: ZeRO-0 and ZeRO-1 only.
void validate_async(const Plan& plan) {
  const std::string& f = plan.file;
  if (plan.zero_stage >= 2) {
    throw_input_error(f, "data_parallel_mode", "async",
                      "with zero_stage " + std::to_string(plan.zero_stage) +
                          " is not supported (asynchronous data parallelism reduces a whole gradient a step "
                          "late; ZeRO-2/3 reduce each microbatch's gradient into a shard as the backward pass goes)",
                      "zero_stage 0 or 1 with data_parallel_mode \"async\", or data_parallel_mode \"sync\"");
  }
  if (plan.num_distributed_optimizer_instances > 1) {
    const std::string instances = std::to_string(plan.num_distributed_optimizer_instances);
    throw_input_error(f, "num_distributed_optimizer_instances", instances,
                      "with data_parallel_mode \"async\" is not supported (hybrid sharding is not lowered for it)",
                      "1 with data_parallel_mode \"async\"");
  }
  if (plan.overlap_grad_reduce) {
    throw_input_error(f, "overlap_grad_reduce", "true",
                      "with data_parallel_mode \"async\": the asynchronous reduction already runs beside the "
                      "next step's compute",
                      "false (or absent) with data_parallel_mode \"async\"");
  }
}

// Context parallelism as Megatron-LM and Transformer Engine run it: every sequence cut into
// 2·cp chunks; the p2p ring merges partial softmaxes, which only the fused (flash) kernel keeps.
void validate_context_parallel(const Plan& plan, const ModelConfig& model) {
  if (plan.cp_size == 1) return;
  const std::string& f = plan.file;
  const std::string cp = std::to_string(plan.cp_size);
  if (model.seq_length % (2 * plan.cp_size) != 0) {
    throw_input_error(f, "context_parallel_size", cp,
                      "does not cut seq_length = " + std::to_string(model.seq_length) + " of " + model.file +
                          " into 2·cp = " + std::to_string(2 * plan.cp_size) +
                          " equal chunks (causal load balancing: rank i holds chunks i and 2·cp−1−i)",
                      "a cp with seq_length divisible by 2·cp");
  }
  if (plan.cp_comm_type == CpCommType::a2a) {  // Ulysses: each cp rank takes 1/cp of a tp rank's heads
    for (const auto& [what, heads] : {std::pair<std::string, int64_t>{"num_attention_heads", model.num_attention_heads},
                                      {"num_key_value_heads", model.num_key_value_heads}}) {
      if (heads % plan.tp_size == 0 && (heads / plan.tp_size) % plan.cp_size != 0) {
        throw_input_error(f, "context_parallel_size", cp,
                          "with cp_comm_type \"a2a\" must divide the " + std::to_string(heads / plan.tp_size) +
                              " " + what + " of a tensor-parallel rank (" + what + " = " + std::to_string(heads) +
                              " of " + model.file + " / tp_size " + std::to_string(plan.tp_size) +
                              "): the all-to-all gives each cp rank 1/cp of them",
                          "a cp dividing " + std::to_string(heads / plan.tp_size) +
                              ", or cp_comm_type \"p2p\" or \"allgather\"");
      }
    }
  }
  if (plan.cp_comm_type == CpCommType::p2p && plan.attention_impl != AttentionImpl::flash) {
    throw_input_error(f, "attention_impl", to_string(plan.attention_impl),
                      "cannot split over the context-parallel ring (cp_comm_type \"p2p\" merges the partial "
                      "softmax of each K/V block by the fused kernel's log-sum-exp)",
                      "\"flash\", or cp_comm_type \"allgather\" (materialized scores over the gathered K/V)");
  }
  const int64_t s_cp = model.seq_length / plan.cp_size;
  if (plan.sequence_parallel && s_cp % plan.tp_size != 0) {
    throw_input_error(f, "tp_size", std::to_string(plan.tp_size),
                      "with sequence_parallel must divide the " + std::to_string(s_cp) +
                          " tokens a context-parallel rank holds (seq_length / context_parallel_size)",
                      "a divisor of " + std::to_string(s_cp));
  }
}

}  // namespace

void validate_plan(Plan& plan, const ModelConfig& model, const Topology& topology, const PlanWorld& world) {
  const std::string& f = plan.file;
  auto fail = [&](const std::string& key, int64_t value, const std::string& why,
                  const std::string& valid) {
    throw_input_error(f, key, std::to_string(value), why, valid);
  };
  if (model.num_attention_heads % plan.tp_size != 0) {
    fail("tp_size", plan.tp_size,
         "does not divide num_attention_heads = " + std::to_string(model.num_attention_heads) +
             " of " + model.file,
         "a divisor of " + std::to_string(model.num_attention_heads));
  }
  if (model.num_key_value_heads % plan.tp_size != 0) {
    fail("tp_size", plan.tp_size,
         "does not divide num_key_value_heads = " + std::to_string(model.num_key_value_heads) +
             " of " + model.file,
         "a divisor of " + std::to_string(model.num_key_value_heads));
  }
  if (model.intermediate_size % plan.tp_size != 0) {
    fail("tp_size", plan.tp_size,
         "does not divide intermediate_size = " + std::to_string(model.intermediate_size) +
             " of " + model.file,
         "a divisor of " + std::to_string(model.intermediate_size));
  }
  if (plan.virtual_pp_size > 1 && plan.schedule != ScheduleKind::interleaved_1f1b) {
    fail("virtual_pp_size", plan.virtual_pp_size,
         std::string("needs schedule \"interleaved_1f1b\", the plan has \"") +
             to_string(plan.schedule) + "\"",
         "1, or set schedule to \"interleaved_1f1b\"");
  }
  if (plan.schedule == ScheduleKind::interleaved_1f1b && plan.pp_size < 2) {
    fail("pp_size", plan.pp_size, "schedule \"interleaved_1f1b\" needs a pipeline",
         "pp_size >= 2, or schedule \"1f1b\"");
  }
  if (plan.schedule == ScheduleKind::interleaved_1f1b && !plan.overlap_p2p_comm && plan.pp_size == 2) {
    // Megatron-LM refuses it (arguments.py:1005-1009): with two stages the previous and the next
    // stage are one rank, which a batch would send to and receive from twice, and NCCL pairs a
    // pair's transfers in posting order (so does program_check). 2021's code did not check.
    throw_input_error(f, "overlap_p2p_comm", "false",
                      "blocking pipeline transfers under schedule \"interleaved_1f1b\" need pp_size > 2 "
                      "(the plan has 2: a batch would exchange twice with the same stage)",
                      "true, or pp_size >= 3, or schedule \"1f1b\"");
  }
  int64_t virtual_stages = saturating_product(plan.pp_size, plan.virtual_pp_size);
  if (virtual_stages > model.num_hidden_layers) {
    fail(plan.virtual_pp_size > 1 ? "virtual_pp_size" : "pp_size",
         plan.virtual_pp_size > 1 ? plan.virtual_pp_size : plan.pp_size,
         "pp_size · virtual_pp_size = " + std::to_string(virtual_stages) + " exceeds the " +
             std::to_string(model.num_hidden_layers) + " layers of " + model.file,
         "pp_size · virtual_pp_size <= " + std::to_string(model.num_hidden_layers));
  }
  if (world.size > 0) resolve_dp_size(plan, world.size, world.from);
  resolve_dp_size(plan, topology.num_devices(),
                  topology.file + ": " + std::to_string(topology.num_nodes) + " nodes × " +
                      std::to_string(topology.node.devices_per_node));
  validate_microbatches_per_replica(plan, model);
  int64_t per_step = saturating_product(plan.micro_batch_size, plan.dp_size);
  if (!plan.unequal_microbatches() && plan.global_batch_size % per_step != 0) {
    fail("global_batch_size", plan.global_batch_size,
         "not divisible by micro_batch_size · dp_size = " + std::to_string(per_step),
         "a multiple of " + std::to_string(per_step));
  }
  // The program holds every (microbatch, layer) pass explicitly, about 130 ops each: bound it so
  // that lowering stays within a few GB of memory instead of failing to allocate.
  constexpr int64_t kMaxLayerPasses = 200'000;
  int64_t layers_on_stage = saturating_product(
      (model.num_hidden_layers + plan.pp_size - 1) / plan.pp_size, 1);
  if (saturating_product(plan.num_microbatches(), layers_on_stage) > kMaxLayerPasses) {
    fail("global_batch_size", plan.global_batch_size,
         "gives " + std::to_string(plan.num_microbatches()) + " microbatches per dp rank × " +
             std::to_string(layers_on_stage) +
             " layers per stage, more (microbatch, layer) passes than the program holds (" +
             std::to_string(kMaxLayerPasses) + ")",
         "at most " + std::to_string(kMaxLayerPasses / layers_on_stage) +
             " microbatches per dp rank: a larger micro_batch_size or dp_size");
  }
  if (plan.schedule == ScheduleKind::interleaved_1f1b &&
      plan.num_microbatches() % plan.pp_size != 0) {
    fail("global_batch_size", plan.global_batch_size,
         "gives " + std::to_string(plan.num_microbatches()) +
             " microbatches per dp rank, which the interleaved schedule needs to be a multiple "
             "of pp_size = " + std::to_string(plan.pp_size),
         "a multiple of micro_batch_size · dp_size · pp_size = " +
             std::to_string(saturating_product(per_step, plan.pp_size)));
  }
  if (plan.sequence_parallel && plan.tp_size == 1) {
    throw_input_error(f, "sequence_parallel", "true", "needs tensor parallelism (the plan has tp_size = 1)",
                      "false, or tp_size > 1");
  }
  if (plan.sequence_parallel && model.seq_length % plan.tp_size != 0) {
    fail("tp_size", plan.tp_size,
         "with sequence_parallel must divide seq_length = " + std::to_string(model.seq_length),
         "a divisor of " + std::to_string(model.seq_length));
  }
  if (plan.scatter_gather_tensors_in_pipeline && plan.sequence_parallel) {
    // Sequence parallelism already sends each tp rank its s/tp rows: nothing left to split.
    throw_input_error(f, "scatter_gather_tensors_in_pipeline", "true",
                      "splits a pipeline transfer over tp, which sequence_parallel already does (each "
                      "rank sends its own s/tp rows)",
                      "false, or sequence_parallel false");
  }
  validate_context_parallel(plan, model);
  validate_fp8(plan, model, topology);
  validate_moe_plan(plan.moe, f, model, plan.tp_size, plan.tp_size * plan.cp_size * plan.dp_size,
                    plan.sequence_parallel);
  if (plan.async_dp()) validate_async(plan);
  if (plan.parameter_server()) validate_parameter_servers(plan, model, topology);
  if (plan.overlap_param_gather && plan.zero_stage == 0) {
    throw_input_error(f, "overlap_param_gather", "true",
                      "needs sharded parameters or optimizer (the plan has zero_stage = 0)",
                      "false, or zero_stage >= 1");
  }
  if (plan.num_distributed_optimizer_instances > 1) {
    int64_t instances = plan.num_distributed_optimizer_instances;
    if (plan.zero_stage == 0) {
      fail("num_distributed_optimizer_instances", instances,
           "needs sharded optimizer state (the plan has zero_stage = 0, every dp rank a full replica)",
           "1, or zero_stage >= 1");
    }
    const int64_t dp_cp = plan.dp_cp_size();
    const std::string group = plan.cp_size > 1 ? "dp_size · context_parallel_size" : "dp_size";
    if (dp_cp % instances != 0 || dp_cp / instances < 2) {
      fail("num_distributed_optimizer_instances", instances,
           "must divide " + group + " = " + std::to_string(dp_cp) +
               " and leave at least 2 ranks per shard group (" + group + " / instances)",
           "1, or a divisor of " + std::to_string(dp_cp) + " no larger than " + std::to_string(dp_cp / 2));
    }
    if (model.is_moe()) {
      validate_moe_hybrid_sharding(plan.moe, f, plan.tp_size, plan.cp_size, plan.dp_size, plan.pp_size, plan.order,
                                   instances);
    }
  }
  if (plan.layers_per_stage.empty()) {
    plan.layers_per_stage = default_layers_per_stage(model.num_hidden_layers, virtual_stages);
  } else {
    int64_t sum = std::accumulate(plan.layers_per_stage.begin(), plan.layers_per_stage.end(),
                                  int64_t{0}, saturating_sum);
    if (int64_t(plan.layers_per_stage.size()) != virtual_stages ||
        sum != model.num_hidden_layers) {
      std::ostringstream why;
      why << "has " << plan.layers_per_stage.size() << " entries summing to " << sum;
      throw_input_error(f, "layers_per_stage", Json(plan.layers_per_stage).dump(),
                        why.str(),
                        std::to_string(virtual_stages) +
                            " entries (pp_size · virtual_pp_size) summing to num_hidden_layers = " +
                            std::to_string(model.num_hidden_layers));
    }
  }
  if (plan.grad_bucket_bytes == 0) {
    // Megatron's DDP bucket: max(40M, 1M · dp_size) parameters.
    int64_t bucket_parameters =
        std::max<int64_t>(40'000'000, saturating_product(1'000'000, plan.dp_size));
    plan.grad_bucket_bytes = double(bucket_parameters) * dtype_bytes(plan.grad_dtype);
  }
  int64_t world_size = saturating_product(
      saturating_product(saturating_product(plan.tp_size, plan.pp_size), plan.dp_size), plan.cp_size);
  if (world_size > topology.num_devices()) {
    int64_t per_node = topology.node.devices_per_node;
    int64_t nodes = world_size / per_node + (world_size % per_node != 0);
    fail("dp_size", plan.dp_size,
         std::string(plan.cp_size > 1 ? "tp_size · context_parallel_size · pp_size · dp_size = "
                                      : "tp_size · pp_size · dp_size = ") +
             std::to_string(world_size) +
             " devices, but topology " + topology.file + " has " +
             std::to_string(topology.num_devices()) + " (" + std::to_string(topology.num_nodes) +
             " nodes × " + std::to_string(per_node) + ")",
         "at most " + std::to_string(topology.num_devices()) + " devices, or --nodes " +
             std::to_string(nodes));
  }
  (void)topology.node.device.peak_for(plan.param_dtype, topology.file);
}

Json plan_to_json(const Plan& plan) {
  Json out;
  out["name"] = plan.name;
  out["tp_size"] = plan.tp_size;
  out["pp_size"] = plan.pp_size;
  out["dp_size"] = plan.dp_size;
  if (plan.cp_size > 1) {  // absent: 1 (outputs of plans without cp keep their bytes)
    out["context_parallel_size"] = plan.cp_size;
    out["cp_comm_type"] = to_string(plan.cp_comm_type);
  }
  out["zero_stage"] = plan.zero_stage;
  out["num_distributed_optimizer_instances"] = plan.num_distributed_optimizer_instances;
  out["micro_batch_size"] = plan.micro_batch_size;
  out["global_batch_size"] = plan.global_batch_size;
  if (plan.unequal_microbatches()) out["microbatches_per_replica"] = plan.microbatches_per_replica;  // absent: equal
  out["schedule"] = to_string(plan.schedule);
  out["virtual_pp_size"] = plan.virtual_pp_size;
  out["recompute"] = to_string(plan.recompute);
  out["sequence_parallel"] = plan.sequence_parallel;
  out["param_dtype"] = to_string(plan.param_dtype);
  out["grad_dtype"] = to_string(plan.grad_dtype);
  out["attention_impl"] = to_string(plan.attention_impl);
  if (plan.fp8.enabled()) {  // absent: off (outputs of plans without FP8 keep their bytes)
    out["fp8"] = to_string(plan.fp8.format);
    out["fp8_recipe"] = to_string(plan.fp8.scaling);
    if (plan.fp8.blockwise() && !plan.fp8.power_of_two_scales) out["fp8_block_scales"] = "fp32";
    if (plan.fp8.param_gather) out["fp8_param_gather"] = true;  // absent: off
    if (plan.fp8.delayed()) {
      out["fp8_amax_history_len"] = plan.fp8.amax_history_len;
      out["fp8_amax_compute_algo"] = to_string(plan.fp8.amax_compute_algo);
      out["fp8_margin"] = plan.fp8.margin;
    }
  }
  moe_plan_to_json(plan.moe, out);
  out["dropout"] = plan.dropout;
  out["overlap_grad_reduce"] = plan.overlap_grad_reduce;
  if (plan.async_dp()) {  // absent: synchronous (outputs of synchronous plans keep their bytes)
    out["data_parallel_mode"] = "async";
    out["staleness"] = plan.async_staleness;
    if (plan.parameter_server()) out["parameter_servers"] = plan.parameter_servers;
  }
  out["overlap_param_gather"] = plan.overlap_param_gather;
  out["overlap_p2p_comm"] = plan.overlap_p2p_comm;
  out["scatter_gather_tensors_in_pipeline"] = plan.scatter_gather_tensors_in_pipeline;
  out["gradient_accumulation_fusion"] = plan.gradient_accumulation_fusion;
  out["cross_entropy_loss_fusion"] = plan.cross_entropy_loss_fusion;
  out["grad_bucket_bytes"] = plan.grad_bucket_bytes;
  out["layers_per_stage"] = plan.layers_per_stage;
  out["order"] = plan.order;
  return out;
}

}  // namespace stepcast
