// `stepcast simulate`: predicts one training step of a plan on a cluster with the SimGrid
// simulator and writes prediction.json (StepResult) and trace.json (Chrome trace).
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "chrome_trace.hpp"
#include "commands.hpp"
#include "errors.hpp"
#include "inputs.hpp"
#include "lower.hpp"
#include "memory.hpp"
#include "program_json.hpp"
#include "program_stats.hpp"
#include "profiler.hpp"
#include "simulator.hpp"
#include "summary.hpp"

namespace stepcast::cli {

namespace {

// tokens/s per device of the same plan at dp_size 1 and global_batch_size / dp_size, simulated
// in a child process (one SimGrid engine per process).
double reference_tokens_per_s_per_device(const Inputs& in, const po::variables_map& vm,
                                         const ProfileChoice& profile) {
  Json plan = plan_to_json(in.plan);
  plan["dp_size"] = 1;
  plan["num_distributed_optimizer_instances"] = 1;  // one replica: nothing to shard it across
  plan["global_batch_size"] = in.plan.global_batch_size / in.plan.dp_size;
  plan["name"] = in.plan.name + "-dp1";
  auto dir = std::filesystem::temp_directory_path() /
             ("stepcast-scaling-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::string plan_file = (dir / "plan.json").string();
  std::ofstream(plan_file) << plan.dump(2);
  std::ostringstream cmd;
  cmd << shell_quote(std::filesystem::read_symlink("/proc/self/exe").string())
      << " simulate --model " << shell_quote(in.model.file) << child_seq_length_argument(in.model)
      << " --topology "
      << shell_quote(in.topology.file) << " --nodes " << in.topology.num_nodes << " --plan "
      << shell_quote(plan_file) << " --no-scaling --no-records --out "  // its tokens/s only
      << shell_quote((dir / "out").string());
  cmd << child_profile_arguments(profile, vm) << " --seed " << vm["seed"].as<uint64_t>()
      << " --variability " << vm["variability"].as<std::string>();
  cmd << " --mode " << vm["mode"].as<std::string>() << " >" << shell_quote((dir / "log").string())
      << " 2>&1";
  int status = std::system(cmd.str().c_str());
  if (status != 0) {
    std::ifstream log(dir / "log");
    std::stringstream text;
    text << log.rdbuf();
    std::filesystem::remove_all(dir);
    throw std::runtime_error("the dp_size = 1 reference simulation failed: " + text.str());
  }
  Json reference = load_json_file((dir / "out" / "prediction.json").string());
  std::filesystem::remove_all(dir);
  return reference.at("tokens_per_s").get<double>() /
         double(in.plan.tp_size * in.plan.pp_size);
}

}  // namespace

int run_simulate(int argc, char** argv) {
  po::options_description options("stepcast simulate options");
  add_input_options(options);
  add_profile_options(options, "that costs each op");
  options.add_options()
      ("mode", po::value<std::string>()->default_value("fast"), "fast, full or approx (see --help)")
      ("out", po::value<std::string>(), "write DIR/prediction.json and DIR/trace.json")
      ("no-scaling", po::bool_switch(), "skip the dp_size = 1 reference run (scaling_efficiency null)")
      ("seed", po::value<uint64_t>()->default_value(1),
       "seed of the run-to-run variability draws (the profile's `variability`): the same seed, "
       "the same prediction")
      ("variability", po::value<std::string>()->default_value("on"),
       "on: draw the profile's device and op variability; off: the nominal step")
      ("no-records", po::bool_switch(),
       "with --out: prediction.json without per-op records, and no trace.json (the figures only; "
       "`compare` needs the records)");
  auto vm = parse_command_line(
      argc, argv, options,
      "usage: stepcast simulate --model M --topology T --plan P [--nodes N]\n"
      "                         [--profile F|roofline] [--allow-profile-mismatch]\n"
      "                         [--mode fast|full|approx] [--out DIR] [--no-scaling]\n"
      "                         [--no-records] [--seed N] [--variability on|off]\n"
      "Predicts one training step on SimGrid: step time and its breakdown (compute, exposed\n"
      "communication, pipeline bubble, optimizer) on the critical rank, tokens/s, MFU and HFU,\n"
      "memory per rank, and scaling efficiency against the same plan at dp_size 1.\n"
      "--mode full simulates every rank and every ring step (up to 256 devices, 8 microbatches);\n"
      "--mode fast (default) folds what is exact to fold and scales to 16,384 devices;\n"
      "--mode approx is fast, and also costs tensor-parallel collectives analytically where\n"
      "another group (dp, pp) has members on the same node, whose NVLink contention with them\n"
      "is then not simulated: on the fast side, by up to a few percent (README); the planner\n"
      "re-simulates with it.");
  if (!vm) return 0;
  claim_out_option(*vm, "simulate");
  std::string mode_name = (*vm)["mode"].as<std::string>();
  if (mode_name != "fast" && mode_name != "full" && mode_name != "approx") {
    throw InputError("command line: --mode '" + mode_name + "': valid: fast, full, approx");
  }
  std::string variability = (*vm)["variability"].as<std::string>();
  if (variability != "on" && variability != "off") {
    throw InputError("command line: --variability '" + variability + "': valid: on, off");
  }
  Inputs in = load_inputs(*vm);
  ProfileChoice profile_choice = profile_from(*vm, in.topology);
  const DeviceProfile& profile = profile_choice.profile;
  // A measured CPU profile describes the machine it ran on: say where this machine differs.
  if (profile.backend == "cpu") {
    std::vector<std::string> differences =
        machine_differences(profile, describe_machine(), library_versions());
    if (!differences.empty()) {
      std::cerr << "warning: profile " << profile.file << " was measured on another machine type (";
      for (size_t i = 0; i < differences.size(); ++i) std::cerr << (i ? "; " : "") << differences[i];
      std::cerr << "); its figures may not hold here\n";
    }
  }
  auto wall_start = std::chrono::steady_clock::now();
  StepProgram program = lower_program(in.model, in.topology, in.plan);
  hash_program(program);
  MemoryReport memory = memory_report(program, in.topology);
  if (!memory.fits) {
    std::cerr << "warning: the plan does not fit in memory (peak " << format_bytes(memory.peak_bytes_max)
              << " + reserved " << format_bytes(memory.reserved_bytes) << " > "
              << format_bytes(memory.capacity_bytes) << "); simulating anyway, fits: false\n";
  }
  const bool records = !(*vm)["no-records"].as<bool>();
  SimulateOptions sim_options;
  sim_options.allow_profile_mismatch = (*vm)["allow-profile-mismatch"].as<bool>();
  sim_options.variability = variability == "on";
  sim_options.seed = (*vm)["seed"].as<uint64_t>();
  sim_options.mode = mode_name == "full"     ? SimMode::full
                     : mode_name == "approx" ? SimMode::approx
                                             : SimMode::fast;
  SimulationOutput sim = simulate_program(program, in.topology, profile, sim_options);
  double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();

  ProgramStats stats = program_stats(program);
  double peak = in.topology.node.device.peak_for(in.plan.param_dtype, in.topology.file);
  double model_flops = model_flops_per_token(in.model) * double(program.tokens_per_step);
  StepResult result;
  result.source = "simulator";
  result.step_time_s = sim.step_time_s;
  result.critical_rank = sim.critical_rank;
  result.breakdown = sim.breakdown;
  result.tokens_per_s = double(program.tokens_per_step) / sim.step_time_s;
  result.mfu = model_flops / sim.step_time_s / (double(program.world_size()) * peak);
  result.hfu = stats.matrix_flops_per_step / sim.step_time_s / (double(program.world_size()) * peak);
  result.memory = memory_to_json(memory);
  if (records) result.ops = sim.records;
  result.program_sha256 = program.program_sha256;
  Json envelope = output_envelope("simulate", in);
  result.inputs = envelope["inputs"];
  result.inputs["profile"] = profile_to_json(profile);
  result.inputs["profile_file"] = profile.file;
  result.inputs["profile_origin"] = profile_choice.origin;
  result.extra = {{"mode", mode_name},
                  {"mode_detail", sim.mode_description},
                  {"simulated_ranks", sim.simulated_ranks.size()},
                  {"detail_ranks", sim.detail_ranks},
                  {"activities", sim.activities},
                  {"simulation_wall_s", wall_s},
                  {"op_records", records ? "kept" : "omitted (--no-records)"},
                  {"variability",
                   {{"applied", sim.variability},
                    {"seed", sim_options.seed},
                    {"device_speed_cv", profile.variability.device_speed_cv},
                    {"op_time_cv", profile.variability.op_time_cv}}},
                  {"measured_collective_corrections",
                   {{"collectives", sim.corrected_collectives},
                    {"factor_min", sim.correction_min},
                    {"factor_max", sim.correction_max}}}};
  if (!(*vm)["no-scaling"].as<bool>()) {
    if (in.plan.dp_size == 1) {
      result.scaling_efficiency = 1.0;
    } else {
      double per_device = result.tokens_per_s / double(program.world_size());
      result.scaling_efficiency = per_device / reference_tokens_per_s_per_device(in, *vm, profile_choice);
    }
  }

  std::cout << "stepcast simulate: " << model_label(in.model) << " on " << in.topology.name << " ("
            << program.world_size() << " devices), plan " << in.plan.name << ", mode "
            << sim.mode_description << "\nprofile " << profile_choice.describe() << "\n";
  std::cout << "step time " << result.step_time_s << " s (critical rank " << result.critical_rank
            << "): compute " << result.breakdown.compute_s << ", exposed comm "
            << result.breakdown.exposed_comm_s << ", bubble " << result.breakdown.bubble_s
            << ", optimizer " << result.breakdown.optimizer_s;
  if (sim.variability) {
    std::cout << ", variability " << result.breakdown.variability_s << " (seed " << sim_options.seed << ")";
  }
  std::cout << "\n";
  if (sim.corrected_collectives > 0) {
    std::cout << "measured collective tables corrected " << sim.corrected_collectives
              << " collectives (factor " << sim.correction_min << " to " << sim.correction_max << ")\n";
  }
  std::cout << "tokens/s " << result.tokens_per_s << ", MFU " << result.mfu << ", HFU "
            << result.hfu << ", peak memory " << format_bytes(memory.peak_bytes_max)
            << (memory.fits ? " (fits)" : " (DOES NOT FIT)");
  if (result.scaling_efficiency) std::cout << ", scaling efficiency " << *result.scaling_efficiency;
  std::cout << "\nsimulated " << sim.simulated_ranks.size() << " ranks, " << sim.activities
            << " activities in " << wall_s << " s\n";
  if (vm->count("out")) {
    std::string dir = (*vm)["out"].as<std::string>();
    write_output_file(dir, "prediction.json", step_result_to_json(result).dump() + "\n");
    if (records) {
      std::ostringstream trace;
      write_chrome_trace(trace, program, sim.records);
      write_output_file(dir, "trace.json", trace.str());
      std::cout << "wrote " << dir << "/prediction.json and " << dir << "/trace.json\n";
    } else {
      std::cout << "wrote " << dir << "/prediction.json (no per-op records)\n";
    }
  }
  return 0;
}

}  // namespace stepcast::cli
