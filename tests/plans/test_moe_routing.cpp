// A mixture of experts' measured routing as a plan names it: a histogram with a row per MoE layer
// (each layer's draws from its own shares) and the samples a run measured (each (microbatch,
// layer) replays one, scaled to the tokens routed), through the plan, the lowering (dropless
// buffers sized by the heaviest sample) and the program's JSON.
#include <catch2/catch.hpp>
#include <numeric>
#include <set>
#include <sstream>

#include "lower.hpp"
#include "lower_context.hpp"
#include "lower_fixtures.hpp"
#include "moe.hpp"
#include "program_json.hpp"
#include "sha256.hpp"

using Catch::Matchers::Contains;
using namespace stepcast;

namespace {

ModelConfig tiny_moe() { return load_model(test::source_path("models/tiny-moe.json")); }

// tiny-moe (4 layers, 4 experts, top-2, sequence 64) over dp 4 with ep 2, naming `histogram`.
Json histogram_plan(const std::string& name, const std::string& histogram) {
  return {{"dp_size", 4},          {"expert_model_parallel_size", 2}, {"micro_batch_size", 1},
          {"global_batch_size", 8}, {"dtype", "fp32"},               {"moe_routing", "histogram"},
          {"moe_routing_histogram", test::write_temp_file(name, histogram)}};
}

int64_t sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

}  // namespace

TEST_CASE("a routing histogram with a row per MoE layer gives each layer its shares", "[plan][moe]") {
  ModelConfig model = tiny_moe();
  Topology topo = test::test_topology();
  Plan plan = test::make_plan(
      histogram_plan("layers.json", R"({"tokens_per_expert": [[60, 20, 10, 10], [10, 10, 20, 60],
                                                              [25, 25, 25, 25], [40, 40, 10, 10]]})"),
      model, topo);
  CHECK(routing_per_layer(plan.moe));
  CHECK(routing_shares(plan.moe, 4, 0)[0] == Approx(0.6));
  CHECK(routing_shares(plan.moe, 4, 1)[3] == Approx(0.6));
  CHECK(routing_shares(plan.moe, 4, 2)[2] == Approx(0.25));
  // Over every layer: the rows summed (135, 95, 65, 105 of 400).
  CHECK(routing_shares(plan.moe, 4)[0] == Approx(135.0 / 400));
  StepProgram program = lower_program(model, topo, plan);
  REQUIRE(program.moe.layer_routing_shares.size() == 4);
  CHECK(program.moe.shares(1)[3] == Approx(0.6));
  CHECK(program.moe.routing_shares[0] == Approx(135.0 / 400));
  // Through the program's JSON, and the plan's histogram named by its resolved path, so that the
  // plan read back from the program finds it.
  std::ostringstream text;
  const std::string sha = write_program_json(program, &text);
  StepProgram back = parse_program_json_text(text.str(), "program.json");
  CHECK(back.program_sha256 == sha);
  CHECK(back.moe.layer_routing_shares == program.moe.layer_routing_shares);
  CHECK(back.moe.routing_samples.empty());
  CHECK(Json(program.plan).at("moe_routing_histogram").get<std::string>().front() == '/');
  // One row for every layer: no per-layer shares, and the program's JSON has no such key.
  Plan flat = test::make_plan(histogram_plan("flat.json", R"({"tokens_per_expert": [60, 20, 10, 10]})"), model, topo);
  CHECK(!routing_per_layer(flat.moe));
  StepProgram flat_program = lower_program(model, topo, flat);
  CHECK(flat_program.moe.layer_routing_shares.empty());
  std::ostringstream flat_text;
  write_program_json(flat_program, &flat_text);
  CHECK_THAT(flat_text.str(), !Contains("layer_routing_shares") && !Contains("routing_samples"));
}

TEST_CASE("replayed routing samples: one per (microbatch, layer), scaled to the tokens, repeatable", "[moe]") {
  const std::vector<std::vector<int64_t>> samples = {{30, 10, 0, 24}, {1, 1, 1, 1}, {0, 0, 5, 3}};
  for (int64_t mb = 0; mb < 20; ++mb) {
    std::vector<int64_t> counts = replay_routing(samples, 512, 7, mb, 2);
    CHECK(sum(counts) == 512);
    CHECK(counts == replay_routing(samples, 512, 7, mb, 2));
    // Each is one of the samples scaled: 8×, 128×, 64×.
    const bool one_of = counts == std::vector<int64_t>{240, 80, 0, 192} ||
                        counts == std::vector<int64_t>{128, 128, 128, 128} ||
                        counts == std::vector<int64_t>{0, 0, 320, 192};
    CHECK(one_of);
  }
  // Largest remainders: 3 copies over 1, 1, 1, 1 and over 2, 1, 0, 0.
  CHECK(sum(replay_routing({{1, 1, 1, 1}}, 3, 0, 0, 0)) == 3);
  CHECK(replay_routing({{2, 1, 0, 0}}, 4, 0, 0, 0) == std::vector<int64_t>{3, 1, 0, 0});
  // Every sample is picked over the microbatches.
  std::set<std::vector<int64_t>> seen;
  for (int64_t mb = 0; mb < 64; ++mb) seen.insert(replay_routing(samples, 512, 1, mb, 0));
  CHECK(seen.size() == 3);
}

