// Fuzz target: a checkpoint folder's `latest` pointer (parse_checkpoint_latest). An accepted
// pointer, written again by checkpoint_latest_text, reads back the same.
#include "checkpoint.hpp"
#include "fuzz_support.hpp"

using namespace stepcast;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string file = "fuzz-latest";
  auto latest = fuzz::accepted([&] { return parse_checkpoint_latest(fuzz::input_text(data, size), file); });
  if (!latest) return 0;
  CheckpointLatest again = parse_checkpoint_latest(checkpoint_latest_text(*latest), file);
  fuzz::expect(again.step_dir == latest->step_dir && again.manifest_sha256 == latest->manifest_sha256,
               "checkpoint_latest_text does not read back the same");
  return 0;
}
