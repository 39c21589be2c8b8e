// Fuzz target: a checkpoint's manifest.json (parse_checkpoint_manifest). An accepted manifest
// must come back from checkpoint_manifest_text with the same self-hash.
#include "checkpoint.hpp"
#include "fuzz_support.hpp"

using namespace stepcast;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string file = "fuzz-manifest.json";
  auto manifest = fuzz::accepted([&] { return parse_checkpoint_manifest(fuzz::input_text(data, size), file); });
  if (!manifest) return 0;
  CheckpointManifest written = *manifest;
  std::string text = checkpoint_manifest_text(written);
  fuzz::expect(written.manifest_sha256 == manifest->manifest_sha256 &&
                   parse_checkpoint_manifest(text, file).manifest_sha256 == manifest->manifest_sha256,
               "checkpoint_manifest_text does not give the manifest's own hash back");
  return 0;
}
