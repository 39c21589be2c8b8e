// Mixture of experts through plans/: the expert rank layout (ep, etp, edp over the ranks of a
// stage, Megatron's expert rank generator), the plan keys and every refusal, the routing draw,
// and the lowering: every MoE plan's program passes check_program, expert groups hold E/ep
// experts f_e/etp wide, dispatch and combine run over ep with the bytes of the routed tokens,
// expert gradients reduce over edp.
#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <numeric>
#include <sstream>

#include "errors.hpp"
#include "lower.hpp"
#include "lower_context.hpp"
#include "lower_fixtures.hpp"
#include "memory.hpp"
#include "program_check.hpp"
#include "program_json.hpp"
#include "rank_grid.hpp"

using Catch::Matchers::Contains;
using namespace stepcast;

namespace {

ModelConfig tiny_moe() { return load_model(test::source_path("models/tiny-moe.json")); }

Json moe_plan(int tp, int dp, int ep, int etp = 1) {
  Json plan = {{"tp_size", tp}, {"dp_size", dp}, {"expert_model_parallel_size", ep},
               {"expert_tensor_parallel_size", etp}, {"micro_batch_size", 1}, {"global_batch_size", 2 * dp},
               {"dtype", "fp32"}};
  if (tp > 1) plan["sequence_parallel"] = true;
  return plan;
}

int64_t count_ops(const StepProgram& p, OpKind kind, OpName name, GroupKind group) {
  int64_t n = 0;
  for (const Op& op : p.roles[0].ops) n += op.kind == kind && op.name == name && op.group == group;
  return n;
}

}  // namespace

TEST_CASE("expert groups regroup a stage's ranks as etp × ep × edp, etp innermost", "[rank_grid][moe]") {
  // tp 2, dp 4, pp 2: 8 ranks a stage; ep 2, etp 2 leave edp 2.
  RankGrid grid(2, 4, 2, "tp-dp-pp", 0, 1, 2, 2);
  CHECK(grid.edp_size() == 2);
  CHECK(grid.group(GroupKind::etp, 0) == std::vector<int64_t>{0, 1});
  CHECK(grid.group(GroupKind::ep, 0) == std::vector<int64_t>{0, 2});
  CHECK(grid.group(GroupKind::edp, 0) == std::vector<int64_t>{0, 4});
  CHECK(grid.group(GroupKind::ep, 13) == std::vector<int64_t>{13, 15});  // stage 1: ranks 8–15
  CHECK(grid.ep_rank(2) == 1);
  // Every rank in exactly one group of each kind, groups of the sizes asked.
  for (GroupKind kind : {GroupKind::ep, GroupKind::etp, GroupKind::edp}) {
    auto groups = grid.all_groups(kind);
    CHECK(groups.size() == 16 / groups[0].size());
  }
  // A pp-inner order: a stage's ranks are not contiguous, the regrouping follows rank order.
  RankGrid inner(1, 4, 2, "tp-pp-dp", 0, 1, 4, 1);
  CHECK(inner.group(GroupKind::ep, 0) == std::vector<int64_t>{0, 2, 4, 6});
  CHECK(inner.group(GroupKind::ep, 1) == std::vector<int64_t>{1, 3, 5, 7});
  CHECK_THROWS_AS(RankGrid(2, 2, 1, "tp-dp-pp", 0, 1, 3, 1), InputError);
}

