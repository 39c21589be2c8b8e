// `stepcast compare`: joins a prediction (source simulator) and a measurement (source executor)
// of the same StepProgram on (rank, id) and returns the errors as data — step time, breakdown,
// memory by class, per op kind and per collective, the largest contributors. No I/O besides the
// three writers at the end. Every error is predicted − measured; relative errors divide by
// measured.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "program.hpp"
#include "step_result.hpp"

namespace stepcast {

// A StepResult read back from prediction.json / measurement.json; InputError naming `file` and
// the key when a field is missing or has the wrong type. `extra` keeps the source-specific keys.
StepResult step_result_from_json(const Json& json, const std::string& file);

// Refuses (InputError) a pair that is not one prediction and one measurement of one program. For
// different program_sha256 it names every resolved input key that differs (inputs.plan.dropout:
// prediction 0.1, measurement 0) or, when none does, says the programs came from different
// stepcast versions.
void check_comparable(const StepResult& prediction, const StepResult& measurement,
                      const std::string& prediction_file, const std::string& measurement_file);

// Lowers the StepProgram again from a StepResult's resolved inputs (model, topology, plan) and
// hashes it; InputError if the hash is not `result.program_sha256` (another stepcast version:
// pass the program.json instead).
StepProgram program_from_inputs(const StepResult& result, const std::string& file);

struct CompareFigure {          // one predicted/measured pair
  std::string name;
  double predicted = 0;
  double measured = 0;
  double error() const { return predicted - measured; }
  // error / measured; nullopt when measured is 0.
  std::optional<double> relative() const;
};

struct RankMemoryCompare {
  int64_t rank = 0;             // first rank of the entry; `ranks` are the ranks alike
  std::vector<std::pair<int64_t, int64_t>> ranks;
  int64_t stage = 0;
  // memory_weights_bytes, ..., memory_comm_bytes, memory_runtime_bytes, peak_bytes
  std::vector<CompareFigure> classes;
};

// A measured process high-water mark against the predicted peak without the runtime allowance.
struct MeasuredPeakCompare {
  int64_t rank = -1;            // -1: the maximum over ranks
  double predicted_arena_peak_bytes = 0;  // peak_bytes − memory_runtime_bytes
  double measured_peak_bytes = 0;
  // The executor's arena as placed (measurement.json, per rank; -1: not recorded): the
  // program's peak, whose memory_placement_bytes count what its placement could not pack.
  double arena_extent_bytes = -1;
  double error_bytes() const { return predicted_arena_peak_bytes - measured_peak_bytes; }
  std::optional<double> relative() const;
};

// Joined ops aggregated over a key. Fields that are not part of the key stay empty.
struct OpGroupCompare {
  std::string kind;
  std::string name;             // compute: what the op computes (gemm qkv, ...), grad appended
  std::string group;            // collectives: group kind
  std::string algorithm;        // collectives: algorithm
  int64_t count = 0;
  double predicted_s = 0;       // summed durations
  double measured_s = 0;
  double abs_gap_s = 0;         // Σ |predicted − measured| over the ops
  double error_s() const { return predicted_s - measured_s; }
  std::optional<double> relative() const;
  std::string label() const;    // "gemm qkv/dgrad", "all_reduce dp ring", "recv"
};

struct OpCompare {
  int64_t rank = 0;
  int32_t id = 0;
  std::string label;            // as OpGroupCompare::label, with layer and microbatch
  double predicted_s = 0;
  double measured_s = 0;
  double error_s() const { return predicted_s - measured_s; }
};

struct CompareResult {
  std::string program_sha256;
  Json inputs;                  // the prediction's resolved inputs
  CompareFigure step_time_s{"step_time_s"};
  int64_t predicted_critical_rank = 0;
  int64_t measured_critical_rank = 0;
  std::vector<CompareFigure> breakdown_s;  // compute, exposed_comm, bubble, optimizer
  std::vector<RankMemoryCompare> memory_ranks;
  CompareFigure peak_bytes_max{"peak_bytes_max"};
  std::optional<MeasuredPeakCompare> measured_peak_max;  // when the measurement has it
  std::vector<MeasuredPeakCompare> measured_peak_ranks;
  // The op join. Durations are end_s − max(start_s, ready_s): the op's own time, without waiting
  // for a peer. alloc and free are joined but not aggregated.
  std::vector<int64_t> predicted_ranks;  // ranks with op records on each side
  std::vector<int64_t> measured_ranks;
  int64_t ops_joined = 0;
  int64_t ops_predicted_only = 0;
  int64_t ops_measured_only = 0;
  // Joined collectives and receives, and how many of them the measurement records with ready_s
  // equal to start_s: all of them means its ready_s is not recorded and its durations include
  // the wait for peers.
  int64_t waiting_ops_joined = 0;
  int64_t waiting_ops_measured_ready_at_start = 0;
  std::vector<OpGroupCompare> by_kind;          // every timed kind
  std::vector<OpGroupCompare> by_compute_name;  // compute ops by (kind, name, grad)
  std::vector<OpGroupCompare> by_collective;    // collectives by (kind, group, algorithm)
  std::vector<OpGroupCompare> contributors;     // the finest groups, largest abs_gap_s first
  std::vector<OpCompare> top_ops;               // the 10 ops with the largest |error|
};

inline constexpr int kCompareTopOps = 10;

// The join. Calls check_comparable; `program` must be the pair's program (same hash).
CompareResult compare_results(const StepResult& prediction, const StepResult& measurement,
                              const StepProgram& program);

Json compare_to_json(const CompareResult& result);
void print_compare_summary(std::ostream& out, const CompareResult& result);
void write_compare_markdown(std::ostream& out, const CompareResult& result);

}  // namespace stepcast
