// Plans in Megatron-LM's words: dp_size derived from the world, and Megatron-LM arguments read
// back into a model and plan. The oracle of the import is the export: for every runnable plan,
// export → import gives the same model and plan. Refusals name the flag.
#include <catch2/catch.hpp>

#include "errors.hpp"
#include "megatron_export.hpp"
#include "megatron_import.hpp"
#include "model.hpp"
#include "plan.hpp"
#include "megatron_test_support.hpp"
#include "test_support.hpp"
#include "topology.hpp"

using namespace stepcast;
using namespace stepcast::test;
using Catch::Matchers::Contains;

namespace {

const std::string kTinyShape =
    "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --max-position-embeddings 64 "
    "--seq-length 64 --micro-batch-size 1 ";

}  // namespace

TEST_CASE("dp_size absent is the world over tp · pp · cp, as Megatron-LM derives it", "[plan][megatron]") {
  ModelConfig model = shipped_model("gpt3-13b");
  Topology topology = shipped_topology("dgx-a100-80gb", 8);  // 64 devices
  Plan plan = validated({{"tp_size", 4}, {"pp_size", 2}, {"micro_batch_size", 2}}, model, topology);
  CHECK(plan.dp_size_derived);
  CHECK(plan.dp_size == 8);
  CHECK(plan.dp_size_world == 64);
  CHECK(plan.global_batch_size == 16);  // Megatron's default: micro_batch_size · dp_size
  CHECK(plan.world_size() == 64);
  Plan given = validated({{"tp_size", 4}, {"dp_size", 2}, {"micro_batch_size", 1}}, model, topology);
  CHECK_FALSE(given.dp_size_derived);
  CHECK(given.dp_size == 2);
  // Another world (a sweep point's ranks) given to validate_plan, or resolved before it.
  Plan ranks = parse_plan({{"tp_size", 2}, {"micro_batch_size", 1}, {"global_batch_size", 8}}, "plan.json");
  validate_plan(ranks, model, topology, {4, "sweep.json (points[0].ranks)"});
  CHECK(ranks.dp_size == 2);
  CHECK(ranks.global_batch_size == 8);
  Plan first = parse_plan({{"tp_size", 2}, {"micro_batch_size", 1}}, "plan.json");
  resolve_dp_size(first, 8, "8 ranks");
  validate_plan(first, model, topology);
  CHECK(first.dp_size == 4);
  CHECK(first.global_batch_size == 4);
  // tp · pp · cp must divide the world.
  Plan odd = parse_plan({{"tp_size", 8}, {"pp_size", 3}, {"micro_batch_size", 1}}, "plan.json");
  try {
    validate_plan(odd, model, topology);
    FAIL("no InputError");
  } catch (const InputError& e) {
    CHECK_THAT(e.what(), Contains("plan.json: key 'dp_size' = (absent)") && Contains("64 devices") &&
                             Contains("tp_size · pp_size · context_parallel_size = 24") &&
                             Contains("valid: dp_size in the plan"));
  }
  // The Megatron alias counts as given.
  Plan alias = validated({{"data_parallel_size", 2}, {"micro_batch_size", 1}}, model, topology);
  CHECK(alias.dp_size == 2);
}

