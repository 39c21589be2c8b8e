// Helpers shared by the tests; see test_support.hpp.
#include "test_support.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace stepcast::test {

CommandResult run_shell(const std::string& command) {
  std::string line = command + " 2>&1";
  FILE* pipe = popen(line.c_str(), "r");
  if (!pipe) throw std::runtime_error("popen failed: " + line);
  CommandResult result;
  std::array<char, 4096> buffer{};
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) result.output.append(buffer.data(), n);
  int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

CommandResult run_stepcast(const std::string& args) {
  return run_shell(std::string(STEPCAST_BINARY) + " " + args);
}

std::string fresh_dir(const std::string& name) {
  auto temp = std::filesystem::path(write_temp_file(name + ".anchor", "")).parent_path();
  auto dir = temp / name;
  std::filesystem::remove_all(dir);
  return dir.string();
}

Json read_json(const std::string& path) { return parse_json_text(read_text_file(path), path); }

std::string with_faults(const std::string& command) {
  std::string out = command;
  const std::string binary = STEPCAST_BINARY;
  for (size_t at = out.find(binary); at != std::string::npos; at = out.find(binary, at + 1)) {
    out.replace(at, binary.size(), STEPCAST_FAULT_BINARY);
  }
  return out;
}

std::string write_temp_file(const std::string& name, const std::string& text) {
  auto dir = std::filesystem::temp_directory_path() /
             ("stepcast-test-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  auto path = dir / name;
  std::ofstream(path) << text;
  return path.string();
}

RunResult run_measured(const std::string& command, const std::string& out) {
  RunResult result;
  CommandResult ran = run_shell(command);
  result.output = ran.output;
  result.exit_code = ran.exit_code;
  result.out = out;
  if (result.exit_code == 0) result.measurement = load_json_file(out + "/measurement.json");
  return result;
}

}  // namespace stepcast::test
