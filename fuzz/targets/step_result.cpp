// Fuzz target: prediction.json and measurement.json as compare reads them
// (step_result_from_json). An accepted StepResult must read back from step_result_to_json.
#include "compare.hpp"
#include "fuzz_support.hpp"

using namespace stepcast;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string file = "fuzz-result.json";
  auto result = fuzz::accepted(
      [&] { return step_result_from_json(parse_json_text(fuzz::input_text(data, size), file), file); });
  if (!result) return 0;
  Json written = step_result_to_json(*result);
  fuzz::expect(step_result_to_json(step_result_from_json(written, file)) == written,
               "step_result_to_json does not read back the same");
  return 0;
}
