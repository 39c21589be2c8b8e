// The CPU executor end to end, through `scripts/mpirun build/stepcast run`: every parallel plan of
// the tiny models reproduces the single-rank loss curve (fp64: 1e-9 relative; fp32: 1e-4), the
// loss falls on the shipped corpus, and measurement.json has what DESIGN.md's StepResult says.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "json_input.hpp"
#include "test_support.hpp"

using namespace stepcast;
using namespace stepcast::test;

namespace {

int64_t ranks_of(const Json& plan) {
  return plan.value("tp_size", 1) * plan.value("pp_size", 1) * plan.value("dp_size", 1) *
         plan.value("context_parallel_size", 1);
}

RunResult run_plan(const std::string& model, const Json& plan, int steps,
                   const std::string& extra = "") {
  static int counter = 0;
  std::string dir = write_temp_file("run-" + std::to_string(++counter) + ".plan.json", plan.dump());
  std::string out = dir + ".out";
  std::filesystem::remove_all(out);
  int64_t n = ranks_of(plan);
  int64_t nodes = (n + 1) / 2;  // localhost-cpu has 2 "devices" per node; oversubscribed here
  std::ostringstream cmd;
  cmd << source_path("scripts/mpirun") << " -np " << n << " " << STEPCAST_BINARY
      << " run --model " << (model.find('/') != std::string::npos ? model : source_path("models/" + model + ".json"))
      << " --plan " << dir
      << " --topology " << source_path("topologies/localhost-cpu.json") << " --nodes " << nodes
      << " --corpus " << source_path("data/corpus/shakespeare.txt") << " --steps " << steps
      << " --quiet --out " << out << " " << extra;
  return run_measured(cmd.str(), out);
}

std::vector<double> losses(const RunResult& r) {
  return r.measurement.at("losses").get<std::vector<double>>();
}

double max_relative_difference(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / std::abs(b[i]));
  return worst;
}

Json plan(int tp, int pp, int dp, int zero, const char* schedule, const char* recompute,
          bool sp, bool flash, int mbs, bool overlap, const char* dtype = "fp64") {
  Json p = {{"tp_size", tp}, {"pp_size", pp}, {"dp_size", dp}, {"zero_stage", zero},
            {"schedule", schedule}, {"recompute", recompute}, {"sequence_parallel", sp},
            {"attention_impl", flash ? "flash" : "materialized"}, {"micro_batch_size", mbs},
            {"global_batch_size", 8}, {"dtype", dtype}, {"dropout", 0.0}};
  if (std::string(schedule) == "interleaved_1f1b") p["virtual_pp_size"] = 2;
  if (overlap) {
    p["overlap_grad_reduce"] = true;
    if (zero > 0) p["overlap_param_gather"] = true;
    // Pipeline transfers overlapped under 1F1B and GPipe too (blocking is their default).
    if (pp > 1 && std::string(schedule) != "interleaved_1f1b") p["overlap_p2p_comm"] = true;
  }
  return p;
}

// Every rank's measured peak against the program's buffers: within 2% (issue 5's bound for every
// validation point), and the arena as placed within 1% of what the process held.
// `program_bound` false: only the arena relation (ZeRO-3's placement gaps, issue 20, put some
// plans just past 2% of the program's peak; the arena itself is checked against the process).
// `slack_bytes`: page-level noise allowed on top of the 1% (plans of a few MiB, where 1% is a
// dozen pages).
void check_measured_memory(const std::string& name, const RunResult& r, bool program_bound = true,
                           double slack_bytes = 0) {
  const Json& memory = r.measurement.at("memory");
  for (const Json& measured : memory.at("measured")) {
    int64_t rank = measured.at("rank").get<int64_t>();
    double predicted = -1;
    for (const Json& entry : memory.at("ranks")) {
      for (const Json& range : entry.at("ranks")) {
        if (range[0].get<int64_t>() <= rank && rank <= range[1].get<int64_t>()) {
          predicted = entry.at("peak_bytes").get<double>() -
                      entry.at("memory_runtime_bytes").get<double>();
        }
      }
    }
    double got = measured.at("measured_peak_bytes").get<double>();
    std::printf("%s rank %lld: predicted %.0f bytes, measured %.0f bytes (%+.2f%%)\n", name.c_str(),
                (long long)rank, predicted, got, 100 * (predicted - got) / got);
    REQUIRE(predicted > 0);
    // Every byte the step allocates is a program buffer (the microbatches' token ids, targets
    // and sample indices, loss scratch included): 2%, as issue 5 asks of every point.
    if (program_bound) CHECK(std::abs(predicted - got) <= 0.02 * got);
    // What the process holds is the arena as placed (the program's peak plus what the
    // placement could not pack; ZeRO-3's gathered weights of unequal sizes leave gaps).
    double extent = measured.at("arena_extent_bytes").get<double>();
    CHECK(extent >= predicted);
    CHECK(std::abs(extent - got) <= 0.01 * got + slack_bytes);
  }
}

}  // namespace

