// StepResult: one schema for a prediction (source "simulator") and a measurement (source
// "executor"): step time, its breakdown, throughput, MFU/HFU, memory, and per-op records joined on
// (rank, id). The breakdown is one function for both sources, so their figures compare.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "json_input.hpp"
#include "program.hpp"

namespace stepcast {

struct OpRecord {
  int64_t rank = 0;
  int32_t id = 0;
  double start_s = 0;  // op began (clocks aligned at step start)
  double end_s = 0;
  double ready_s = 0;  // when its last peer issued it (collective) or its sender did (recv);
                       // start_s for other ops
};

// Where the critical rank's step time went; the four add up to the step time.
struct Breakdown {
  double compute_s = 0;       // compute ops other than the optimizer's
  double exposed_comm_s = 0;  // collectives on the compute stream, waiting on a collective
  double bubble_s = 0;        // waiting on a pipeline receive (or for the step to reach the rank)
  double optimizer_s = 0;     // the optimizer phase's ops (in_optimizer_part)
  // The simulator's run-to-run variation on this rank's compute (above its nominal cost), taken
  // out of compute_s; the executor's measurements have none (it is in their compute).
  double variability_s = 0;
  // The simulator's slowdown of this rank's compute by collectives running beside it (the
  // profile's overlap figures), taken out of compute_s; the executor's is in its compute.
  double overlap_interference_s = 0;
  double total() const {
    return compute_s + exposed_comm_s + bubble_s + optimizer_s + variability_s + overlap_interference_s;
  }
};

// The optimizer part of a breakdown: the optimizer phase's optimizer_step ops (the gradient
// pass, AdamW); gradient accumulation during the backward pass is compute.
inline bool in_optimizer_part(const Op& op) {
  // (fp8_param_gather's casts from the master shards: Megatron-LM's optimizer step makes them.)
  const bool fp8_params = op.name == OpName::fp8_param_absmax || op.name == OpName::fp8_param_cast;
  return (op.kind == OpKind::optimizer_step || fp8_params) && op.phase == Phase::optimizer;
}

// Attributes [step_start_s, step_end_s] of one rank: its compute-stream ops by kind; the time its
// compute stream waits to whatever the next compute op (or the end of the step) waited for — a
// receive → bubble, a collective → exposed_comm. `records` are that rank's, indexed by op id.
Breakdown breakdown_of_rank(const Role& role, const std::vector<OpRecord>& records,
                            double step_start_s, double step_end_s);

struct StepResult {
  static constexpr int kSchemaVersion = 1;
  std::string source;              // "simulator" or "executor"
  double step_time_s = 0;
  int64_t critical_rank = 0;
  Breakdown breakdown;
  double tokens_per_s = 0;
  double mfu = 0;                  // model flops (no recompute) / step time / (ranks · peak)
  double hfu = 0;                  // matrix flops executed, recompute included, likewise
  Json memory;                     // memory_to_json, plus measured figures for the executor
  std::optional<double> scaling_efficiency;
  std::vector<OpRecord> ops;       // ranks simulated or instrumented in detail
  std::string program_sha256;
  Json inputs;                     // fully resolved model, topology, plan, profile
  Json extra = Json::object();     // source-specific figures (mode, wall time, losses, ...)
  std::string file;                // the file it was read from (messages), empty when made here
};

Json step_result_to_json(const StepResult& result);
// The same document as text, written as it goes (a prediction holds 10^6 records and more: no
// JSON tree of them in memory), laid out for a person who opens it: the summary first, one key a
// line (step time, breakdown, throughput, the run's figures), then memory and inputs, the per-op
// records last, one a line. Reads back as step_result_to_json(result) does.
void write_step_result_json(std::ostream& out, const StepResult& result);

// Fills ready_s of receives (when the matching send started on the peer) and collectives (when
// the last member of the group started the same collective: the k-th of its group kind and
// stream on every member) from the records of every rank involved; other ops keep start_s.
// Records of ranks not present leave ready_s at start_s.
void fill_ready_times(const StepProgram& program, std::vector<OpRecord>& records);

}  // namespace stepcast
