// Replays fuzz inputs through a target without libFuzzer: the seed corpus and the crash
// reproducers, as ctest tests built with the project's normal compiler. Runs the target on every
// file of the folders and files given (folders recursively; names starting with '.' and README.md
// skipped), naming each, and reports each input that lets an exception escape: a finding. Exit
// status 1 when any input did; a crash ends the run after the name of its input. Crashes that
// only a sanitizer sees need the libFuzzer build (scripts/fuzz.sh).
#include <cxxabi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <typeinfo>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace fs = std::filesystem;

namespace {

bool is_input(const fs::path& path) {
  std::string name = path.filename().string();
  return fs::is_regular_file(path) && !name.empty() && name[0] != '.' && name != "README.md";
}

std::vector<fs::path> inputs_of(const std::vector<std::string>& arguments) {
  std::vector<fs::path> out;
  for (const std::string& argument : arguments) {
    if (fs::is_directory(argument)) {
      for (const auto& entry : fs::recursive_directory_iterator(argument)) {
        if (is_input(entry.path())) out.push_back(entry.path());
      }
    } else if (fs::is_regular_file(argument)) {
      out.push_back(argument);
    } else {
      std::fprintf(stderr, "fuzz replay: %s: no such file or folder\n", argument.c_str());
      std::exit(2);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// "std::out_of_range" rather than the mangled "St12out_of_range".
std::string type_name(const std::exception& e) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(typeid(e).name(), nullptr, nullptr, &status);
  std::string out = status == 0 && demangled ? demangled : typeid(e).name();
  std::free(demangled);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<fs::path> inputs = inputs_of(std::vector<std::string>(argv + 1, argv + argc));
  int findings = 0;
  for (const fs::path& path : inputs) {
    // Named first: a crash (a signal, no exception) ends the process right after its input's name.
    std::printf("%s\n", path.c_str());
    std::fflush(stdout);
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    try {
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    } catch (const std::exception& e) {
      ++findings;
      std::printf("FINDING %s: %s: %s\n", path.c_str(), type_name(e).c_str(), e.what());
    } catch (...) {
      ++findings;
      std::printf("FINDING %s: an exception not derived from std::exception\n", path.c_str());
    }
  }
  std::printf("fuzz replay: %zu inputs, %d findings\n", inputs.size(), findings);
  return findings == 0 ? 0 : 1;
}