TEST_CASE("run: every plan of the tiny model gives the single-rank loss curve (fp64)", "[run]") {
  const int steps = 10;
  std::map<std::string, std::vector<double>> reference;
  for (const char* model : {"tiny", "tiny-gpt"}) {
    RunResult single = run_plan(model, plan(1, 1, 1, 0, "1f1b", "none", false, false, 2, false), steps);
    INFO(single.output);
    REQUIRE(single.exit_code == 0);
    reference[model] = losses(single);
  }
  // A pairwise-covering set over tp, pp, dp ∈ {1, 2}, ZeRO 0–3, the schedules, the recompute
  // modes, sequence parallelism, attention kernels and the overlap switches.
  struct Case {
    const char* model;
    Json plan;
  };
  std::vector<Case> cases = {
      {"tiny", plan(1, 1, 2, 0, "1f1b", "none", false, false, 2, false)},
      {"tiny", plan(1, 1, 2, 1, "1f1b", "selective", false, false, 1, true)},
      {"tiny", plan(1, 1, 2, 2, "1f1b", "full", false, true, 2, false)},
      {"tiny", plan(1, 1, 2, 3, "1f1b", "none", false, true, 1, true)},
      {"tiny", plan(2, 1, 1, 0, "1f1b", "selective", true, false, 2, false)},
      {"tiny", plan(2, 1, 1, 0, "1f1b", "full", false, true, 1, false)},
      {"tiny", plan(2, 1, 2, 1, "1f1b", "none", true, false, 2, true)},
      {"tiny", plan(2, 1, 2, 3, "1f1b", "selective", false, false, 1, false)},
      {"tiny", plan(1, 2, 1, 0, "1f1b", "none", false, false, 1, false)},
      {"tiny", plan(1, 2, 1, 0, "gpipe", "full", false, true, 2, false)},
      {"tiny", plan(1, 2, 1, 0, "interleaved_1f1b", "selective", false, false, 1, false)},
      {"tiny", plan(1, 2, 2, 1, "interleaved_1f1b", "none", false, true, 1, true)},
      {"tiny", plan(1, 2, 2, 2, "1f1b", "selective", false, false, 1, false)},
      {"tiny", plan(1, 2, 2, 3, "gpipe", "full", false, true, 2, true)},
      {"tiny", plan(2, 2, 1, 1, "1f1b", "full", true, false, 1, false)},
      {"tiny", plan(2, 2, 1, 0, "interleaved_1f1b", "selective", false, true, 1, false)},
      {"tiny", plan(2, 2, 2, 1, "interleaved_1f1b", "none", true, false, 1, true)},
      {"tiny", plan(2, 2, 2, 2, "gpipe", "selective", false, false, 2, false)},
      {"tiny", plan(2, 2, 2, 3, "1f1b", "full", false, true, 1, false)},
      {"tiny", plan(2, 2, 2, 0, "1f1b", "selective", true, true, 2, true)},
      {"tiny-gpt", plan(2, 2, 2, 1, "interleaved_1f1b", "selective", true, false, 1, true)},
      {"tiny-gpt", plan(2, 1, 2, 3, "1f1b", "full", false, true, 1, true)},
  };
  double largest = 0;
  for (const Case& c : cases) {
    RunResult r = run_plan(c.model, c.plan, steps);
    INFO(c.model << " " << c.plan.dump() << "\n" << r.output);
    REQUIRE(r.exit_code == 0);
    double d = max_relative_difference(losses(r), reference[c.model]);
    std::printf("cross-plan %-9s %s: max relative loss difference %.3g\n", c.model,
                c.plan.dump().c_str(), d);
    largest = std::max(largest, d);
    CHECK(d < 1e-9);
  }
  std::printf("cross-plan: largest deviation over %zu plans: %.3g\n", cases.size(), largest);
}

