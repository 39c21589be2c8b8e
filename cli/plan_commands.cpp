// `stepcast memory` and `stepcast lower`: the memory verdict of a plan and its StepProgram.
#include <filesystem>
#include <fstream>
#include <iostream>

#include "commands.hpp"
#include "errors.hpp"
#include "inputs.hpp"
#include "lower.hpp"
#include "memory.hpp"
#include "program_check.hpp"
#include "program_json.hpp"
#include "program_stats.hpp"
#include "summary.hpp"

namespace stepcast::cli {

namespace {

void print_header(const std::string& command, const Inputs& in) {
  std::cout << "stepcast " << command << ": " << model_label(in.model) << " on " << in.topology.name
            << " (" << in.topology.num_nodes << " nodes × " << in.topology.node.devices_per_node
            << " = " << in.topology.num_devices() << " devices), plan " << in.plan.name
            << dp_size_note(in.plan) << "\n";
  if (in.plan.world_size() < in.topology.num_devices()) {
    std::cout << "note: the plan uses " << in.plan.world_size() << " of the topology's "
              << in.topology.num_devices() << " devices\n";
  }
}

double model_flops_per_step(const Inputs& in) {
  return model_flops_per_token(in.model) * double(in.plan.global_batch_size) *
         double(in.model.seq_length);
}

}  // namespace

int run_memory(int argc, char** argv) {
  po::options_description options("stepcast memory options");
  add_input_options(options);
  options.add_options()("out", po::value<std::string>(), "write DIR/memory.json");
  auto vm = parse_command_line(
      argc, argv, options,
      "usage: stepcast memory --model M --topology T --plan P [--nodes N] [--out DIR]\n"
      "Bytes per rank by class (weights, grads, optimizer, activations, workspace, comm)\n"
      "at each rank's peak, from the alloc/free walk of the lowered step; placement (what the\n"
      "executors' arena takes beyond that live peak: alignment and gaps no layout packed);\n"
      "the runtime allowance; and whether the plan fits the device's memory. Ranks that are\n"
      "alike are listed once.");
  if (!vm) return 0;
  claim_out_option(*vm, "memory");
  Inputs in = load_inputs(*vm);
  StepProgram program = lower_program(in.model, in.topology, in.plan);
  MemoryReport report = memory_report(program, in.topology);
  print_header("memory", in);
  print_memory_report(std::cout, report);
  if (vm->count("out")) {
    hash_program(program);
    Json out = output_envelope("memory", in);
    out["program_sha256"] = program.program_sha256;
    Json memory = memory_to_json(report);
    for (auto it = memory.begin(); it != memory.end(); ++it) out[it.key()] = it.value();
    std::string dir = (*vm)["out"].as<std::string>();
    write_output_file(dir, "memory.json", out.dump(2) + "\n");
    std::cout << "wrote " << dir << "/memory.json\n";
  }
  return 0;
}

int run_lower(int argc, char** argv) {
  po::options_description options("stepcast lower options");
  add_input_options(options);
  options.add_options()
      ("out", po::value<std::string>()->required(), "write DIR/program.json")
      ("allow-oom", po::bool_switch(), "write the program even if the plan does not fit in memory")
      ("check", po::bool_switch(),
       "verify the program's invariants (matching sends/receives, identical collectives per "
       "group, live buffers, no deadlock) before writing it");
  auto vm = parse_command_line(
      argc, argv, options,
      "usage: stepcast lower --model M --topology T --plan P --out DIR [--nodes N] [--allow-oom]\n"
      "                      [--check]\n"
      "Lowers the plan into the StepProgram (one op list per pipeline stage; with unequal\n"
      "replicas, microbatches_per_replica, per stage of each distinct count) that the simulator\n"
      "and the executor interpret, writes DIR/program.json and prints its summary.");
  if (!vm) return 0;
  claim_out_option(*vm, "lower");
  Inputs in = load_inputs(*vm);
  StepProgram program = lower_program(in.model, in.topology, in.plan);
  MemoryReport report = memory_report(program, in.topology);
  if (!report.fits && !(*vm)["allow-oom"].as<bool>()) {
    std::ostringstream why;
    why << "needs " << format_bytes(report.peak_bytes_max) << " + reserved "
        << format_bytes(report.reserved_bytes) << " per device, the device has "
        << format_bytes(report.capacity_bytes) << " (see `stepcast memory`)";
    throw_input_error(in.plan.file, "(plan)", in.plan.name, "does not fit in memory: " + why.str(),
                      "a plan that fits, or --allow-oom to lower it anyway");
  }
  if ((*vm)["check"].as<bool>()) {
    std::vector<std::string> errors = check_program(program);
    if (!errors.empty()) {
      for (const auto& e : errors) std::cerr << "check: " << e << "\n";
      throw std::logic_error("the lowered program breaks " + std::to_string(errors.size()) +
                             " invariant(s); first: " + errors.front());
    }
    std::cout << "check: all invariants hold\n";
  }
  std::string dir = (*vm)["out"].as<std::string>();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw InputError("--out " + dir + ": cannot create directory: " + ec.message());
  std::string path = dir + "/program.json";
  print_header("lower", in);
  {
    std::ofstream file(path + ".tmp", std::ios::binary);
    if (!file) throw InputError("--out " + dir + ": cannot write " + path);
    program.program_sha256 = write_program_json(program, &file);
    if (!file) throw InputError("--out " + dir + ": write failed for " + path);
  }
  std::filesystem::rename(path + ".tmp", path, ec);
  if (ec) throw InputError("--out " + dir + ": cannot rename to " + path + ": " + ec.message());
  print_program_summary(std::cout, program, program_stats(program), model_flops_per_step(in));
  if (!report.fits) std::cout << "warning: the plan does not fit in memory (--allow-oom)\n";
  std::cout << "wrote " << path << "\n";
  return 0;
}

}  // namespace stepcast::cli
