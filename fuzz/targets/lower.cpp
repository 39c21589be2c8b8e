// Fuzz target: plan → lower → memory. The input is one JSON document {"model": {...},
// "topology": {...}, "plan": {...}}, all three fuzzed, because validate_plan checks their
// combination (a plan's sizes against the model's heads and layers and the topology's devices);
// the seeds are shipped valid triples, so mutations start inside what validates. A document that
// validates is lowered (lower_program) and its memory walked (memory_report), and must give:
//  - a program check_program finds sound (what `stepcast lower --check` verifies);
//  - program.json text that reads back with its hash (write_program_json, parse_program_json_text);
//  - the same program again from its resolved inputs (program_from_inputs: what compare does).
#include <sstream>

#include "compare.hpp"
#include "fuzz_support.hpp"
#include "lower.hpp"
#include "memory.hpp"
#include "model.hpp"
#include "plan.hpp"
#include "program_check.hpp"
#include "program_json.hpp"
#include "topology.hpp"

using namespace stepcast;

namespace {

// Valid plans can be large (validate_plan admits 200,000 (microbatch, layer) passes of ~130 ops
// each, and any world size the topology holds); lowering those takes seconds and gigabytes,
// which is their size, not a bug. Documents past these bounds are skipped, so that a timeout or
// an out-of-memory here means real slowness on a small program (about 130 × 512 ops at most).
constexpr int64_t kMaxLayerPasses = 512;    // num_microbatches · num_hidden_layers
constexpr int64_t kMaxVirtualStages = 64;   // pp_size · virtual_pp_size: roles and chunks
constexpr int64_t kMaxWorldSize = 4096;     // memory_report and the rank grid walk every rank

bool small_enough(const ModelConfig& model, const Plan& plan) {
  return plan.num_microbatches() * model.num_hidden_layers <= kMaxLayerPasses &&
         plan.pp_size * plan.virtual_pp_size <= kMaxVirtualStages && plan.world_size() <= kMaxWorldSize;
}

// The document's part `key`, or null when the document has no such object (not a finding: the
// harness's own format).
const Json* part(const Json& document, const char* key) {
  auto it = document.find(key);
  return it != document.end() && it->is_object() ? &*it : nullptr;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string file = "fuzz-lower.json";
  auto document = fuzz::accepted([&] { return parse_json_text(fuzz::input_text(data, size), file); });
  if (!document || !document->is_object()) return 0;
  const Json* model_json = part(*document, "model");
  const Json* topology_json = part(*document, "topology");
  const Json* plan_json = part(*document, "plan");
  if (!model_json || !topology_json || !plan_json) return 0;

  struct Inputs {
    ModelConfig model;
    Topology topology;
    Plan plan;
  };
  auto in = fuzz::accepted([&] {
    Inputs read{parse_model(*model_json, file + " (model)"), parse_topology(*topology_json, file + " (topology)"),
                parse_plan(*plan_json, file + " (plan)")};
    validate_plan(read.plan, read.model, read.topology);
    return read;
  });
  if (!in || !small_enough(in->model, in->plan)) return 0;

  StepProgram program = lower_program(in->model, in->topology, in->plan);
  MemoryReport memory = memory_report(program, in->topology);
  memory_to_json(memory);
  std::vector<std::string> broken = check_program(program);
  fuzz::expect(broken.empty(), "the lowered program breaks an invariant: " +
                                   (broken.empty() ? std::string() : broken.front()));

  std::ostringstream text;
  hash_program(program);
  fuzz::expect(write_program_json(program, &text) == program.program_sha256 &&
                   parse_program_json_text(text.str(), file).program_sha256 == program.program_sha256,
               "program.json does not read back with the program's hash");

  StepResult result;
  result.inputs = {{"model", model_to_json(in->model)},
                   {"topology", topology_to_json(in->topology)},
                   {"plan", plan_to_json(in->plan)}};
  result.program_sha256 = program.program_sha256;
  program_from_inputs(result, file);  // InputError here: the resolved inputs lower differently
  return 0;
}
