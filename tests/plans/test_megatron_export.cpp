// The Megatron-LM launch line of a plan (plans/megatron_export.hpp): for GPT-3 13B and Llama 3
// 8B / 70B, interleaved (even and uneven splits), ZeRO 0-3 and hybrid sharding, the flags the
// model and plan call for, held against Megatron-LM's own argument rules (written out below with
// file:line of Megatron-LM commit d98e8a64ddf3); plans Megatron-LM cannot run are marked, and
// `stepcast plan --megatron-runnable` drops them.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <set>

#include "json_input.hpp"
#include "lower.hpp"
#include "megatron_export.hpp"
#include "search.hpp"
#include "megatron_test_support.hpp"
#include "test_support.hpp"

using namespace stepcast;
using namespace stepcast::test;

namespace {

ModelConfig named_model(const std::string& name) {
  return load_model(source_path("models/" + name + ".json"));
}

// A plan on DGX A100 nodes (1,024 GPUs), validated so that layers_per_stage is resolved.
Plan resolved(Plan plan, const ModelConfig& m) {
  plan.overlap_grad_reduce = plan.dp_size > 1;
  plan.overlap_param_gather = plan.zero_stage >= 1 && plan.dp_size > 1;
  plan.overlap_p2p_comm = default_overlap_p2p_comm(plan.schedule);
  plan.name = plan_name(plan);
  validate_plan(plan, m, load_topology(source_path("topologies/dgx-a100-80gb.json")));
  return plan;
}

// Megatron's layout string as core/transformer/pipeline_parallel_layer_layout.py:283-321 parses
// it: "(x)*n" and "x*n" unrolled, '|' splits stages.
std::vector<std::string> parse_layout(std::string text) {
  text.erase(std::remove(text.begin(), text.end(), ','), text.end());
  for (const char* pattern : {R"(\(([^)]+)\)\*(\d+))", R"((.)\*(\d+))"}) {
    std::regex re(pattern);
    std::smatch match;
    while (std::regex_search(text, match, re)) {
      std::string repeated;
      for (int i = 0; i < std::stoi(match[2]); ++i) repeated += match[1];
      text = match.prefix().str() + repeated + match.suffix().str();
    }
  }
  std::vector<std::string> stages{""};
  for (char ch : text) {
    if (ch == '|') stages.emplace_back();
    else stages.back() += ch;
  }
  return stages;
}

// Megatron-LM's rules for the flags of a plan (Megatron-LM d98e8a64ddf3; arguments.py is
// megatron/training/arguments.py), and that Megatron then builds the plan simulated.
void check_megatron_rules(const MegatronArguments& m, const Plan& plan, const ModelConfig& model) {
  auto f = flags_of(m);
  auto has = [&](const std::string& name) { return f.count(name) > 0; };
  // Every flag is one Megatron-LM defines (its add_argument or dataclass field, cited in
  // plans/megatron_export.cpp).
  static const std::set<std::string> known{
      "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--sequence-parallel",
      "--use-tp-pp-dp-mapping", "--num-layers", "--hidden-size", "--num-attention-heads",
      "--group-query-attention", "--num-query-groups", "--ffn-hidden-size", "--swiglu",
      "--normalization", "--norm-epsilon", "--position-embedding-type", "--rotary-base",
      "--max-position-embeddings", "--seq-length", "--untie-embeddings-and-output-weights",
      "--disable-bias-linear", "--tokenizer-type", "--vocab-size", "--make-vocab-size-divisible-by",
      "--hidden-dropout", "--attention-dropout", "--attention-backend",
      "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
      "--pipeline-model-parallel-layout", "--no-overlap-p2p-communication", "--micro-batch-size",
      "--global-batch-size", "--use-distributed-optimizer", "--use-megatron-fsdp",
      "--data-parallel-sharding-strategy", "--ckpt-format", "--num-distributed-optimizer-instances",
      "--overlap-grad-reduce", "--overlap-param-gather", "--ddp-bucket-size", "--bf16",
      "--grad-reduce-in-bf16", "--recompute-granularity", "--recompute-method",
      "--recompute-num-layers", "--context-parallel-size", "--cp-comm-type", "--fp8-format", "--fp8-recipe",
      "--fp8-amax-history-len", "--fp8-amax-compute-algo", "--fp8-margin",
      "--no-gradient-accumulation-fusion", "--cross-entropy-loss-fusion"};
  for (const auto& [name, value] : f) {
    INFO(name);
    CHECK(known.count(name) == 1);
  }
  // Context parallelism: seq_length a multiple of 2·cp (arguments.py:1334-1337); Megatron's
  // comm kinds (arguments.py:3221).
  if (has("--context-parallel-size")) {
    CHECK(integer(f, "--seq-length") % (2 * integer(f, "--context-parallel-size")) == 0);
    const std::string kind = f.at("--cp-comm-type");
    CHECK((kind == "p2p" || kind == "allgather" || kind == "a2a"));
    if (kind == "a2a") {  // Ulysses splits a tensor-parallel rank's heads over cp (TE's A2A checks)
      const int64_t tp = has("--tensor-model-parallel-size") ? integer(f, "--tensor-model-parallel-size") : 1;
      const int64_t cp = integer(f, "--context-parallel-size");
      CHECK(integer(f, "--num-attention-heads") / tp % cp == 0);
      if (has("--num-query-groups")) CHECK(integer(f, "--num-query-groups") / tp % cp == 0);
    }
  }
  // Required arguments (arguments.py:1314-1317).
  for (const char* name : {"--num-layers", "--hidden-size", "--num-attention-heads", "--max-position-embeddings"}) {
    CHECK(has(name));
  }
  const int64_t tp = integer(f, "--tensor-model-parallel-size");
  const int64_t pp = integer(f, "--pipeline-model-parallel-size");
  const int64_t L = integer(f, "--num-layers");
  const int64_t heads = integer(f, "--num-attention-heads");
  CHECK(tp == plan.tp_size);
  CHECK(pp == plan.pp_size);
  CHECK(L == model.num_hidden_layers);
  CHECK(integer(f, "--hidden-size") == model.hidden_size);
  // Heads a multiple of tp (core/transformer/transformer_config.py:1446-1450); query groups,
  // read only under --group-query-attention (training/argument_utils.py:330-333), a multiple or
  // divisor of tp (transformer_config.py:1461-1468); hidden a multiple of heads (arguments.py:1332).
  CHECK(heads % tp == 0);
  int64_t groups = has("--group-query-attention") ? integer(f, "--num-query-groups") : heads;
  CHECK(!(has("--num-query-groups") && !has("--group-query-attention")));
  CHECK(groups == model.num_key_value_heads);
  CHECK((groups % tp == 0 || tp % groups == 0));
  CHECK(integer(f, "--hidden-size") % heads == 0);
  CHECK(integer(f, "--ffn-hidden-size") == model.intermediate_size);
  // max_position_embeddings ≥ seq_length (arguments.py:1354).
  CHECK(integer(f, "--max-position-embeddings") >= integer(f, "--seq-length"));
  CHECK(integer(f, "--seq-length") == model.seq_length);
  // Choices: transformer_config.py:256, arguments.py:2397-2398, AttnBackend (core/transformer/
  // enums.py:51-58), recompute (transformer_config.py:532, 543), training_config.py:698-711.
  CHECK(std::set<std::string>{"LayerNorm", "RMSNorm"}.count(f["--normalization"]) == 1);
  CHECK(std::set<std::string>{"learned_absolute", "rope"}.count(f["--position-embedding-type"]) == 1);
  CHECK(std::set<std::string>{"flash", "fused", "unfused", "local", "auto"}.count(f["--attention-backend"]) == 1);
  CHECK(f["--tokenizer-type"] == "NullTokenizer");
  // Vocabulary: the NullTokenizer's --vocab-size tokens (null_tokenizer.py:60-62) padded to a
  // multiple of make_vocab_size_divisible_by · tp (core/tokenizers/utils/build_tokenizer.py:
  // 138-139): the padded vocabulary the lowering uses.
  int64_t multiple = integer(f, "--make-vocab-size-divisible-by") * tp;
  int64_t padded = (integer(f, "--vocab-size") + multiple - 1) / multiple * multiple;
  CHECK(padded == padded_vocab_size(model, tp));
  // global_batch_size % (micro_batch_size · dp) (core/num_microbatches_calculator.py:381).
  CHECK(integer(f, "--global-batch-size") % (integer(f, "--micro-batch-size") * plan.dp_size) == 0);
  // At most one of the virtual-pipeline flags (arguments.py:928-939), then Megatron's split.
  int vpp_flags = has("--num-layers-per-virtual-pipeline-stage") +
                  has("--num-virtual-stages-per-pipeline-rank") + has("--pipeline-model-parallel-layout");
  CHECK(vpp_flags <= 1);
  std::vector<int64_t> layers;  // per virtual stage, as Megatron builds them
  int64_t vpp = 1;
  if (has("--pipeline-model-parallel-layout")) {
    auto stages = parse_layout(f["--pipeline-model-parallel-layout"]);
    CHECK(int64_t(stages.size()) % pp == 0);  // arguments.py:945-948
    vpp = int64_t(stages.size()) / pp;        // arguments.py:950
    std::string all;
    for (const auto& s : stages) {
      all += s;
      layers.push_back(std::count(s.begin(), s.end(), 't'));
      CHECK(s.find_first_not_of("EtL") == std::string::npos);
    }
    // validate_layer_layout (pipeline_parallel_layer_layout.py:95-110): E first, L last, each
    // once, the decoder layers num_layers.
    CHECK(all.front() == 'E');
    CHECK(all.back() == 'L');
    CHECK(std::count(all.begin(), all.end(), 'E') == 1);
    CHECK(std::count(all.begin(), all.end(), 'L') == 1);
    CHECK(std::count(all.begin(), all.end(), 't') == L);
  } else if (has("--num-layers-per-virtual-pipeline-stage")) {
    int64_t per_chunk = integer(f, "--num-layers-per-virtual-pipeline-stage");
    CHECK(L % pp == 0);                   // arguments.py:968-969
    CHECK((L / pp) % per_chunk == 0);     // arguments.py:972-973
    vpp = (L / pp) / per_chunk;           // arguments.py:974-975
    layers.assign(size_t(pp * vpp), per_chunk);
  } else {
    CHECK(L % pp == 0);  // arguments.py:997-998
    layers.assign(size_t(pp), L / pp);
  }
  CHECK(vpp == plan.virtual_pp_size);
  CHECK(layers == plan.layers_per_stage);
  // Interleaved without overlap needs pp > 2 (arguments.py:1000-1009); without interleaving the
  // overlap is off (arguments.py:1010-1012).
  bool overlap_p2p = vpp > 1 && !has("--no-overlap-p2p-communication");
  if (vpp > 1 && has("--no-overlap-p2p-communication")) CHECK(pp > 2);
  if (m.runnable) CHECK(overlap_p2p == plan.overlap_p2p_comm);
  // --overlap-param-gather needs the distributed optimizer or Megatron-FSDP and
  // --overlap-grad-reduce (arguments.py:1025-1029).
  if (has("--overlap-param-gather")) {
    CHECK((has("--use-distributed-optimizer") || has("--use-megatron-fsdp")));
    CHECK(has("--overlap-grad-reduce"));
  }
  CHECK(has("--overlap-grad-reduce") == plan.overlap_grad_reduce);
  CHECK(has("--overlap-param-gather") == plan.overlap_param_gather);
  // Megatron-FSDP v1 runs on the distributed optimizer (arguments.py:1124-1135) and needs
  // --ckpt-format fsdp_dtensor (arguments.py:1169-1170), which needs it (arguments.py:1675-1676);
  // the strategy is one of arguments.py:3190-3191.
  if (has("--use-megatron-fsdp")) {
    CHECK(has("--use-distributed-optimizer"));
    CHECK(f["--ckpt-format"] == "fsdp_dtensor");
    CHECK(std::set<std::string>{"no_shard", "optim", "optim_grads", "optim_grads_params"}.count(
              f["--data-parallel-sharding-strategy"]) == 1);
  }
  if (has("--ckpt-format") && f["--ckpt-format"] == "fsdp_dtensor") CHECK(has("--use-megatron-fsdp"));
  // ZeRO stage as Megatron shards: 1 the distributed optimizer, 2 / 3 Megatron-FSDP.
  const char* strategy[] = {"", "", "optim_grads", "optim_grads_params"};
  CHECK(has("--use-distributed-optimizer") == (plan.zero_stage >= 1));
  CHECK(has("--use-megatron-fsdp") == (plan.zero_stage >= 2));
  if (plan.zero_stage >= 2) CHECK(f["--data-parallel-sharding-strategy"] == strategy[plan.zero_stage]);
  // Partial distributed optimizer: instances divide dp (core/parallel_state.py:922-926).
  int64_t instances = has("--num-distributed-optimizer-instances")
                          ? integer(f, "--num-distributed-optimizer-instances") : 1;
  CHECK(instances == plan.num_distributed_optimizer_instances);
  CHECK(plan.dp_size % instances == 0);
  // Selective recompute takes no method (arguments.py:1425-1428).
  if (f.count("--recompute-granularity") && f["--recompute-granularity"] == "selective") {
    CHECK(!has("--recompute-method"));
  }
  // Sequence parallelism survives only with tp > 1 (arguments.py:1433-1439).
  CHECK(has("--sequence-parallel") == plan.sequence_parallel);
  if (plan.sequence_parallel) CHECK(tp > 1);
}

}  // namespace

