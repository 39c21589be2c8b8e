// Fuzz target: model files (parse_model). An accepted model must also give its parameter and
// FLOP counts (what every command prints) and read back from model_to_json as the same model
// (outputs carry it as resolved input, and compare lowers from it again).
#include "fuzz_support.hpp"
#include "model.hpp"

using namespace stepcast;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string file = "fuzz-model.json";
  auto model = fuzz::accepted([&] { return parse_model(parse_json_text(fuzz::input_text(data, size), file), file); });
  if (!model) return 0;
  parameter_count(*model);
  layer_parameter_count(*model);
  model_flops_per_token(*model);
  Json written = model_to_json(*model);
  fuzz::expect(model_to_json(parse_model(written, file)) == written, "model_to_json does not read back the same");
  return 0;
}
