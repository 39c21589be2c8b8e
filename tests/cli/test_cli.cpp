// The command line as a user meets it: help and version, `memory` and `lower` with their output
// files, plans that do not fit, and bad input, which must end in exit code 2 with one message
// naming what is wrong, never an internal error (3) or a crash.
#include <catch2/catch.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "json_input.hpp"
#include "test_support.hpp"

using namespace stepcast;
using Catch::Matchers::Contains;
using test::CommandResult;
using test::fresh_dir;
using test::read_json;
using test::run_stepcast;
using test::source_path;

namespace {

using test::model_arg;
using test::plan_arg;
using test::topology_arg;

// The tiny model on the shipped 2-core host: every command on it runs in milliseconds.
const std::string kTinyInputs =
    model_arg("tiny") + topology_arg("localhost-cpu") + plan_arg("tiny-cpu");
const std::string kGpt3Inputs =
    model_arg("gpt3-175b") + topology_arg("dgx-a100-80gb") + plan_arg("gpt3-175b-a100-1024");

// The hash `lower` prints on its "program_sha256 HEX" line; empty when there is none.
std::string printed_sha256(const std::string& output) {
  std::smatch match;
  std::regex line("program_sha256 ([0-9a-f]{64})");
  return std::regex_search(output, match, line) ? match[1].str() : "";
}

// Bad input: exit code 2 and exactly one line, the error, that contains `expected`.
void check_one_error(const CommandResult& result, const std::string& expected) {
  INFO(result.output);
  CHECK(result.exit_code == 2);
  CHECK(std::count(result.output.begin(), result.output.end(), '\n') == 1);
  CHECK_THAT(result.output, Contains(": error: "));
  CHECK_THAT(result.output, Contains(expected));
  CHECK_THAT(result.output, !Contains("internal error"));
}

// localhost-cpu with 4 MB per core and 1 MB of runtime allowance: tiny-cpu needs about 7 MiB.
std::string small_memory_topology() {
  Json topology = read_json(source_path("topologies/localhost-cpu.json"));
  topology["name"] = "localhost-4mb";
  topology["node"]["device"]["memory_bytes"] = 4e6;
  topology["node"]["device"]["runtime_allowance_bytes"] = 1e6;
  return test::write_temp_file("localhost-4mb.json", topology.dump(2));
}

}  // namespace

TEST_CASE("help and version", "[cli]") {
  SECTION("--help lists the commands and exit codes") {
    CommandResult result = run_stepcast("--help");
    INFO(result.output);
    CHECK(result.exit_code == 0);
    CHECK_THAT(result.output, Contains("usage: stepcast <command>"));
    CHECK_THAT(result.output, Contains("memory"));
    CHECK_THAT(result.output, Contains("lower"));
    CHECK_THAT(result.output, Contains("2 bad input"));
  }
  SECTION("no command prints the help and fails") {
    CommandResult result = run_stepcast("");
    CHECK(result.exit_code == 2);
    CHECK_THAT(result.output, Contains("usage: stepcast <command>"));
  }
  SECTION("--version names the git commit") {
    CommandResult result = run_stepcast("--version");
    INFO(result.output);
    CHECK(result.exit_code == 0);
    CHECK_THAT(result.output, Contains("stepcast "));
    CHECK_THAT(result.output, Contains("(git "));
  }
  SECTION("memory --help lists its options") {
    CommandResult result = run_stepcast("memory --help");
    INFO(result.output);
    CHECK(result.exit_code == 0);
    for (const char* option : {"--model", "--topology", "--plan", "--nodes", "--out", "--help"}) {
      CHECK_THAT(result.output, Contains(option));
    }
  }
  SECTION("lower --help lists its options") {
    CommandResult result = run_stepcast("lower --help");
    INFO(result.output);
    CHECK(result.exit_code == 0);
    for (const char* option :
         {"--model", "--topology", "--plan", "--nodes", "--out", "--allow-oom", "--help"}) {
      CHECK_THAT(result.output, Contains(option));
    }
  }
  SECTION("an unknown command names the closest") {
    CommandResult result = run_stepcast("memroy");
    INFO(result.output);
    CHECK(result.exit_code == 2);
    CHECK_THAT(result.output, Contains("unknown command 'memroy' (closest: 'memory')"));
    CHECK_THAT(run_stepcast("lowr").output, Contains("(closest: 'lower')"));
  }
}

