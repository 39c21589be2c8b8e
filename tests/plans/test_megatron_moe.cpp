// Mixture-of-experts plans in Megatron-LM's words (plans/megatron_export.cpp add_moe,
// plans/megatron_import_moe.cpp): the flags of Mixtral 8x7B and DeepSeek-V3-shaped plans, held
// against Megatron-LM's MoE rules (written out below with file:line of Megatron-LM commit
// d98e8a64ddf3; arguments.py is megatron/training/arguments.py, transformer_config.py
// megatron/core/transformer/transformer_config.py); the plans Megatron-LM cannot run, marked;
// export → import giving the same model and plan; and the MoE flags stepcast cannot model, or that
// conflict, refused by name.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <regex>
#include <set>

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

// Megatron-LM's MoE rules for the flags of a plan, and that they build the layers simulated.
void check_moe_rules(const MegatronArguments& args, const Plan& plan, const ModelConfig& model) {
  auto f = flags_of(args);
  auto has = [&](const std::string& name) { return f.count(name) > 0; };
  const int64_t experts = integer(f, "--num-experts"), ep = integer(f, "--expert-model-parallel-size"),
                etp = integer(f, "--expert-tensor-parallel-size"), tp = integer(f, "--tensor-model-parallel-size"),
                pp = integer(f, "--pipeline-model-parallel-size"), k = integer(f, "--moe-router-topk");
  CHECK(experts == model.num_experts);
  CHECK(k == plan.moe.top_k);
  CHECK(integer(f, "--moe-ffn-hidden-size") == model.moe_intermediate_size);
  CHECK(ep == plan.moe.ep_size);
  CHECK(etp == plan.moe.etp_size);
  // Experts a multiple of ep (arguments.py:1657-1658); the world a multiple of etp · ep · pp
  // (core/parallel_state.py:874-884).
  CHECK(experts % ep == 0);
  CHECK(plan.world_size() % (etp * ep * pp) == 0);
  CHECK((k >= 1 && k <= experts));
  // Top-1 with the softmax router needs pre-softmax (transformer_config.py:2661-2669); the
  // pre-softmax router weighs by the probabilities over all experts, the default one by those of
  // the top k renormalised (the model's norm_topk_prob).
  if (k == 1) CHECK((has("--moe-router-pre-softmax") || !args.runnable));
  CHECK(has("--moe-router-pre-softmax") == !model.norm_topk_prob);
  // Dispatchers and drop policies Megatron knows (transformer_config.py:891, 932).
  CHECK(std::set<std::string>{"allgather", "alltoall", "flex"}.count(f["--moe-token-dispatcher-type"]) == 1);
  CHECK(f["--moe-token-dispatcher-type"] == to_string(plan.moe.dispatcher));
  if (has("--moe-token-drop-policy")) CHECK((f["--moe-token-drop-policy"] == "probs" || f["--moe-token-drop-policy"] == "position"));
  // Padding needs a capacity (transformer_config.py:1862-1866); a capacity needs the aux_loss,
  // seq_aux_loss, global_aux_loss or none balancing (transformer_config.py:1836-1860).
  if (has("--moe-pad-expert-input-to-capacity")) CHECK(has("--moe-expert-capacity-factor"));
  if (has("--moe-expert-capacity-factor")) {
    CHECK(std::set<std::string>{"aux_loss", "seq_aux_loss", "global_aux_loss", "none"}.count(
              f["--moe-router-load-balancing-type"]) == 1);
    CHECK(std::stod(f["--moe-expert-capacity-factor"]) == plan.moe.capacity_factor);
  }
  CHECK(has("--moe-expert-capacity-factor") == !plan.moe.dropless());
  // Experts with tensor parallelism in training need sequence parallelism (core/transformer/moe/
  // moe_layer.py:636-640); biases only with etp 1 (transformer_config.py:2612-2615).
  if (tp > 1) CHECK(has("--sequence-parallel"));
  if (!has("--disable-bias-linear")) CHECK(etp == 1);
  // Shared experts: a positive total width (transformer_config.py:1813-1819), n · f_e.
  if (has("--moe-shared-expert-intermediate-size")) {
    CHECK(integer(f, "--moe-shared-expert-intermediate-size") > 0);
  }
  CHECK(f["--moe-shared-expert-intermediate-size"] ==
        (model.n_shared_experts > 0 ? std::to_string(model.n_shared_experts * model.moe_intermediate_size) : ""));
  // The layer pattern, evaluated as Python would, is num_layers long (core/models/gpt/
  // gpt_layer_specs.py:651-656): the first first_k_dense_replace layers dense.
  int64_t dense = 0, moe_layers = integer(f, "--num-layers");
  if (has("--moe-layer-freq")) {
    std::smatch match;
    REQUIRE(std::regex_match(f["--moe-layer-freq"], match, std::regex(R"(\(\[0\]\*(\d+)\+\[1\]\*(\d+)\))")));
    dense = std::stoll(match[1]);
    moe_layers = std::stoll(match[2]);
  }
  CHECK(dense + moe_layers == integer(f, "--num-layers"));
  CHECK(dense == model.first_k_dense_replace);
  // Grouped GEMMs as lowered; the load-balancing loss with the model's coefficient.
  CHECK(has("--moe-grouped-gemm"));
  CHECK(f["--moe-router-load-balancing-type"] == "aux_loss");
  if (model.router_aux_loss_coef != 0) CHECK(std::stod(f["--moe-aux-loss-coeff"]) == model.router_aux_loss_coef);
}

