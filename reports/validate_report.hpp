// The results of `stepcast validate` as data, the figures derived from them, and the report
// writers (validate.json, report.md, report.html). No I/O besides the writers' streams; running the
// sweep (child processes) is the command line's job.
// Per point: the measured step time is the median of the repeats' step times, the spread is
// (max − min) / median of them, and a point whose spread exceeds kValidateSpreadFlag is flagged
// (too noisy to judge the prediction by). So is a point during which the machine ran more than
// kValidateDriftFlag faster or slower than when the profile was measured (a fixed GEMM timed then
// and around the point: cli/machine_canary.hpp), since its profile no longer describes it.
// Errors are predicted − measured over measured.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "compare.hpp"
#include "profile.hpp"
#include "step_result.hpp"
#include "validate_sweep.hpp"

namespace stepcast {

inline constexpr double kValidateSpreadFlag = 0.025;  // (max − min) / median of the repeats
inline constexpr double kValidateBand = 0.05;          // the ±band drawn around predicted = measured
inline constexpr double kValidateDriftFlag = 0.05;     // |machine speed around a point / at the profile − 1|
// Exposed communication is summed over the unflagged points where the prediction has at least
// this share of the step in it, and counted within kValidateExposedCommBand of its prediction.
inline constexpr double kValidateExposedCommFloor = 0.05;
inline constexpr double kValidateExposedCommBand = 0.10;

struct ValidatePoint {
  std::string name;
  int64_t ranks = 0;
  int64_t steps = 0;
  Json plan;                     // plan_to_json of the resolved plan
  std::string dir;               // the point's folder under --out
  // A point fails at one stage (simulate, run, compare); the sweep goes on without it.
  std::string failed_stage;      // empty: the point ran
  std::string failure;           // the message: the exit status and the command's own error lines
  std::optional<double> predicted_step_time_s;
  std::vector<double> measured_step_times_s;  // each repeat's step time (its median timed step)
  int64_t compared_repeat = -1;  // 0-based repeat whose measurement was compared op by op
  // Each repeat's exposed communication on its instrumented step's critical rank (repeats whose run
  // recorded ops); exposed_comm_error takes their median, one step's being noisy.
  std::vector<double> measured_exposed_comm_s;
  std::optional<CompareResult> compare;
  double wall_s = 0;
  // The machine's speed around this point's runs over its speed when the profile was measured (the
  // canary GEMM's rate before and after the runs, averaged, over the reference's); none: not timed.
  std::optional<double> machine_speed;
  // Each canary's (machine_canary.hpp): the GEMM's and the memory-bound softmax's; machine_speed
  // is the one further from 1.
  std::optional<double> machine_speed_gemm, machine_speed_softmax;