TEST_CASE("memory: GPT-3 175B on 1,024 A100 fits, and memory.json says why", "[cli]") {
  std::string dir = fresh_dir("memory-gpt3");
  CommandResult result = run_stepcast("memory" + kGpt3Inputs + " --out " + dir);
  INFO(result.output);
  REQUIRE(result.exit_code == 0);
  CHECK_THAT(result.output, Contains(": fits"));
  CHECK_THAT(result.output, !Contains("DOES NOT FIT"));
  CHECK_THAT(result.output, Contains("wrote " + dir + "/memory.json"));

  Json memory = read_json(dir + "/memory.json");
  for (const char* key : {"ranks", "peak_bytes_max", "reserved_bytes", "capacity_bytes", "fits",
                          "program_sha256", "inputs", "git_commit"}) {
    INFO(key);
    CHECK(memory.contains(key));
  }
  REQUIRE(memory["ranks"].is_array());
  REQUIRE_FALSE(memory["ranks"].empty());
  double peak_max = 0;
  std::set<int64_t> covered;
  for (const Json& rank : memory["ranks"]) {
    for (const char* key :
         {"rank", "ranks", "stage", "memory_weights_bytes", "memory_grads_bytes",
          "memory_optimizer_bytes", "memory_activations_bytes", "memory_workspace_bytes",
          "memory_comm_bytes", "memory_placement_bytes", "memory_runtime_bytes", "peak_bytes"}) {
      INFO(key << " in " << rank.dump());
      REQUIRE(rank.contains(key));
    }
    CHECK(rank["stage"].get<int64_t>() >= 0);
    CHECK(rank["stage"].get<int64_t>() < 8);
    CHECK(rank["rank"] == rank["ranks"][0][0]);
    for (const Json& range : rank["ranks"]) {
      for (int64_t r = range[0].get<int64_t>(); r <= range[1].get<int64_t>(); ++r) {
        CHECK(covered.insert(r).second);  // no rank listed twice
      }
    }
    // The runtime allowance is the topology's; the classes add up to at most the peak.
    CHECK(rank["memory_runtime_bytes"] == 2.0e9);
    double classes = 0;
    for (const char* key : {"memory_weights_bytes", "memory_grads_bytes", "memory_optimizer_bytes",
                            "memory_activations_bytes", "memory_workspace_bytes",
                            "memory_comm_bytes", "memory_placement_bytes", "memory_runtime_bytes"}) {
      classes += rank[key].get<double>();
    }
    CHECK(classes == Approx(rank["peak_bytes"].get<double>()));
    peak_max = std::max(peak_max, rank["peak_bytes"].get<double>());
  }
  CHECK(covered.size() == 1024);
  CHECK(*covered.rbegin() == 1023);
  CHECK(memory["peak_bytes_max"].get<double>() == peak_max);
  // From dgx-a100-80gb.json.
  CHECK(memory["capacity_bytes"] == 85899345920.0);
  CHECK(memory["reserved_bytes"] == 1717986918.0);
  CHECK(memory["fits"] == true);
  CHECK(peak_max + memory["reserved_bytes"].get<double>() <=
        memory["capacity_bytes"].get<double>());
  CHECK(std::regex_match(memory["program_sha256"].get<std::string>(), std::regex("[0-9a-f]{64}")));
  CHECK_FALSE(memory["git_commit"].get<std::string>().empty());

  const Json& inputs = memory["inputs"];
  CHECK(inputs["model"]["name"] == "gpt3-175b");
  CHECK(inputs["topology"]["name"] == "dgx-a100-80gb");
  CHECK(inputs["topology"]["num_nodes"] == 128);
  // The plan as resolved: defaults written out, not left implicit.
  CHECK(inputs["plan"]["name"] == "gpt3-175b-a100-1024");
  CHECK(inputs["plan"]["layers_per_stage"] == Json(std::vector<int64_t>(24, 4)));
  CHECK(inputs["plan"]["grad_bucket_bytes"] == 4e7 * 4);
  CHECK(inputs["plan"]["order"] == "tp-dp-pp");
  CHECK(inputs["plan"]["grad_dtype"] == "fp32");
  CHECK_THAT(inputs["plan_file"].get<std::string>(), Contains("gpt3-175b-a100-1024.json"));
}