TEST_CASE("Megatron-LM export then import gives the same model and plan", "[plan][megatron]") {
  struct Case {
    const char* model;
    const char* topology;
    int nodes;
    Json plan;
  };
  const std::vector<Case> cases = {
      {"gpt3-13b", "dgx-a100-80gb", 8,
       {{"tp_size", 8}, {"dp_size", 8}, {"zero_stage", 1}, {"sequence_parallel", true},
        {"micro_batch_size", 1}, {"global_batch_size", 64}, {"recompute", "selective"},
        {"overlap_grad_reduce", true}, {"dtype", "bf16"}}},
      {"gpt3-13b", "dgx-a100-80gb", 8,
       {{"tp_size", 4}, {"pp_size", 2}, {"dp_size", 8}, {"zero_stage", 2}, {"micro_batch_size", 2},
        {"global_batch_size", 128}, {"recompute", "full"}, {"attention_impl", "flash"}, {"dropout", 0.0},
        {"gradient_accumulation_fusion", false}, {"cross_entropy_loss_fusion", false}}},
      {"llama3-8b", "dgx-h100", 2,
       {{"tp_size", 2}, {"pp_size", 2}, {"dp_size", 4}, {"zero_stage", 3},
        {"num_distributed_optimizer_instances", 2}, {"schedule", "interleaved_1f1b"},
        {"virtual_pp_size", 4}, {"micro_batch_size", 1}, {"global_batch_size", 32},
        {"overlap_grad_reduce", true}, {"overlap_param_gather", true}, {"grad_dtype", "bf16"},
        {"grad_bucket_bytes", 2e8}, {"attention_impl", "flash"}}},
      {"llama3-8b", "dgx-h100", 3,  // 32 layers on 3 stages: a layout
       {{"tp_size", 8}, {"pp_size", 3}, {"micro_batch_size", 1}, {"dp_size", 1},
        {"global_batch_size", 12}, {"attention_impl", "flash"}}},
      {"llama3-70b", "dgx-h100", 6,  // 80 layers on 2 × 5 virtual stages of 8: an even interleave
       {{"tp_size", 8}, {"pp_size", 2}, {"dp_size", 3}, {"schedule", "interleaved_1f1b"},
        {"virtual_pp_size", 5}, {"micro_batch_size", 1}, {"global_batch_size", 24},
        {"zero_stage", 1}, {"sequence_parallel", true}, {"attention_impl", "flash"}}},
      {"llama3-8b", "dgx-h100", 2,
       {{"tp_size", 4}, {"context_parallel_size", 2}, {"cp_comm_type", "allgather"}, {"dp_size", 2},
        {"micro_batch_size", 1}, {"global_batch_size", 8}, {"attention_impl", "flash"}, {"zero_stage", 1}}},
      {"gpt2-124m", "dgx-a100-80gb", 1,  // vocabulary 50257: padded to tp by both
       {{"tp_size", 2}, {"dp_size", 4}, {"micro_batch_size", 4}, {"global_batch_size", 32},
        {"dtype", "fp32"}, {"order", "tp-pp-dp"}}},
      {"llama3-8b", "dgx-h100", 1,
       {{"tp_size", 2}, {"pp_size", 4}, {"dp_size", 1}, {"micro_batch_size", 1},
        {"global_batch_size", 16}, {"recompute", "full"}, {"attention_impl", "flash"}}},
      {"llama3-8b", "dgx-h100", 1,  // FP8: Transformer Engine's flags both ways
       {{"tp_size", 2}, {"dp_size", 4}, {"zero_stage", 1}, {"micro_batch_size", 1}, {"global_batch_size", 8},
        {"attention_impl", "flash"}, {"fp8", "hybrid"}, {"fp8_amax_history_len", 1024},
        {"fp8_amax_compute_algo", "max"}}}};
  for (const Case& c : cases) {
    INFO(c.model << " " << c.plan.dump());
    ModelConfig model = shipped_model(c.model);
    Topology topology = shipped_topology(c.topology, c.nodes);
    Plan plan = validated(c.plan, model, topology);
    Plan plan_back = check_round_trip(model, plan, topology);
    CHECK(plan_back.dp_size_derived);  // the launch line has no dp size: the world gave it
  }
}

TEST_CASE("a launch script: variables, arrays, comments, quotes and torchrun's flags", "[plan][megatron]") {
  const std::string script = R"(#!/bin/bash
# Llama-style, 2 nodes
export TP=2
PP=${PP:-2}
MODEL_ARGS=(
    --num-layers 8 --hidden-size 512 --num-attention-heads 8   # shape
    --group-query-attention --num-query-groups 2 --swiglu
    --normalization RMSNorm --position-embedding-type rope --rotary-base 500000
    --max-position-embeddings 4096 --seq-length 2048 --vocab-size 32000
    --untie-embeddings-and-output-weights --disable-bias-linear
)
torchrun --nproc_per_node 8 --nnodes 2 --master_addr "$MASTER" pretrain_gpt.py \
    "${MODEL_ARGS[@]}" \
    --tensor-model-parallel-size $TP --pipeline-model-parallel-size=${PP} \
    --micro-batch-size 2 --global-batch-size 64 --bf16 --sequence-parallel \
    --recompute-activations --lr 3e-4 --data-path '/data/my corpus' --log-interval 10
)";
  MegatronImport in = import_megatron_arguments(script, "train.sh", "train");
  CHECK(in.model["num_hidden_layers"] == 8);
  CHECK(in.model["num_key_value_heads"] == 2);
  CHECK(in.model["mlp_type"] == "swiglu");
  // Megatron's SwiGLU default width: int((4h · 2/3) / 64) · 64 (arguments.py:1327).
  CHECK(in.model["intermediate_size"] == 1344);
  CHECK(in.model["norm_type"] == "rmsnorm");
  CHECK(in.model["rope_theta"] == 500000.0);
  CHECK(in.model["seq_length"] == 2048);
  CHECK(in.model["vocab_size"] == 32000);  // a multiple of 128 · tp already
  CHECK(in.model["tie_word_embeddings"] == false);
  CHECK(in.model["use_bias"] == false);
  CHECK(in.plan["tp_size"] == 2);
  CHECK(in.plan["pp_size"] == 2);
  CHECK(in.plan["micro_batch_size"] == 2);
  CHECK(in.plan["global_batch_size"] == 64);
  CHECK(in.plan["dtype"] == "bf16");
  CHECK(in.plan["sequence_parallel"] == true);
  CHECK(in.plan["recompute"] == "selective");
  CHECK(in.plan["attention_impl"] == "flash");  // attention_backend auto: a fused kernel
  CHECK_FALSE(in.plan.contains("dp_size"));
  CHECK(in.ignored == std::vector<std::string>{"--data-path", "--log-interval", "--lr"});
  // torchrun's world: Megatron-LM's dp_size is it over tp·pp·cp, whatever the topology holds.
  CHECK(in.world_size == 16);
  CHECK(in.world_from == "torchrun --nnodes 2 --nproc_per_node 8");
  Plan plan = parse_plan(in.plan, "train.sh");
  validate_plan(plan, parse_model(in.model, "train.sh"), shipped_topology("dgx-h100", 8),
                {in.world_size, in.world_from});
  CHECK(plan.dp_size == 4);
  CHECK(plan.world_size() == 16);
  // Megatron's vocabulary padding: 128 · tp unless --make-vocab-size-divisible-by says otherwise.
  MegatronImport padded = import_megatron_arguments(kTinyShape + "--vocab-size 50257 --tensor-model-parallel-size 2",
                                                    "x", "x");
  CHECK(padded.model["vocab_size"] == 50432);
  // A head width other than hidden / heads is the model's head_dim; hidden / heads is no override.
  MegatronImport wide = import_megatron_arguments(kTinyShape + "--vocab-size 256 --kv-channels 32", "x", "x");
  CHECK(wide.model["head_dim"] == 32);
  CHECK(parse_model(wide.model, "x").head_dim() == 32);
  MegatronImport plain = import_megatron_arguments(kTinyShape + "--vocab-size 256 --kv-channels 16", "x", "x");
  CHECK_FALSE(plain.model.contains("head_dim"));
}

