// `stepcast compare`: a synthetic prediction/measurement pair of the real tiny-cpu program with
// chosen differences (every gemm predicted 10% slower, one all_reduce 2×, step time +10%,
// activations +25%) must come back as exactly those errors; pairs of different programs or of
// two predictions are refused; and the command runs end to end on `simulate` and `run` output.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "compare.hpp"
#include "errors.hpp"
#include "lower.hpp"
#include "memory.hpp"
#include "model.hpp"
#include "plan.hpp"
#include "program_json.hpp"
#include "test_support.hpp"
#include "topology.hpp"

using namespace stepcast;
using namespace stepcast::test;
using Catch::Contains;

namespace {

constexpr double kGemmS = 1e-3;   // measured duration of every gemm
constexpr double kOtherS = 5e-4;  // of every other timed op
constexpr double kWaitS = 2e-4;   // measured collectives wait this long for their peer first

struct Pair {
  StepProgram program;
  StepResult prediction;
  StepResult measurement;
  int32_t doubled_all_reduce = -1;  // id of the all_reduce predicted 2× on rank 0
};

// One rank's records: ops back to back in list order, with durations from `duration_of`.
template <typename F>
void append_records(std::vector<OpRecord>& out, const Role& role, int64_t rank, double wait_s,
                    F duration_of) {
  double t = 0;
  for (const Op& op : role.ops) {
    double ready = is_collective(op.kind) ? t + wait_s : t;
    double end = ready + duration_of(op);
    out.push_back({rank, op.id, t, end, ready});
    t = end;
  }
}

// Through JSON and back, as the command reads it.
StepResult round_trip(const StepResult& r) {
  return step_result_from_json(step_result_to_json(r), r.source);
}

Pair make_pair() {
  ModelConfig model = load_model(source_path("models/tiny.json"));
  Topology topology = load_topology(source_path("topologies/localhost-cpu.json"));
  Plan plan = load_plan(source_path("examples/tiny-cpu.json"));
  validate_plan(plan, model, topology);
  Pair p;
  p.program = lower_program(model, topology, plan);
  hash_program(p.program);
  REQUIRE(p.program.world_size() == 2);
  const Role& role = p.program.roles.at(0);
  for (const Op& op : role.ops) {
    if (op.kind == OpKind::all_reduce) {
      p.doubled_all_reduce = op.id;
      break;
    }
  }
  REQUIRE(p.doubled_all_reduce >= 0);

  Json inputs = {{"model", model_to_json(model)},
                 {"topology", topology_to_json(topology)},
                 {"plan", plan_to_json(plan)}};
  Json memory = memory_to_json(memory_report(p.program, topology));

  StepResult& m = p.measurement;
  m.source = "executor";
  m.step_time_s = 0.1;
  m.critical_rank = 1;
  m.breakdown = {0.06, 0.02, 0.01, 0.01};
  m.memory = memory;
  Json& m_rank0 = m.memory["ranks"][0];
  double arena_peak =
      m_rank0["peak_bytes"].get<double>() - m_rank0["memory_runtime_bytes"].get<double>();
  m.memory["measured_peak_bytes_max"] = 0.8 * arena_peak;
  m.memory["measured"] = {{{"rank", 0}, {"measured_peak_bytes", 0.8 * arena_peak}},
                          {{"rank", 1}, {"measured_peak_bytes", 0.5 * arena_peak}}};
  m.program_sha256 = p.program.program_sha256;
  m.inputs = inputs;
  auto measured = [](const Op& op) {
    if (op.kind == OpKind::alloc || op.kind == OpKind::free) return 0.0;
    return op.kind == OpKind::gemm ? kGemmS : kOtherS;
  };
  for (int64_t rank : {0, 1}) append_records(m.ops, role, rank, kWaitS, measured);

  StepResult& s = p.prediction;
  s.source = "simulator";
  s.step_time_s = 0.11;
  s.critical_rank = 0;
  s.breakdown = {0.07, 0.02, 0.005, 0.015};
  s.memory = memory;
  Json& s_rank0 = s.memory["ranks"][0];
  double activations = s_rank0["memory_activations_bytes"].get<double>();
  s_rank0["memory_activations_bytes"] = 1.25 * activations;
  s_rank0["peak_bytes"] = s_rank0["peak_bytes"].get<double>() + 0.25 * activations;
  s.memory["peak_bytes_max"] = s_rank0["peak_bytes"];
  s.program_sha256 = p.program.program_sha256;
  s.inputs = inputs;
  int32_t doubled = p.doubled_all_reduce;
  // Rank 0 only, as `simulate --mode fast` details one rank of the two.
  append_records(s.ops, role, 0, 0.0, [&](const Op& op) {
    if (op.id == doubled) return 2 * kOtherS;
    return op.kind == OpKind::gemm ? 1.1 * kGemmS : measured(op);
  });
  p.prediction = round_trip(p.prediction);
  p.measurement = round_trip(p.measurement);
  return p;
}

const OpGroupCompare& group(const std::vector<OpGroupCompare>& groups, const std::string& label) {
  for (const auto& g : groups) {
    if (g.label() == label) return g;
  }
  FAIL("no group " << label);
  throw std::logic_error("unreachable");
}

std::string refusal(const StepResult& a, const StepResult& b) {
  try {
    check_comparable(a, b, "A/prediction.json", "B/measurement.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("compare: a constructed pair reports exactly the differences put into it", "[compare]") {
  Pair p = make_pair();
  // The resolved inputs lower to the same program again.
  CHECK(program_from_inputs(p.prediction, "prediction.json").program_sha256 ==
        p.program.program_sha256);
  CompareResult c = compare_results(p.prediction, p.measurement, p.program);

  CHECK(c.step_time_s.relative().value() == Approx(0.1));
  CHECK(c.predicted_critical_rank == 0);
  CHECK(c.measured_critical_rank == 1);
  REQUIRE(c.breakdown_s.size() == 4);
  CHECK(c.breakdown_s[0].name == "compute");
  CHECK(c.breakdown_s[0].error() == Approx(0.01));
  CHECK(c.breakdown_s[0].relative().value() == Approx(0.01 / 0.06));
  CHECK(c.breakdown_s[1].error() == Approx(0).margin(1e-15));
  CHECK(c.breakdown_s[2].error() == Approx(-0.005));
  CHECK(c.breakdown_s[3].error() == Approx(0.005));

  // The ops that take time are joined: alloc and free are not (the pair records them on both sides).
  int64_t timed_ops = 0, memory_ops = 0;
  for (const Op& op : p.program.roles[0].ops) {
    (op.kind == OpKind::alloc || op.kind == OpKind::free ? memory_ops : timed_ops) += 1;
  }
  REQUIRE(memory_ops > 0);
  CHECK(c.ops_joined == timed_ops);
  CHECK(c.ops_predicted_only == 0);
  CHECK(c.ops_measured_only == timed_ops);  // rank 1 is measured, not predicted
  CHECK(c.predicted_ranks == std::vector<int64_t>{0});
  CHECK(c.measured_ranks == std::vector<int64_t>{0, 1});

  int64_t gemms = 0, collectives = 0;
  for (const Op& op : p.program.roles[0].ops) {
    gemms += op.kind == OpKind::gemm;
    collectives += is_collective(op.kind);
  }
  CHECK(c.waiting_ops_joined == collectives);
  CHECK(c.waiting_ops_measured_ready_at_start == 0);
  const OpGroupCompare& gemm = group(c.by_kind, "gemm");
  CHECK(gemm.count == gemms);
  CHECK(gemm.measured_s == Approx(gemms * kGemmS));
  CHECK(gemm.relative().value() == Approx(0.1));
  for (const OpGroupCompare& g : c.by_compute_name) {
    INFO(g.label());
    CHECK(g.relative().value() == Approx(g.kind == "gemm" ? 0.1 : 0.0).margin(1e-12));
  }
  for (const OpGroupCompare& g : c.by_kind) {
    if (g.kind == "gemm" || g.kind == "all_reduce") continue;
    INFO(g.label());
    CHECK(g.relative().value() == Approx(0).margin(1e-12));  // the measured wait is excluded
  }
  // The one all_reduce is the 2× collective: +100%; every other collective agrees.
  const Op& doubled = p.program.roles[0].ops[p.doubled_all_reduce];
  std::string label =
      std::string("all_reduce ") + to_string(doubled.group) + " " + to_string(doubled.algorithm);
  const OpGroupCompare& all_reduce = group(c.by_collective, label);
  CHECK(all_reduce.count == 1);
  CHECK(all_reduce.relative().value() == Approx(1.0));
  CHECK(group(c.by_kind, "all_reduce").relative().value() == Approx(1.0));
  for (const OpGroupCompare& g : c.by_collective) {
    if (g.label() != label) CHECK(g.relative().value() == Approx(0).margin(1e-12));
  }
  // The all_reduce's gap (0.5 ms) is the largest single op; the gemm names follow.
  REQUIRE(c.top_ops.size() == size_t(kCompareTopOps));
  CHECK(c.top_ops[0].id == p.doubled_all_reduce);
  CHECK(c.top_ops[0].error_s() == Approx(kOtherS));
  CHECK_THAT(c.top_ops[1].label, Contains("gemm"));
  CHECK(c.top_ops[1].error_s() == Approx(0.1 * kGemmS));
  REQUIRE(!c.contributors.empty());
  CHECK(c.contributors[0].abs_gap_s >= c.contributors.back().abs_gap_s);
  double gap = 0;
  for (const auto& g : c.contributors) gap += g.abs_gap_s;
  CHECK(gap == Approx(kOtherS + 0.1 * kGemmS * gemms));

  // Memory: activations +25% on the first entry, its peak by as many bytes.
  REQUIRE(c.memory_ranks.size() == 1);
  const RankMemoryCompare& rm = c.memory_ranks[0];
  auto figure = [&](const std::string& name) {
    auto f = std::find_if(rm.classes.begin(), rm.classes.end(), [&](const CompareFigure& x) { return x.name == name; });
    REQUIRE(f != rm.classes.end());
    return *f;
  };
  CHECK(rm.ranks == std::vector<std::pair<int64_t, int64_t>>{{0, 1}});
  for (const CompareFigure& f : rm.classes) {
    INFO(f.name);
    if (f.name == "memory_activations_bytes")
      CHECK(f.relative().value() == Approx(0.25));
    else if (f.name != "peak_bytes")
      CHECK(f.error() == 0);
  }
  CHECK(rm.classes.back().name == "peak_bytes");
  CHECK(rm.classes.back().error() == Approx(0.25 * figure("memory_activations_bytes").measured));
  CHECK(c.peak_bytes_max.error() == Approx(rm.classes.back().error()));
  // The measured peak (0.8 of the arena peak) against peak − runtime of the
  // prediction, which is 25% of the activations above the arena peak.
  REQUIRE(c.measured_peak_max);
  // The arena's placement is compared where both sides have it, before the runtime allowance.
  CHECK(rm.classes[6].name == "memory_placement_bytes");
  double runtime = figure("memory_runtime_bytes").predicted;
  CHECK(c.measured_peak_max->predicted_arena_peak_bytes ==
        Approx(c.peak_bytes_max.predicted - runtime));
  CHECK(c.measured_peak_max->measured_peak_bytes ==
        Approx(0.8 * (c.peak_bytes_max.measured - runtime)));
  REQUIRE(c.measured_peak_ranks.size() == 2);
  CHECK(c.measured_peak_ranks[1].relative().value() ==
        Approx(c.measured_peak_max->predicted_arena_peak_bytes /
                   (0.5 * (c.peak_bytes_max.measured - runtime)) -
               1));

  Json json = compare_to_json(c);
  CHECK(json.at("step_time_error").get<double>() == Approx(0.1));
  CHECK(json.at("breakdown_s").at("compute").at("error_relative_to_measured_step").get<double>() ==
        Approx(0.1));
  CHECK(json.at("ops").at("top_ops").size() == size_t(kCompareTopOps));
  CHECK(json.at("memory")
            .at("ranks")[0]
            .at("classes")
            .at("memory_comm_bytes")
            .at("relative_error")
            .is_null());
  CHECK_THAT(json.at("memory").at("measured_peak").at("note").get<std::string>(),
             Contains("without the runtime allowance"));
  std::ostringstream md, summary;
  write_compare_markdown(md, c);
  print_compare_summary(summary, c);
  CHECK_THAT(md.str(), Contains("| " + label + " | 1 |"));
  CHECK_THAT(md.str(), Contains("+100.0%"));
  CHECK_THAT(summary.str(), Contains("error +10.0%"));
}

TEST_CASE("compare: the arena's placement is compared where both results have it", "[compare]") {
  // Results written before the placement was modelled have no memory_placement_bytes: the
  // class is left out, and the rest compares as before.
  Pair p = make_pair();
  for (Json& rank : p.measurement.memory["ranks"]) rank.erase("memory_placement_bytes");
  CompareResult c = compare_results(p.prediction, p.measurement, p.program);
  REQUIRE(c.memory_ranks.size() == 1);
  for (const CompareFigure& f : c.memory_ranks[0].classes) CHECK(f.name != "memory_placement_bytes");
  CHECK(c.memory_ranks[0].classes.size() == 8);
  // A placement that is not a number is refused by name.
  Pair bad = make_pair();
  bad.prediction.memory["ranks"][0]["memory_placement_bytes"] = "none";
  CHECK_THROWS_WITH(compare_results(bad.prediction, bad.measurement, bad.program),
                    Contains("memory_placement_bytes"));
}

TEST_CASE("compare: pairs of different programs or of one source are refused", "[compare]") {
  Pair p = make_pair();
  SECTION("a different plan: the differing key with both values") {
    StepResult other = p.measurement;
    other.program_sha256 = std::string(64, 'f');
    other.inputs["plan"]["dropout"] = 0.1;
    std::string message = refusal(p.prediction, other);
    CHECK_THAT(message, Contains("are of different programs"));
    CHECK_THAT(message, Contains("1 resolved input key differs"));
    CHECK_THAT(message, Contains("inputs.plan.dropout: prediction 0.0, measurement 0.1"));
    CHECK_THROWS_AS(compare_results(p.prediction, other, p.program), InputError);
  }
  SECTION("the same inputs but another hash: another stepcast version") {
    StepResult other = p.measurement;
    other.program_sha256 = std::string(64, 'f');
    CHECK_THAT(refusal(p.prediction, other), Contains("different stepcast versions"));
  }
  SECTION("two predictions, two measurements, or the order swapped") {
    CHECK_THAT(
        refusal(p.prediction, p.prediction),
        Contains("B/measurement.json: key 'source' = \"simulator\": the second argument must "
                 "be a measurement"));
    CHECK_THAT(refusal(p.prediction, p.prediction), Contains("this is a prediction"));
    CHECK_THAT(refusal(p.measurement, p.measurement),
               Contains("A/prediction.json: key 'source' = \"executor\""));
    CHECK_THAT(refusal(p.measurement, p.prediction), Contains("must be a prediction"));
  }
  SECTION("a program that is not the pair's") {
    StepProgram other = p.program;
    other.program_sha256 = std::string(64, '0');
    CHECK_THROWS_WITH(compare_results(p.prediction, p.measurement, other),
                      Contains("is not the one the pair ran"));
  }
  SECTION("a StepResult with a missing field names it") {
    Json j = step_result_to_json(p.measurement);
    j["breakdown_s"].erase("bubble");
    CHECK_THROWS_WITH(step_result_from_json(j, "m.json"),
                      Contains("m.json: key 'breakdown_s.bubble'"));
  }
}

TEST_CASE("compare: end to end on `simulate` and `run` of the shipped default", "[compare]") {
  auto dir =
      std::filesystem::temp_directory_path() / ("stepcast-compare-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::string a = (dir / "A").string(), b = (dir / "B").string(), c = (dir / "C").string();
  std::string inputs = " --model " + source_path("models/tiny.json") + " --topology " +
                       source_path("topologies/localhost-cpu.json") + " --plan " +
                       source_path("examples/tiny-cpu.json");
  CommandResult sim = run_stepcast("simulate" + inputs + " --no-scaling --out " + a);
  INFO(sim.output);
  REQUIRE(sim.exit_code == 0);
  std::string run = source_path("scripts/mpirun") + " -np 2 " + STEPCAST_BINARY + " run" + inputs +
                    " --corpus " + source_path("data/corpus/shakespeare.txt") +
                    " --steps 3 --quiet --out " + b;
  CommandResult ran = run_shell(run);
  INFO(ran.output);
  REQUIRE(ran.exit_code == 0);

  CommandResult cmp =
      run_stepcast("compare " + a + "/prediction.json " + b + "/measurement.json --out " + c);
  INFO(cmp.output);
  std::printf("%s", cmp.output.c_str());
  REQUIRE(cmp.exit_code == 0);
  CHECK_THAT(cmp.output, Contains("step time predicted"));
  Json json = load_json_file(c + "/compare.json");
  CHECK(json.at("step_time_error").is_number());
  CHECK(json.at("ops").at("joined").get<int64_t>() > 100);
  CHECK(std::filesystem::exists(c + "/compare.md"));
  // The program given explicitly gives the same figures.
  REQUIRE(run_stepcast("lower" + inputs + " --out " + (dir / "P").string()).exit_code == 0);
  CommandResult with_program =
      run_stepcast("compare " + a + "/prediction.json " + b + "/measurement.json --program " +
                   (dir / "P").string() + "/program.json");
  CHECK(with_program.exit_code == 0);
  CHECK(with_program.output == cmp.output.substr(0, cmp.output.rfind("wrote ")));

  CommandResult twice = run_stepcast("compare " + a + "/prediction.json " + a + "/prediction.json");
  CHECK(twice.exit_code == 2);
  CHECK_THAT(twice.output, Contains("this is a prediction"));
  CommandResult missing = run_stepcast("compare " + a + "/prediction.json");
  CHECK(missing.exit_code == 2);
  CHECK_THAT(missing.output, Contains("measurement"));
  std::filesystem::remove_all(dir);
}
