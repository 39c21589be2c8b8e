// Synthetic validate results for the report tests: StepResults of the real tiny-cpu program
// (every op of a rank back to back, chosen step times and measured peak) and a ValidateReport
// of points with known errors, one flagged and one failed. No processes, no timing.
#pragma once

#include <cmath>

#include "lower.hpp"
#include "memory.hpp"
#include "model.hpp"
#include "plan.hpp"
#include "program_json.hpp"
#include "test_support.hpp"
#include "topology.hpp"
#include "validate_report.hpp"
#include "validate_sweep.hpp"

namespace stepcast::test {

struct TinyProgram {
  ModelConfig model;
  Topology topology;
  Plan plan;
  StepProgram program;
  Json inputs;
};

// tiny-cpu, with the plan's dropout replaced when `dropout` >= 0 (another program).
inline TinyProgram tiny_program(double dropout = -1) {
  TinyProgram t;
  t.model = load_model(source_path("models/tiny.json"));
  t.topology = load_topology(source_path("topologies/localhost-cpu.json"));
  t.plan = load_plan(source_path("examples/tiny-cpu.json"));
  if (dropout >= 0) t.plan.dropout = dropout;
  validate_plan(t.plan, t.model, t.topology);
  t.program = lower_program(t.model, t.topology, t.plan);
  hash_program(t.program);
  t.inputs = {{"model", model_to_json(t.model)},
              {"topology", topology_to_json(t.topology)},
              {"plan", plan_to_json(t.plan)}};
  return t;
}

// A StepResult of `t` whose ops take `op_s` each (gemms `gemm_s`), back to back on both ranks.
// Measurements get a measured peak of `measured_peak_fraction` × the predicted program buffers.
inline StepResult tiny_result(const TinyProgram& t, const std::string& source, double step_time_s,
                              double gemm_s, double op_s, double measured_peak_fraction = 1.0) {
  StepResult r;
  r.source = source;
  r.step_time_s = step_time_s;
  r.critical_rank = 0;
  r.breakdown = {0.7 * step_time_s, 0.2 * step_time_s, 0.0, 0.1 * step_time_s};
  r.memory = memory_to_json(memory_report(t.program, t.topology));
  if (source == "executor") {
    const Json& rank0 = r.memory["ranks"][0];
    double arena = rank0["peak_bytes"].get<double>() - rank0["memory_runtime_bytes"].get<double>();
    r.memory["measured_peak_bytes_max"] = measured_peak_fraction * arena;
    r.memory["measured"] = {{{"rank", 0}, {"measured_peak_bytes", measured_peak_fraction * arena}},
                            {{"rank", 1}, {"measured_peak_bytes", measured_peak_fraction * arena}}};
  }
  r.program_sha256 = t.program.program_sha256;
  r.inputs = t.inputs;
  for (int64_t rank : {0, 1}) {
    double clock = 0;
    for (const Op& op : t.program.role_of_rank(rank).ops) {
      double d = op.kind == OpKind::alloc || op.kind == OpKind::free ? 0
                 : op.kind == OpKind::gemm                            ? gemm_s
                                                                      : op_s;
      r.ops.push_back({rank, op.id, clock, clock + d, clock});
      clock += d;
    }
  }
  return r;
}

inline SweepPoint tiny_point(const TinyProgram& t, const std::string& name) {
  SweepPoint p;
  p.name = name;
  p.model = t.model;
  p.plan = t.plan;
  p.plan_json = plan_to_json(t.plan);
  p.ranks = 2;
  p.steps = 6;
  return p;
}

// A point whose prediction is `predicted_s` and whose runs measured `measured_s`.
inline ValidatePoint tiny_validate_point(const TinyProgram& t, const std::string& name,
                                         double predicted_s, const std::vector<double>& measured_s,
                                         double measured_peak_fraction = 1.0) {
  StepResult prediction = tiny_result(t, "simulator", predicted_s, 1.1e-4, 4e-5);
  std::vector<StepResult> runs;
  std::vector<std::string> files;
  for (double m : measured_s) {
    runs.push_back(tiny_result(t, "executor", m, 1e-4, 5e-5, measured_peak_fraction));
    files.push_back(name + "/run-" + std::to_string(files.size() + 1) + "/measurement.json");
  }
  return evaluate_point(tiny_point(t, name), prediction, name + "/prediction.json", runs, files);
}

// Four points: +3% and −8% step-time error (quiet), one flagged (+50%, spread 20%), one failed.
inline ValidateReport synthetic_report() {
  TinyProgram t = tiny_program();
  ValidateReport r;
  r.sweep_name = "synthetic";
  r.sweep_file = "sweeps/synthetic.json";
  r.sweep_notes = "Synthetic results <with> characters & to escape.";
  r.topology_file = "topologies/localhost-cpu.json";
  r.machine = {"test-host", "Test CPU", 2};
  r.stepcast_version = "0.1.0";
  r.git_commit = "0123456789ab";
  r.date_utc = "2026-11-30T17:00:00Z";
  r.command_line = "stepcast validate --sweep sweeps/synthetic.json";
  r.profile_source = "measure-quick";
  r.profile_file = "out/validate/synthetic/profile.json";
  r.profile_name = "cpu-test";
  r.repeats = 3;
  r.points.push_back(tiny_validate_point(t, "plus3", 0.0103, {0.0100, 0.01001, 0.00999}, 1.01));
  r.points.push_back(tiny_validate_point(t, "minus8", 0.0092, {0.0100, 0.0101, 0.0099}, 0.995));
  r.points.push_back(tiny_validate_point(t, "noisy", 0.015, {0.0090, 0.0100, 0.0110}));
  ValidatePoint failed;
  failed.name = "dies";
  failed.ranks = 2;
  failed.steps = 6;
  failed.plan = plan_to_json(t.plan);
  failed.failed_stage = "run";
  failed.failure = "run 1/3: mpirun stepcast run exited with code 1: rank 1 <killed>";
  r.points.push_back(failed);
  r.wall_s = 12.5;
  return r;
}

}  // namespace stepcast::test