TEST_CASE("Megatron-LM arguments stepcast cannot model, or that conflict, are refused by name", "[plan][megatron]") {
  struct Case {
    std::string args, fragments[2];
  };
  const std::vector<Case> cases = {
      {"--frobnicate 3", {"key '--frobnicate' = '3'", "not a flag stepcast reads"}},
      {"--num-experts 8", {"key '--num-experts' = '8'", "--moe-grouped-gemm"}},
      {"--moe-router-topk 2", {"key '--moe-router-topk'", "needs experts"}},
      {"--bf16 --fp16", {"key '--fp16'", "given with --bf16"}},
      {"--hidden-dropout 0.1 --attention-dropout 0", {"key '--attention-dropout' = '0'", "one dropout"}},
      {"--num-query-groups 2", {"key '--num-query-groups' = '2'", "without --group-query-attention"}},
      {"--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1 "
       "--pipeline-model-parallel-layout 'Et|t|t|tL'",
       {"key '--pipeline-model-parallel-layout'", "one of the three"}},
      {"--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 3",
       {"key '--num-layers-per-virtual-pipeline-stage' = '3'", "arguments.py:966-975"}},
      {"--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'Et|tt|tL'",
       {"key '--pipeline-model-parallel-layout'", "not a multiple of pipeline_model_parallel_size 2"}},
      {"--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'E(t|)*1t*1L'",
       {"key '--pipeline-model-parallel-layout'", "places 2 decoder layers ('t'), the model has --num-layers 4"}},
      {"--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout '(t|)*99999999t'",
       {"key '--pipeline-model-parallel-layout'", "more than 2^20 characters"}},
      {"--tensor-model-parallel-size 2 --tensor-model-parallel-size 4",
       {"key '--tensor-model-parallel-size' = '4'", "given twice"}},
      {"--tensor-model-parallel-size $TP", {"key '--tensor-model-parallel-size' = '$TP'", "shell expression"}},
      {"--recompute-granularity full --recompute-method block --recompute-num-layers 2",
       {"key '--recompute-method' = 'block'", "--recompute-method uniform --recompute-num-layers 1"}},
      {"--recompute-granularity selective --recompute-method uniform",
       {"key '--recompute-method'", "arguments.py:1425-1428"}},
      {"--data-parallel-sharding-strategy optim", {"key '--data-parallel-sharding-strategy'", "Megatron-FSDP only"}},
      {"--normalization Foo", {"key '--normalization' = 'Foo'", "LayerNorm, RMSNorm"}},
      {"--kv-channels 0", {"key '--kv-channels' = '0'", "an integer >= 1"}},
      {"--swiglu yes", {"key '--swiglu' = 'yes'", "takes no value"}},
      {"--optimizer sgd", {"key '--optimizer' = 'sgd'", "adam"}},
      {"--fp4-format e2m1", {"key '--fp4-format'", "FP4"}}};
  for (const Case& c : cases) {
    INFO(c.args);
    std::string message = import_error(kTinyShape + "--vocab-size 256 " + c.args);
    CHECK_THAT(message, Contains("launch.sh: ") && Contains(c.fragments[0]) && Contains(c.fragments[1]));
  }
  std::string no_vocab = import_error("--num-layers 4 --hidden-size 64 --num-attention-heads 4 "
                                      "--max-position-embeddings 64 --seq-length 64 --micro-batch-size 1");
  CHECK_THAT(no_vocab, Contains("key '--vocab-size' = (absent)") && Contains("NullTokenizer"));
  std::string no_layers = import_error("--hidden-size 64 --num-attention-heads 4 --vocab-size 8 "
                                       "--max-position-embeddings 64 --seq-length 64 --micro-batch-size 1");
  CHECK_THAT(no_layers, Contains("key '--num-layers' = (absent)") && Contains("required"));
}
