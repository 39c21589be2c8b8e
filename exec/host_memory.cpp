// host_memory.hpp: reads of /proc/self.
#include "host_memory.hpp"

#include <cstring>
#include <fstream>
#include <string>

#include "errors.hpp"

namespace stepcast {

double resident_bytes(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field, 0) == 0) return std::stod(line.substr(std::strlen(field))) * 1024.0;
  }
  return 0;
}

double exact_anonymous_bytes() {
  std::ifstream rollup("/proc/self/smaps_rollup");
  std::string line;
  while (std::getline(rollup, line)) {
    if (line.rfind("Anonymous:", 0) == 0) return std::stod(line.substr(10)) * 1024.0;
  }
  STEPCAST_CHECK(false, "no Anonymous: line in /proc/self/smaps_rollup");
}

void reset_peak_resident_bytes() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  STEPCAST_CHECK(bool(clear), "cannot reset the resident high-water mark (/proc/self/clear_refs)");
}

}  // namespace stepcast