TEST_CASE("run: the blocking interleaved schedule (Megatron's rounds) gives the single-rank curve", "[run]") {
  // pp 3 (blocking interleaved needs pp > 2), vpp 2 on a 6-layer tiny model: one layer per
  // virtual stage; 6 microbatches, so every round kind (warm-up, steady, cool-down) runs, and
  // with tp 1 and 2; then scatter_gather_tensors_in_pipeline (tp 2), interleaved and 1F1B.
  const int steps = 6;
  Json model = read_json(source_path("models/tiny.json"));
  model["num_hidden_layers"] = 6;
  std::string model_file = write_temp_file("tiny-6-layers.json", model.dump());
  Json reference = plan(1, 1, 1, 0, "1f1b", "none", false, false, 2, false);
  reference["global_batch_size"] = 6;
  RunResult single = run_plan(model_file, reference, steps);
  INFO(single.output);
  REQUIRE(single.exit_code == 0);
  std::vector<Json> plans;
  for (int tp : {1, 2}) {
    Json p = plan(tp, 3, 1, 0, "interleaved_1f1b", tp == 1 ? "none" : "selective", tp == 2, false, 1, false);
    p["global_batch_size"] = 6;
    p["overlap_p2p_comm"] = false;
    plans.push_back(p);
  }
  // As SC'21 ran it: 2021's scatter/gather of pipeline transfers over tp, without SP; and under 1F1B.
  Json sg = plans.back();
  sg["sequence_parallel"] = false;
  sg["scatter_gather_tensors_in_pipeline"] = true;
  plans.push_back(sg);
  sg["schedule"] = "1f1b";
  sg.erase("virtual_pp_size");
  sg.erase("overlap_p2p_comm");
  plans.push_back(sg);
  for (const Json& p : plans) {
    RunResult r = run_plan(model_file, p, steps);
    INFO(p.dump() << "\n" << r.output);
    REQUIRE(r.exit_code == 0);
    double d = max_relative_difference(losses(r), losses(single));
    std::printf("pp 3 %s: max relative loss difference %.3g\n", p.dump().c_str(), d);
    CHECK(d < 1e-9);
  }
}

TEST_CASE("run: hybrid sharding (shards in groups of 2, replicas across them) gives the single-rank curve",
          "[run]") {
  // dp 4 as 2 optimizer instances of 2 ranks: the reduce_scatter inside an instance, the shards'
  // all_reduce across instances, the norm over one instance, ZeRO-1, 2 and 3.
  const int steps = 6;
  RunResult single = run_plan("tiny", plan(1, 1, 1, 0, "1f1b", "none", false, false, 2, false), steps);
  INFO(single.output);
  REQUIRE(single.exit_code == 0);
  double largest = 0;
  for (int zero : {1, 2, 3}) {
    Json p = plan(1, 1, 4, zero, "1f1b", zero == 2 ? "selective" : "none", false, zero == 3, 1, zero != 2);
    p["num_distributed_optimizer_instances"] = 2;
    RunResult r = run_plan("tiny", p, steps);
    INFO(p.dump() << "\n" << r.output);
    REQUIRE(r.exit_code == 0);
    check_measured_memory("hybrid ZeRO-" + std::to_string(zero), r, zero < 3);
    double d = max_relative_difference(losses(r), losses(single));
    std::printf("hybrid sharding %s: max relative loss difference %.3g\n", p.dump().c_str(), d);
    largest = std::max(largest, d);
    CHECK(d < 1e-9);
  }
  std::printf("hybrid sharding: largest deviation %.3g\n", largest);
}

