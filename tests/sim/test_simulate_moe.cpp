// Routing imbalance in the simulator, end to end through `stepcast simulate`: a skewed routing
// loads the first ep rank's experts, whose grouped GEMMs then pace the step; the draws repeat
// with their seed; under a padded capacity (moe_pad_expert_input_to_capacity) the step does not
// move with the skew, and the token copies over capacity are counted; unpadded, each expert
// computes the copies it keeps.
#include <catch2/catch.hpp>
#include <string>

#include "json_input.hpp"
#include "test_support.hpp"

using stepcast::Json;
using stepcast::test::fresh_dir;
using stepcast::test::read_json;
using stepcast::test::run_stepcast;
using stepcast::test::source_path;
using stepcast::test::write_temp_file;

namespace {

// tiny-moe on 4 host ranks: dp 4, its 4 experts over ep 2 (edp 2); `extra` plan keys.
Json simulate_moe(const std::string& name, Json extra) {
  Json plan = {{"name", name}, {"dp_size", 4}, {"expert_model_parallel_size", 2}, {"micro_batch_size", 2},
               {"global_batch_size", 16}, {"dtype", "fp32"}, {"dropout", 0.0}};
  plan.update(extra);
  std::string file = write_temp_file("moe-" + name + ".json", plan.dump());
  std::string dir = fresh_dir("simulate-moe-" + name);
  auto result = run_stepcast("simulate --model " + source_path("models/tiny-moe.json") + " --topology " +
                             source_path("topologies/localhost-cpu.json") + " --nodes 2 --plan " + file +
                             " --no-scaling --out " + dir);
  INFO(result.output);
  REQUIRE(result.exit_code == 0);
  return read_json(dir + "/prediction.json");
}

double step(const Json& p) { return p.at("step_time_s").get<double>(); }
const Json& moe(const Json& p) { return p.at("moe"); }

}  // namespace

TEST_CASE("simulate: a skewed routing slows the step through the most loaded ep rank", "[simulate][moe]") {
  Json uniform = simulate_moe("uniform", Json::object());
  Json skewed = simulate_moe("skew", {{"moe_routing", "skew"}, {"moe_routing_skew", 2.0}});
  // Shares 1, 1/4, 1/9, 1/16: ep rank 0 (experts 0 and 1) takes 88% of the tokens, 1.76× the mean.
  CHECK(moe(uniform).at("load_ratio_mean").get<double>() < 1.15);
  CHECK(moe(skewed).at("load_ratio_mean").get<double>() > 1.6);
  CHECK(moe(skewed).at("routing_draws").get<int64_t>() == 2 * 4);  // microbatches × MoE layers
  CHECK(step(skewed) > 1.05 * step(uniform));
  // The draws repeat with their seed and move with another.
  CHECK(step(simulate_moe("uniform-again", Json::object())) == step(uniform));
  CHECK(step(simulate_moe("seed-2", {{"moe_routing_seed", 2}})) != step(uniform));
}

TEST_CASE("simulate: under a padded capacity the step does not move with the skew, dropped tokens are counted",
          "[simulate][moe]") {
  Json uniform = simulate_moe("cap-uniform", {{"moe_expert_capacity_factor", 1.0},
                                              {"moe_pad_expert_input_to_capacity", true}});
  Json skewed = simulate_moe("cap-skew", {{"moe_expert_capacity_factor", 1.0}, {"moe_routing", "skew"},
                                          {"moe_routing_skew", 2.0}, {"moe_pad_expert_input_to_capacity", true}});
  CHECK(step(skewed) == Approx(step(uniform)).epsilon(1e-9));
  // Capacity 1.0: an expert takes a quarter of the routed copies; the skew sends 70% to expert 0.
  const double routed = moe(skewed).at("routed_tokens").get<double>();
  CHECK(moe(skewed).at("dropped_tokens").get<double>() > 0.35 * routed);
  CHECK(moe(uniform).at("dropped_tokens").get<double>() < 0.1 * routed);
}

TEST_CASE("simulate: unpadded, an expert computes the copies it keeps — padded, its whole capacity", "[simulate][moe]") {
  // Capacity factor 2.0 = experts / top-k: nothing is dropped, and a padded expert computes twice
  // its mean rows.
  Json dropless = simulate_moe("dropless", Json::object());
  Json kept = simulate_moe("cap2-kept", {{"moe_expert_capacity_factor", 2.0}});
  Json padded = simulate_moe("cap2-padded", {{"moe_expert_capacity_factor", 2.0}, {"moe_pad_expert_input_to_capacity", true}});
  std::printf("moe capacity 2.0: dropless %.6f s, kept %.6f s, padded %.6f s\n", step(dropless), step(kept),
              step(padded));
  CHECK(moe(kept).at("dropped_tokens").get<double>() == 0);
  // (The kept step is above the dropless one: the elementwise ops on the experts' rows run over
  // the capacity-sized buffers, in the executor too.)
  CHECK(step(kept) >= step(dropless));
  CHECK(step(padded) > 1.1 * step(kept));
  // A skew moves the unpadded step (the most loaded rank keeps more copies, up to its capacity).
  Json skewed = simulate_moe("cap2-kept-skew", {{"moe_expert_capacity_factor", 2.0}, {"moe_routing", "skew"},
                                                {"moe_routing_skew", 2.0}});
  CHECK(step(skewed) > step(kept));
}

TEST_CASE("simulate: a histogram's layers each draw from their own row, and measured samples are replayed",
          "[simulate][moe]") {
  // Layers 0 and 1 load ep rank 0 (experts 0 and 1) 3:1, layers 2 and 3 ep rank 1: summed over
  // the layers the routing is even, so one row for every layer gives no imbalance and a row per
  // layer gives each layer its own.
  const std::string rows = "[[40, 35, 15, 10], [35, 40, 10, 15], [10, 15, 40, 35], [15, 10, 35, 40]]";
  const std::string flat_file = write_temp_file("hist-flat.json", R"({"tokens_per_expert": [1, 1, 1, 1]})");
  const std::string layers_file = write_temp_file("hist-layers.json", "{\"tokens_per_expert\": " + rows + "}");
  Json flat = simulate_moe("hist-flat", {{"moe_routing", "histogram"}, {"moe_routing_histogram", flat_file}});
  Json layers = simulate_moe("hist-layers", {{"moe_routing", "histogram"}, {"moe_routing_histogram", layers_file}});
  CHECK(moe(flat).at("load_ratio_mean").get<double>() < 1.15);
  CHECK(moe(layers).at("load_ratio_mean").get<double>() > 1.35);  // 1.5 expected
  CHECK(step(layers) > step(flat));
  // Samples, as `stepcast run` writes them: every (microbatch, layer) replays one, scaled to its
  // 512 copies (T·k·ep = 128·2·2); the one sample gives ep rank 0 15/16 of them.
  Json replayed = simulate_moe(
      "hist-samples", {{"moe_routing", "histogram"},
                       {"moe_routing_histogram",
                        write_temp_file("hist-samples.json", "{\"tokens_per_expert\": " + rows +
                                                                 ", \"samples\": [[[8, 7, 1, 0]], [[8, 7, 1, 0]], "
                                                                 "[[8, 7, 1, 0]], [[8, 7, 1, 0]]]}")}});
  CHECK(moe(replayed).at("load_ratio_mean").get<double>() == Approx(1.875));
  CHECK(moe(replayed).at("load_ratio_max").get<double>() == Approx(1.875));
  CHECK(step(replayed) > step(layers));
}