TEST_CASE("hybrid sharding cuts each edp group as it cuts dp (Megatron's partial expert dp groups)",
          "[rank_grid][moe]") {
  // tp 2, dp 8, ep 2, etp 1: 16 ranks, edp 8; 2 instances (dp blocks of 4) cut edp into blocks of
  // 4 consecutive edp coordinates, the replicas the same place of each block.
  RankGrid grid(2, 8, 1, "tp-dp-pp", 4, 1, 2, 1);
  CHECK(grid.instances() == 2);
  CHECK(grid.edp_shard_size() == 4);
  CHECK(grid.group(GroupKind::edp, 0) == std::vector<int64_t>{0, 2, 4, 6, 8, 10, 12, 14});
  CHECK(grid.group(GroupKind::edp_shard, 10) == std::vector<int64_t>{8, 10, 12, 14});
  CHECK(grid.group(GroupKind::edp_replica, 10) == std::vector<int64_t>{2, 10});
  CHECK(grid.all_groups(GroupKind::edp_shard).size() == 4);
  CHECK(grid.expert_shards_within_instances());
  // ep 4 over 8 ranks with 2 instances: edp 2 in blocks of one rank.
  RankGrid one(1, 8, 1, "tp-dp-pp", 4, 1, 4, 1);
  CHECK(one.edp_shard_size() == 1);
  CHECK(one.group(GroupKind::edp_shard, 5) == std::vector<int64_t>{5});
  CHECK(one.group(GroupKind::edp_replica, 5) == std::vector<int64_t>{1, 5});
  // Without hybrid sharding edp_shard is edp, edp_replica the rank.
  RankGrid plain(2, 4, 2, "tp-dp-pp", 0, 1, 2, 2);
  for (int64_t r = 0; r < plain.world_size(); ++r) {
    CHECK(plain.group(GroupKind::edp_shard, r) == plain.group(GroupKind::edp, r));
    CHECK(plain.group(GroupKind::edp_replica, r) == std::vector<int64_t>{r});
  }
  // dp outside tp puts an instance's ranks across expert blocks (its tp ranks sit a dp apart).
  CHECK_FALSE(RankGrid(2, 4, 1, "dp-tp-pp", 2, 1, 2, 1).expert_shards_within_instances());
  CHECK(RankGrid(2, 4, 2, "tp-pp-dp", 2, 1, 2, 1).expert_shards_within_instances());
  // Against the definition (every member of a rank's instance on its stage in its expert block),
  // over orders, cp and ep.
  for (const char* order : {"tp-dp-pp", "tp-pp-dp", "dp-tp-pp", "pp-dp-tp", "tp-dp-cp-pp", "cp-tp-dp-pp"}) {
    for (int64_t cp : {1, 2}) {
      for (int64_t ep : {1, 2, 4}) {
        const RankGrid g(2, 4, 2, order, 4 * cp / 2, cp, ep, 1);
        bool within = true;
        const int64_t block = ep * g.edp_shard_size();
        for (int64_t r = 0; r < g.world_size(); ++r) {
          for (int64_t s : g.group(GroupKind::instance, r)) {
            if (g.coord(s).pp == g.coord(r).pp && g.stage_index(s) / block != g.stage_index(r) / block) within = false;
          }
        }
        INFO(order << " cp " << cp << " ep " << ep);
        CHECK(g.expert_shards_within_instances() == within);
      }
    }
  }
  CHECK_THROWS_AS(RankGrid(1, 6, 1, "tp-dp-pp", 3, 1, 2, 1), InputError);  // 2 instances, edp 3
}

TEST_CASE("hybrid sharding with experts lowers the expert buckets over edp_shard and edp_replica", "[lower][moe]") {
  // dp 4, 2 instances, 2 microbatches: ep 1 (edp_shard 2) reduce_scatters inside the block after
  // each microbatch (ZeRO-2) and all_reduces the shard across once; ep 2 (edp_shard 1) only
  // all_reduces across.
  for (int ep : {1, 2}) {
    Json p = moe_plan(1, 4, ep, 1);
    p["zero_stage"] = 2;
    p["num_distributed_optimizer_instances"] = 2;
    ModelConfig model = tiny_moe();
    Topology topo = test::test_topology();
    StepProgram program = lower_program(model, topo, test::make_plan(p, model, topo));
    INFO("ep " << ep);
    CHECK(check_program(program).empty());
    CHECK(count_ops(program, OpKind::reduce_scatter, OpName::grad_bucket, GroupKind::edp_shard) == (ep == 1 ? 2 : 0));
    CHECK(count_ops(program, OpKind::all_reduce, OpName::replica_grads, GroupKind::edp_replica) == 1);
    CHECK(count_ops(program, OpKind::reduce_scatter, OpName::grad_bucket, GroupKind::edp) == 0);
  }
}

TEST_CASE("routing draws sum to the tokens, repeat with the seed and follow the skew", "[moe]") {
  MoePlan uniform;
  auto shares = routing_shares(uniform, 8);
  auto a = draw_routing(shares, 10000, 7, 3, 5);
  CHECK(std::accumulate(a.begin(), a.end(), int64_t{0}) == 10000);
  CHECK(a == draw_routing(shares, 10000, 7, 3, 5));
  CHECK(a != draw_routing(shares, 10000, 7, 4, 5));
  for (int64_t c : a) CHECK(std::abs(double(c) - 1250.0) < 6 * std::sqrt(1250.0));
  MoePlan skew;
  skew.routing = RoutingKind::skew;
  skew.skew = 1.0;
  auto s = routing_shares(skew, 4);  // 1, 1/2, 1/3, 1/4 over 25/12
  CHECK(s[0] == Approx(12.0 / 25));
  CHECK(s[3] == Approx(3.0 / 25));
  CHECK(expert_capacity(64 * 2, 4, 1.25) == 40);
}