TEST_CASE("run: context-parallel plans give the single-rank loss curve (fp64), with their memory", "[run]") {
  // cp 2 and 4 over the p2p ring and the allgather kind (flash, and materialized scores), with tp
  // (and SP), pp, dp, ZeRO 1–3, hybrid sharding, recompute and dropout; both tiny models (rotary
  // and learned positions).
  const int steps = 6;
  auto cp_plan = [](int tp, int pp, int dp, int cp, const char* comm, int zero, const char* recompute, bool sp,
                    bool overlap, bool flash = true) {
    Json p = plan(tp, pp, dp, zero, "1f1b", recompute, sp, flash, 1, overlap);
    p["context_parallel_size"] = cp;
    p["cp_comm_type"] = comm;
    return p;
  };
  struct Case {
    const char* model;
    Json plan;
  };
  Json hybrid = cp_plan(1, 1, 2, 2, "p2p", 2, "none", false, false);
  hybrid["num_distributed_optimizer_instances"] = 2;
  std::vector<Case> cases = {
      {"tiny", cp_plan(1, 1, 1, 2, "p2p", 0, "none", false, false)},
      {"tiny", cp_plan(1, 1, 1, 2, "allgather", 0, "selective", false, false)},
      {"tiny", cp_plan(1, 1, 1, 4, "p2p", 0, "full", false, false)},
      {"tiny", cp_plan(2, 1, 1, 2, "p2p", 0, "selective", true, false)},
      {"tiny", cp_plan(1, 2, 1, 2, "allgather", 0, "full", false, true)},
      {"tiny", cp_plan(1, 1, 2, 2, "p2p", 1, "none", false, true)},
      {"tiny", cp_plan(1, 1, 2, 2, "allgather", 3, "none", false, false)},
      {"tiny", hybrid},
      {"tiny-gpt", cp_plan(2, 2, 1, 2, "p2p", 1, "selective", true, true)},
      // Materialized scores over the gathered K/V.
      {"tiny", cp_plan(1, 1, 2, 2, "allgather", 2, "selective", false, true, false)},
      {"tiny-gpt", cp_plan(2, 1, 1, 2, "allgather", 0, "full", true, false, false)},
  };
  std::map<std::string, std::vector<double>> reference;
  for (const char* model : {"tiny", "tiny-gpt"}) {
    RunResult single = run_plan(model, plan(1, 1, 1, 0, "1f1b", "none", false, true, 2, false), steps);
    REQUIRE(single.exit_code == 0);
    reference[model] = losses(single);
  }
  double largest = 0;
  for (const Case& c : cases) {
    RunResult r = run_plan(c.model, c.plan, steps);
    INFO(c.model << " " << c.plan.dump() << "\n" << r.output);
    REQUIRE(r.exit_code == 0);
    double d = max_relative_difference(losses(r), reference[c.model]);
    std::printf("context parallel %-9s %s: max relative loss difference %.3g\n", c.model, c.plan.dump().c_str(), d);
    largest = std::max(largest, d);
    CHECK(d < 1e-9);
    check_measured_memory(std::string("cp ") + c.plan.dump(), r, c.plan.at("zero_stage") != 3, 64 * 1024);
  }
  std::printf("context parallel: largest deviation over %zu plans: %.3g\n", cases.size(), largest);
  // Dropout: the masks are drawn at global token positions, so a cp rank draws what one rank does.
  Json one = plan(1, 1, 1, 0, "1f1b", "none", false, true, 2, false);
  Json ring = cp_plan(1, 1, 1, 2, "p2p", 0, "none", false, false);
  Json gathered = cp_plan(1, 1, 1, 2, "allgather", 0, "selective", false, false, false);
  one["dropout"] = ring["dropout"] = gathered["dropout"] = 0.1;
  RunResult a = run_plan("tiny-gpt", one, 4), b = run_plan("tiny-gpt", ring, 4), c = run_plan("tiny-gpt", gathered, 4);
  REQUIRE(a.exit_code == 0);
  REQUIRE(b.exit_code == 0);
  REQUIRE(c.exit_code == 0);
  CHECK(max_relative_difference(losses(b), losses(a)) < 1e-9);
  CHECK(max_relative_difference(losses(c), losses(a)) < 1e-9);
}

