// Formatting of user-facing input errors and of internal invariant failures.
#include "errors.hpp"

#include <unistd.h>

#include <cerrno>
#include <sstream>

namespace stepcast {

void throw_input_error(const std::string& file, const std::string& key, const std::string& value,
                       const std::string& why, const std::string& valid) {
  std::ostringstream out;
  out << file << ": key '" << key << "'";
  if (!value.empty()) out << " = " << value;
  out << ": " << why;
  if (!valid.empty()) out << "; valid: " << valid;
  throw InputError(out.str());
}

void fail_invariant(const char* file, int line, const std::string& what) {
  throw std::logic_error(std::string("internal invariant broken at ") + file + ":" +
                         std::to_string(line) + ": " + what);
}

std::string printable_excerpt(const std::string& text, size_t max) {
  std::string out = text.substr(0, max);
  for (char& c : out) {
    unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f) c = '?';
  }
  if (text.size() > max) out += "...";
  return out;
}

void write_stderr_line(const std::string& line) {
  size_t done = 0;
  while (done < line.size()) {
    ssize_t n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += size_t(n);
  }
}

}  // namespace stepcast
