// Fuzz target: program.json (parse_program_json_text). The text is checked against the SHA-256
// recorded after its `,"program_sha256":"` marker, which a mutation almost always breaks; so each
// input is read twice: as it is (the hash check itself), and re-signed — the hash of the text
// before the last marker written after it — so that mutations reach the JSON reading behind it.
// A program that reads must write back (write_program_json) to text that reads to the same hash.
#include <sstream>

#include "fuzz_support.hpp"
#include "program_json.hpp"
#include "sha256.hpp"

using namespace stepcast;

namespace {

const std::string kMarker = ",\"program_sha256\":\"";

// `text` with the 64 characters after its last marker replaced by the hash of what precedes the
// marker (appended when fewer follow); unchanged without a marker.
std::string resigned(const std::string& text) {
  size_t at = text.rfind(kMarker);
  if (at == std::string::npos) return text;
  size_t hash_at = at + kMarker.size();
  std::string out = text.substr(0, hash_at) + sha256_hex(std::string_view(text).substr(0, at));
  if (text.size() > hash_at + 64) out += text.substr(hash_at + 64);
  return out;
}

void read_program(const std::string& text) {
  const std::string file = "fuzz-program.json";
  auto program = fuzz::accepted([&] { return parse_program_json_text(text, file); });
  if (!program) return;
  std::ostringstream written;
  std::string hash = write_program_json(*program, &written);
  fuzz::expect(parse_program_json_text(written.str(), file).program_sha256 == hash,
               "write_program_json's text does not read back with its own hash");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text = fuzz::input_text(data, size);
  read_program(text);
  std::string signed_text = resigned(text);
  if (signed_text != text) read_program(signed_text);
  return 0;
}
