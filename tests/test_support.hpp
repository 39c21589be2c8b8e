// Helpers shared by the tests: paths to shipped inputs and running the stepcast binary.
#pragma once

#include <string>

#include "json_input.hpp"

namespace stepcast::test {

inline std::string source_path(const std::string& relative) {
  return std::string(STEPCAST_SOURCE_DIR) + "/" + relative;
}

// " --model <repo>/models/NAME.json" and the like, for command lines.
inline std::string model_arg(const std::string& name) {
  return " --model " + source_path("models/" + name + ".json");
}
inline std::string topology_arg(const std::string& name) {
  return " --topology " + source_path("topologies/" + name + ".json");
}
inline std::string plan_arg(const std::string& name) {
  return " --plan " + source_path("examples/" + name + ".json");
}

struct CommandResult {
  int exit_code = 0;
  std::string output;  // stdout and stderr together
};

// A `stepcast run` command line's result and, when it succeeded, the measurement.json it wrote
// in `out` (run_measured).
struct RunResult {
  int exit_code = 0;
  std::string output;
  Json measurement;
  std::string out;  // the --out folder (measurement.json, trace.json, moe-routing.json)
};
RunResult run_measured(const std::string& command, const std::string& out);

// Runs a shell command line; its exit code and output (stdout and stderr together).
CommandResult run_shell(const std::string& command);
// Runs `build/stepcast ARGS` through the shell and captures its output.
CommandResult run_stepcast(const std::string& args);

// `command` with the stepcast binary replaced by the fault tests' build of it
// (stepcast-with-faults, exec/fault_main.cpp: faults from STEPCAST_TEST_HANG, _DIE, _STOP).
std::string with_faults(const std::string& command);

// An empty directory for --out (not created), under the test's temporary directory.
std::string fresh_dir(const std::string& name);
// A JSON file, parsed strictly (InputError when it is missing or malformed).
Json read_json(const std::string& path);

// Writes `text` to a fresh temporary file named `name` and returns its path.
std::string write_temp_file(const std::string& name, const std::string& text);

}  // namespace stepcast::test
