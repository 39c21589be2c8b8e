// Formatting of user-facing input errors and of internal invariant failures.
#include "errors.hpp"

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

}  // namespace stepcast