const std::string kTinyShape =
    "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --max-position-embeddings 64 "
    "--seq-length 64 --micro-batch-size 1 --vocab-size 256 --disable-bias-linear ";

const Json kMixtralPlan = {{"tp_size", 2},           {"sequence_parallel", true}, {"dp_size", 4},
                           {"expert_model_parallel_size", 4}, {"micro_batch_size", 1}, {"global_batch_size", 16},
                           {"zero_stage", 1},         {"attention_impl", "flash"}, {"dtype", "bf16"}};

// 64 H100: tp 2 · pp 4 · dp 8, 256 experts over ep 16 (etp 1), a capacity of 1.25.
const Json kDeepSeekPlan = {{"tp_size", 2},
                            {"sequence_parallel", true},
                            {"pp_size", 4},
                            {"dp_size", 8},
                            {"expert_model_parallel_size", 16},
                            {"expert_tensor_parallel_size", 1},
                            {"moe_expert_capacity_factor", 1.25},
                            {"moe_pad_expert_input_to_capacity", true},
                            {"moe_token_dispatcher_type", "alltoall"},
                            {"micro_batch_size", 1},
                            {"global_batch_size", 64},
                            {"zero_stage", 1},
                            {"attention_impl", "flash"}};

}  // namespace

TEST_CASE("Megatron-LM arguments: Mixtral 8x7B, experts over ep with the alltoall dispatcher", "[plan][megatron][moe]") {
  ModelConfig m = shipped_model("mixtral-8x7b");
  Plan plan = validated(kMixtralPlan, m, shipped_topology("dgx-h100", 1));
  auto args = megatron_arguments(plan, m);
  INFO(Json(args.arguments).dump() << Json(args.notes).dump());
  CHECK(args.runnable);
  check_moe_rules(args, plan, m);
  auto f = flags_of(args);
  CHECK(f.at("--num-experts") == "8");
  CHECK(f.at("--moe-router-topk") == "2");
  CHECK(f.at("--moe-ffn-hidden-size") == "14336");
  CHECK(f.at("--expert-model-parallel-size") == "4");
  CHECK(f.at("--expert-tensor-parallel-size") == "2");  // default tp, said
  CHECK(f.at("--moe-token-dispatcher-type") == "alltoall");  // Megatron's default is allgather
  CHECK(f.at("--moe-aux-loss-coeff") == "0.02");
  CHECK(f.count("--moe-grouped-gemm") == 1);
  // Dropless, every layer MoE, no shared experts, and Mixtral's top-k weights renormalised (HF's
  // MixtralSparseMoeBlock): Megatron's defaults, no flags.
  CHECK(m.norm_topk_prob);
  for (const char* absent : {"--moe-router-pre-softmax", "--moe-expert-capacity-factor",
                             "--moe-pad-expert-input-to-capacity", "--moe-token-drop-policy", "--moe-layer-freq",
                             "--moe-shared-expert-intermediate-size"}) {
    CHECK(f.count(absent) == 0);
  }
  CHECK_THAT(Json(args.notes).dump(), !Contains("routing"));
  // A dense model has none of them.
  ModelConfig dense = shipped_model("llama3-8b");
  auto dense_args = megatron_arguments(validated({{"tp_size", 2}, {"dp_size", 4}, {"micro_batch_size", 1},
                                                  {"global_batch_size", 8}}, dense, shipped_topology("dgx-h100", 1)),
                                       dense);
  for (const auto& a : dense_args.arguments) CHECK(a.find("expert") == std::string::npos);
}

