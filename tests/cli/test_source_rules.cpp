// Rules the sources keep that no compiler checks: every MPI call is checked (STEPCAST_MPI,
// exec/mpi_check.hpp) and bad input is one error type (InputError, not std::invalid_argument).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kProductionFolders = {"common", "topologies", "plans", "sim", "exec", "reports", "cli"};

// "exec/watchdog.cpp:87: MPI_Isend(..." for each line of the production sources matching `rule`
// and none of `allowed`.
std::vector<std::string> lines_matching(const std::regex& rule, const std::vector<std::regex>& allowed) {
  std::vector<std::string> out;
  for (const std::string& folder : kProductionFolders) {
    for (const auto& entry : fs::recursive_directory_iterator(fs::path(STEPCAST_SOURCE_DIR) / folder)) {
      std::string extension = entry.path().extension().string();
      if (extension != ".cpp" && extension != ".hpp" && extension != ".cu" && extension != ".cuh") continue;
      std::ifstream in(entry.path());
      int number = 0;
      for (std::string line; std::getline(in, line);) {
        ++number;
        if (!std::regex_search(line, rule)) continue;
        bool ok = false;
        for (const std::regex& a : allowed) ok = ok || std::regex_search(line, a);
        if (!ok) {
          out.push_back(fs::relative(entry.path(), STEPCAST_SOURCE_DIR).string() + ":" + std::to_string(number) + ": " +
                        line);
        }
      }
    }
  }
  return out;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& line : lines) out += line + "\n";
  return out;
}

}  // namespace

TEST_CASE("source rules: every MPI call's result is checked", "[source]") {
  // A statement that starts with an MPI call (its result dropped).
  std::regex unchecked(R"(^\s*(?:if \(.*\)\s*)?MPI_[A-Z][a-z_]*\()");
  // The calls that return nothing to check, and those on the way out of an error already named.
  std::vector<std::regex> allowed = {std::regex(R"(MPI_(Wtime|Abort|Init|Finalize|Initialized|Error_string)\()"),
                                     std::regex(R"(^\s*//)"), std::regex(R"(// unchecked: )")};
  std::vector<std::string> found = lines_matching(unchecked, allowed);
  INFO("wrap each in STEPCAST_MPI(...) (exec/mpi_check.hpp):\n" + joined(found));
  CHECK(found.empty());
}

TEST_CASE("source rules: bad input is an InputError, not std::invalid_argument", "[source]") {
  std::vector<std::string> found = lines_matching(std::regex(R"(throw std::invalid_argument)"), {});
  INFO(joined(found));
  CHECK(found.empty());
}
