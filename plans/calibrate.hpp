// `stepcast calibrate`: a small, named set of profile parameters fitted to a user's measured
// steps, and what it reads.
//  - gemm:     GEMM rates × s (peak fractions, measured GEMM tables, fused attention);
//  - memory:   memory-bound bandwidth × s (fraction, measured bandwidth, memory-bound tables);
//  - links:    collective and point-to-point bandwidth × s (bus fractions, measured link rate,
//              measured collective and p2p times ÷ s);
//  - overhead: seconds added to every kernel (GEMM and other kernels' fixed cost);
//  - jitter:   the device speed spread (variability.device_speed_cv).
// Fractions of peak stay ≤ 1 (a scale that would pass it stops there). The fit minimises the
// squared log error of predicted against measured step time over the runs (Levenberg–Marquardt
// on finite differences, with a weak pull towards the base profile so that parameters the runs
// cannot tell apart stay where the base has them); leave-one-out refits without each run.
//
// Megatron-LM logs: the arguments Megatron prints ("  tensor_model_parallel_size ....... 8",
// between "--- arguments ---" and "--- end of arguments ---") or given on its command line
// (--tensor-model-parallel-size 8), and its "elapsed time per iteration (ms): T" lines; the step
// time is the median of those after the first (warm-up).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "json_input.hpp"
#include "profile.hpp"

namespace stepcast {

struct MegatronLog {
  std::string file;
  Json plan;              // a stepcast plan (tp_size, pp_size, dp_size, micro_batch_size, ...)
  int64_t world_size = 0;
  std::optional<int64_t> seq_length;
  std::vector<double> iteration_times_s;  // every iteration line's time
  double step_time_s = 0;                 // the median after the first
};
MegatronLog parse_megatron_log(const std::string& text, const std::string& file);

enum class CalibrationParam { gemm, memory, links, overhead, jitter };
const char* to_string(CalibrationParam p);
// "gemm,memory,links" → the list; InputError naming what is valid.
std::vector<CalibrationParam> parse_calibration_params(const std::string& list);

struct Calibration {
  double gemm_scale = 1, memory_scale = 1, link_scale = 1;
  double overhead_s = 0;
  double device_speed_cv = 0;
  double get(CalibrationParam p) const;
  void set(CalibrationParam p, double value);
};
// `base` with the calibration applied (as the header lists).
DeviceProfile apply_calibration(DeviceProfile base, const Calibration& c);
// The calibration `base` is (scales 1, no overhead, its own device spread).
Calibration calibration_of(const DeviceProfile& base);

// The largest GEMM and memory scales that keep a GPU profile's measured points within `device`'s
// datasheet (its dense peak, its HBM bandwidth), as simulate checks them (profile.cpp): runs
// faster than the datasheet allows fit to the limit instead of to a profile simulate refuses.
// 10 (the fit's own bound) where nothing limits them.
struct CalibrationLimits {
  double gemm_scale_max = 10, memory_scale_max = 10;
};
CalibrationLimits calibration_limits(const DeviceProfile& base, const DeviceSpec& device);

// Predicted step times under each calibration: result[setting][run], for every run when `only`
// is empty, else for run only[setting] alone (the other entries unused).
using StepEvaluator = std::function<std::vector<std::vector<double>>(
    const std::vector<Calibration>& settings, const std::vector<int64_t>& only)>;

struct CalibrationResult {
  Calibration fitted;
  std::vector<double> before_s, after_s;   // predicted per run with the base and the fit
  std::vector<double> leave_one_out_s;     // run i predicted by the fit without it
  int iterations = 0;
  int evaluations = 0;                     // calibrations evaluated (each: every run)
};
CalibrationResult calibrate(const Calibration& base, const std::vector<CalibrationParam>& params,
                            const std::vector<double>& measured_s, const StepEvaluator& evaluate,
                            const CalibrationLimits& limits = {});

}  // namespace stepcast