TEST_CASE("plan: attention defaults to flash and dropout to the model's stated rate, else Megatron's", "[cli]") {
  std::string out = (std::filesystem::temp_directory_path() / "stepcast-test-plan-defaults").string();
  std::filesystem::remove_all(out);
  auto inputs = [&](const std::string& model, const std::string& topology, const std::string& more) {
    CommandResult r = run_stepcast("plan" + model_arg(model) + topology_arg(topology) +
                                   " --global-batch-size 8 --nodes 1 --top 1 --evaluate 0 --out " + out + more);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    Json plans = read_json(out + "/plans.json");
    std::filesystem::remove_all(out);
    CHECK(plans.at("top").at(0).at("plan").at("attention_impl") == plans.at("inputs").at("attention_impl"));
    return std::make_pair(plans.at("inputs"), r.output);
  };
  auto [tiny, tiny_output] = inputs("tiny", "localhost-cpu", "");  // no dropout key in the config
  CHECK(tiny.at("attention_impl") == "flash");
  CHECK(tiny.at("dropout") == 0.1);
  CHECK(tiny.at("dropout_from") == "Megatron-LM's default");
  CHECK_THAT(tiny_output, Contains("attention flash, dropout 0.1 (Megatron-LM's default)"));
  auto [llama, llama_output] = inputs("llama3-8b", "dgx-h100", "");  // attention_dropout 0.0
  CHECK(llama.at("dropout") == 0.0);
  CHECK(llama.at("dropout_from") == "the model's attention_dropout");
  CHECK_THAT(llama_output, Contains("attention flash, dropout 0 (the model's attention_dropout)"));
  auto [given, given_output] = inputs("llama3-8b", "dgx-h100", " --dropout 0.05 --attention materialized");
  CHECK(given.at("dropout") == 0.05);
  CHECK(given.at("dropout_from") == "--dropout");
  CHECK(given.at("attention_impl") == "materialized");
}

TEST_CASE("lower writes program.json with the hash it prints", "[cli]") {
  std::string dir = fresh_dir("lower-tiny");
  CommandResult result = run_stepcast("lower" + kTinyInputs + " --out " + dir);
  INFO(result.output);
  REQUIRE(result.exit_code == 0);
  std::string printed = printed_sha256(result.output);
  REQUIRE_FALSE(printed.empty());
  CHECK_THAT(result.output, Contains("wrote " + dir + "/program.json"));
  Json program = read_json(dir + "/program.json");
  CHECK(program["program_sha256"] == printed);
  CHECK_FALSE(std::filesystem::exists(dir + "/program.json.tmp"));

  SECTION("memory hashes the same program") {
    std::string memory_dir = fresh_dir("memory-tiny");
    CommandResult memory = run_stepcast("memory" + kTinyInputs + " --out " + memory_dir);
    REQUIRE(memory.exit_code == 0);
    CHECK(read_json(memory_dir + "/memory.json")["program_sha256"] == printed);
  }
  SECTION("lowering is deterministic") {
    std::string again = fresh_dir("lower-tiny-again");
    REQUIRE(run_stepcast("lower" + kTinyInputs + " --out " + again).exit_code == 0);
    CHECK(read_json(again + "/program.json")["program_sha256"] == printed);
  }
}

TEST_CASE("lower without --out is bad input", "[cli]") {
  check_one_error(run_stepcast("lower" + kTinyInputs), "'--out' is required");
}

