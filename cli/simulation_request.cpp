// Simulation requests and outcomes, and running one in a folder; see simulation_request.hpp.
#include "simulation_request.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "inputs.hpp"

namespace stepcast::cli {

namespace fs = std::filesystem;

namespace {

std::string read_whole(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_whole(const fs::path& file, const std::string& text) {
  std::ofstream out(file, std::ios::binary);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + file.string());
}

}  // namespace

Json request_to_json(const SimulationRequest& request) {
  return {{"model_json", request.model_json}, {"plan_json", request.plan_json}, {"arguments", request.arguments}};
}

SimulationRequest request_from_json(const Json& j) {
  return {j.at("model_json").get<std::string>(), j.at("plan_json").get<std::string>(),
          j.at("arguments").get<std::string>()};
}

Json outcome_to_json(const SimulationOutcome& outcome) {
  return {{"exit_code", outcome.exit_code},
          {"signal", outcome.signal},
          {"prediction_json", outcome.prediction_json},
          {"log", outcome.log}};
}

SimulationOutcome outcome_from_json(const Json& j) {
  SimulationOutcome o;
  o.exit_code = j.at("exit_code").get<int>();
  o.signal = j.at("signal").get<int>();
  o.prediction_json = j.at("prediction_json").get<std::string>();
  o.log = j.at("log").get<std::string>();
  return o;
}

std::string prepare_simulation(const SimulationRequest& request, const fs::path& folder,
                               const std::string& executable) {
  fs::create_directories(folder);
  write_whole(folder / "model.json", request.model_json);
  write_whole(folder / "plan.json", request.plan_json);
  // exec: the shell becomes the child, so a signal that kills it shows in the wait status.
  return "exec " + executable + " simulate --model " + shell_quote((folder / "model.json").string()) + " --plan " +
         shell_quote((folder / "plan.json").string()) + " --out " + shell_quote((folder / "out").string()) +
         request.arguments + " >" + shell_quote((folder / "log").string()) + " 2>&1";
}

SimulationOutcome collect_simulation(const fs::path& folder, int wait_status) {
  SimulationOutcome o;
  if (wait_status == -1) {
    o.exit_code = 127;
    o.log = "cannot start /bin/sh for the simulation";
  } else if (WIFSIGNALED(wait_status)) {
    o.signal = WTERMSIG(wait_status);
  } else {
    o.exit_code = WEXITSTATUS(wait_status);
    // A shell that did not exec reports a child killed by signal N as 128 + N.
    if (o.exit_code > 128 && o.exit_code <= 128 + 64) o.signal = o.exit_code - 128, o.exit_code = 0;
  }
  std::error_code ec;
  fs::path prediction = folder / "out" / "prediction.json";
  if (o.ok() && fs::is_regular_file(prediction, ec)) {
    o.prediction_json = read_whole(prediction);
  } else {
    if (o.ok()) o.exit_code = 1;  // it said it succeeded and wrote nothing
    o.log = read_whole(folder / "log");
    if (o.log.empty() && !fs::exists(folder / "log", ec)) o.log = "the simulation left no log in " + folder.string();
  }
  fs::remove_all(folder, ec);
  return o;
}

std::string this_executable() { return "/proc/" + std::to_string(getpid()) + "/exe"; }

fs::path make_temp_folder(const std::string& prefix) {
  std::string dir =
      (fs::temp_directory_path() / ("stepcast-" + prefix + "-" + std::to_string(getpid()) + "-XXXXXX")).string();
  if (!mkdtemp(dir.data())) throw std::runtime_error("cannot create a folder like " + dir);
  return dir;
}

LocalRunner::~LocalRunner() { remove_folder(); }

void LocalRunner::remove_folder() {
  std::error_code ec;
  if (!dir_.empty()) fs::remove_all(dir_, ec);
}

SimulationOutcome LocalRunner::run(const SimulationRequest& request, int /*jobs: the caller's threads*/) {
  std::call_once(made_, [this] { dir_ = make_temp_folder("children"); });
  fs::path folder = dir_ / std::to_string(next_++);
  std::string command = prepare_simulation(request, folder, this_executable());
  return collect_simulation(folder, std::system(command.c_str()));
}

}  // namespace stepcast::cli
