// Fuzz target: validate sweep files (parse_sweep). The input is read as if it were
// sweeps/fuzz.json of the source tree, so that its relative paths reach the shipped models,
// plans and topologies, which parse_sweep loads and validates point by point.
#include "fuzz_support.hpp"
#include "validate_sweep.hpp"

using namespace stepcast;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string file = fuzz::source_path("sweeps/fuzz.json");
  auto sweep = fuzz::accepted([&] { return parse_sweep(parse_json_text(fuzz::input_text(data, size), file), file); });
  if (!sweep) return 0;
  sweep->max_ranks();
  fuzz::return_or_refuse([&] { check_sweep_fits_cores(*sweep, 2); });
  return 0;
}
