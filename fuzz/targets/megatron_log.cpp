// Fuzz target: Megatron-LM training logs (parse_megatron_log), as `calibrate --megatron-log`
// reads them: the plan an accepted log yields is then read as a plan file would be.
#include "calibrate.hpp"
#include "fuzz_support.hpp"
#include "plan.hpp"

using namespace stepcast;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string file = "fuzz-megatron.log";
  auto log = fuzz::accepted([&] { return parse_megatron_log(fuzz::input_text(data, size), file); });
  if (!log) return 0;
  fuzz::return_or_refuse([&] { parse_plan(log->plan, file); });
  return 0;
}