TEST_CASE("Megatron-LM layout strings", "[search][megatron]") {
  CHECK(megatron_pipeline_layout({2, 1, 3}) == "Et*2|t|t*3L");
  CHECK(megatron_pipeline_layout({4}) == "Et*4L");
  CHECK(parse_layout("Et*2|t|t*3L") == std::vector<std::string>{"Ett", "t", "tttL"});
  CHECK(parse_layout("E|(tt|)*2,L") == std::vector<std::string>{"E", "tt", "tt", "L"});
}

TEST_CASE("Megatron-LM arguments: GPT-3 13B, 1F1B, ZeRO-1, selective recompute", "[search][megatron]") {
  ModelConfig m = named_model("gpt3-13b");
  Plan p;
  p.tp_size = 8;
  p.pp_size = 2;
  p.dp_size = 4;
  p.zero_stage = 1;
  p.micro_batch_size = 1;
  p.global_batch_size = 64;
  p.sequence_parallel = true;
  p.recompute = RecomputeKind::selective;
  Plan plan = resolved(p, m);
  auto args = megatron_arguments(plan, m);
  INFO(Json(args.arguments).dump() << Json(args.notes).dump());
  CHECK(args.runnable);
  check_megatron_rules(args, plan, m);
  auto f = flags_of(args);
  CHECK(f["--num-layers"] == "40");
  CHECK(f["--hidden-size"] == "5120");
  CHECK(f["--ffn-hidden-size"] == "20480");
  CHECK(f["--normalization"] == "LayerNorm");
  CHECK(f["--norm-epsilon"] == "1e-05");
  CHECK(f["--position-embedding-type"] == "learned_absolute");
  CHECK(f["--max-position-embeddings"] == "2048");
  CHECK(f["--vocab-size"] == "50257");
  CHECK(f["--attention-backend"] == "unfused");
  CHECK(f["--hidden-dropout"] == "0.1");
  CHECK(f["--recompute-granularity"] == "selective");
  CHECK(f.count("--bf16") == 1);
  // GPT: biases, tied embeddings, GeLU, all heads their own keys.
  for (const char* absent : {"--swiglu", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
                             "--group-query-attention", "--rotary-base", "--pipeline-model-parallel-layout"}) {
    CHECK(f.count(absent) == 0);
  }
}

