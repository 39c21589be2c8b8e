// The TorchTitan job config of a plan (plans/torchtitan_export.hpp): Llama 3 8B and 70B under
// FSDP2 (ZeRO-3), HSDP, DDP, tensor and context parallelism and interleaved pipelines, every key
// held against TorchTitan's JobConfig (torchtitan/config/job_config.py at pytorch/torchtitan
// 000204a4a8bf, sections and fields listed below); plans TorchTitan cannot run as simulated are
// marked with their reason. Then `stepcast plan --out` writes NN-NAME.torchtitan.toml.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "deepspeed_export.hpp"
#include "json_input.hpp"
#include "lower.hpp"
#include "test_support.hpp"
#include "torchtitan_export.hpp"

using namespace stepcast;
using namespace stepcast::test;
using Catch::Matchers::Contains;

namespace {

// JobConfig's fields this export may write, by section (job_config.py: Job, Model, Training,
// Parallelism, ActivationCheckpoint, Float8).
const std::map<std::string, std::set<std::string>> kJobConfig = {
    {"job", {"description"}},
    {"model", {"name", "flavor", "converters"}},
    {"training",
     {"local_batch_size", "global_batch_size", "seq_len", "mixed_precision_param", "mixed_precision_reduce"}},
    {"parallelism",
     {"data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
      "tensor_parallel_degree", "pipeline_parallel_degree", "module_fqns_per_model_part",
      "pipeline_parallel_schedule", "pipeline_parallel_microbatch_size", "context_parallel_degree",
      "context_parallel_rotate_method", "expert_parallel_degree"}},
    {"activation_checkpoint", {"mode", "selective_ac_option"}},
    {"float8", {"recipe_name"}}};

// The TOML as section.key → value text; every key checked against kJobConfig.
std::map<std::string, std::string> parse(const std::string& toml) {
  std::map<std::string, std::string> out;
  std::istringstream in(toml);
  std::string section, line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (line.front() == '[') {
      section = line.substr(1, line.size() - 2);
      INFO(section);
      REQUIRE(kJobConfig.count(section));
      continue;
    }
    size_t eq = line.find(" = ");
    REQUIRE(eq != std::string::npos);
    std::string key = line.substr(0, eq);
    INFO(section << "." << key);
    CHECK(kJobConfig.at(section).count(key));
    CHECK(!out.count(section + "." + key));
    out[section + "." + key] = line.substr(eq + 3);
  }
  return out;
}

Plan resolved(const Json& j, const ModelConfig& m, int nodes) {
  Plan plan = parse_plan(j, "test-plan.json");
  validate_plan(plan, m, load_topology(source_path("topologies/dgx-h100.json"), nodes));
  return plan;
}

Json base(int tp, int pp, int dp, int zero) {
  return {{"name", "p"},
          {"tp_size", tp},
          {"pp_size", pp},
          {"dp_size", dp},
          {"zero_stage", zero},
          {"micro_batch_size", 1},
          {"global_batch_size", 256},
          {"recompute", "full"},
          {"sequence_parallel", tp > 1},
          {"dtype", "bf16"},
          {"attention_impl", "flash"},
          {"dropout", 0.0}};
}

}  // namespace

TEST_CASE("TorchTitan export: Llama 3 8B under FSDP2, tp and an interleaved pipeline", "[torchtitan]") {
  ModelConfig m = load_model(source_path("models/llama3-8b.json"));
  Json j = base(2, 4, 8, 3);
  j["schedule"] = "interleaved_1f1b";
  j["virtual_pp_size"] = 2;
  Plan plan = resolved(j, m, 8);
  TorchTitanConfig c = torchtitan_config(plan, m);
  INFO(c.toml);
  CHECK(c.runnable);
  auto v = parse(c.toml);
  CHECK(v["model.name"] == "\"llama3\"");
  CHECK(v["model.flavor"] == "\"8B\"");
  CHECK(v["parallelism.data_parallel_shard_degree"] == "8");
  CHECK(v["parallelism.data_parallel_replicate_degree"] == "1");
  CHECK(v["parallelism.tensor_parallel_degree"] == "2");
  CHECK(v["parallelism.pipeline_parallel_degree"] == "4");
  CHECK(v["parallelism.pipeline_parallel_schedule"] == "\"Interleaved1F1B\"");
  // 32 layers over 8 virtual stages of 4, the embedding on the first, norm and output on the last.
  const std::string parts = v["parallelism.module_fqns_per_model_part"];
  CHECK(parts.rfind("[[\"tok_embeddings\", \"layers.0\", \"layers.1\", \"layers.2\", \"layers.3\"], "
                    "[\"layers.4\", ", 0) == 0);
  CHECK_THAT(parts, Contains("[\"layers.28\", \"layers.29\", \"layers.30\", \"layers.31\", \"norm\", \"output\"]]"));
  CHECK(std::count(parts.begin(), parts.end(), '[') == 9);
  // Under a pipeline the local batch is every microbatch of the step: 256 / 8 dp ranks.
  CHECK(v["training.local_batch_size"] == "32");
  CHECK(v["training.global_batch_size"] == "256");
  CHECK(v["training.seq_len"] == std::to_string(m.seq_length));
  CHECK(v["training.mixed_precision_param"] == "\"bfloat16\"");
  CHECK(v["activation_checkpoint.mode"] == "\"full\"");
}

