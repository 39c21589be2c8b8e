// Fuzz target: device profiles (parse_profile). profile.hpp promises that
// parse_profile(profile_to_json(p)) gives p back; an accepted profile is checked for it.
#include "fuzz_support.hpp"
#include "profile.hpp"

using namespace stepcast;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string file = "fuzz-profile.json";
  auto profile = fuzz::accepted(
      [&] { return parse_profile(parse_json_text(fuzz::input_text(data, size), file), file); });
  if (!profile) return 0;
  Json written = profile_to_json(*profile);
  fuzz::expect(profile_to_json(parse_profile(written, file)) == written,
               "profile_to_json does not read back the same");
  return 0;
}
