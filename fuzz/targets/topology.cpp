// Fuzz target: topology files (parse_topology). An accepted topology must read back from
// topology_to_json as the same topology (outputs carry it as resolved input).
#include "fuzz_support.hpp"
#include "topology.hpp"

using namespace stepcast;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string file = "fuzz-topology.json";
  auto topology = fuzz::accepted(
      [&] { return parse_topology(parse_json_text(fuzz::input_text(data, size), file), file); });
  if (!topology) return 0;
  topology->num_devices();
  Json written = topology_to_json(*topology);
  fuzz::expect(topology_to_json(parse_topology(written, file)) == written,
               "topology_to_json does not read back the same");
  return 0;
}