TEST_CASE("TorchTitan export: DDP, HSDP, ZeRO-2 and context parallelism", "[torchtitan]") {
  ModelConfig m = load_model(source_path("models/llama3-70b.json"));
  {  // DDP: ZeRO-0, replicated over dp; gradient accumulation from the local batch of one microbatch.
    Json j = base(8, 1, 4, 0);
    j["overlap_grad_reduce"] = true;
    TorchTitanConfig c = torchtitan_config(resolved(j, m, 4), m);
    auto v = parse(c.toml);
    CHECK(c.runnable);
    CHECK(v["model.flavor"] == "\"70B\"");
    CHECK(v["parallelism.data_parallel_replicate_degree"] == "4");
    CHECK(v["parallelism.data_parallel_shard_degree"] == "1");
    CHECK(v["training.local_batch_size"] == "1");
  }
  {  // HSDP: 2 replicas of 4-way shards.
    Json j = base(8, 1, 8, 3);
    j["num_distributed_optimizer_instances"] = 2;
    TorchTitanConfig c = torchtitan_config(resolved(j, m, 8), m);
    auto v = parse(c.toml);
    CHECK(c.runnable);
    CHECK(v["parallelism.data_parallel_replicate_degree"] == "2");
    CHECK(v["parallelism.data_parallel_shard_degree"] == "4");
  }
  {  // ZeRO-2 as FSDP2 keeping the gathered parameters until backward ends; cp 2 over the ring.
    Json j = base(8, 1, 4, 2);
    j["context_parallel_size"] = 2;
    TorchTitanConfig c = torchtitan_config(resolved(j, m, 8), m);
    auto v = parse(c.toml);
    CHECK(c.runnable);
    CHECK(v["parallelism.fsdp_reshard_after_forward"] == "\"never\"");
    CHECK(v["parallelism.data_parallel_shard_degree"] == "4");  // dp·cp / cp: the mesh's dp_shard
    CHECK(v["parallelism.context_parallel_degree"] == "2");
    CHECK(v["parallelism.context_parallel_rotate_method"] == "\"alltoall\"");
  }
}

TEST_CASE("TorchTitan export: what TorchTitan cannot run is marked with its reason", "[torchtitan]") {
  ModelConfig llama = load_model(source_path("models/llama3-8b.json"));
  auto reasons = [](const TorchTitanConfig& c) {
    std::string all;
    for (const std::string& n : c.notes) all += n + "\n";
    return all;
  };
  struct Case {
    const char* what;
    Json plan;
    const char* reason;
  };
  Json zero1 = base(2, 1, 4, 1);
  Json no_sp = base(2, 1, 4, 3);
  no_sp["sequence_parallel"] = false;
  Json selective = base(1, 1, 8, 3);
  selective["recompute"] = "selective";
  Json delayed = base(1, 1, 8, 0);
  delayed["fp8"] = "hybrid";
  Json materialized = base(1, 1, 8, 3);
  materialized["attention_impl"] = "materialized";
  Json ulysses = base(1, 1, 4, 3);
  ulysses["context_parallel_size"] = 2;
  ulysses["cp_comm_type"] = "a2a";
  Json fp16 = base(1, 1, 8, 3);
  fp16["dtype"] = "fp16";
  std::vector<Case> cases = {{"ZeRO-1", zero1, "ZeRO-1"},
                             {"tp without SP", no_sp, "sequence parallelism"},
                             {"selective recompute", selective, "selective recompute"},
                             {"delayed FP8", delayed, "delayed scaling"},
                             {"materialized attention", materialized, "SDPA"},
                             {"Ulysses", ulysses, "Ulysses"},
                             {"fp16", fp16, "mixed_precision_param"}};
  for (const Case& c : cases) {
    TorchTitanConfig t = torchtitan_config(resolved(c.plan, llama, 1), llama);
    INFO(c.what << "\n" << reasons(t));
    parse(t.toml);
    CHECK(!t.runnable);
    CHECK_THAT(reasons(t), Contains(c.reason));
  }
  // A GPT-shaped model has no llama3 flavor: named, with its shape.
  ModelConfig gpt = load_model(source_path("models/gpt3-13b.json"));
  TorchTitanConfig t = torchtitan_config(resolved(base(8, 1, 1, 3), gpt, 1), gpt);
  CHECK(!t.runnable);
  CHECK_THAT(reasons(t), Contains("not Llama-shaped") && Contains("no llama3 flavor") && Contains("dim 5120"));
  // The tensorwise recipe is expressed as torchao's Float8.
  Json tensorwise = base(1, 1, 8, 0);
  tensorwise["fp8"] = "e4m3";
  tensorwise["fp8_recipe"] = "tensorwise";
  TorchTitanConfig f = torchtitan_config(resolved(tensorwise, llama, 1), llama);
  auto v = parse(f.toml);
  CHECK(f.runnable);
  CHECK(v["model.converters"] == "[\"float8\"]");
  CHECK(v["float8.recipe_name"] == "\"tensorwise\"");
}

