// `stepcast calibrate`: fits a profile's named parameters (plans/calibrate.hpp) to measured steps —
// stepcast measurement.json files and Megatron-LM training logs — simulating each run in child
// processes, and writes the calibrated profile with its leave-one-out error on those runs.
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <mutex>
#include <sstream>

#include "calibrate.hpp"
#include "child_simulate.hpp"
#include "distributed_simulations.hpp"
#include "commands.hpp"
#include "errors.hpp"
#include "inputs.hpp"
#include "units.hpp"

namespace stepcast::cli {

namespace fs = std::filesystem;

namespace {

// One measured run: what to simulate and its measured step time.
struct Run {
  std::string name;
  ModelConfig model;
  Topology topology;
  Plan plan;
  double measured_s = 0;
};


void write_json(const fs::path& path, const Json& json) {
  std::ofstream out(path);
  out << json.dump(2) << "\n";
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

// A measurement.json (stepcast run): its resolved inputs, written out as files to simulate.
Run run_from_measurement(const std::string& file, const fs::path& dir) {
  Json m = load_json_file(file);
  auto need = [&](const Json& j, const char* key, const std::string& where) -> const Json& {
    if (!j.is_object() || !j.contains(key)) {
      throw InputError(file + ": key '" + where + key + "' is missing; valid: a measurement.json of `stepcast run`");
    }
    return j.at(key);
  };
  if (need(m, "source", "") != "executor") {
    throw InputError(file + ": key 'source' = " + m["source"].dump() + ": valid: \"executor\" (a measurement, not a prediction)");
  }
  const Json& step = need(m, "step_time_s", "");
  if (!step.is_number() || !(step.get<double>() > 0)) {
    throw InputError(file + ": key 'step_time_s' = " + step.dump() + ": valid: a positive number");
  }
  const Json& inputs = need(m, "inputs", "");
  fs::create_directories(dir);
  Json topology = need(inputs, "topology", "inputs.");
  topology.erase("profile");
  write_json(dir / "model.json", need(inputs, "model", "inputs."));
  write_json(dir / "topology.json", topology);
  write_json(dir / "plan.json", need(inputs, "plan", "inputs."));
  Run run;
  run.name = file;
  run.model = load_model((dir / "model.json").string());
  run.topology = load_topology((dir / "topology.json").string());
  run.plan = load_plan((dir / "plan.json").string());
  validate_plan(run.plan, run.model, run.topology);
  run.measured_s = step.get<double>();
  return run;
}

Run run_from_megatron(const std::string& file, const std::string& model_file, const std::string& topology_file,
                      const fs::path& dir) {
  MegatronLog log = parse_megatron_log(read_text_file(file), file);
  Json model = load_json_file(model_file);
  if (log.seq_length) model["seq_length"] = *log.seq_length;
  Topology topology = load_topology(topology_file);
  int64_t per_node = topology.node.devices_per_node;
  if (log.world_size % per_node != 0) {
    throw InputError(file + ": world_size " + std::to_string(log.world_size) + " is not a whole number of " +
                     topology_file + "'s nodes (" + std::to_string(per_node) + " devices each); valid: a topology "
                     "whose node size divides the job");
  }
  fs::create_directories(dir);
  write_json(dir / "model.json", model);
  write_json(dir / "plan.json", log.plan);
  Run run;
  run.name = file;
  run.model = load_model((dir / "model.json").string());
  run.topology = load_topology(topology_file, int(log.world_size / per_node));
  run.plan = load_plan((dir / "plan.json").string());
  validate_plan(run.plan, run.model, run.topology);
  run.measured_s = log.step_time_s;
  return run;
}

std::string percent(double x) {
  std::ostringstream out;
  out << std::showpos << std::fixed << std::setprecision(1) << 100 * x << "%";
  return out.str();
}

}  // namespace

int run_calibrate(int argc, char** argv) {
  po::options_description options("stepcast calibrate options");
  options.add_options()
      ("topology", po::value<std::string>()->required(),
       "the cluster the runs ran on (its device's profile is the base unless --base)")
      ("base", po::value<std::string>(), "the profile to calibrate (default: the topology's)")
      ("measurement", po::value<std::vector<std::string>>()->multitoken(),
       "measurement.json files of `stepcast run`")
      ("megatron-log", po::value<std::vector<std::string>>()->multitoken(),
       "Megatron-LM training logs (arguments and 'elapsed time per iteration (ms)' lines)")
      ("model", po::value<std::string>(), "the model the Megatron-LM logs trained (models/*.json)")
      ("params", po::value<std::string>()->default_value("gemm,memory,links"),
       "what to fit: any of gemm, memory, links, overhead, jitter")
      ("jobs", po::value<int>()->default_value(2), "concurrent simulations")
      ("sim-mode", po::value<std::string>()->default_value("fast"), "simulate's --mode: fast or approx")
      ("out", po::value<std::string>()->required(), "write DIR/profile.json and DIR/calibrate.json");
  auto vm = parse_command_line(
      argc, argv, options,
      "usage: stepcast calibrate --topology T [--base PROFILE] [--measurement M.json ...]\n"
      "                          [--megatron-log LOG ... --model M] [--params gemm,memory,links]\n"
      "                          [--jobs J] [--sim-mode fast|approx] --out DIR\n"
      "Fits a small, named set of profile parameters to measured steps: gemm (GEMM rate scale),\n"
      "memory (memory-bound bandwidth scale), links (collective and p2p bandwidth scale),\n"
      "overhead (seconds added to every kernel), jitter (device speed spread). Each run is\n"
      "simulated with the profile; the fit minimises the squared log error of the step times\n"
      "(Levenberg-Marquardt; parameters the runs cannot tell apart stay at the base). Prints each\n"
      "run's error before and after, and its leave-one-out error (the run predicted by the fit to\n"
      "the others). Writes DIR/profile.json (the calibrated profile) and DIR/calibrate.json.");
  if (!vm) return 0;
  if (launched_job_size() != 1) {
    throw InputError("command line: calibrate under an MPI launcher: its profiles live in its output folder, so its "
                     "simulations stay on one machine; valid: start it without mpirun or srun");
  }
  claim_out_option(*vm, "calibrate");
  std::vector<CalibrationParam> params = parse_calibration_params((*vm)["params"].as<std::string>());
  int jobs = (*vm)["jobs"].as<int>();
  std::string mode = (*vm)["sim-mode"].as<std::string>();
  if (jobs < 1) throw InputError("command line: --jobs: valid: >= 1");
  if (mode != "fast" && mode != "approx") throw InputError("command line: --sim-mode '" + mode + "': valid: fast, approx");
  std::string topology_file = (*vm)["topology"].as<std::string>();
  Topology topology = load_topology(topology_file);
  std::optional<std::string> base_file;
  if (vm->count("base")) base_file = (*vm)["base"].as<std::string>();
  ProfileChoice choice = choose_profile(base_file, topology);
  if (choice.profile.is_roofline) {
    throw InputError("command line: calibrate needs a base profile (--base, or a topology that names one); " +
                     (choice.warning.empty() ? std::string("the roofline has no figures to scale") : choice.warning));
  }
  const DeviceProfile base = choice.profile;
  std::string out = (*vm)["out"].as<std::string>();
  fs::create_directories(out);
  fs::path work = fs::path(out) / "runs";

  std::vector<Run> runs;
  if (vm->count("measurement")) {
    for (const std::string& f : (*vm)["measurement"].as<std::vector<std::string>>()) {
      runs.push_back(run_from_measurement(f, work / std::to_string(runs.size())));
    }
  }
  if (vm->count("megatron-log")) {
    if (!vm->count("model")) throw InputError("command line: --megatron-log needs --model M (the model the logs trained)");
    for (const std::string& f : (*vm)["megatron-log"].as<std::vector<std::string>>()) {
      runs.push_back(run_from_megatron(f, (*vm)["model"].as<std::string>(), topology_file, work / std::to_string(runs.size())));
    }
  }
  if (runs.empty()) throw InputError("command line: no runs; valid: --measurement M.json ... and/or --megatron-log LOG ...");
  for (const Run& r : runs) check_profile_matches(base, r.topology);
  std::cout << "stepcast calibrate: " << runs.size() << (runs.size() == 1 ? " run" : " runs") << ", base "
            << choice.describe() << ", fitting";
  for (CalibrationParam p : params) std::cout << " " << to_string(p);
  std::cout << "\n";

  std::atomic<int64_t> profiles_written{0};
  int64_t simulations = 0;
  StepEvaluator evaluate = [&](const std::vector<Calibration>& settings, const std::vector<int64_t>& only) {
    struct Task {
      size_t setting, run;
    };
    std::vector<Task> tasks;
    std::vector<std::string> profile_files;
    for (size_t s = 0; s < settings.size(); ++s) {
      fs::path file = fs::path(out) / "runs" / ("profile-" + std::to_string(profiles_written++) + ".json");
      DeviceProfile p = apply_calibration(base, settings[s]);
      write_json(file, profile_to_json(p));
      profile_files.push_back(file.string());
      for (size_t r = 0; r < runs.size(); ++r) {
        if (only.empty() || only[s] == int64_t(r)) tasks.push_back({s, r});
      }
    }
    std::vector<std::vector<double>> result(settings.size(), std::vector<double>(runs.size(), std::nan("")));
    std::mutex mutex;
    std::string failure;
    LocalRunner local;  // children of this process: calibrate does not spread over an MPI job
    parallel_for(int64_t(tasks.size()), jobs, [&](int64_t i) {
      const Task& t = tasks[size_t(i)];
      try {
        ChildSimulator child(runs[t.run].model, " --profile " + shell_quote(profile_files[t.setting]), local, jobs, mode);
        double step = child.simulate("run", runs[t.run].plan, runs[t.run].topology).step_time_s;
        std::lock_guard<std::mutex> lock(mutex);
        result[t.setting][t.run] = step;
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mutex);
        failure = e.what();
      }
    });
    if (!failure.empty()) throw std::runtime_error("a simulation failed: " + failure);
    simulations += int64_t(tasks.size());
    for (const std::string& f : profile_files) fs::remove(f);
    return result;
  };
  std::vector<double> measured;
  for (const Run& r : runs) measured.push_back(r.measured_s);
  auto start = std::chrono::steady_clock::now();
  // Within the datasheet of every run's device (simulate refuses a profile beyond it).
  CalibrationLimits limits = calibration_limits(base, topology.node.device);
  for (const Run& r : runs) {
    CalibrationLimits l = calibration_limits(base, r.topology.node.device);
    limits.gemm_scale_max = std::min(limits.gemm_scale_max, l.gemm_scale_max);
    limits.memory_scale_max = std::min(limits.memory_scale_max, l.memory_scale_max);
  }
  CalibrationResult result = calibrate(calibration_of(base), params, measured, evaluate, limits);
  auto at_limit = [&](double scale, double limit) { return limit < 10 && scale >= limit * (1 - 1e-6); };
  if (at_limit(result.fitted.gemm_scale, limits.gemm_scale_max)) {
    std::cout << "the GEMM scale stops at " << limits.gemm_scale_max
              << ": beyond it a measured GEMM or attention point would beat the device's datasheet peak "
                 "(the runs are faster than the profile's figures allow)\n";
  }
  if (at_limit(result.fitted.memory_scale, limits.memory_scale_max)) {
    std::cout << "the memory scale stops at " << limits.memory_scale_max
              << ": beyond it a measured memory-bound point would beat the device's HBM bandwidth\n";
  }
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::cout << std::left << std::setw(44) << "run" << std::right << std::setw(14) << "measured s"
            << std::setw(12) << "before" << std::setw(12) << "after" << std::setw(16) << "leave-one-out\n";
  Json rows = Json::array();
  std::vector<double> loo_errors, after_errors;
  for (size_t i = 0; i < runs.size(); ++i) {
    double before = result.before_s[i] / measured[i] - 1, after = result.after_s[i] / measured[i] - 1;
    std::optional<double> loo;
    if (!result.leave_one_out_s.empty()) loo = result.leave_one_out_s[i] / measured[i] - 1;
    std::string name = runs[i].name.size() > 42 ? "..." + runs[i].name.substr(runs[i].name.size() - 39) : runs[i].name;
    std::cout << std::left << std::setw(44) << name << std::right << std::setw(14) << std::setprecision(6)
              << measured[i] << std::setw(12) << percent(before) << std::setw(12) << percent(after)
              << std::setw(15) << (loo ? percent(*loo) : "n/a") << "\n";
    after_errors.push_back(std::abs(after));
    if (loo) loo_errors.push_back(std::abs(*loo));
    rows.push_back({{"run", runs[i].name},
                    {"plan", plan_to_json(runs[i].plan)},
                    {"nodes", runs[i].topology.num_nodes},
                    {"measured_step_time_s", measured[i]},
                    {"predicted_before_s", result.before_s[i]},
                    {"predicted_after_s", result.after_s[i]},
                    {"error_before", before},
                    {"error_after", after},
                    {"leave_one_out_error", loo ? Json(*loo) : Json(nullptr)}});
  }
  auto mean = [](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0.0 : s / double(v.size());
  };
  Json fitted = Json::object();
  for (CalibrationParam p : params) fitted[to_string(p)] = result.fitted.get(p);
  std::cout << "fitted:";
  for (CalibrationParam p : params) std::cout << " " << to_string(p) << " " << result.fitted.get(p);
  std::cout << "\nmean |error| after " << std::fixed << std::setprecision(2) << 100 * mean(after_errors) << "%";
  if (!loo_errors.empty()) std::cout << ", leave-one-out " << 100 * mean(loo_errors) << "%";
  std::cout << std::defaultfloat << " (" << simulations << " simulations in " << std::setprecision(3) << wall
            << " s)\n";

