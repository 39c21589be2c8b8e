// Fuzz target: Megatron-LM launch lines and scripts (import_megatron_arguments), as
// `--from-megatron` reads them: the model and plan an accepted text yields are then read as a
// model and a plan file would be.
#include "fuzz_support.hpp"
#include "megatron_import.hpp"
#include "model.hpp"
#include "plan.hpp"

using namespace stepcast;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string file = "fuzz-launch.sh";
  auto imported = fuzz::accepted([&] { return import_megatron_arguments(fuzz::input_text(data, size), file, "fuzz"); });
  if (!imported) return 0;
  fuzz::return_or_refuse([&] { parse_model(imported->model, file); });
  fuzz::return_or_refuse([&] { parse_plan(imported->plan, file); });
  return 0;
}