TEST_CASE("memory with --from-megatron: a launch line is the model and plan, dp_size follows the devices", "[cli]") {
  const std::string line =
      "'torchrun --nnodes 2 --nproc_per_node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 "
      "--num-attention-heads 32 --group-query-attention --num-query-groups 8 --ffn-hidden-size 14336 "
      "--swiglu --normalization RMSNorm --position-embedding-type rope --rotary-base 500000 "
      "--max-position-embeddings 8192 --seq-length 8192 --untie-embeddings-and-output-weights "
      "--disable-bias-linear --vocab-size 128256 --make-vocab-size-divisible-by 1 "
      "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel "
      "--use-distributed-optimizer --micro-batch-size 1 --global-batch-size 64 --bf16 --lr 3e-4 --mock-data'";
  std::string dir = fresh_dir("from-megatron");
  CommandResult result =
      run_stepcast("memory" + topology_arg("dgx-h100") + " --nodes 2 --from-megatron " + line + " --out " + dir);
  INFO(result.output);
  REQUIRE(result.exit_code == 0);
  CHECK_THAT(result.output, Contains("plan megatron, dp_size 4 derived (16 devices / tp·pp·cp = 4)"));
  CHECK_THAT(result.output, Contains("the 16 devices of torchrun --nnodes 2 --nproc_per_node 8"));
  CHECK_THAT(result.output, Contains("not modelled: --lr --mock-data"));
  Json memory = read_json(dir + "/memory.json");
  CHECK(memory["inputs"]["plan"]["dp_size"] == 4);
  CHECK(memory["inputs"]["plan"]["zero_stage"] == 1);
  CHECK(memory["inputs"]["model"]["num_key_value_heads"] == 8);
  CHECK(memory["inputs"]["model"]["seq_length"] == 8192);
  // The same launch line's shape as a model file gives the same memory verdict.
  CommandResult file = run_stepcast("memory" + model_arg("llama3-8b") + topology_arg("dgx-h100") +
                                    " --nodes 2 --seq-length 8192 --plan " +
                                    test::write_temp_file("tp2-pp2.json",
                                                          R"({"tp_size": 2, "pp_size": 2, "sequence_parallel": true,
                                                              "zero_stage": 1, "micro_batch_size": 1,
                                                              "global_batch_size": 64, "attention_impl": "flash",
                                                              "dropout": 0.1})"));
  INFO(file.output);
  REQUIRE(file.exit_code == 0);
  auto peak = [](const std::string& out) {
    size_t at = out.find("\npeak ");
    return out.substr(at, out.find('\n', at + 1) - at);
  };
  CHECK(peak(result.output) == peak(file.output));
}

TEST_CASE("a plan that does not fit: memory says so, lower refuses unless --allow-oom", "[cli]") {
  SECTION("Llama 3 405B without recompute needs about 80 GiB of 80 GB") {
    Json plan = read_json(source_path("examples/llama3-405b-h100-16384.json"));
    plan["recompute"] = "none";
    std::string path = test::write_temp_file("llama3-405b-no-recompute.json", plan.dump(2));
    CommandResult result = run_stepcast("memory" + model_arg("llama3-405b") +
                                        topology_arg("dgx-h100") + " --plan " + path);
    INFO(result.output);
    CHECK(result.exit_code == 0);
    CHECK_THAT(result.output, Contains("DOES NOT FIT"));
  }
  SECTION("tiny-cpu on 4 MB devices") {
    std::string inputs =
        model_arg("tiny") + " --topology " + small_memory_topology() + plan_arg("tiny-cpu");
    CommandResult memory = run_stepcast("memory" + inputs);
    INFO(memory.output);
    CHECK(memory.exit_code == 0);
    CHECK_THAT(memory.output, Contains("DOES NOT FIT"));

    std::string dir = fresh_dir("lower-oom");
    CommandResult refused = run_stepcast("lower" + inputs + " --out " + dir);
    INFO(refused.output);
    CHECK(refused.exit_code == 2);
    CHECK_THAT(refused.output, Contains("tiny-cpu.json"));
    CHECK_THAT(refused.output, Contains("does not fit in memory"));
    CHECK_THAT(refused.output, Contains("--allow-oom"));
    CHECK_FALSE(std::filesystem::exists(dir + "/program.json"));

    CommandResult allowed = run_stepcast("lower" + inputs + " --out " + dir + " --allow-oom");
    INFO(allowed.output);
    CHECK(allowed.exit_code == 0);
    CHECK_THAT(allowed.output, Contains("does not fit"));
    REQUIRE(std::filesystem::exists(dir + "/program.json"));
    CHECK(read_json(dir + "/program.json")["program_sha256"] == printed_sha256(allowed.output));
  }
}

