// One `stepcast simulate` child process as data: the request (the model's and the plan's JSON
// text and the rest of its command line), its outcome (prediction.json's text, or the child's
// log), and running it in a folder of this machine. ChildSimulator makes the requests; a
// SimulationRunner says where they run: here (LocalRunner), or on the ranks of an MPI job
// (distributed_simulations.hpp), which run the same child on the same text, so the same figures.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <string>

#include "json_input.hpp"

namespace stepcast::cli {

struct SimulationRequest {
  std::string model_json;  // the model file's text (a model without a file: its config)
  std::string plan_json;
  // The rest of simulate's command line, shell-quoted: " [--seq-length N] --topology ABS_PATH
  // --nodes N --mode M --no-scaling --no-records --profile ARG". Paths in it must read the same
  // on every rank of a job (a shared file system or the same install).
  std::string arguments;
};

struct SimulationOutcome {
  int exit_code = 0;            // the child's exit status; 0 when a signal killed it
  int signal = 0;               // the signal that killed the child, 0 when none did
  std::string prediction_json;  // prediction.json's text when it succeeded
  std::string log;              // the child's stdout and stderr otherwise
  bool ok() const { return exit_code == 0 && signal == 0; }
};

Json request_to_json(const SimulationRequest& request);
SimulationRequest request_from_json(const Json& j);
Json outcome_to_json(const SimulationOutcome& outcome);
SimulationOutcome outcome_from_json(const Json& j);

// Writes the request's model.json and plan.json into `folder` (created) and returns the child's
// /bin/sh command line: `exec EXECUTABLE simulate ... --out FOLDER/out >FOLDER/log 2>&1`.
std::string prepare_simulation(const SimulationRequest& request, const std::filesystem::path& folder,
                               const std::string& executable);
// What the child left in `folder`, given its wait status (std::system's or waitpid's); removes
// the folder.
SimulationOutcome collect_simulation(const std::filesystem::path& folder, int wait_status);
// This process's executable as /proc/PID/exe: it still runs this binary if a rebuild replaced the
// file meanwhile.
std::string this_executable();

// Where a command's simulations run. `jobs` is the command's --jobs: each rank runs at most that
// many at once.
class SimulationRunner {
 public:
  virtual ~SimulationRunner() = default;
  // The ranks the simulations spread over (1: this process alone).
  virtual int ranks() const = 0;
  // How many threads a command should submit simulations from to keep every rank busy.
  virtual int threads(int jobs) const = 0;
  // Runs one simulation and returns its outcome; safe to call from several threads.
  virtual SimulationOutcome run(const SimulationRequest& request, int jobs) = 0;
};

// Every simulation a child of this process, in a temporary folder of the runner's (made at the
// first simulation, removed with the runner): DIR/K for the K-th, counted from 0.
class LocalRunner : public SimulationRunner {
 public:
  LocalRunner() = default;
  ~LocalRunner() override;
  LocalRunner(const LocalRunner&) = delete;
  LocalRunner& operator=(const LocalRunner&) = delete;
  int ranks() const override { return 1; }
  int threads(int jobs) const override { return jobs; }
  SimulationOutcome run(const SimulationRequest& request, int jobs) override;
  // Removes the folder now (a job about to be aborted runs no destructor); no simulation may run.
  void remove_folder();

 private:
  std::once_flag made_;
  std::filesystem::path dir_;
  std::atomic<int64_t> next_{0};
};

// A fresh temporary folder "stepcast-PREFIX-PID-XXXXXX"; std::runtime_error when it cannot be made.
std::filesystem::path make_temp_folder(const std::string& prefix);

}  // namespace stepcast::cli