TEST_CASE("Megatron-LM arguments: DeepSeek-V3 shaped, shared experts, dense first layers, a capacity",
          "[plan][megatron][moe]") {
  ModelConfig m = shipped_model("deepseek-v3-shaped");
  Topology topology = shipped_topology("dgx-h100", 8);
  Plan plan = validated(kDeepSeekPlan, m, topology);
  auto args = megatron_arguments(plan, m);
  INFO(Json(args.arguments).dump() << Json(args.notes).dump());
  CHECK(args.runnable);
  check_moe_rules(args, plan, m);
  auto f = flags_of(args);
  CHECK(f.at("--num-experts") == "256");
  CHECK(f.at("--moe-router-topk") == "8");
  CHECK(f.at("--ffn-hidden-size") == "18432");  // the 3 dense layers
  CHECK(f.at("--moe-ffn-hidden-size") == "2048");
  CHECK(f.at("--moe-shared-expert-intermediate-size") == "2048");  // 1 shared expert
  CHECK(f.at("--moe-layer-freq") == "([0]*3+[1]*58)");
  CHECK(args.arguments.end() != std::find(args.arguments.begin(), args.arguments.end(),
                                          "--moe-layer-freq '([0]*3+[1]*58)'"));  // quoted for the shell
  CHECK(f.at("--expert-model-parallel-size") == "16");
  CHECK(f.at("--expert-tensor-parallel-size") == "1");
  CHECK(f.at("--moe-expert-capacity-factor") == "1.25");
  CHECK(f.count("--moe-pad-expert-input-to-capacity") == 1);
  CHECK(f.at("--moe-token-drop-policy") == "probs");  // the plan's: Megatron's default
  CHECK(f.at("--moe-aux-loss-coeff") == "0.001");
  CHECK(f.count("--pipeline-model-parallel-layout") == 1);  // 61 layers on 4 stages
  CHECK_THAT(Json(args.notes).dump(), !Contains("capacity"));  // 80 rows an expert, 2048 tokens

  // The allgather dispatcher; a skewed routing, which no flag says: a note, still runnable.
  Json skewed = kDeepSeekPlan;
  skewed["moe_token_dispatcher_type"] = "allgather";
  skewed["moe_routing"] = "skew";
  skewed["moe_routing_skew"] = 1.2;
  auto s = megatron_arguments(validated(skewed, m, topology), m);
  INFO(Json(s.notes).dump());
  CHECK(s.runnable);
  CHECK(flags_of(s).at("--moe-token-dispatcher-type") == "allgather");
  CHECK_THAT(Json(s.notes).dump(), Contains("routing: simulated with expert loads drawn from a Zipf skew of exponent 1.2") &&
                                       Contains("no flag sets"));
  // A capacity above a rank's tokens: Megatron pads to the tokens (2048), not the capacity
  // ceil(2048 · 8 / 256 · 40) = 2560.
  Json roomy = kDeepSeekPlan;
  roomy["moe_expert_capacity_factor"] = 40;
  auto r = megatron_arguments(validated(roomy, m, topology), m);
  CHECK(r.runnable);
  CHECK_THAT(Json(r.notes).dump(), Contains("capacity: 2560 rows per expert exceed a rank's 2048 tokens"));
}

