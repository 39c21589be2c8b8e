// The planner on mixtures of experts: the expert layouts enumerated (counts worked by hand), the
// persistent bound exact against lowering, the MoE path's verdicts, peaks and estimates equal to
// `memory` and quick_estimate on the lowered program, the estimate's routing imbalance worked by
// hand, the expert groups' reductions counted, and `plan` / `compare-strategies` end to end.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <tuple>

#include "cheap_path_check.hpp"
#include "lower.hpp"
#include "quick_estimate.hpp"
#include "search.hpp"
#include "test_support.hpp"

using namespace stepcast;
using namespace stepcast::test;

namespace {

ModelConfig tiny_moe() { return load_model(source_path("models/tiny-moe.json")); }
ModelConfig tiny_moe_shared() { return load_model(source_path("models/tiny-moe-shared.json")); }
Topology cpu(int nodes) { return load_topology(source_path("topologies/localhost-cpu.json"), nodes); }

ComputeCostModel costs(const Topology& topology) {
  return ComputeCostModel(topology.node.device, Dtype::fp32, roofline_profile(topology), topology.file);
}

Plan moe_plan(const ModelConfig& model, const Topology& topology, int64_t tp, int64_t dp, int64_t ep,
              double skew = 0, double capacity = 0) {
  Plan p;
  p.tp_size = tp;
  p.dp_size = dp;
  p.sequence_parallel = tp > 1;
  p.param_dtype = Dtype::fp32;
  p.grad_dtype = Dtype::fp32;
  p.micro_batch_size = 1;
  p.global_batch_size = 2 * dp;
  p.overlap_grad_reduce = true;
  p.moe.ep_size = ep;
  p.moe.etp_size = 1;
  p.moe.capacity_factor = capacity;
  p.moe.routing = skew > 0 ? RoutingKind::skew : RoutingKind::uniform;
  p.moe.skew = skew;
  p.moe.set = true;
  p.name = "moe";
  p.file = "test plan";
  validate_plan(p, model, topology);
  return p;
}

double persistent_allocated(const Role& role) {
  double bytes = 0;
  for (const Op& op : role.ops) {
    if (op.kind == OpKind::alloc && op.persistent) bytes += op.bytes;
  }
  return bytes;
}

}  // namespace

TEST_CASE("the planner enumerates expert layouts: tiny-moe on 4 CPU cores", "[search][moe]") {
  // 4 experts. Stage ranks tp·dp = 4 on every (tp, pp=1) triple. tp 1: etp {1}, ep ∈ {1, 2, 4}
  // → 3 layouts; tp 2: etp 1 with ep {1, 2, 4}, etp 2 with ep·2 | 4 → {1, 2}: 5 layouts. Each
  // with both dispatchers, but ep·etp = 1 (nothing dispatched) with one: 5 and 9.
  SearchSpace space;
  space.global_batch_size = 16;
  space.micro_batch_sizes = {1};
  space.zero_stages = {0};
  auto candidates = enumerate_candidates(tiny_moe(), cpu(2), space);
  std::map<std::tuple<int64_t, int64_t>, std::set<std::tuple<int64_t, int64_t, int>>> layouts;
  std::set<std::string> names;
  for (const auto& c : candidates) {
    layouts[{c.plan.tp_size, c.plan.pp_size}].insert({c.plan.moe.ep_size, c.plan.moe.etp_size, int(c.plan.moe.dispatcher)});
    if (c.kept()) names.insert(c.plan.name);
  }
  CHECK(layouts[{1, 1}].size() == 3 * 2 - 1);
  CHECK(layouts[{2, 1}].size() == 5 * 2 - 1);
  // Named with ep, etp where it is not tp, and the allgather dispatcher.
  CHECK(names.count("tp1-pp1-dp4-z0-mbs1-1f1b-ep4"));
  CHECK(names.count("tp1-pp1-dp4-z0-mbs1-1f1b-ep2-agd"));
  CHECK(names.count("tp2-pp1-dp2-z0-mbs1-1f1b-sp-ep2"));
  CHECK(names.count("tp2-pp1-dp2-z0-mbs1-1f1b-sp-ep4-etp1"));
  // tp 2 without sequence parallelism is Megatron's refusal for experts: pruned with its reason.
  int64_t sp_reasons = 0;
  for (const auto& c : candidates) {
    INFO(c.plan.name << ": " << c.pruned_detail);
    if (c.plan.tp_size == 2 && !c.plan.sequence_parallel) CHECK(!c.kept());
    sp_reasons += c.pruned.rfind("sequence_parallel", 0) == 0;
  }
  CHECK(sp_reasons > 0);
  // A dense model keeps one layout (no expert keys in its names).
  for (const auto& c : enumerate_candidates(load_model(source_path("models/tiny.json")), cpu(2), space)) {
    CHECK(c.plan.name.find("-ep") == std::string::npos);
  }
  // --ep / --etp / one dispatcher narrow the layouts.
  space.expert_parallel_sizes = {2};
  space.moe_dispatchers = {MoeDispatcher::alltoall};
  for (const auto& c : enumerate_candidates(tiny_moe(), cpu(2), space)) CHECK(c.plan.moe.ep_size == 2);
}