TEST_CASE("routing samples: replayed by the program, and the dropless buffers hold the heaviest", "[lower][moe]") {
  ModelConfig model = tiny_moe();
  Topology topo = test::test_topology();
  // A sample per layer row: ep rank 0 (experts 0 and 1) gets 7/8 of the copies in the second.
  Plan plan = test::make_plan(histogram_plan("samples.json", R"({"tokens_per_expert": [10, 10, 10, 10],
      "samples": [[[1, 1, 1, 1], [4, 3, 1, 0]]]})"),
                              model, topo);
  REQUIRE(plan.moe.samples.size() == 1);
  StepProgram program = lower_program(model, topo, plan);
  REQUIRE(program.moe.routing_samples.size() == 4);  // every layer replays the one list
  // N = T·k·ep = 64·2·2 = 256 copies a (microbatch, layer); the heaviest sample puts 224 on rank 0.
  LowerContext ctx(model, topo, plan);
  CHECK(ctx.moe.expert_rows == 224);
  for (int64_t mb = 0; mb < 8; ++mb) {
    std::vector<int64_t> counts = program.moe.routing_counts(mb, 1);
    CHECK(sum(counts) == program.moe.routed_tokens);
    CHECK((counts == std::vector<int64_t>{64, 64, 64, 64} || counts == std::vector<int64_t>{128, 96, 32, 0}));
  }
  std::ostringstream text;
  write_program_json(program, &text);
  StepProgram back = parse_program_json_text(text.str(), "program.json");
  CHECK(back.moe.routing_samples == program.moe.routing_samples);
  CHECK(back.moe.routing_counts(3, 2) == program.moe.routing_counts(3, 2));
  // A program whose samples do not match its experts is refused, naming the key.
  std::string bad = text.str();
  const size_t at = bad.find("[[1,1,1,1]");
  REQUIRE(at != std::string::npos);
  bad.replace(at, 10, "[[1,1,1]");
  const std::string marker = ",\"program_sha256\":\"";  // hashed again: the content is refused, not the hash
  const size_t hash_at = bad.find(marker);
  REQUIRE(hash_at != std::string::npos);
  bad.replace(hash_at + marker.size(), 64, sha256_hex(std::string_view(bad).substr(0, hash_at)));
  CHECK_THROWS_WITH(parse_program_json_text(bad, "program.json"),
                    Contains("'moe.routing_samples[") && Contains("one count >= 0 per expert (4)"));
}

TEST_CASE("moe_token_drop_policy: Megatron's default probs, position on request, refused dropless", "[plan][moe]") {
  ModelConfig model = tiny_moe();
  Topology topo = test::test_topology();
  Json j = {{"dp_size", 2},          {"expert_model_parallel_size", 2}, {"micro_batch_size", 1},
            {"global_batch_size", 4}, {"dtype", "fp32"},               {"moe_expert_capacity_factor", 1.0}};
  Plan probs = test::make_plan(j, model, topo);
  CHECK(probs.moe.drop_by_probs);
  CHECK(plan_to_json(probs).at("moe_token_drop_policy") == "probs");
  j["moe_token_drop_policy"] = "position";
  Plan position = test::make_plan(j, model, topo);
  CHECK_FALSE(position.moe.drop_by_probs);
  // The program carries it; a program from before the key dropped by position.
  for (const Plan* plan : {&probs, &position}) {
    StepProgram program = lower_program(model, topo, *plan);
    CHECK(program.moe.drop_by_probs == plan->moe.drop_by_probs);
    std::ostringstream text;
    write_program_json(program, &text);
    CHECK(parse_program_json_text(text.str(), "program.json").moe.drop_by_probs == plan->moe.drop_by_probs);
    // Without the key (hashed again), as an older program is read: by position.
    std::string old = text.str();
    const std::string key =
        std::string(",\"token_drop_policy\":\"") + (plan->moe.drop_by_probs ? "probs" : "position") + "\"";
    REQUIRE(old.find(key) != std::string::npos);
    old.erase(old.find(key), key.size());
    const std::string marker = ",\"program_sha256\":\"";
    const size_t hash_at = old.find(marker);
    old.replace(hash_at + marker.size(), 64, sha256_hex(std::string_view(old).substr(0, hash_at)));
    CHECK_FALSE(parse_program_json_text(old, "program.json").moe.drop_by_probs);
  }
  j.erase("moe_expert_capacity_factor");
  CHECK_THROWS_WITH(test::make_plan(j, model, topo), Contains("'moe_token_drop_policy' = \"position\"") &&
                                                         Contains("the plan has none") &&
                                                         Contains("a moe_expert_capacity_factor beside it"));
  j.erase("moe_token_drop_policy");
  CHECK_FALSE(plan_to_json(test::make_plan(j, model, topo)).contains("moe_token_drop_policy"));  // dropless
}