TEST_CASE("Megatron-LM cannot run these MoE plans as simulated: marked, with the reason", "[plan][megatron][moe]") {
  ModelConfig m = shipped_model("mixtral-8x7b");
  Topology topology = shipped_topology("dgx-h100", 1);
  // Expert biases with etp 2 (Megatron: etp 1 only).
  ModelConfig biased = m;
  biased.use_bias = true;
  Plan plan = validated(kMixtralPlan, biased, topology);
  auto a = megatron_arguments(plan, biased);
  CHECK_FALSE(a.runnable);
  CHECK_THAT(Json(a.notes).dump(), Contains("Megatron-LM cannot run") && Contains("transformer_config.py:2612-2615"));
  Json etp1 = kMixtralPlan;
  etp1["expert_tensor_parallel_size"] = 1;
  CHECK(megatron_arguments(validated(etp1, biased, topology), biased).runnable);
  // Tensor parallelism without sequence parallelism (validate_plan refuses it too).
  Plan unsplit = validated(kMixtralPlan, m, topology);
  unsplit.sequence_parallel = false;
  auto b = megatron_arguments(unsplit, m);
  CHECK_FALSE(b.runnable);
  CHECK_THAT(Json(b.notes).dump(), Contains("moe_layer.py:636-640"));
  // tp-pp-dp with a pipeline: the experts' data-parallel size must be dp, so ep · etp = tp · cp.
  Json mapped = {{"tp_size", 2}, {"sequence_parallel", true}, {"pp_size", 2}, {"dp_size", 4},
                 {"order", "tp-pp-dp"}, {"expert_model_parallel_size", 4}, {"expert_tensor_parallel_size", 1},
                 {"micro_batch_size", 1}, {"global_batch_size", 16}};
  Topology two_nodes = shipped_topology("dgx-h100", 2);
  auto c = megatron_arguments(validated(mapped, m, two_nodes), m);
  CHECK_FALSE(c.runnable);
  CHECK_THAT(Json(c.notes).dump(), Contains("parallel_state.py:898-902") && Contains("ep · etp = 4, tp · cp = 2"));
  mapped["expert_model_parallel_size"] = 2;
  CHECK(megatron_arguments(validated(mapped, m, two_nodes), m).runnable);
}

TEST_CASE("Megatron-LM MoE export then import gives the same model and plan", "[plan][megatron][moe]") {
  struct Case {
    const char* model;
    int nodes;
    Json plan;
  };
  Json allgather = {{"dp_size", 8}, {"expert_model_parallel_size", 2}, {"expert_tensor_parallel_size", 1},
                    {"moe_token_dispatcher_type", "allgather"}, {"moe_expert_capacity_factor", 2.0},
                    {"micro_batch_size", 1}, {"global_batch_size", 8}};
  // Qwen3 and GPT-OSS have a head width of their own (--kv-channels: without it Megatron built
  // 453M and 284M parameters fewer).
  Json ep8 = {{"dp_size", 8}, {"expert_model_parallel_size", 8}, {"micro_batch_size", 1}, {"global_batch_size", 8}};
  const std::vector<Case> cases = {{"mixtral-8x7b", 1, kMixtralPlan},
                                   {"deepseek-v3-shaped", 8, kDeepSeekPlan},
                                   {"tiny-moe-shared", 1, allgather},
                                   {"qwen3-30b-a3b", 1, ep8},
                                   {"gpt-oss-120b", 1, ep8}};
  for (const Case& c : cases) {
    INFO(c.model << " " << c.plan.dump());
    ModelConfig model = shipped_model(c.model);
    Topology topology = shipped_topology("dgx-h100", c.nodes);
    check_round_trip(model, validated(c.plan, model, topology), topology);
  }
}