// Every kept candidate's persistent bound (pp ≤ 2, no recompute) against its lowering's persistent
// bytes; the expert parallel sizes and ZeRO stages compared, and how many candidates.
int64_t compare_persistent(const ModelConfig& model, const Topology& topology, const SearchSpace& space,
                           std::set<int64_t>& eps, std::set<int64_t>& zero_stages) {
  int64_t compared = 0;
  for (const auto& c : enumerate_candidates(model, topology, space)) {
    if (!c.kept() || c.plan.recompute != RecomputeKind::none || c.plan.pp_size > 2) continue;
    std::vector<double> bound = stage_persistent_bytes(c.plan, model, topology);
    StepProgram program = lower_program(model, topology, c.plan);
    REQUIRE(bound.size() == program.roles.size());
    for (const Role& role : program.roles) {
      INFO(c.plan.name << " stage " << role.pp_stage);
      CHECK(bound[size_t(role.pp_stage)] == Approx(persistent_allocated(role)).epsilon(1e-12));
    }
    eps.insert(c.plan.moe.ep_size);
    zero_stages.insert(c.plan.zero_stage);
    ++compared;
  }
  return compared;
}

TEST_CASE("the planner's persistent bound is lowering's persistent bytes, experts included", "[search][moe]") {
  // tiny-moe-shared: a dense first layer, 8 experts and a shared one; every ZeRO stage, pp 1 and 2.
  SearchSpace space;
  space.global_batch_size = 16;
  space.micro_batch_sizes = {1};
  space.virtual_pp_sizes = {};
  std::set<int64_t> eps, zero_stages;
  CHECK(compare_persistent(tiny_moe_shared(), cpu(4), space, eps, zero_stages) > 50);
  CHECK(eps.size() >= 3);
}

TEST_CASE("the planner's persistent bound holds the FP8 copies: the experts' too, none kept under ZeRO-3",
          "[search][moe][fp8]") {
  // FP8 weight copies of the layers and of their experts (and their transposes on a device that
  // reads FP8 row-wise only), persistent unless ZeRO-3 shards the weights; the scale slots of
  // both recipes (current scaling: each kept input's per microbatch, each local expert's).
  SearchSpace space;
  space.global_batch_size = 8;
  space.micro_batch_sizes = {1};
  space.virtual_pp_sizes = {};
  Topology transposed = cpu(4);
  transposed.node.device.fp8_transposed_copies = true;
  for (Fp8Scaling scaling : {Fp8Scaling::delayed, Fp8Scaling::current}) {
    INFO(to_string(scaling));
    space.fp8.format = Fp8Format::hybrid;
    space.fp8.scaling = scaling;
    std::set<int64_t> eps, zero_stages;
    CHECK(compare_persistent(tiny_moe_shared(), transposed, space, eps, zero_stages) > 20);
    CHECK(zero_stages.count(3) == 1);
    CHECK(eps.size() >= 2);
  }
}

TEST_CASE("the MoE path agrees with memory and quick_estimate: tiny-moe on 4 cores", "[search][moe]") {
  SearchSpace space;
  space.global_batch_size = 16;
  space.micro_batch_sizes = {1, 2};
  space.moe_lowered_plans = 0;  // (every candidate lowered)
  check_cheap_path(tiny_moe(), cpu(2), space, 7);
  space.moe.routing = RoutingKind::skew;
  space.moe.skew = 1.0;
  space.moe.capacity_factor = 1.5;
  check_cheap_path(tiny_moe_shared(), cpu(2), space, 7);
}

TEST_CASE("the MoE path agrees with memory and quick_estimate under FP8: tiny-moe-shared on 8 H100",
          "[search][moe][fp8]") {
  // The experts' FP8 copies (persistent, or cast at each use under ZeRO-3) and, under current
  // scaling, each local expert's scale slots.
  SearchSpace space;
  space.global_batch_size = 16;
  space.micro_batch_sizes = {1};
  space.attention_impl = AttentionImpl::flash;
  space.moe_lowered_plans = 0;  // (every candidate lowered)
  space.fp8.format = Fp8Format::hybrid;
  const Topology h100 = load_topology(source_path("topologies/dgx-h100.json"), 1);
  check_cheap_path(tiny_moe_shared(), h100, space, 3);
  space.fp8.scaling = Fp8Scaling::current;
  check_cheap_path(tiny_moe_shared(), h100, space, 3);
}