TEST_CASE("bad input reaches the user as exit code 2 and one message", "[cli]") {
  const std::string tiny = model_arg("tiny") + topology_arg("localhost-cpu");
  for (const char* command : {"memory", "lower"}) {
    INFO(command);
    const std::string run = std::string(command) + tiny + " --out " + fresh_dir("bad-input");
    SECTION(std::string(command) + ": malformed JSON, with line and column") {
      std::string path = test::write_temp_file(
          "malformed.json", "{\n  \"micro_batch_size\": 2,\n  \"tp_size\": 1,,\n}\n");
      check_one_error(run_stepcast(run + " --plan " + path), path + ":3:16: malformed JSON");
    }
    SECTION(std::string(command) + ": unknown key, with the closest valid name") {
      std::string path = test::write_temp_file("unknown-key.json",
                                               R"({"micro_batch_size": 2, "tp_sise": 2})");
      check_one_error(run_stepcast(run + " --plan " + path),
                      path + ": key 'tp_sise': unknown key; valid: did you mean 'tp_size'?");
    }
    SECTION(std::string(command) + ": tp_size not dividing the heads") {
      std::string path = test::write_temp_file("tp3.json",
                                               R"({"micro_batch_size": 2, "tp_size": 3})");
      check_one_error(run_stepcast(run + " --plan " + path),
                      path + ": key 'tp_size' = 3: does not divide num_attention_heads = 4");
    }
    SECTION(std::string(command) + ": more devices than the topology, suggesting --nodes") {
      std::string path = test::write_temp_file(
          "dp4.json", R"({"micro_batch_size": 2, "dp_size": 4, "dtype": "fp32"})");
      CommandResult result = run_stepcast(run + " --plan " + path);
      check_one_error(result, path + ": key 'dp_size' = 4");
      CHECK_THAT(result.output, Contains("--nodes 2"));
      // ... and with that suggestion it runs.
      CHECK(run_stepcast(run + " --plan " + path + " --nodes 2").exit_code == 0);
    }
    SECTION(std::string(command) + ": sizes whose product overflows do not crash") {
      std::string path = test::write_temp_file(
          "dp-huge.json", R"({"micro_batch_size": 4, "dp_size": 4611686018427387904})");
      check_one_error(run_stepcast(run + " --plan " + path), path + ": key 'micro_batch_size' = 4");
      path = test::write_temp_file(
          "tp-dp-huge.json",
          R"({"micro_batch_size": 1, "tp_size": 2, "dp_size": 4611686018427387904})");
      check_one_error(run_stepcast(run + " --plan " + path),
                      path + ": key 'dp_size' = 4611686018427387904");
    }
    SECTION(std::string(command) + ": --nodes 0") {
      CommandResult result = run_stepcast(run + plan_arg("tiny-cpu") + " --nodes 0");
      check_one_error(result, "key 'num_nodes' = 0");
      CHECK_THAT(result.output, Contains("--nodes N with N >= 1"));
    }
    SECTION(std::string(command) + ": --nodes that is not a number") {
      check_one_error(run_stepcast(run + plan_arg("tiny-cpu") + " --nodes two"),
                      "the argument ('two') for option '--nodes' is invalid");
    }
    SECTION(std::string(command) + ": a missing --plan") {
      check_one_error(run_stepcast(run), "the option '--plan' is required but missing");
    }
    SECTION(std::string(command) + ": an unknown option") {
      check_one_error(run_stepcast(run + plan_arg("tiny-cpu") + " --plna x"),
                      "unrecognised option '--plna'");
    }
    SECTION(std::string(command) + ": a file that does not exist") {
      check_one_error(run_stepcast(run + " --plan /nonexistent/plan.json"),
                      "/nonexistent/plan.json: cannot open file");
      check_one_error(
          run_stepcast(std::string(command) + " --model /nonexistent/model.json" +
                       topology_arg("localhost-cpu") + plan_arg("tiny-cpu") + " --out " +
                       fresh_dir("bad-input")),
          "/nonexistent/model.json: cannot open file");
    }
  }
}
