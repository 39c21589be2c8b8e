// Errors stepcast reports to its users: bad input (exit code 2) and broken internal invariants.
// Bad input names the file, the key, the value and what would be valid; nothing is defaulted
// silently. Invariant failures abort with file:line, they are bugs, not user errors.
#pragma once

#include <stdexcept>
#include <string>

namespace stepcast {

// Thrown for anything the user can fix: malformed files, invalid values, infeasible plans.
// The command-line front end prints what() and exits with kInputErrorExitCode.
class InputError : public std::runtime_error {
 public:
  explicit InputError(const std::string& message) : std::runtime_error(message) {}
};

inline constexpr int kInputErrorExitCode = 2;

// "FILE: key 'KEY' = VALUE: WHY; valid: VALID". `value` is already rendered (JSON text).
[[noreturn]] void throw_input_error(const std::string& file, const std::string& key,
                                    const std::string& value, const std::string& why,
                                    const std::string& valid);

[[noreturn]] void fail_invariant(const char* file, int line, const std::string& what);

// At most `max` bytes of `text` for a message, control and non-ASCII bytes shown as '?'.
std::string printable_excerpt(const std::string& text, size_t max = 80);

// Writes `line` (ending in a newline) to stderr in one write(2): lines of processes sharing the
// stream (MPI ranks) never interleave.
void write_stderr_line(const std::string& line);

}  // namespace stepcast

// Checks an internal invariant; on failure aborts the command with file:line (a bug in stepcast).
#define STEPCAST_CHECK(cond, what)                                     \
  do {                                                                 \
    if (!(cond)) ::stepcast::fail_invariant(__FILE__, __LINE__, what); \
  } while (0)