TEST_CASE("Megatron-LM arguments: Llama 3 8B and 70B, interleaved even and uneven", "[search][megatron]") {
  ModelConfig m8 = named_model("llama3-8b");
  Plan p;
  p.tp_size = 4;
  p.pp_size = 4;
  p.dp_size = 2;
  p.schedule = ScheduleKind::interleaved_1f1b;
  p.virtual_pp_size = 2;  // 32 layers on 8 virtual stages: 4 each
  p.zero_stage = 1;
  p.global_batch_size = 16;
  p.attention_impl = AttentionImpl::flash;
  Plan even = resolved(p, m8);
  auto args = megatron_arguments(even, m8);
  INFO(Json(args.arguments).dump() << Json(args.notes).dump());
  CHECK(args.runnable);
  check_megatron_rules(args, even, m8);
  auto f = flags_of(args);
  CHECK(f["--num-layers-per-virtual-pipeline-stage"] == "4");
  CHECK(f["--group-query-attention"] == "");
  CHECK(f["--num-query-groups"] == "8");
  CHECK(f["--ffn-hidden-size"] == "14336");
  CHECK(f["--normalization"] == "RMSNorm");
  CHECK(f["--position-embedding-type"] == "rope");
  CHECK(f["--rotary-base"] == "500000");
  CHECK(f["--attention-backend"] == "flash");
  for (const char* present : {"--swiglu", "--disable-bias-linear", "--untie-embeddings-and-output-weights"}) {
    CHECK(f.count(present) == 1);
  }
  // 8B on pp 3 without interleaving: 32 layers do not split evenly, so a layout.
  p.schedule = ScheduleKind::one_f_one_b;
  p.virtual_pp_size = 1;
  p.pp_size = 3;
  p.global_batch_size = 6;
  Plan uneven_1f1b = resolved(p, m8);
  auto layout = megatron_arguments(uneven_1f1b, m8);
  INFO(Json(layout.arguments).dump());
  CHECK(layout.runnable);
  check_megatron_rules(layout, uneven_1f1b, m8);
  CHECK(flags_of(layout).count("--pipeline-model-parallel-layout") == 1);

  // 70B: 80 layers on pp 4 · vpp 3 = 12 virtual stages, uneven: a layout (Megatron's
  // --num-layers-per-virtual-pipeline-stage needs 80/4 = 20 divisible by it, arguments.py:972).
  ModelConfig m70 = named_model("llama3-70b");
  Plan q;
  q.tp_size = 8;
  q.pp_size = 4;
  q.dp_size = 4;
  q.schedule = ScheduleKind::interleaved_1f1b;
  q.virtual_pp_size = 3;
  q.zero_stage = 3;
  q.global_batch_size = 64;
  q.sequence_parallel = true;
  q.recompute = RecomputeKind::full;
  Plan uneven = resolved(q, m70);
  REQUIRE(80 % 12 != 0);
  auto a70 = megatron_arguments(uneven, m70);
  INFO(Json(a70.arguments).dump() << Json(a70.notes).dump());
  CHECK(a70.runnable);
  check_megatron_rules(a70, uneven, m70);
  auto f70 = flags_of(a70);
  CHECK(f70.count("--num-layers-per-virtual-pipeline-stage") == 0);
  CHECK(parse_layout(f70["--pipeline-model-parallel-layout"]).size() == 12);
  CHECK(f70["--recompute-granularity"] == "full");
  CHECK(f70["--recompute-method"] == "uniform");
  CHECK(f70["--recompute-num-layers"] == "1");
}

