// Shared by the files of `stepcast compare` (compare_read.cpp, compare.cpp, compare_json.cpp,
// compare_text.cpp), not part of compare.hpp: the memory classes compared, the note a measured
// peak carries, typed field access whose errors name the file and key, and relative errors.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "json_input.hpp"
#include "step_result.hpp"

namespace stepcast::compare_detail {

inline constexpr const char* kMemoryKeys[] = {"memory_weights_bytes",   "memory_grads_bytes",
                                              "memory_optimizer_bytes", "memory_activations_bytes",
                                              "memory_workspace_bytes", "memory_comm_bytes",
                                              "memory_runtime_bytes",   "peak_bytes"};
// The arena's placement (memory.hpp): compared where both results have it (those written before it
// was modelled do not), after memory_comm_bytes.
inline constexpr const char* kPlacementKey = "memory_placement_bytes";
inline constexpr const char* kMeasuredPeakNote =
    "measured_peak_bytes is the process's anonymous memory after the steps (pages the steps "
    "touched stay resident) above its level before the arena was allocated (after a throwaway "
    "warm-up step, so without the runtime allowance): it is compared with peak_bytes - memory_runtime_bytes";

// json[key], of the type `is_type` checks; InputError naming `file` and `prefix` + key otherwise.
const Json& field(const Json& json, const std::string& key, const std::string& file,
                  const std::string& prefix, bool (Json::*is_type)() const, const char* type);
double number(const Json& json, const std::string& key, const std::string& file,
              const std::string& prefix = "");
int64_t integer(const Json& json, const std::string& key, const std::string& file,
                const std::string& prefix = "");

// error / measured; nullopt when measured is 0.
inline std::optional<double> ratio(double error, double measured) {
  if (measured == 0) return std::nullopt;
  return error / measured;
}

// Where a StepResult came from, for messages: its file, or its role when made in memory.
inline std::string label(const StepResult& r, const char* role) { return r.file.empty() ? role : r.file; }

}  // namespace stepcast::compare_detail