TEST_CASE("run: FP8 plans give the single-rank FP8 curve (fp64), near the curve without FP8", "[run][fp8]") {
  // Delayed scaling's amax is maximised over every rank, so every plan rounds to the same FP8
  // values as one rank does: the curves agree like the plans without FP8. Both formats, both tiny
  // models (tiny-gpt has column-parallel biases), with tp + SP, pp, dp with ZeRO 1-2, cp, recompute.
  const int steps = 6;
  auto fp8 = [](Json p, const char* format) {
    p["fp8"] = format;
    p["fp8_amax_history_len"] = 3;
    p["fp8_amax_compute_algo"] = "max";
    return p;
  };
  struct Case {
    const char* model;
    Json plan;
  };
  Json cp = plan(1, 1, 1, 0, "1f1b", "none", false, true, 1, false);
  cp["context_parallel_size"] = 2;
  std::vector<Case> cases = {
      {"tiny", fp8(plan(1, 1, 2, 1, "1f1b", "none", false, false, 2, true), "hybrid")},
      {"tiny", fp8(plan(2, 1, 1, 0, "1f1b", "selective", true, false, 2, false), "hybrid")},
      {"tiny", fp8(plan(1, 2, 1, 0, "1f1b", "full", false, false, 1, false), "hybrid")},
      {"tiny", fp8(cp, "hybrid")},
      {"tiny-gpt", fp8(plan(2, 1, 1, 0, "1f1b", "full", false, false, 2, false), "e4m3")},
      {"tiny-gpt", fp8(plan(1, 1, 2, 2, "1f1b", "none", false, true, 1, true), "e4m3")},
  };
  std::map<std::string, std::vector<double>> reference;
  for (const Case& c : cases) {
    std::string key = std::string(c.model) + c.plan.at("fp8").get<std::string>();
    if (reference.count(key)) continue;
    Json one = fp8(plan(1, 1, 1, 0, "1f1b", "none", false, true, 2, false), c.plan.at("fp8").get<std::string>().c_str());
    RunResult single = run_plan(c.model, one, steps);
    INFO(single.output);
    REQUIRE(single.exit_code == 0);
    reference[key] = losses(single);
    RunResult plain = run_plan(c.model, plan(1, 1, 1, 0, "1f1b", "none", false, true, 2, false), steps);
    REQUIRE(plain.exit_code == 0);
    double d = max_relative_difference(reference[key], losses(plain));
    std::printf("fp8 %-8s %-6s against no FP8: max relative loss difference %.3g\n", c.model,
                c.plan.at("fp8").get<std::string>().c_str(), d);
    CHECK(d > 0);     // the rounding is there
    CHECK(d < 0.01);  // and small: Transformer Engine's recipe keeps FP8 training on the curve
  }
  for (const Case& c : cases) {
    RunResult r = run_plan(c.model, c.plan, steps);
    INFO(c.model << " " << c.plan.dump() << "\n" << r.output);
    REQUIRE(r.exit_code == 0);
    double d = max_relative_difference(losses(r), reference[std::string(c.model) + c.plan.at("fp8").get<std::string>()]);
    std::printf("fp8 %-8s %s: max relative loss difference %.3g\n", c.model, c.plan.dump().c_str(), d);
    CHECK(d < 1e-9);
    check_measured_memory(std::string("fp8 ") + c.plan.dump(), r, true, 64 * 1024);
  }
}

