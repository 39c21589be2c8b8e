// Reports of the planner's commands (plan, compare-strategies, scale): the figures the command
// printed, as DIR/report.md (for review), DIR/report.html (for people: tables and inline SVG
// charts through reports/html.hpp, one self-contained file) and a CSV per table (for tools).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace stepcast::cli {

struct PlanReportRow {
  int64_t rank = 0;
  std::string name;
  std::string plan_file;
  double step_time_s = 0;
  bool simulated = false;
  double estimate_s = 0;
  double tokens_per_s = 0;
  double mfu = 0;
  double peak_bytes = 0;
  double headroom_bytes = 0;
  double comm_tp_bytes = 0, comm_dp_bytes = 0, comm_pp_bytes = 0, comm_other_bytes = 0;
  std::optional<double> energy_j;  // per step: simulated where the plan was, else estimated
  std::optional<double> cost;      // per step, in PlanReport::currency
};

struct PlanReport {
  std::string title;
  std::string objective;
  std::string currency;  // of the rows' cost
  int64_t candidates = 0;
  std::map<std::string, int64_t> pruned_counts;
  std::vector<PlanReportRow> rows;
  // Every plan that fits, in ranked order: quick estimate and peak (upper bound where not exact).
  std::vector<std::string> all_names;
  std::vector<double> all_estimates_s;
  std::vector<double> all_peaks_bytes;
  double capacity_bytes = 0;  // allowed per device
  double wall_s = 0;
  std::string sim_mode = "approx";  // simulate's --mode of the re-simulations
};

struct StrategyRow {
  std::string strategy;  // "pure DP", "ZeRO-1", ...
  std::string plan;      // plan name, empty when no plan of the strategy is valid
  std::string note;      // why not valid / why it does not fit
  bool fits = false;
  bool simulated = false;
  double weights_bytes = 0, grads_bytes = 0, optimizer_bytes = 0, activations_bytes = 0,
         workspace_bytes = 0, comm_bytes = 0, placement_bytes = 0, runtime_bytes = 0, peak_bytes = 0;
  double step_time_s = 0;
  double exposed_comm_s = 0;
  double bubble_s = 0;
  double comm_volume_bytes = 0;  // per rank per step, all group kinds
  double mfu = 0;
  std::optional<double> energy_j;  // per step, simulated, where the device has power figures
  // Mixtures of experts: the quick estimate's dispatch and combine collectives (ep, etp) and the
  // busiest ep rank's expert GEMMs beyond the ops as lowered on the critical stage, and the simulation's
  // variation (its routing draws and run-to-run variation) on the critical rank.
  bool moe = false;
  double ep_comm_estimate_s = 0, imbalance_estimate_s = 0, variability_s = 0;
};

// compare-strategies --moe-skew-sweep: a row's plan simulated again with its routing skewed.
struct SkewPoint {
  std::string strategy;  // the first row that chose the plan
  std::string plan;
  double skew = 0;       // the Zipf exponent (0: uniform)
  bool simulated = false;
  std::string note;      // why not simulated
  double step_time_s = 0, variability_s = 0, load_ratio_mean = 0, dropped_tokens = 0, peak_bytes = 0;
  bool fits = false;
};

struct StrategyReport {
  std::string title;
  std::string sim_mode = "approx";
  double capacity_bytes = 0;
  std::vector<StrategyRow> rows;
  std::vector<SkewPoint> skew_points;  // by plan, then skew as given
};

struct ScalePoint {
  int64_t nodes = 0;
  int64_t devices = 0;
  std::string plan;
  int64_t global_batch_size = 0;
  std::string error;  // not simulated: why
  bool fits = true;
  double step_time_s = 0;
  double tokens_per_s = 0;
  double speedup = 0;
  double efficiency = 0;
  double compute_s = 0, exposed_comm_s = 0, bubble_s = 0, optimizer_s = 0;
};

struct ScaleReport {
  std::string title;
  std::string sim_mode = "approx";
  bool weak = false;
  std::vector<ScalePoint> points;
  double serial_fraction = 0;  // Amdahl's f, least squares (scale_command.cpp)
  bool serial_fraction_valid = false;
};

// DIR/NAME.csv for every table of `markdown` (reports/csv_tables.hpp); the files' names.
std::vector<std::string> write_csv_tables(const std::string& dir, const std::string& markdown);

void write_plan_report(const std::string& dir, const PlanReport& report);
void write_strategy_report(const std::string& dir, const StrategyReport& report);
void write_scale_report(const std::string& dir, const ScaleReport& report);

}  // namespace stepcast::cli