TEST_CASE("the MoE search lowers in the screen's order until enough fit", "[search][moe]") {
  ModelConfig model = tiny_moe();
  Topology topology = cpu(2);
  SearchSpace space;
  space.global_batch_size = 16;
  space.micro_batch_sizes = {1, 2};
  space.moe_lowered_plans = 5;
  auto candidates = enumerate_candidates(model, topology, space);
  ComputeCostModel cost_model = costs(topology);
  check_candidates(candidates, model, topology, space, cost_model, 2, nullptr);
  int64_t fit = 0, skipped = 0, lowered = 0;
  for (const auto& c : candidates) {
    if (c.kept()) {
      ++fit;
      CHECK(c.peak_exact);
      // The estimate is quick_estimate's on the lowered program.
      QuickEstimate e = quick_estimate(lower_program(model, topology, memory_path_plan(c.plan)), c.plan,
                                       c.plan.num_microbatches(), topology, cost_model);
      CHECK(c.estimate.step_time_s == Approx(e.step_time_s).epsilon(1e-9));
    }
    if (c.pruned == "not lowered: below the best the MoE screen ranks") {
      ++skipped;
      CHECK_THAT(c.pruned_detail, Catch::Contains("--moe-lowered 0"));
    }
    lowered += c.walked_stages > 0;
  }
  // Batches of 8 (2 jobs): at least 5 fit, the rest named.
  CHECK(fit >= 5);
  CHECK(skipped > 0);
  CHECK(lowered >= fit);
}

TEST_CASE("the quick estimate's expert imbalance, worked by hand", "[search][moe]") {
  // tiny-moe, 4 experts on ep 2: rank 0 holds experts 0 and 1, rank 1 experts 2 and 3. Dropless,
  // each expert's GEMM runs with its expected rows (routed copies × share), the busiest rank's
  // sum against the op as lowered (both experts at the mean rows, one launch).
  ModelConfig model = tiny_moe();
  Topology topology = cpu(2);
  ComputeCostModel cost_model = costs(topology);
  // The expert GEMMs of microbatch 0 on the busiest rank, with rows_of(e) rows for expert e,
  // minus the ops as lowered, over the step's microbatches.
  auto by_hand = [&](const StepProgram& program, const Plan& plan, const std::vector<int64_t>& rows) {
    std::map<std::pair<int32_t, int64_t>, double> memo;
    double beyond = 0;
    for (const Op& op : program.roles[0].ops) {
      if (op.microbatch != 0 || (op.name != OpName::expert_gate && op.name != OpName::expert_up &&
                                 op.name != OpName::expert_down)) {
        continue;
      }
      const double rank0 = grouped_gemm_time_s(cost_model, op, {rows[0], rows[1]}, memo);
      const double rank1 = grouped_gemm_time_s(cost_model, op, {rows[2], rows[3]}, memo);
      beyond += std::max(rank0, rank1) - cost_model.op_time_s(op);
    }
    return beyond * double(plan.num_microbatches());
  };
  auto estimate = [&](double skew, double capacity, double* expected, bool pad = false) {
    Plan plan = moe_plan(model, topology, 1, 4, 2, skew, capacity);
    plan.moe.pad_to_capacity = pad;
    StepProgram program = lower_program(model, topology, plan);
    const double routed = double(program.moe.routed_tokens);
    // Skew 1: shares ∝ 1, 1/2, 1/3, 1/4 (sum 25/12): 0.48, 0.24, 0.16, 0.12.
    const std::vector<double> shares =
        skew == 0 ? std::vector<double>(4, 0.25) : std::vector<double>{0.48, 0.24, 0.16, 0.12};
    std::vector<int64_t> rows;
    // Under a capacity an expert computes the copies it keeps, at most its capacity rows; padded,
    // its capacity (every rank alike).
    for (double share : shares) {
      const int64_t r = std::llround(share * routed);
      rows.push_back(capacity > 0 ? std::min(r, program.moe.expert_capacity_rows) : r);
    }
    *expected = pad ? 0.0 : by_hand(program, plan, rows);
    return quick_estimate(program, plan, plan.num_microbatches(), topology, cost_model);
  };
  double expected = 0;
  QuickEstimate uniform = estimate(0, 0, &expected);
  CHECK(uniform.expert_imbalance_s == Approx(expected).epsilon(1e-9));  // (the experts' own launches)
  QuickEstimate skewed = estimate(1.0, 0, &expected);
  CHECK(skewed.expert_imbalance_s == Approx(expected).epsilon(1e-9));
  CHECK(skewed.expert_imbalance_s > uniform.expert_imbalance_s);
  // The dispatch and combine: rank 0 receives 0.72 of the copies, 1.44 × the mean.
  CHECK(skewed.ep_comm_s > 1.3 * uniform.ep_comm_s);
  CHECK(skewed.step_time_s > uniform.step_time_s);
  // Under a capacity the busiest rank keeps at most its experts' capacities; padded to it, every
  // rank computes and sends alike.
  QuickEstimate capped = estimate(1.0, 1.2, &expected);
  CHECK(capped.expert_imbalance_s == Approx(expected).epsilon(1e-9));
  CHECK(capped.expert_imbalance_s < skewed.expert_imbalance_s);
  QuickEstimate padded = estimate(1.0, 1.2, &expected, true);
  CHECK(padded.expert_imbalance_s == 0);
}