  bool ok() const { return failed_stage.empty(); }
  std::optional<double> measured_step_time_s() const;  // median of the repeats
  std::optional<double> spread() const;                // (max − min) / median
  bool noisy() const;                                  // spread > kValidateSpreadFlag
  bool drifted() const;                                // |machine_speed − 1| > kValidateDriftFlag
  bool flagged() const;                                // noisy or drifted
  std::string flag() const;  // "", "noisy", "machine +7.2%", "noisy, machine −6.0%" or "FAILED (stage)"
  std::optional<double> step_time_error() const;       // predicted vs the median, relative
  // The measured high-water mark against the predicted peak without the runtime allowance, as
  // compare reports it (relative).
  std::optional<double> memory_error() const;
};

// A figure over the sweep's points, with the point it comes from.
struct PointFigure {
  std::string point;
  double value = 0;
};

// Σ durations of one op kind over the points that ran.
struct KindErrorSum {
  std::string kind;
  int64_t points = 0;
  int64_t count = 0;
  double predicted_s = 0;
  double measured_s = 0;
  std::optional<double> relative() const;
};

// One op of one point; the sweep's worst are those with the largest |error| as a share of the
// point's measured step time.
struct PointOp {
  std::string point;
  OpCompare op;
  double share_of_step = 0;  // |error_s| / measured step time
};

struct ValidateSummary {
  int64_t points = 0;
  int64_t ran = 0;
  int64_t failed = 0;
  int64_t flagged = 0;
  // |step-time error| over the points that ran and are not flagged.
  std::optional<double> median_abs_step_time_error;
  std::optional<PointFigure> max_abs_step_time_error;  // signed value of the largest
  // |memory error| over every point that ran.
  std::optional<PointFigure> max_abs_memory_error;
  // The critical rank's exposed communication, predicted against measured (the compared run's
  // instrumented step), over the unflagged points whose predicted share of the step is at least
  // kValidateExposedCommFloor: how many, how many within kValidateExposedCommBand, the largest.
  int64_t exposed_comm_points = 0;
  int64_t exposed_comm_within_band = 0;
  std::optional<PointFigure> max_abs_exposed_comm_error;
  std::vector<KindErrorSum> by_kind;   // largest measured first
  std::vector<PointOp> worst_ops;      // at most kValidateWorstOps
};

inline constexpr size_t kValidateWorstOps = 10;

struct ValidateReport {
  std::string sweep_name;
  std::string sweep_file;
  std::string sweep_notes;
  std::string topology_file;
  MachineInfo machine;
  std::string stepcast_version;
  std::string git_commit;
  std::string date_utc;          // ISO 8601
  std::string command_line;
  // The profile the predictions used.
  // "measure", "measure-quick" (measured by this validate), "file" or "roofline" (none)
  std::string profile_source;
  std::string profile_file;
  std::string profile_name;
  std::vector<std::string> profile_warnings;  // fields where it differs from this machine
  // The canary GEMM's rate (GFLOP/s) the points' machine_speed is relative to, and when it was
  // timed ("just before the profile was measured", "at the start of the sweep"); 0: not timed.
  double machine_reference_gflops = 0;
  double machine_reference_softmax_gbps = 0;  // the softmax canary's rate then (GB/s)
  std::string machine_reference_when;
  int64_t repeats = 0;
  std::vector<ValidatePoint> points;
  double wall_s = 0;
};

// The figures of a point from its prediction and its repeats' measurements: the step-time
// statistics, and compare (reports/compare.hpp) of the prediction with the median repeat. A pair
// compare refuses (different programs, ...) makes the point failed at stage "compare" with
// compare's message. The file names only label messages.
ValidatePoint evaluate_point(const SweepPoint& point, const StepResult& prediction,
                             const std::string& prediction_file,
                             const std::vector<StepResult>& measurements,
                             const std::vector<std::string>& measurement_files);

ValidateSummary summarize_validate(const ValidateReport& report);
// A point's exposed communication, (predicted − measured) / measured, measured the median of the
// repeats' (measured_exposed_comm_s; the compared repeat's where none recorded it), where the
// prediction puts kValidateExposedCommFloor of the step or more in it; none otherwise.
std::optional<double> exposed_comm_error(const ValidatePoint& p);
// The summary row of it: "exposed communication within 10% (unflagged points with ≥ 5% of the
// step in it)" and "13 of 15".
std::string exposed_comm_label();
std::string exposed_comm_count(const ValidateSummary& s);

// The predicted memory entry with the largest peak (the one the measured maximum is compared
// with), nullptr when there is none; and one class's predicted bytes in it (0 when absent).
const RankMemoryCompare* largest_peak_entry(const CompareResult& compare);
double predicted_bytes(const RankMemoryCompare& entry, const std::string& key);

// "out/v/profile.json (cpu-host; measured by this validate, measure-quick)"
std::string describe_profile(const ValidateReport& report);

// "tp 1 · pp 1 · dp 2, ZeRO 1, 1f1b, micro batch 2 of 8, recompute none"
std::string describe_plan(const Json& plan);

Json validate_to_json(const ValidateReport& report);
void write_validate_markdown(std::ostream& out, const ValidateReport& report);
void write_validate_html(std::ostream& out, const ValidateReport& report);
// One line per point, for progress: "predicted 1.23 ms, measured 1.30 ms (3 repeats, spread
// 0.8%), error -5.4%, memory error +0.2%" or "FAILED at run: ...".
std::string describe_point_result(const ValidatePoint& point);

}  // namespace stepcast