TEST_CASE("Megatron-LM arguments: ZeRO 0-3 and hybrid sharding", "[search][megatron]") {
  ModelConfig m = named_model("llama3-8b");
  for (int zero : {0, 1, 2, 3}) {
    for (int64_t instances : {int64_t{1}, int64_t{2}}) {
      if (zero == 0 && instances > 1) continue;
      Plan p;
      p.tp_size = 2;
      p.pp_size = 2;
      p.dp_size = 8;
      p.zero_stage = zero;
      p.num_distributed_optimizer_instances = instances;
      p.global_batch_size = 32;
      Plan plan = resolved(p, m);
      auto args = megatron_arguments(plan, m);
      INFO(plan.name << " " << Json(args.arguments).dump());
      CHECK(args.runnable);
      check_megatron_rules(args, plan, m);
    }
  }
}

TEST_CASE("Megatron-LM arguments: context parallelism in Megatron's words", "[search][megatron]") {
  ModelConfig m = named_model("llama3-8b");
  for (CpCommType kind : {CpCommType::p2p, CpCommType::all_gather, CpCommType::a2a}) {
    Plan p;
    p.tp_size = 2;
    p.cp_size = 4;
    p.cp_comm_type = kind;
    p.pp_size = 2;
    p.dp_size = 2;
    p.zero_stage = 1;
    p.attention_impl = AttentionImpl::flash;
    p.global_batch_size = 16;
    Plan plan = resolved(p, m);
    auto args = megatron_arguments(plan, m);
    auto f = flags_of(args);
    INFO(Json(args.arguments).dump());
    CHECK(args.runnable);
    CHECK(f.at("--context-parallel-size") == "4");
    CHECK(f.at("--cp-comm-type") == to_string(kind));
    CHECK(std::string(to_string(CpCommType::all_gather)) == "allgather");
    CHECK(plan.name.find("-cp4-") != std::string::npos);
    check_megatron_rules(args, plan, m);
  }
}