TEST_CASE("run: MPI's own collectives give the same curve as the program's algorithms", "[run]") {
  Json p = plan(2, 1, 2, 1, "1f1b", "none", true, false, 1, true);
  RunResult ours = run_plan("tiny", p, 5), theirs = run_plan("tiny", p, 5, "--collectives mpi");
  INFO(theirs.output);
  REQUIRE(ours.exit_code == 0);
  REQUIRE(theirs.exit_code == 0);
  CHECK(max_relative_difference(losses(theirs), losses(ours)) < 1e-9);
  CHECK(theirs.measurement.at("collectives") == "mpi");
  CHECK(theirs.measurement.at("collective_algorithms_used").contains("mpi"));
}

TEST_CASE("run: fp32 plans stay within 1e-4 of the single-rank fp32 curve", "[run]") {
  RunResult single = run_plan("tiny", plan(1, 1, 1, 0, "1f1b", "none", false, false, 2, false, "fp32"), 10);
  REQUIRE(single.exit_code == 0);
  RunResult r = run_plan("tiny", plan(2, 2, 2, 1, "1f1b", "selective", true, false, 1, true, "fp32"), 10);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(max_relative_difference(losses(r), losses(single)) < 1e-4);
}

TEST_CASE("run: dropout masks depend on global coordinates only", "[run]") {
  Json one = plan(1, 1, 1, 0, "1f1b", "none", false, false, 2, false);
  Json many = plan(2, 2, 2, 1, "1f1b", "selective", true, false, 1, false);
  one["dropout"] = many["dropout"] = 0.1;
  RunResult a = run_plan("tiny-gpt", one, 5), b = run_plan("tiny-gpt", many, 5);
  REQUIRE(a.exit_code == 0);
  REQUIRE(b.exit_code == 0);
  CHECK(max_relative_difference(losses(b), losses(a)) < 1e-9);
}

TEST_CASE("run: the loss falls on the shipped corpus", "[run]") {
  RunResult r = run_plan("tiny", plan(1, 1, 2, 1, "1f1b", "none", false, false, 2, false, "fp32"), 40,
                         "--lr 3e-3");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  auto l = losses(r);
  std::printf("loss: step 1 %.4f, step 20 %.4f, step 40 %.4f\n", l[0], l[19], l[39]);
  CHECK(l[0] == Approx(std::log(256.0)).epsilon(0.02));  // a fresh model guesses uniformly
  CHECK(l[39] < l[0] - 1.0);
}

TEST_CASE("run: measurement.json is a StepResult with measured memory", "[run]") {
  RunResult r = run_plan("tiny", plan(1, 2, 1, 0, "1f1b", "none", false, false, 2, false, "fp32"), 4);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const Json& m = r.measurement;
  CHECK(m.at("source") == "executor");
  CHECK(m.at("step_time_s").get<double>() > 0);
  CHECK(m.at("losses").size() == 4);
  for (const char* key : {"compute", "exposed_comm", "bubble", "optimizer"}) {
    CHECK(m.at("breakdown_s").contains(key));
  }
  CHECK(m.at("program_sha256").get<std::string>().size() == 64);
  CHECK(m.at("memory").at("measured_peak_bytes_max").get<double>() > 0);
  CHECK(m.at("memory").at("ranks").size() == 2);
  CHECK(m.at("ops").size() > 100);
  // Nothing is allocated outside the arena once the first step ran: the heap does not grow
  // during steps 2 onwards (a few bytes of slack for MPI's internal request pools).
  for (const auto& rank : m.at("memory").at("measured")) {
    double growth = rank.at("heap_growth_after_first_step_bytes").get<double>();
    std::printf("heap growth during steps 2..n on rank %d: %.0f bytes\n", rank.at("rank").get<int>(), growth);
    CHECK(growth <= 1024);
    // The exact count is the figure; the kernel's (approximate) high-water mark is beside it.
    double high_water = rank.at("resident_high_water_bytes").get<double>();
    CHECK(high_water > 0);
    CHECK(rank.at("measured_peak_bytes").get<double>() > 0);
  }
}