TEST_CASE("the quick estimate counts the expert groups' gradient reductions", "[search][moe]") {
  // ep 2 on dp 4: the experts' gradients reduce over edp (2 ranks), the rest over dp; with
  // overlap their buckets go out during the last backward pass. Without them the dp
  // communication the estimate exposes is smaller.
  ModelConfig model = tiny_moe();
  Topology topology = cpu(2);
  ComputeCostModel cost_model = costs(topology);
  Plan plan = moe_plan(model, topology, 1, 4, 2);
  plan.overlap_grad_reduce = false;
  StepProgram program = lower_program(model, topology, plan);
  StepProgram without = program;
  int64_t removed = 0;
  for (Role& role : without.roles) {
    for (Op& op : role.ops) {
      if (is_collective(op.kind) && op.group == GroupKind::edp) op.bytes = 0, ++removed;
    }
  }
  REQUIRE(removed > 0);
  QuickEstimate with_edp = quick_estimate(program, plan, plan.num_microbatches(), topology, cost_model);
  QuickEstimate no_edp = quick_estimate(without, plan, plan.num_microbatches(), topology, cost_model);
  CHECK(with_edp.dp_comm_s > no_edp.dp_comm_s);
  CHECK(with_edp.optimizer_s == Approx(no_edp.optimizer_s));  // (counted as dp's, not the step's)
}

TEST_CASE("stepcast plan and compare-strategies search expert layouts on tiny-moe", "[search][moe][cli]") {
  std::string out = fresh_dir("moe-plan");
  auto r = run_stepcast("plan" + model_arg("tiny-moe") + topology_arg("localhost-cpu") +
                        " --nodes 2 --global-batch-size 8 --top 3 --evaluate 2 --out " + out);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  Json plans = read_json(out + "/plans.json");
  std::set<int64_t> eps;
  for (const auto& p : plans.at("plans")) {
    eps.insert(p.at("plan").at("expert_model_parallel_size").get<int64_t>());
  }
  CHECK(eps.size() >= 2);
  CHECK(plans["plans"][0]["step_time_source"] == "simulate");
  std::string strategies = fresh_dir("moe-strategies");
  auto s = run_stepcast("compare-strategies" + model_arg("tiny-moe") + topology_arg("localhost-cpu") +
                        " --nodes 2 --global-batch-size 8 --moe-routing-skew 1 --moe-skew-sweep 0,1.5 --out " +
                        strategies);
  INFO(s.output);
  REQUIRE(s.exit_code == 0);
  CHECK_THAT(s.output, Catch::Contains("EP in a node (alltoall)"));
  Json rows = read_json(strategies + "/strategies.json").at("strategies");
  bool imbalance = false;
  for (const auto& row : rows) {
    INFO(row.dump());
    if (row.at("plan").get<std::string>().empty()) continue;
    CHECK(row.at("ep_comm_estimate_s").is_number());
    if (row.at("plan").get<std::string>().find("-ep1") == std::string::npos) {
      imbalance = imbalance || row.at("expert_imbalance_estimate_s").get<double>() > 0;
    }
  }
  CHECK(imbalance);  // skewed routing over ep > 1 shows a busiest rank
  // --moe-skew-sweep: each simulated row's plan again under skew 0 and 1.5; over ep > 1 the
  // busiest rank's load and the step grow with the skew.
  Json skews = read_json(strategies + "/strategies.json").at("routing_skew");
  REQUIRE(skews.size() >= 4);
  REQUIRE(skews.size() % 2 == 0);
  bool slower = false;
  for (size_t i = 0; i < skews.size(); i += 2) {
    const Json &uniform = skews[i], &skewed = skews[i + 1];
    INFO(uniform.dump() << "\n" << skewed.dump());
    REQUIRE(uniform.at("simulated").get<bool>());
    REQUIRE(skewed.at("simulated").get<bool>());
    CHECK(uniform.at("plan") == skewed.at("plan"));
    CHECK(uniform.at("skew").get<double>() == 0);
    CHECK(skewed.at("skew").get<double>() == 1.5);
    if (uniform.at("plan").get<std::string>().find("-ep1") != std::string::npos) continue;
    CHECK(skewed.at("load_ratio_mean").get<double>() > uniform.at("load_ratio_mean").get<double>() + 0.2);
    slower = slower || skewed.at("step_time_s").get<double>() > 1.05 * uniform.at("step_time_s").get<double>();
  }
  CHECK(slower);
  CHECK_THAT(s.output, Catch::Contains("routing skew"));
  CHECK_THAT(read_text_file(strategies + "/report.md"), Catch::Contains("## Routing skew"));
  CHECK_THAT(read_text_file(strategies + "/report.html"),
             Catch::Contains("Simulated step time against the routing skew"));
  CHECK(std::filesystem::exists(strategies + "/routing-skew.csv"));
  std::filesystem::remove_all(out);
  std::filesystem::remove_all(strategies);
}

