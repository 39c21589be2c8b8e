// The results of `validate --sweep published` as data, and their three writers (published.json,
// published.md, published.html). The runner (validate_published.cpp) fills a PublishedReport;
// nothing here runs a prediction. Errors are (predicted − published) / published.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "components.hpp"
#include "json_input.hpp"
#include "profiler.hpp"
#include "published_figures.hpp"
#include "published_rows.hpp"

namespace stepcast::cli {

struct MegatronResult {
  const MegatronRow* row = nullptr;
  int64_t nodes = 0;
  bool ok = false;
  std::string failure;
  double step_time_s = 0;
  double tflops_per_gpu = 0;
  Json breakdown = Json::object();  // seconds: compute, exposed_comm, bubble, optimizer, variability
  double mfu = 0;
  bool fits = false;
  double peak_bytes_max = 0;
  double wall_s = 0;
  double published_time_s() const {
    return megatron_iteration_flops(*row) / (row->published_tflops_per_gpu * 1e12 * double(row->gpus));
  }
  double error() const { return relative_error(tflops_per_gpu, row->published_tflops_per_gpu); }
  double time_error() const { return relative_error(step_time_s, published_time_s()); }
};

struct NcclResult {
  const NcclRow* row = nullptr;
  NcclPrediction predicted;
  std::string profile_file;  // the profile used (--profile-dir's, or the repository's), relative to it
  double error() const {
    return relative_error(predicted.busbw_bytes_per_s, row->published_busbw_bytes_per_s);
  }
};

// One profile's component figures predicted by the cost model (components.hpp).
struct ComponentSection {
  std::string profile_file;  // relative to the repository
  std::string topology_file;
  std::vector<ComponentCheck> checks;
  std::map<std::string, FamilyErrors> summary() const { return errors_by_family(checks); }
};

struct PublishedReport {
  std::vector<MegatronResult> megatron;
  std::vector<NcclResult> nccl;
  std::vector<ComponentSection> components;
  Json baseline;  // name → {error, breakdown_s} of an earlier report; null when none
  std::string baseline_file;
  Json profiles = Json::array();
  MachineInfo machine;
  std::string created_utc;
  double wall_s = 0;

  double megatron_mean() const;  // over the rows that ran
  double nccl_mean() const;      // over the rows in the mean
  double overall_mean() const;   // both
};

Json published_report_json(const PublishedReport& report);
std::string published_report_markdown(const PublishedReport& report);
std::string published_report_html(const PublishedReport& report);

// "12.35" with `digits` decimals, "n/a" when not finite; "+1.2%" for a fraction.
std::string fixed_or_na(double v, int digits);
std::string signed_percent(double fraction);

}  // namespace stepcast::cli