TEST_CASE("MoE plan keys: defaults from the model, refusals name key, value and what is valid", "[plan][moe]") {
  ModelConfig model = tiny_moe();
  Topology topo = test::test_topology();
  Plan plan = test::make_plan(moe_plan(2, 2, 2), model, topo);
  CHECK(plan.moe.top_k == 2);
  CHECK(plan.moe.etp_size == 1);
  CHECK(plan.moe.dropless());
  Json no_etp = moe_plan(2, 2, 2);
  no_etp.erase("expert_tensor_parallel_size");
  CHECK(test::make_plan(no_etp, model, topo).moe.etp_size == 2);  // Megatron: tp
  Json json = plan_to_json(plan);
  CHECK(json.at("expert_model_parallel_size") == 2);
  CHECK(json.at("moe_token_dispatcher_type") == "alltoall");

  auto refused = [&](Json j, const std::string& a, const std::string& b) {
    CHECK_THROWS_WITH(test::make_plan(j, model, topo), Contains(a) && Contains(b));
  };
  Json j = moe_plan(1, 4, 3);
  refused(j, "'expert_model_parallel_size' = 3", "a divisor of 4");
  j = moe_plan(1, 4, 2, 3);
  refused(j, "'expert_tensor_parallel_size' = 3", "a divisor of 64");
  j = moe_plan(1, 2, 4);
  refused(j, "'expert_model_parallel_size' = 4", "ep · etp a divisor of 2");
  j = moe_plan(1, 2, 1);
  j["moe_router_topk"] = 5;
  refused(j, "'moe_router_topk' = 5", "[1, 4]");
  j = moe_plan(1, 2, 1);
  j["moe_expert_capacity_factor"] = 0;
  refused(j, "'moe_expert_capacity_factor'", "a number > 0");
  j = moe_plan(2, 1, 1);
  j.erase("sequence_parallel");
  refused(j, "'sequence_parallel'", "true, or tp_size 1");
  j = moe_plan(1, 2, 1);
  j["moe_routing"] = "skew";
  refused(j, "'moe_routing_skew'", "missing");
  j = moe_plan(1, 2, 1);
  j["moe_routing_skew"] = 1.0;
  refused(j, "'moe_routing_skew'", "moe_routing \"skew\"");
  ModelConfig dense = load_model(test::source_path("models/tiny.json"));
  CHECK_THROWS_WITH(test::make_plan(moe_plan(1, 2, 2), dense, topo),
                    Contains("'expert_model_parallel_size' = 2") && Contains("no experts"));
}

TEST_CASE("routing histograms: the expert count and the total are checked", "[plan][moe]") {
  ModelConfig model = tiny_moe();
  Topology topo = test::test_topology();
  auto write = [&](const std::string& name, const std::string& text) { return test::write_temp_file(name, text); };
  Json j = moe_plan(1, 2, 2);
  j["moe_routing"] = "histogram";
  j["moe_routing_histogram"] = write("ok.json", R"({"tokens_per_expert": [40, 30, 20, 10], "total_tokens": 100})");
  Plan plan = test::make_plan(j, model, topo);
  CHECK(routing_shares(plan.moe, 4)[0] == Approx(0.4));
  j["moe_routing_histogram"] = write("three.json", R"({"tokens_per_expert": [40, 30, 30]})");
  CHECK_THROWS_WITH(test::make_plan(j, model, topo), Contains("'moe_routing_histogram'") && Contains("has 3") &&
                                                         Contains("a histogram of 4 counts"));
  j["moe_routing_histogram"] = write("sum.json", R"({"tokens_per_expert": [40, 30, 20, 10], "total_tokens": 90})");
  CHECK_THROWS_WITH(test::make_plan(j, model, topo), Contains("'total_tokens' = 90") && Contains("differs"));
}

