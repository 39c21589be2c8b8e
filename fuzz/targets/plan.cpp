// Fuzz target: plan files (parse_plan), and validate_plan against shipped models and topologies:
// the tiny test model on localhost-cpu, GPT-3 175B on DGX A100, Llama 3 405B on DGX H100, each
// topology given as many nodes as the plan needs (as --nodes would). A plan validate_plan accepts
// must read back from plan_to_json as the same resolved plan (outputs carry it, compare re-reads it).
#include <algorithm>
#include <vector>

#include "fuzz_support.hpp"
#include "model.hpp"
#include "plan.hpp"
#include "topology.hpp"

using namespace stepcast;

namespace {

struct Machine {
  ModelConfig model;
  Json topology;  // parsed again per input, with the plan's node count
  std::string topology_file;
};

std::vector<Machine> load_machines() {
  std::vector<Machine> out;
  for (auto [model, topology] : {std::pair{"models/tiny.json", "topologies/localhost-cpu.json"},
                                 std::pair{"models/gpt3-175b.json", "topologies/dgx-a100-80gb.json"},
                                 std::pair{"models/llama3-405b.json", "topologies/dgx-h100.json"}}) {
    out.push_back({load_model(fuzz::source_path(model)), load_json_file(fuzz::source_path(topology)),
                   fuzz::source_path(topology)});
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<Machine> machines = load_machines();
  const std::string file = "fuzz-plan.json";
  auto plan = fuzz::accepted([&] { return parse_plan(parse_json_text(fuzz::input_text(data, size), file), file); });
  if (!plan) return 0;
  for (const Machine& machine : machines) {
    // Plan::world_size() may overflow before validate_plan has checked the sizes.
    int64_t world = 0;
    if (__builtin_mul_overflow(plan->tp_size, plan->pp_size, &world) ||
        __builtin_mul_overflow(world, plan->dp_size, &world)) {
      world = int64_t(1) << 40;
    }
    int64_t per_node = machine.topology["node"]["devices_per_node"].get<int64_t>();
    int64_t nodes = std::clamp<int64_t>((world + per_node - 1) / per_node, 1, 1 << 20);
    Topology topology = parse_topology(machine.topology, machine.topology_file, int(nodes));
    Plan resolved = *plan;
    if (!fuzz::accepted([&] { return (validate_plan(resolved, machine.model, topology), true); })) continue;
    Json written = plan_to_json(resolved);
    Plan again = parse_plan(written, file);
    validate_plan(again, machine.model, topology);
    fuzz::expect(plan_to_json(again) == written, "plan_to_json does not read back the same resolved plan");
  }
  return 0;
}