TEST_CASE("Megatron-LM arguments: FP8 in Transformer Engine's words", "[search][megatron][fp8]") {
  ModelConfig m = named_model("llama3-8b");
  Plan p;
  p.tp_size = 2;
  p.dp_size = 4;
  p.global_batch_size = 8;
  p.fp8.format = Fp8Format::hybrid;
  p.fp8.amax_history_len = 1024;
  p.fp8.amax_compute_algo = Fp8AmaxAlgo::max;
  Plan plan = resolved(p, m);
  auto args = megatron_arguments(plan, m);
  auto f = flags_of(args);
  INFO(Json(args.arguments).dump());
  CHECK(args.runnable);
  // megatron/training/arguments.py, _add_transformer_engine_args: --fp8-format (dest fp8)
  // e4m3|hybrid, --fp8-recipe delayed, --fp8-amax-history-len, --fp8-amax-compute-algo, --fp8-margin.
  CHECK(f.at("--fp8-format") == "hybrid");
  CHECK(f.at("--fp8-recipe") == "delayed");
  CHECK(f.at("--fp8-amax-history-len") == "1024");
  CHECK(f.at("--fp8-amax-compute-algo") == "max");
  CHECK(f.at("--fp8-margin") == "0");
  CHECK(plan.name.find("-fp8h") != std::string::npos);
  check_megatron_rules(args, plan, m);
}