  DeviceProfile calibrated = apply_calibration(base, result.fitted);
  calibrated.name = base.name + "-calibrated";
  calibrated.file = (fs::path(out) / "profile.json").string();
  std::ostringstream notes;
  notes << "Calibrated by `stepcast calibrate` from " << base.file << " on " << runs.size() << " measured runs ("
        << "calibrate.json beside it):";
  for (CalibrationParam p : params) notes << " " << to_string(p) << " " << result.fitted.get(p);
  notes << ". " << base.notes;
  calibrated.notes = notes.str();
  write_output_file(out, "profile.json", profile_to_json(calibrated).dump(1) + "\n");
  Json report = envelope_head("calibrate");
  report["base_profile"] = base.file;
  report["params"] = fitted;
  report["runs"] = rows;
  report["mean_abs_error_after"] = mean(after_errors);
  report["mean_abs_leave_one_out_error"] = loo_errors.empty() ? Json(nullptr) : Json(mean(loo_errors));
  report["iterations"] = result.iterations;
  report["simulations"] = simulations;
  write_output_file(out, "calibrate.json", report.dump(2) + "\n");
  fs::remove_all(work);
  std::cout << "wrote " << out << "/profile.json and " << out << "/calibrate.json\n";
  return 0;
}

}  // namespace stepcast::cli