TEST_CASE("Megatron-LM MoE flags read back, and the ones stepcast cannot model refused by name", "[plan][megatron][moe]") {
  // Megatron's defaults: top-2, the expert width ffn_hidden_size, the allgather dispatcher,
  // dropless, an aux-loss coefficient of 0; --moe-layer-freq as an integer or a list expression.
  const std::string moe = kTinyShape + "--num-experts 8 --moe-grouped-gemm ";
  MegatronImport plain = import_megatron_arguments(moe + "--ffn-hidden-size 96", "x", "x");
  CHECK(plain.model["num_local_experts"] == 8);
  CHECK(plain.model["num_experts_per_tok"] == 2);
  CHECK(plain.model["moe_intermediate_size"] == 96);
  CHECK(plain.model["router_aux_loss_coef"] == 0.0);
  CHECK(plain.model["norm_topk_prob"] == true);  // without --moe-router-pre-softmax: the top k renormalised
  CHECK_FALSE(plain.model.contains("first_k_dense_replace"));
  CHECK(plain.plan["moe_token_dispatcher_type"] == "allgather");
  CHECK_FALSE(plain.plan.contains("moe_expert_capacity_factor"));
  CHECK_FALSE(plain.plan.contains("expert_model_parallel_size"));
  for (const auto& [pattern, dense] : std::vector<std::pair<std::string, int64_t>>{
           {"1", 0}, {"'([0]*1+[1]*3)'", 1}, {"'[0,0]+[1]*2'", 2}, {"'3*[1]+[1]'", 0}, {"'([0]*4)'", 4},
           {"'[0,]+([1])*3'", 1}}) {
    INFO(pattern);
    CHECK(import_megatron_arguments(moe + "--moe-layer-freq " + pattern, "x", "x").model["first_k_dense_replace"] ==
          dense);
  }
  MegatronImport full = import_megatron_arguments(
      moe + "--moe-ffn-hidden-size 32 --moe-shared-expert-intermediate-size 64 --moe-router-topk 1 "
            "--moe-router-pre-softmax --moe-aux-loss-coeff 0.01 --moe-router-load-balancing-type none "
            "--moe-expert-capacity-factor -1 --moe-token-drop-policy probs",
      "x", "x");
  CHECK(full.model["n_shared_experts"] == 2);
  CHECK(full.model["num_experts_per_tok"] == 1);
  CHECK(full.model["norm_topk_prob"] == false);
  CHECK(full.model["router_aux_loss_coef"] == 0.0);  // none: no aux loss, whatever the coefficient
  CHECK_FALSE(full.plan.contains("moe_expert_capacity_factor"));  // negative: dropless
  CHECK(full.ignored.empty());
  // A capacity without padding (Megatron's default): each expert computes the copies it keeps.
  MegatronImport kept = import_megatron_arguments(moe + "--moe-expert-capacity-factor 1.5", "x", "x");
  CHECK(kept.plan["moe_expert_capacity_factor"] == 1.5);
  CHECK_FALSE(kept.plan.contains("moe_pad_expert_input_to_capacity"));
  MegatronImport padded =
      import_megatron_arguments(moe + "--moe-expert-capacity-factor 1.5 --moe-pad-expert-input-to-capacity", "x", "x");
  CHECK(padded.plan["moe_pad_expert_input_to_capacity"] == true);

  struct Case {
    std::string args, fragments[2];
  };
  const std::vector<Case> cases = {
      {"--moe-router-topk 2", {"key '--moe-router-topk' = '2'", "needs experts (--num-experts)"}},
      {"--expert-model-parallel-size 2", {"key '--expert-model-parallel-size' = '2'", "needs experts"}},
      {"--num-experts 8", {"key '--num-experts' = '8'", "--moe-grouped-gemm"}},
      {"--num-experts 8 --moe-grouped-gemm --moe-shared-expert-overlap",
       {"key '--moe-shared-expert-overlap'", "mixture-of-experts option stepcast does not model"}},
      {"--num-experts 8 --moe-grouped-gemm --moe-token-dispatcher-type flex",
       {"key '--moe-token-dispatcher-type' = 'flex'", "alltoall, allgather"}},
      {"--num-experts 8 --moe-grouped-gemm --moe-router-load-balancing-type seq_aux_loss",
       {"key '--moe-router-load-balancing-type' = 'seq_aux_loss'", "aux_loss, none"}},
      {"--num-experts 8 --moe-grouped-gemm --moe-router-topk 1",
       {"key '--moe-router-topk' = '1'", "needs --moe-router-pre-softmax"}},
      {"--num-experts 8 --moe-grouped-gemm --moe-router-topk 9", {"key '--moe-router-topk' = '9'", "exceeds the 8"}},
      {"--num-experts 8 --moe-grouped-gemm --moe-pad-expert-input-to-capacity",
       {"key '--moe-pad-expert-input-to-capacity'", "transformer_config.py:1862-1866"}},
      {"--num-experts 8 --moe-grouped-gemm --moe-token-drop-policy random",
       {"key '--moe-token-drop-policy' = 'random'", "probs, position"}},
      {"--num-experts 8 --moe-grouped-gemm --moe-layer-freq 2",
       {"key '--moe-layer-freq' = '2'", "dense layers after the first MoE layer"}},
      {"--num-experts 8 --moe-grouped-gemm --moe-layer-freq '([0]+[1])*2'",
       {"key '--moe-layer-freq'", "dense layers after the first MoE layer"}},
      {"--num-experts 8 --moe-grouped-gemm --moe-layer-freq '([0]*1+[1]*2)'",
       {"key '--moe-layer-freq'", "has 3 layers, the model --num-layers 4"}},
      {"--num-experts 8 --moe-grouped-gemm --moe-layer-freq '[0, 1, 1, 1]'",
       {"key '--moe-layer-freq' = '[0, 1, 1, 1]'", "arguments.py:250-251"}},
      {"--num-experts 8 --moe-grouped-gemm --moe-layer-freq '([0]+[1]*3'", {"key '--moe-layer-freq'", "'(' without ')'"}},
      {"--num-experts 8 --moe-grouped-gemm --moe-layer-freq '[0,2,1,1]'", {"key '--moe-layer-freq'", "other than 0 and 1"}},
      {"--num-experts 8 --moe-grouped-gemm --moe-layer-freq '[1]*99999999'", {"key '--moe-layer-freq'", "2^20"}},
      {"--num-experts 8 --moe-grouped-gemm --moe-ffn-hidden-size 64 --moe-shared-expert-intermediate-size 100",
       {"key '--moe-shared-expert-intermediate-size' = '100'", "a multiple of 64"}}};
  for (const Case& c : cases) {
    INFO(c.args);
    std::string message = import_error(kTinyShape + c.args);
    CHECK_THAT(message, Contains("launch.sh: ") && Contains(c.fragments[0]) && Contains(c.fragments[1]));
  }
  // Biases (no --disable-bias-linear) with etp = tp = 2 (transformer_config.py:2612-2615).
  std::string biased = import_error(
      "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --max-position-embeddings 64 --seq-length 64 "
      "--micro-batch-size 1 --vocab-size 256 --num-experts 8 --moe-grouped-gemm --tensor-model-parallel-size 2 "
      "--sequence-parallel");
  CHECK_THAT(biased, Contains("key '--expert-tensor-parallel-size' = '2'") && Contains("transformer_config.py:2612-2615"));
}