TEST_CASE("Megatron-LM cannot run these as simulated: marked, with the reason", "[search][megatron]") {
  ModelConfig m = named_model("llama3-8b");
  Plan p;
  p.tp_size = 8;
  p.pp_size = 4;
  p.dp_size = 1;
  p.global_batch_size = 8;
  p.schedule = ScheduleKind::gpipe;
  Plan gpipe = resolved(p, m);
  auto a = megatron_arguments(gpipe, m);
  CHECK_FALSE(a.runnable);
  REQUIRE(!a.notes.empty());
  CHECK_THAT(Json(a.notes).dump(), Catch::Contains("gpipe"));
  // 1F1B with its pipeline transfers overlapped: Megatron turns the overlap off (no flag).
  p.schedule = ScheduleKind::one_f_one_b;
  Plan overlapped = resolved(p, m);
  overlapped.overlap_p2p_comm = true;
  auto b = megatron_arguments(overlapped, m);
  CHECK_FALSE(b.runnable);
  CHECK_THAT(Json(b.notes).dump(), Catch::Contains("overlap_p2p_comm"));
  // 2021's scatter/gather of pipeline transfers: the option is gone from today's Megatron-LM.
  Plan scattered = resolved(p, m);
  scattered.scatter_gather_tensors_in_pipeline = true;
  auto c = megatron_arguments(scattered, m);
  CHECK_FALSE(c.runnable);
  CHECK_THAT(Json(c.notes).dump(), Catch::Contains("scatter_gather_tensors_in_pipeline"));
  // The same plan with Megatron's rule runs.
  Plan plain = resolved(p, m);
  CHECK(megatron_arguments(plain, m).runnable);
  check_megatron_rules(megatron_arguments(plain, m), plain, m);
  // A rank order Megatron has no mapping for.
  plain.order = "dp-tp-pp";
  CHECK_FALSE(megatron_arguments(plain, m).runnable);
}