TEST_CASE("TorchTitan export: plan --out writes each plan's job config", "[torchtitan][plan]") {
  std::string out = fresh_dir("torchtitan-plan");
  CommandResult r = run_stepcast("plan --model " + source_path("models/llama3-8b.json") + " --topology " +
                                 source_path("topologies/dgx-h100.json") +
                                 " --nodes 1 --global-batch-size 16 --top 2 --evaluate 0 --out " + out);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  Json plans = read_json(out + "/plans.json");
  const Json& first = plans.at("top").at(0);
  CHECK(first.contains("torchtitan_runnable"));
  CHECK(first.contains("torchtitan_notes"));
  std::string stem = first.at("plan_file").get<std::string>();
  stem = stem.substr(0, stem.size() - 5);
  std::string toml = read_text_file(out + "/" + stem + ".torchtitan.toml");
  CHECK_THAT(toml, Contains("[parallelism]") && Contains("flavor = \"8B\""));
  parse(toml.substr(toml.find("[job]")));
  Json ds = read_json(out + "/" + stem + ".deepspeed.json");
  CHECK(ds.at("train_batch_size") == 16);
  CHECK(first.contains("deepspeed_runnable"));
}

TEST_CASE("DeepSpeed export: batch sizes, precision and ZeRO, and what the config cannot hold named", "[deepspeed]") {
  ModelConfig m = load_model(source_path("models/llama3-8b.json"));
  {  // ZeRO-3 over 8 ranks in 2 groups of 4: DeepSpeed 0.19.8 has no MiCS any more, so the
     // config shards over all 8 and says so; 256 / (1 · 8) microbatches accumulated.
    Json j = base(1, 1, 8, 3);
    j["num_distributed_optimizer_instances"] = 2;
    j["overlap_param_gather"] = true;
    DeepSpeedConfig d = deepspeed_config(resolved(j, m, 1), m);
    CHECK_FALSE(d.runnable);
    std::string notes;
    for (const std::string& n : d.notes) notes += n;
    CHECK_THAT(notes, Contains("#8489") && Contains("\"mics_shard_size\": 4"));
    CHECK(d.config["train_batch_size"] == 256);
    CHECK(d.config["train_micro_batch_size_per_gpu"] == 1);
    CHECK(d.config["gradient_accumulation_steps"] == 32);
    CHECK(d.config["bf16"]["enabled"] == true);
    CHECK(d.config["zero_optimization"]["stage"] == 3);
    CHECK_FALSE(d.config["zero_optimization"].contains("mics_shard_size"));
    CHECK(d.config["zero_optimization"]["overlap_comm"] == true);
  }
  {  // ZeRO-1 with tp 2 and pp 2: runnable through Megatron-DeepSpeed's launch flags, named.
    Json j = base(2, 2, 2, 1);
    DeepSpeedConfig d = deepspeed_config(resolved(j, m, 1), m);
    CHECK(d.runnable);
    CHECK(d.config["zero_optimization"]["reduce_scatter"] == true);
    std::string notes;
    for (const std::string& n : d.notes) notes += n;
    CHECK_THAT(notes, Contains("--tensor-model-parallel-size 2") && Contains("--pipeline-model-parallel-size 2"));
  }
  {  // ZeRO-2 with a pipeline: DeepSpeed's PipelineEngine refuses it.
    DeepSpeedConfig d = deepspeed_config(resolved(base(1, 2, 4, 2), m, 1), m);
    CHECK(!d.runnable);
    std::string notes;
    for (const std::string& n : d.notes) notes += n;
    CHECK_THAT(notes, Contains("cannot run this plan as simulated: ZeRO-2 with pipeline parallelism"));
  }
}