TEST_CASE("stepcast plan and compare-strategies take a measured routing (--moe-routing-histogram)",
          "[search][moe][cli]") {
  // A run's routing as `run --out` writes it: even summed, but each sample loads ep rank 0 of an
  // ep 2 layout 7:1 (experts 0 and 1); every candidate carries it, and over ep > 1 the estimate
  // sees the busiest rank.
  const std::string histogram = write_temp_file(
      "leaning-routing.json",
      R"({"tokens_per_expert": [1, 1, 1, 1], "samples": [[[8, 6, 1, 1], [6, 8, 1, 1]]]})");
  std::string out = fresh_dir("moe-plan-histogram");
  auto r = run_stepcast("plan" + model_arg("tiny-moe") + topology_arg("localhost-cpu") +
                        " --nodes 2 --global-batch-size 8 --top 3 --evaluate 2 --moe-routing-histogram " + histogram +
                        " --out " + out);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  Json plans = read_json(out + "/plans.json");
  for (const auto& p : plans.at("plans")) {
    CHECK(p.at("plan").at("moe_routing") == "histogram");
    const std::string path = std::filesystem::absolute(histogram).lexically_normal().string();
    CHECK(p.at("plan").at("moe_routing_histogram") == path);
  }
  std::string strategies = fresh_dir("moe-strategies-histogram");
  auto s = run_stepcast("compare-strategies" + model_arg("tiny-moe") + topology_arg("localhost-cpu") +
                        " --nodes 2 --global-batch-size 8 --moe-lowered 0 --moe-routing-histogram " + histogram +
                        " --out " + strategies);
  INFO(s.output);
  REQUIRE(s.exit_code == 0);
  bool imbalance = false;
  const Json rows = read_json(strategies + "/strategies.json").at("strategies");
  for (const auto& row : rows) {
    const std::string name = row.at("plan").get<std::string>();
    if (name.empty() || name.find("-ep1") != std::string::npos) continue;
    imbalance = imbalance || row.at("expert_imbalance_estimate_s").get<double>() > 0;
  }
  CHECK(imbalance);
  // Refused: the routing given twice, and a histogram of another expert count.
  auto twice = run_stepcast("plan" + model_arg("tiny-moe") + topology_arg("localhost-cpu") +
                            " --nodes 2 --global-batch-size 8 --moe-routing-skew 1 --moe-routing-histogram " +
                            histogram);
  CHECK(twice.exit_code == 2);
  CHECK_THAT(twice.output, Catch::Contains("the routing is given twice"));
  const std::string three = write_temp_file("three-experts.json", R"({"tokens_per_expert": [1, 2, 3]})");
  auto wrong = run_stepcast("plan" + model_arg("tiny-moe") + topology_arg("localhost-cpu") +
                            " --nodes 2 --global-batch-size 8 --moe-routing-histogram " + three);
  CHECK(wrong.exit_code == 2);
  CHECK_THAT(wrong.output, Catch::Contains("'--moe-routing-histogram'") && Catch::Contains("a histogram of 4 counts"));
  std::filesystem::remove_all(out);
  std::filesystem::remove_all(strategies);
}