TEST_CASE("MoE programs pass check_program under ep, etp, tp, pp, dp, ZeRO, hybrid sharding, recompute, both dispatchers",
          "[lower][moe]") {
  Topology topo = test::test_topology();
  for (const char* file : {"models/tiny-moe.json", "models/tiny-moe-shared.json"}) {
    ModelConfig model = load_model(test::source_path(file));
    int index = 0;
    for (int tp : {1, 2}) {
      for (int ep : {1, 2, 4}) {
        for (int etp : {1, 2}) {
          for (const char* dispatcher : {"alltoall", "allgather"}) {
            if ((tp * 4) % (ep * etp) != 0) continue;  // ep · etp must divide the stage's tp·dp ranks
            ++index;
            Json j = moe_plan(tp, 4, ep, etp);
            j["moe_token_dispatcher_type"] = dispatcher;
            j["pp_size"] = index % 3 == 0 ? 2 : 1;
            j["zero_stage"] = index % 4;
            j["recompute"] = index % 5 == 0 ? "full" : index % 5 == 1 ? "selective" : "none";
            if (index % 2) j["moe_expert_capacity_factor"] = 1.25;
            if (index % 7 == 0) j["overlap_grad_reduce"] = true;
            // Hybrid sharding where 2 instances divide edp.
            if (index % 4 > 0 && (tp * 4 / (ep * etp)) % 2 == 0 && index % 3 != 2) {
              j["num_distributed_optimizer_instances"] = 2;
            }
            Plan plan = test::make_plan(j, model, topo);
            StepProgram program = lower_program(model, topo, plan);
            INFO(file << " " << j.dump());
            auto errors = check_program(program);
            CHECK(errors.empty());
            for (size_t i = 0; i < std::min<size_t>(3, errors.size()); ++i) INFO(errors[i]);
            bool a2a = std::string(dispatcher) == "alltoall";
            int64_t moe_layers_per_stage = model.num_moe_layers() / (j["pp_size"].get<int>() == 2 ? 2 : 1);
            if (ep > 1 && a2a && j["pp_size"] == 1) {
              // dispatch and combine forward, and their backward, each microbatch and MoE layer
              CHECK(count_ops(program, OpKind::all_to_all, OpName::ep_dispatch, GroupKind::ep) ==
                    2 * moe_layers_per_stage * program.num_microbatches * (plan.recompute == RecomputeKind::full ? 1 : 1) +
                        (plan.recompute == RecomputeKind::full ? moe_layers_per_stage * program.num_microbatches : 0));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("expert weights per rank: E/ep experts f_e/etp wide, reduced over edp", "[lower][moe][memory]") {
  ModelConfig model = tiny_moe();
  Topology topo = test::test_topology();
  auto weights = [&](int ep, int etp) {
    Plan plan = test::make_plan(moe_plan(1, 4, ep, etp), model, topo);
    StepProgram program = lower_program(model, topo, plan);
    return memory_report(program, topo).ranks[0].weights_bytes;
  };
  const double experts_bytes = 4.0 * 4 * double(expert_parameter_count(model)) * 4;  // 4 layers, 4 experts, fp32
  CHECK(weights(1, 1) - weights(2, 1) == Approx(experts_bytes / 2));
  CHECK(weights(1, 1) - weights(4, 1) == Approx(experts_bytes * 3 / 4));
  CHECK(weights(2, 1) - weights(2, 2) == Approx(experts_bytes / 4));
  // dp 4 with ep 2: expert gradients reduce over edp (2 ranks), dense ones over dp (4).
  Plan plan = test::make_plan(moe_plan(1, 4, 2), model, topo);
  StepProgram program = lower_program(model, topo, plan);
  CHECK(program.grid().group(GroupKind::edp, 0).size() == 2);
  CHECK(count_ops(program, OpKind::all_reduce, OpName::grad_bucket, GroupKind::edp) >= 1);
  CHECK(count_ops(program, OpKind::all_reduce, OpName::grad_bucket, GroupKind::dp) >= 1);
  // The dispatch carries the rank's T·k routed token copies of h elements.
  for (const Op& op : program.roles[0].ops) {
    if (op.kind == OpKind::all_to_all && op.name == OpName::ep_dispatch && op.phase == Phase::forward) {
      CHECK(op.bytes == 64.0 * 2 * 64 * 4);
      break;
    }
  }
}

TEST_CASE("the aux loss's expert counts are summed over tp and cp where they split the sequence",
          "[lower][moe]") {
  ModelConfig model = tiny_moe();  // router_aux_loss_coef 0.01
  REQUIRE(model.router_aux_loss_coef != 0);
  Topology topo = test::test_topology();
  auto program_of = [&](const ModelConfig& m, Json j) {
    Plan plan = test::make_plan(j, m, topo);
    StepProgram program = lower_program(m, topo, plan);
    CHECK(check_program(program).empty());
    return program;
  };
  const int64_t moe_layers = model.num_moe_layers(), E = model.num_experts;
  // tp 2 (sequence parallel): one all_reduce of E wide counts per MoE layer and microbatch, which
  // routing writes and the aux loss and routing's backward read.
  StepProgram tp2 = program_of(model, moe_plan(2, 2, 1));
  CHECK(count_ops(tp2, OpKind::all_reduce, OpName::moe_aux_counts, GroupKind::tp) ==
        moe_layers * tp2.num_microbatches);
  int64_t readers = 0;
  for (const Op& op : tp2.roles[0].ops) {
    if (op.name == OpName::moe_aux_counts) {
      CHECK(op.bytes == double(E) * 4);  // fp32 plan: wide is fp32
      CHECK(op.phase == Phase::forward);
    }
    for (const BufferName& b : op.inputs) readers += b.str().find(".routed") != std::string::npos;
  }
  // Each MoE layer and microbatch: the all_reduce, the aux loss and routing's backward.
  CHECK(readers == 3 * moe_layers * tp2.num_microbatches);
  // Full recompute: routed again in the recomputed forward, so counted twice.
  Json full = moe_plan(2, 2, 1);
  full["recompute"] = "full";
  CHECK(count_ops(program_of(model, full), OpKind::all_reduce, OpName::moe_aux_counts, GroupKind::tp) ==
        2 * moe_layers * tp2.num_microbatches);
  // tp 1: the rank holds the sequence, nothing to sum; without the aux loss, nothing either.
  CHECK(count_ops(program_of(model, moe_plan(1, 4, 1)), OpKind::all_reduce, OpName::moe_aux_counts, GroupKind::tp) ==
        0);
  ModelConfig no_aux = model;
  no_aux.router_aux_loss_coef = 0;
  CHECK(count_ops(program_of(no_aux, moe_plan(2, 2, 1)), OpKind::all_reduce, OpName::moe_aux_counts,
                  GroupKind::tp) == 0);
  // cp 2: summed over cp as well.
  Json cp = moe_plan(1, 2, 1);
  cp["context_parallel_size"] = 2;
  cp["attention_impl"] = "flash";
  StepProgram cp2 = program_of(model, cp);
  CHECK(count_ops(cp2, OpKind::all_reduce, OpName::moe_aux_counts, GroupKind::cp) == moe_layers * cp2.num_microbatches);
}

TEST_CASE("under etp the alltoall dispatcher's counts are [etp, ep, E] and the etp gather carries them",
          "[lower][moe]") {
  ModelConfig model = tiny_moe();
  Topology topo = test::test_topology();
  Plan plan = test::make_plan(moe_plan(2, 2, 2, 2), model, topo);  // tp 2, dp 2: etp 2 × ep 2
  StepProgram program = lower_program(model, topo, plan);
  REQUIRE(check_program(program).empty());
  int64_t gathers = 0, count_allocs = 0;
  for (const Op& op : program.roles[0].ops) {
    if (op.kind == OpKind::alloc && op.buffer.str().find(".counts") != std::string::npos) {
      CHECK(op.shape.to_vector() == std::vector<int64_t>{4, model.num_experts});
      ++count_allocs;
    }
    if (op.kind == OpKind::all_gather && op.name == OpName::etp_gather) {
      ++gathers;
      REQUIRE(op.inputs.size() == 2);
      CHECK(op.inputs[1].str().find(".counts") != std::string::npos);
      CHECK(op.outputs[1] == op.inputs[1]);
    }
  }
  CHECK(count_allocs >= 1);
  CHECK(gathers == model.num_moe_layers() * program.num_microbatches);
}

TEST_CASE("dropless dispatch buffers hold the worst load the routing draws give — capacity buffers the capacity",
          "[lower][moe][memory]") {
  ModelConfig model = tiny_moe();
  Topology topo = test::test_topology();
  Json j = moe_plan(1, 4, 2);
  Plan uniform = test::make_plan(j, model, topo);
  j["moe_routing"] = "skew";
  j["moe_routing_skew"] = 2.0;
  Plan skewed = test::make_plan(j, model, topo);
  LowerContext u(model, topo, uniform), s(model, topo, skewed);
  // N = T·k·ep = 64·2·2 = 256 token copies over 4 experts, 2 a rank.
  CHECK(u.moe.expert_rows >= 128);
  CHECK(u.moe.expert_rows < 128 + 6 * 8);
  CHECK(s.moe.expert_rows > 200);  // shares 1, 1/4, 1/9, 1/16: experts 0 and 1 take 88%
  j = moe_plan(1, 4, 2);
  j["moe_expert_capacity_factor"] = 1.0;
  LowerContext c(model, topo, test::make_plan(j, model, topo));
  CHECK(c.moe.capacity == 32);  // ceil(64·2 / 4 · 1.0)
  CHECK(c.moe.expert_rows == 2 * 32 * 2);
  // moe_dropless_buffers "any_routing": every copy of the expert block fits one rank, whatever
  // the draws (and it is written back into the plan's JSON, "draws" being the default).
  j = moe_plan(1, 4, 2);
  j["moe_dropless_buffers"] = "any_routing";
  Plan any = test::make_plan(j, model, topo);
  LowerContext a(model, topo, any);
  CHECK(a.moe.expert_rows == 256);
  CHECK(a.moe.recv_rows == 256);
  Json back;
  moe_plan_to_json(any.moe, back);
  CHECK(back.at("moe_dropless_buffers") == "any_routing");
  Json none;
  moe_plan_to_json(uniform.moe, none);
  CHECK_FALSE(none.contains("moe_dropless_buffers"));
  // With a capacity, refused: the capacity sizes the buffers.
  j["moe_expert_capacity_factor"] = 1.0;
  CHECK_THROWS_WITH(test::make_plan(j, model, topo),
                    Contains("moe_dropless_buffers") && Contains("\"draws\" (or absent) with moe_expert_capacity_factor"));
  j.erase("moe_expert_capacity_factor");
  j["moe_dropless_buffers"] = "all";
  CHECK_THROWS_WITH(test::make_plan(j, model, topo), Contains("moe_dropless_buffers") && Contains("any_routing"));
}

TEST_CASE("a MoE program round-trips through program.json with its expert grid and routing", "[lower][moe]") {
  ModelConfig model = load_model(test::source_path("models/tiny-moe-shared.json"));
  Topology topo = test::test_topology();
  Json j = moe_plan(2, 2, 2, 2);
  j["moe_routing"] = "skew";
  j["moe_routing_skew"] = 1.5;
  j["moe_expert_capacity_factor"] = 1.5;
  StepProgram program = lower_program(model, topo, test::make_plan(j, model, topo));
  std::ostringstream text;
  const std::string sha = write_program_json(program, &text);
  StepProgram back = parse_program_json_text(text.str(), "program.json");
  CHECK(back.program_sha256 == sha);
  CHECK(back.ep_size == 2);
  CHECK(back.etp_size == 2);
  CHECK(back.moe.num_experts == 8);
  CHECK(back.moe.top_k == 2);
  CHECK(back.moe.routing_shares == program.moe.routing_shares);
  CHECK(back.moe.routed_tokens == 32 * 2 * 2 * 2);  // (64 / tp 2) tokens · k · ep · etp
  CHECK(back.moe.expert_capacity_rows == program.moe.expert_capacity_rows);
  CHECK(back.moe.expert_capacity_rows == 12 * 2 * 2);  // ceil(32·2 / 8 · 1.5) from each of ep·etp ranks
  CHECK(back.roles[0].ops.size() == program.roles[0].ops.size());
}

TEST_CASE("the allgather dispatcher gathers each token's routing with it and reduce_scatters its gradient back",
          "[lower][moe]") {
  ModelConfig model = tiny_moe();  // top-2 of 4 experts, seq 64
  Topology topo = test::test_topology();
  Json j = moe_plan(2, 2, 2, 2);  // tp 2, dp 2: etp 2 × ep 2
  j["moe_token_dispatcher_type"] = "allgather";
  Plan plan = test::make_plan(j, model, topo);
  StepProgram program = lower_program(model, topo, plan);
  auto errors = check_program(program);
  for (size_t i = 0; i < std::min<size_t>(3, errors.size()); ++i) INFO(errors[i]);
  REQUIRE(errors.empty());
  const int64_t per_layer = model.num_moe_layers() * program.num_microbatches;
  const int64_t T = 64 / 2, k = model.num_experts_per_tok;  // a rank's tokens (sequence parallel)
  // The top-k weights (fp32) and experts (int32) gathered over ep, then etp: the bytes of the
  // rows after each gather.
  std::map<std::pair<GroupKind, std::string>, int64_t> gathers;
  int64_t scatters = 0, permutes_writing_counts = 0;
  for (const Op& op : program.roles[0].ops) {
    if (op.name == OpName::moe_route_gather && op.kind == OpKind::all_gather) {
      const bool idx = op.inputs[0].str().find("route_idx") != std::string::npos;
      ++gathers[{op.group, idx ? "idx" : "w"}];
      CHECK(op.bytes == double(T * k * 4 * (op.group == GroupKind::ep ? 2 : 4)));
    }
    if (op.name == OpName::moe_route_gather && op.kind == OpKind::reduce_scatter) {
      ++scatters;
      CHECK(op.phase == Phase::backward);
      CHECK(op.bytes == double(T * k * 4 * (op.group == GroupKind::etp ? 4 : 2)));
    }
    if (op.name == OpName::moe_permute && op.phase == Phase::forward) {
      REQUIRE(op.outputs.size() == 2);
      CHECK(op.outputs[1].str().find(".counts") != std::string::npos);
      CHECK(op.inputs[1].str().find("route_idx_g") != std::string::npos);
      ++permutes_writing_counts;
    }
    if (op.kind == OpKind::alloc && op.buffer.str().find(".counts") != std::string::npos) {
      CHECK(op.shape.to_vector() == std::vector<int64_t>{4, model.num_experts});  // [etp · ep, E]
    }
  }
  for (GroupKind g : {GroupKind::ep, GroupKind::etp}) {
    CHECK(gathers[{g, "idx"}] == per_layer);
    CHECK(gathers[{g, "w"}] == per_layer);
  }
  CHECK(scatters == 2 * per_layer);  // over etp, then ep
  CHECK(permutes_writing_counts == per_layer);
  // ep 1, etp 1: the rank's own routing, nothing gathered.
  Json one = moe_plan(1, 2, 1);
  one["moe_token_dispatcher_type"] = "allgather";
  StepProgram single = lower_program(model, topo, test::make_plan(one, model, topo));
  CHECK(check_program(single).empty());
  for (GroupKind g : {GroupKind::ep, GroupKind::etp}) {
    CHECK(count_ops(single, OpKind::all_gather, OpName::moe_route_gather, g) == 0);
  }
}

TEST_CASE("FP8 with experts: the grouped GEMMs read FP8 copies of their inputs and the experts' weights",
          "[lower][moe][fp8]") {
  ModelConfig model = tiny_moe();
  Topology native = test::test_topology(), transposed = native;
  transposed.node.device.fp8_transposed_copies = true;  // Hopper: a wgrad reads transposed FP8 copies
  int64_t checked = 0;
  for (const Topology* topo : {&native, &transposed}) {
    for (const char* dispatcher : {"alltoall", "allgather"}) {
      for (const char* recompute : {"none", "full"}) {
        Json j = moe_plan(2, 2, 2, 2);  // etp 2 × ep 2
        j["moe_token_dispatcher_type"] = dispatcher;
        j["recompute"] = recompute;
        j["fp8"] = "hybrid";
        j["zero_stage"] = 1;
        StepProgram program = lower_program(model, *topo, test::make_plan(j, model, *topo));
        INFO(j.dump() << (topo == &transposed ? " (transposed copies)" : ""));
        auto errors = check_program(program);
        for (size_t i = 0; i < std::min<size_t>(3, errors.size()); ++i) INFO(errors[i]);
        REQUIRE(errors.empty());
        int64_t grouped = 0, fp8_grouped = 0, expert_casts = 0, wgrads = 0, transposed_reads = 0;
        for (const Op& op : program.roles[0].ops) {
          const bool expert_gemm = op.kind == OpKind::gemm && (op.name == OpName::expert_gate ||
                                                               op.name == OpName::expert_up ||
                                                               op.name == OpName::expert_down);
          if (expert_gemm) {
            ++grouped;
            fp8_grouped += op.fp8_slots[0] >= 0;
            CHECK(op.inputs[0].str().find("_f8") != std::string::npos);  // x, or d_y
            if (op.grad == Grad::wgrad) {
              ++wgrads;
              CHECK(op.inputs[1].str().find("_f8") != std::string::npos);
              transposed_reads += op.inputs.size() == 5;  // x_t and d_y_t after the counts
            } else {
              CHECK(op.inputs[1].str().rfind(topo == &transposed && op.grad == Grad::dgrad ? "fp8wt.X" : "fp8w.X",
                                             0) == 0);
            }
          }
          if (op.name == OpName::fp8_weights && !op.outputs.empty() && op.outputs[0].str() == "fp8w.X1") {
            ++expert_casts;
          }
        }
        CHECK(grouped > 0);
        CHECK(fp8_grouped == grouped);
        CHECK(expert_casts == 1);  // the experts' FP8 copy cast once a step
        CHECK(wgrads > 0);
        CHECK(transposed_reads == (topo == &transposed ? wgrads : 0));  // every wgrad, on Hopper
        ++checked;
      }
    }
  }
  CHECK(checked == 8);
  // Shared experts (a dense MLP in the MoE layer) run their linear layers in FP8 too, their input
  // cast once and gathered in FP8 under SP.
  ModelConfig shared = load_model(test::source_path("models/tiny-moe-shared.json"));
  for (const Topology* topo : {&native, &transposed}) {
    for (Json j : {moe_plan(2, 2, 2, 2), moe_plan(1, 4, 2)}) {  // tp 2 with SP; tp 1 (no gathers)
      const bool sp = j["tp_size"] == 2;
      j["fp8"] = "hybrid";
      j["recompute"] = "selective";
      j["pp_size"] = 2;
      StepProgram program = lower_program(shared, *topo, test::make_plan(j, shared, *topo));
      auto errors = check_program(program);
      for (size_t i = 0; i < std::min<size_t>(3, errors.size()); ++i) INFO(errors[i]);
      REQUIRE(errors.empty());
      int64_t shared_gemms = 0, fp8_shared = 0, fp8_gathers = 0;
      for (const Op& op : program.roles[0].ops) {
        if (op.layer < shared.first_k_dense_replace) continue;  // the dense layers' own MLP
        if (op.kind == OpKind::gemm &&
            (op.name == OpName::mlp_up || op.name == OpName::mlp_gate || op.name == OpName::mlp_down)) {
          ++shared_gemms;
          fp8_shared += op.fp8_slots[0] >= 0;
        }
        if (op.kind == OpKind::all_gather && op.name == OpName::sp_ln2) {
          fp8_gathers += op.inputs[0].str().find("ln2_f8") != std::string::npos;
        }
      }
      CHECK(shared_gemms > 0);
      CHECK(fp8_shared == shared_gemms);
      CHECK((fp8_gathers > 0) == sp);
    }
  }
  // Bytes of an FP8 grouped GEMM: a byte an FP8 operand element, the output in the plan's dtype.
  Json j = moe_plan(1, 2, 1);
  j["fp8"] = "e4m3";
  StepProgram program = lower_program(model, native, test::make_plan(j, model, native));
  for (const Op& op : program.roles[0].ops) {
    if (op.kind == OpKind::gemm && op.name == OpName::expert_up && op.grad == Grad::none) {
      const double one = double(op.m) * op.k + double(op.k) * op.n + double(op.m) * op.n * 4;  // fp32 output
      CHECK(op.bytes == Approx(one * double(op.batch)));
      break;
    }
  }
}

TEST_CASE("ZeRO-3 gathers a MoE layer's experts with it and prefetches the next layer's whole, experts too",
          "[lower][moe]") {
  // Megatron-FSDP's unit is the whole layer (TransformerLayer, MoETransformerLayer): with
  // overlap_param_gather the next layer's groups, experts included, gather beside this one's.
  ModelConfig model = tiny_moe();
  Topology topo = test::test_topology();
  Json p = moe_plan(1, 4, 2);
  p["zero_stage"] = 3;
  p["overlap_param_gather"] = true;
  StepProgram program = lower_program(model, topo, test::make_plan(p, model, topo));
  const auto& ops = program.roles[0].ops;
  auto gather_at = [&](const std::string& full) {
    size_t i = 0;
    while (i < ops.size() && !(ops[i].name == OpName::zero3_param_gather && ops[i].outputs[0].str() == full)) ++i;
    return i;  // ops.size() when there is none: the checks below fail
  };
  auto first_expert_op = [&](int32_t layer, Phase phase) {
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].name == OpName::expert_gate && ops[i].layer == layer && ops[i].phase == phase &&
          ops[i].microbatch == 0) {
        return i;
      }
    }
    FAIL("no expert GEMM of layer " << layer);
    return size_t(0);
  };
  const int32_t layers = int32_t(model.num_hidden_layers);
  for (int32_t l = 0; l + 1 < layers; ++l) {
    INFO("layer " << l);
    const std::string x = "wfull.X" + std::to_string(l), next_l = "wfull.L" + std::to_string(l + 1),
                      next_x = "wfull.X" + std::to_string(l + 1);
    // Forward: this layer's experts, the next layer, its experts, all before this layer's experts run.
    CHECK(gather_at(x + ".mb0.forward") < gather_at(next_l + ".mb0.forward"));
    CHECK(gather_at(next_l + ".mb0.forward") < gather_at(next_x + ".mb0.forward"));
    CHECK(gather_at(next_x + ".mb0.forward") < first_expert_op(l, Phase::forward));
    // Backward (layers in reverse): layer l+1's experts, then layer l and its experts.
    CHECK(gather_at("wfull.X" + std::to_string(l) + ".mb0.backward") < first_expert_op(l + 1, Phase::backward));
  }
}
