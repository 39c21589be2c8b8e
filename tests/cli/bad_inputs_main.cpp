// The bad-input table (tests/cli/bad_inputs.json) run case by case: each case writes its input files
// (a shipped file with text replaced, or text of its own), runs one stepcast command line and
// checks the exit code, the message fragments it must print and the ones it must not (a crash,
// an uncaught exception, an internal error). ctest runs one test per case ("bad input: NAME");
//   stepcast_bad_inputs TABLE NAME      runs one case (exit 0: as expected)
//   stepcast_bad_inputs TABLE --all     runs every case and prints the summary (cases, exit codes)
//   stepcast_bad_inputs TABLE --show N  runs case N and prints its output whatever the result
//
// Placeholders in `setup`, `command` and `expect`: {stepcast} the binary ({stepcast_with_faults}
// the fault tests' build of it), {mpirun} the repository's
// mpirun wrapper, {src} the repository, {tmp} the case's own empty folder, {NAME} the path of the
// case's file NAME. In file text, {deep:N} stands for N '[' then N ']', {byte:HH} for the byte
// 0xHH and {src} for the repository.
#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "errors.hpp"
#include "json_input.hpp"
#include "test_support.hpp"

using namespace stepcast;
using namespace stepcast::test;

namespace {

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  if (from.empty()) return text;
  size_t at = 0;
  while ((at = text.find(from, at)) != std::string::npos) {
    text.replace(at, from.size(), to);
    at += to.size();
  }
  return text;
}

std::string expand_deep(std::string text) {
  size_t at;
  while ((at = text.find("{byte:")) != std::string::npos) {
    text.replace(at, 9, 1, char(std::stoi(text.substr(at + 6, 2), nullptr, 16)));
  }
  while ((at = text.find("{deep:")) != std::string::npos) {
    size_t end = text.find('}', at);
    int64_t n = std::stoll(text.substr(at + 6, end - at - 6));
    text.replace(at, end - at + 1, std::string(size_t(n), '[') + std::string(size_t(n), ']'));
  }
  return text;
}

struct Outcome {
  bool ok = true;
  int exit_code = 0;
  std::string output;
  std::vector<std::string> problems;
};

Outcome run_case(const Json& c, const std::string& table_dir) {
  (void)table_dir;
  const std::string name = c.at("name").get<std::string>();
  std::string tmp = std::filesystem::temp_directory_path().string() + "/stepcast-bad-input/" +
                    std::to_string(std::hash<std::string>{}(name));
  std::filesystem::remove_all(tmp);
  std::filesystem::create_directories(tmp);
  std::map<std::string, std::string> vars = {{"{stepcast}", STEPCAST_BINARY},
                                             {"{stepcast_with_faults}", STEPCAST_FAULT_BINARY},
                                             {"{mpirun}", source_path("scripts/mpirun")},
                                             {"{src}", STEPCAST_SOURCE_DIR},
                                             {"{tmp}", tmp}};
  auto expand = [&](std::string s) {
    for (const auto& [k, v] : vars) s = replace_all(s, k, v);
    return s;
  };
  if (c.contains("files")) {
    for (const auto& [file, spec] : c.at("files").items()) {
      std::string text;
      std::string file_name = spec.value("name", file + ".json");
      if (spec.contains("from")) {
        text = read_text_file(source_path(spec.at("from").get<std::string>()));
        for (const Json& r : spec.value("replace", Json::array())) {
          std::string from = r.at(0).get<std::string>();
          if (text.find(from) == std::string::npos) {
            throw std::runtime_error("case '" + name + "': file " + file + ": '" + from +
                                     "' is not in " + spec.at("from").get<std::string>());
          }
          text = replace_all(text, from, expand_deep(replace_all(r.at(1).get<std::string>(), "{src}", STEPCAST_SOURCE_DIR)));
        }
      } else {
        text = expand_deep(replace_all(spec.at("text").get<std::string>(), "{src}", STEPCAST_SOURCE_DIR));
      }
      std::string path = tmp + "/" + file_name;
      FILE* f = std::fopen(path.c_str(), "wb");
      std::fwrite(text.data(), 1, text.size(), f);
      std::fclose(f);
      vars["{" + file + "}"] = path;
    }
  }
  Outcome out;
  if (c.contains("setup")) {
    CommandResult setup = run_shell("(cd " + tmp + " && " + expand(c.at("setup").get<std::string>()) + ")");
    if (setup.exit_code != 0) {
      out.ok = false;
      out.problems.push_back("setup failed (exit " + std::to_string(setup.exit_code) + "): " + setup.output);
      return out;
    }
  }
  // `env` runs the command line, whose leading VAR=value words set its environment.
  CommandResult r =
      run_shell("(cd " + tmp + " && timeout 120 env " + expand(c.at("command").get<std::string>()) + ")");
  out.exit_code = r.exit_code;
  out.output = r.output;
  int expected = c.at("exit").get<int>();
  if (r.exit_code != expected) {
    out.problems.push_back("exit code " + std::to_string(r.exit_code) + ", expected " + std::to_string(expected) +
                           (r.exit_code == 124 ? " (timed out after 120 s: a hang)" : ""));
  }
  for (const Json& e : c.value("expect", Json::array())) {
    std::string fragment = expand(e.get<std::string>());
    if (r.output.find(fragment) == std::string::npos) out.problems.push_back("missing: " + fragment);
  }
  std::vector<std::string> forbidden = {"internal error", "terminate called", "Segmentation fault",
                                        "what():", "Assertion", "core dumped"};
  for (const Json& e : c.value("forbid", Json::array())) forbidden.push_back(e.get<std::string>());
  for (const std::string& f : forbidden) {
    if (r.output.find(f) != std::string::npos) out.problems.push_back("printed: " + f);
  }
  out.ok = out.problems.empty();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::cerr << "usage: stepcast_bad_inputs TABLE NAME | --all | --show NAME\n";
    return 2;
  }
  try {
    std::string table_file = argv[1];
    Json table = load_json_file(table_file);
    std::string table_dir = std::filesystem::path(table_file).parent_path().string();
    std::string which = argv[2];
    if (which == "--all") {
      std::map<int, int> by_exit;
      int failed = 0;
      for (const Json& c : table.at("cases")) {
        Outcome o = run_case(c, table_dir);
        ++by_exit[c.at("exit").get<int>()];
        if (!o.ok) {
          ++failed;
          std::cout << "FAILED " << c.at("name").get<std::string>() << ":";
          for (const auto& p : o.problems) std::cout << " [" << p << "]";
          std::cout << "\n";
        }
      }
      std::cout << table.at("cases").size() << " cases:";
      for (const auto& [code, n] : by_exit) std::cout << " " << n << " exit " << code << ";";
      std::cout << " " << failed << " not as expected\n";
      return failed ? 1 : 0;
    }
    std::string name = argc == 4 ? argv[3] : which;
    for (const Json& c : table.at("cases")) {
      if (c.at("name").get<std::string>() != name) continue;
      Outcome o = run_case(c, table_dir);
      if (!o.ok || which == "--show") {
        std::cout << "case: " << name << "\nexit code: " << o.exit_code << "\noutput:\n" << o.output << "\n";
        for (const auto& p : o.problems) std::cout << "PROBLEM: " << p << "\n";
      }
      return o.ok ? 0 : 1;
    }
    std::cerr << "no case named '" << name << "' in " << table_file << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "stepcast_bad_inputs: " << e.what() << "\n";
    return 2;
  }
}