TEST_CASE("stepcast plan --megatron-runnable drops what Megatron-LM cannot run", "[search][megatron][cli]") {
  std::string out = (std::filesystem::temp_directory_path() / "stepcast-test-plan-megatron").string();
  std::filesystem::remove_all(out);
  // 4 devices (2 nodes of 2), so pp 2 and 4: gpipe candidates, which Megatron-LM cannot run.
  std::string common = "plan" + model_arg("tiny") + topology_arg("localhost-cpu") +
                       " --nodes 2 --global-batch-size 8 --include-gpipe --top 200 --evaluate 0 --out ";
  auto all = run_stepcast(common + out + "/all");
  INFO(all.output);
  REQUIRE(all.exit_code == 0);
  Json every = load_json_file(out + "/all/plans.json");
  int64_t not_runnable = 0;
  for (const auto& p : every.at("plans")) {
    bool gpipe = p.at("plan").at("schedule") == "gpipe";
    CHECK(p.at("megatron_runnable").get<bool>() == !gpipe);
    not_runnable += !p["megatron_runnable"].get<bool>();
  }
  REQUIRE(not_runnable > 0);
  // Each written plan's launch line says the same.
  for (const auto& t : every.at("top")) {
    CHECK(t.at("megatron_runnable").get<bool>() == (t["plan"]["schedule"] != "gpipe"));
    std::string stem = t.at("plan_file").get<std::string>();
    stem = stem.substr(0, stem.size() - 5);
    std::ifstream file(out + "/all/" + stem + ".megatron.txt");
    std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    CHECK((text.find("NOT RUNNABLE") == std::string::npos) == t["megatron_runnable"].get<bool>());
    CHECK(text.find("--num-layers 4") != std::string::npos);
  }
  auto runnable = run_stepcast(common + out + "/runnable --megatron-runnable");
  INFO(runnable.output);
  REQUIRE(runnable.exit_code == 0);
  Json kept = load_json_file(out + "/runnable/plans.json");
  CHECK(kept.at("plans").size() + not_runnable == every.at("plans").size());
  for (const auto& p : kept.at("plans")) CHECK(p.at("megatron_runnable").get<bool>());
  CHECK(kept.at("pruned_counts").at("Megatron-LM cannot run it as simulated").get<int64_t>() >= not_runnable);
  std::filesystem::remove_all(out);
}