// The measured peak (the kernel's exact count of anonymous pages the steps added, above the
// process after a throwaway warm-up step) against the program's buffers (peak_bytes − runtime): the
// staging and scratch the CPU backend communicates through are program buffers, so the two
// agree within the 2% issue 5 asks of every validation point.
TEST_CASE("run: measured peak memory is the program's buffers within 2% (tp2, pp2, dp2 ZeRO-1, ZeRO-3)",
          "[run]") {
  struct Case {
    const char* name;
    Json plan;
  };
  std::vector<Case> cases = {
      {"tp2", plan(2, 1, 1, 0, "1f1b", "none", false, false, 2, false, "fp32")},
      {"pp2-1f1b", plan(1, 2, 1, 0, "1f1b", "none", false, false, 2, false, "fp32")},
      {"dp2-zero1", plan(1, 1, 2, 1, "1f1b", "none", false, false, 2, false, "fp32")},
      {"dp2-zero3", plan(1, 1, 2, 3, "1f1b", "none", false, false, 2, false, "fp32")}};
  for (const Case& c : cases) {
    RunResult r = run_plan("tiny", c.plan, 3);
    INFO(c.name << "\n" << r.output);
    REQUIRE(r.exit_code == 0);
    check_measured_memory(c.name, r);
  }
}

TEST_CASE("run: a rank count that does not match the plan is refused", "[run]") {
  std::string file = write_temp_file("mismatch.plan.json", plan(1, 1, 2, 0, "1f1b", "none", false, false, 2, false).dump());
  std::ostringstream cmd;
  cmd << source_path("scripts/mpirun") << " -np 1 " << STEPCAST_BINARY << " run --model "
      << source_path("models/tiny.json") << " --plan " << file << " --steps 1";
  CommandResult r = run_shell(cmd.str());
  const std::string& output = r.output;
  CHECK(r.exit_code != 0);
  CHECK_THAT(output, Catch::Contains("needs 2 ranks"));
}

TEST_CASE("run: a plan without dp_size fills mpirun's world, as Megatron-LM does", "[run]") {
  Json p = plan(1, 1, 1, 0, "1f1b", "none", false, false, 1, false);
  p.erase("dp_size");
  p["global_batch_size"] = 4;
  std::string file = write_temp_file("no-dp.plan.json", p.dump());
  std::ostringstream cmd;
  cmd << source_path("scripts/mpirun") << " -np 2 " << STEPCAST_BINARY << " run --model "
      << source_path("models/tiny.json") << " --plan " << file << " --steps 2";
  CommandResult r = run_shell(cmd.str());
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("no dp_size: dp_size = 2, the 2 devices of mpirun's world"));
  CHECK_THAT(r.output, Catch::Contains("2 ranks"));
}

namespace {

std::string run_command_line(const std::string& plan_file, const std::string& extra) {
  return source_path("scripts/mpirun") + " -np 2 " + STEPCAST_BINARY + " run --model " +
         source_path("models/tiny.json") + " --plan " + plan_file + " --topology " +
         source_path("topologies/localhost-cpu.json") + " --corpus " +
         source_path("data/corpus/shakespeare.txt") + " --quiet " + extra;
}

}  // namespace

