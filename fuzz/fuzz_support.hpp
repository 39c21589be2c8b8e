// What every fuzz target shares: the contract, and the oracles that check more than it.
// The contract (issue 19): for any input a loader returns or throws InputError. The targets catch
// InputError only; anything else escapes — another exception (an invariant's std::logic_error, a
// nlohmann::json exception, std::out_of_range …) reaches libFuzzer as a crash, and the replay
// driver reports it as a finding. Oracles (a written form that does not read back, a lowered
// program that breaks an invariant) throw OracleFailure, a finding of the same kind.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>

#include "errors.hpp"

namespace stepcast::fuzz {

// An oracle of a target does not hold: a bug, reported like any other escaping exception.
class OracleFailure : public std::logic_error {
 public:
  explicit OracleFailure(const std::string& what) : std::logic_error("fuzz oracle: " + what) {}
};

inline std::string input_text(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// With STEPCAST_FUZZ_VERBOSE set, refusals are printed: to see which seeds a loader accepts.
inline void note_refusal(const InputError& e) {
  if (std::getenv("STEPCAST_FUZZ_VERBOSE")) std::fprintf(stderr, "refused: %s\n", e.what());
}

// `load()`'s result, or nothing when it refused the input with InputError (the contract's other
// outcome). Every other exception escapes.
template <class Load>
auto accepted(Load&& load) -> std::optional<decltype(load())> {
  try {
    return load();
  } catch (const InputError& e) {
    note_refusal(e);
    return std::nullopt;
  }
}

// Runs `load()` for its refusal or success alone.
template <class Load>
void return_or_refuse(Load&& load) {
  try {
    load();
  } catch (const InputError& e) {
    note_refusal(e);
  }
}

inline void expect(bool holds, const std::string& what) {
  if (!holds) throw OracleFailure(what);
}

// A shipped file of the source tree (the sweep's relative paths, the plan target's models).
inline std::string source_path(const std::string& relative) {
  return std::string(STEPCAST_SOURCE_DIR) + "/" + relative;
}

}  // namespace stepcast::fuzz
