// Fuzz target: GEMM sweep CSVs (parse_gemm_csv), as `profile import --gemm-csv` reads them: an
// accepted CSV is merged into the shipped H100 profile, and the merged profile is read back as
// the command reads what it writes (a refusal there is an InputError like any other).
#include "fuzz_support.hpp"
#include "profile_import.hpp"

using namespace stepcast;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const DeviceProfile base = load_profile(fuzz::source_path("profiles/h100-sxm.json"));
  const std::string file = "fuzz-gemm.csv";
  auto csv = fuzz::accepted([&] { return parse_gemm_csv(fuzz::input_text(data, size), file); });
  if (!csv) return 0;
  fuzz::return_or_refuse([&] { parse_profile(profile_to_json(merge_imports(base, {}, &*csv, nullptr)), file); });
  return 0;
}
