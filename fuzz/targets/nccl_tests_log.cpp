// Fuzz target: nccl-tests logs (parse_nccl_tests_log), as `profile import --nccl-tests` reads
// them: an accepted log is merged into the shipped H100 profile, and the merged profile is read
// back as the command reads what it writes (a refusal there is an InputError like any other).
#include "fuzz_support.hpp"
#include "profile_import.hpp"

using namespace stepcast;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const DeviceProfile base = load_profile(fuzz::source_path("profiles/h100-sxm.json"));
  const std::string file = "fuzz-nccl-tests.log";
  auto log = fuzz::accepted([&] { return parse_nccl_tests_log(fuzz::input_text(data, size), file); });
  if (!log) return 0;
  fuzz::return_or_refuse([&] { parse_profile(profile_to_json(merge_imports(base, {*log}, nullptr, nullptr)), file); });
  return 0;
}