TEST_CASE("run: resuming a checkpoint continues the loss curve bit for bit", "[run]") {
  Json p = plan(1, 2, 1, 0, "1f1b", "none", false, false, 1, false);
  p["global_batch_size"] = 4;
  p["dropout"] = 0.1;
  std::string file = write_temp_file("resume.plan.json", p.dump());
  std::string dir = file + ".dir";
  std::filesystem::remove_all(dir);
  CommandResult full = run_shell(run_command_line(file, "--steps 10 --out " + dir + "/full"));
  REQUIRE(full.exit_code == 0);
  CommandResult first = run_shell(run_command_line(file, "--steps 5 --checkpoint-dir " + dir + "/ck --checkpoint-every 5"));
  REQUIRE(first.exit_code == 0);
  CommandResult resumed = run_shell(run_command_line(file, "--steps 10 --resume " + dir + "/ck --out " + dir + "/resumed"));
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  auto a = load_json_file(dir + "/full/measurement.json").at("losses").get<std::vector<double>>();
  auto b = load_json_file(dir + "/resumed/measurement.json").at("losses").get<std::vector<double>>();
  REQUIRE(b.size() == 5);
  for (size_t i = 0; i < 5; ++i) CHECK(b[i] == a[i + 5]);  // identical, not approximately

  SECTION("a checkpoint of another plan is refused") {
    Json other = p;
    other["dropout"] = 0.0;
    std::string other_file = write_temp_file("resume-other.plan.json", other.dump());
    CommandResult refused = run_shell(run_command_line(other_file, "--steps 10 --resume " + dir + "/ck"));
    CHECK(refused.exit_code == 2);
    CHECK_THAT(refused.output, Catch::Contains("not of this program"));
  }
  SECTION("a truncated checkpoint is refused") {
    std::string rank_file = dir + "/ck/step-00000005/rank-00001.bin";
    std::filesystem::resize_file(rank_file, std::filesystem::file_size(rank_file) / 2);
    CommandResult refused = run_shell(run_command_line(file, "--steps 10 --resume " + dir + "/ck"));
    CHECK(refused.exit_code == 2);
    CHECK_THAT(refused.output, Catch::Contains("truncated"));
  }
}

TEST_CASE("run: a hung rank is caught by the watchdog, which names the op and the rank", "[run]") {
  Json p = plan(1, 2, 1, 0, "1f1b", "none", false, false, 1, false);
  p["global_batch_size"] = 4;
  std::string file = write_temp_file("hang.plan.json", p.dump());
  // Rank 1 sleeps before its op 20 (inside its first forward pass); rank 0 waits on it.
  CommandResult r = run_shell("STEPCAST_TEST_HANG=1:20 timeout 120 " +
                              with_faults(run_command_line(file, "--steps 3 --watchdog-s 3")));
  INFO(r.output);
  CHECK(r.exit_code != 0);
  CHECK(r.exit_code != 124);  // the watchdog ended it, not the test's timeout
  CHECK_THAT(r.output, Catch::Contains("watchdog"));
  CHECK_THAT(r.output, Catch::Contains("waiting for rank 1;"));
}

TEST_CASE("run: a rank that dies ends the job, and the last complete checkpoint survives", "[run]") {
  Json p = plan(1, 2, 1, 0, "1f1b", "none", false, false, 1, false);
  p["global_batch_size"] = 4;
  std::string file = write_temp_file("die.plan.json", p.dump());
  std::string dir = file + ".ck";
  std::filesystem::remove_all(dir);
  CommandResult r = run_shell("STEPCAST_TEST_DIE=1:5 timeout 120 " +
                              with_faults(run_command_line(file, "--steps 10 --checkpoint-dir " + dir +
                                                                    " --checkpoint-every 2")));
  INFO(r.output);
  CHECK(r.exit_code != 0);
  CHECK(r.exit_code != 124);
  CHECK_THAT(r.output, Catch::Contains("rank 1"));  // the launcher names the rank that died
  // The checkpoint after step 4 is complete and resumes.
  CHECK(std::filesystem::exists(dir + "/step-00000004/manifest.json"));
  CommandResult resumed = run_shell(run_command_line(file, "--steps 6 --resume " + dir));
  INFO(resumed.output);
  CHECK(resumed.exit_code == 0);
}

TEST_CASE("run: the CPU backend refuses a GPU topology, whose program has no host staging", "[run]") {
  Json p = plan(1, 2, 1, 0, "1f1b", "none", false, false, 1, false);
  std::string file = write_temp_file("gpu-topology.plan.json", p.dump());
  CommandResult r = run_shell(source_path("scripts/mpirun") + " -np 2 " + STEPCAST_BINARY + " run --model " +
                  source_path("models/tiny.json") + " --plan " + file + " --topology " +
                  source_path("topologies/dgx-a100-80gb.json") + " --steps 2 --quiet");
  INFO(r.output);
  CHECK(r.exit_code != 0);
  CHECK_THAT(r.output, Catch::Contains("node.intra_node.kind"));
  CHECK_THAT(r.output, Catch::Contains("shared_memory"));
}
