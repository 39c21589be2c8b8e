// `stepcast simulate`: predicts one training step of a plan on a cluster with the SimGrid
// simulator and writes prediction.json (StepResult) and trace.json (Chrome trace).
#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <iostream>
#include <set>
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
#include "scaling_reference.hpp"
#include "simulate_extras.hpp"
#include "simulator.hpp"
#include "summary.hpp"

namespace stepcast::cli {

namespace {

// Which ranks' records an output holds (--records, --trace).
enum class Scope { representative, all, none };

Scope parse_scope(const po::variables_map& vm, const std::string& option) {
  std::string value = vm[option].as<std::string>();
  if (value == "representative") return Scope::representative;
  if (value == "all") return Scope::all;
  if (value == "none") return Scope::none;
  throw InputError("command line: --" + option + " '" + value +
                   "': valid: representative (one rank per role and the critical rank), all "
                   "(every simulated rank), none");
}

std::string describe(Scope scope) {
  return scope == Scope::all ? "all simulated ranks"
         : scope == Scope::representative
             ? "representative: the first rank of each role (pipeline stage; in full mode every rank "
               "up to 64) and the critical rank"
             : "omitted";
}

// The records of `scope` out of the simulated ones.
std::vector<OpRecord> records_of(Scope scope, const SimulationOutput& sim) {
  if (scope == Scope::all) return sim.records;
  std::vector<OpRecord> kept;
  if (scope == Scope::none) return kept;
  std::set<int64_t> ranks(sim.representative_ranks.begin(), sim.representative_ranks.end());
  for (const OpRecord& r : sim.records) {
    if (ranks.count(r.rank)) kept.push_back(r);
  }
  return kept;
}

// records_of, taking `sim`'s records where the scope keeps every one of them (all; by default the
// detail ranks are the representative ones): 10^6 records not copied.
std::vector<OpRecord> take_records(Scope scope, SimulationOutput& sim) {
  const std::set<int64_t> representative(sim.representative_ranks.begin(), sim.representative_ranks.end());
  bool every = scope == Scope::all;
  if (scope == Scope::representative) {
    every = std::all_of(sim.detail_ranks.begin(), sim.detail_ranks.end(),
                        [&](int64_t rank) { return representative.count(rank) > 0; });
  }
  return every ? std::move(sim.records) : records_of(scope, sim);
}

}  // namespace

// What --mode auto chose and why (SimulationOutput::AutoMode); empty where a mode was given.
std::string auto_mode_choice(const SimulationOutput::AutoMode& choice) {
  if (!choice.applied) return "";
  std::ostringstream why;
  if (choice.chosen == SimMode::approx) {
    why << "mode auto chose approx: fast mode would simulate " << choice.fast_ranks << " ranks (" << kAutoApproxRanks
        << " or more), approx " << choice.approx_ranks
        << " (within 1% of fast mode where tested: README `--mode approx`); --mode fast for exact folds only";
  } else if (choice.fast_ranks >= kAutoApproxRanks) {
    why << "mode auto chose fast: it simulates " << choice.fast_ranks << " ranks, and approx would fold no more";
  } else {
    why << "mode auto chose fast: it simulates " << choice.fast_ranks << " ranks (approx from " << kAutoApproxRanks
        << ")";
  }
  return why.str();
}

int run_simulate(int argc, char** argv) {
  po::options_description options("stepcast simulate options");
  add_input_options(options);
  add_profile_options(options, "that costs each op");
  options.add_options()
      ("mode", po::value<std::string>()->default_value("auto"), "auto, fast, full or approx (see --help)")
      ("out", po::value<std::string>(), "write DIR/prediction.json and DIR/trace.json")
      ("no-scaling", po::bool_switch(), "skip the dp_size = 1 reference run (scaling_efficiency null)")
      ("seed", po::value<uint64_t>()->default_value(1),
       "seed of the run-to-run variability draws (the profile's `variability`): the same seed, "
       "the same prediction")
      ("variability", po::value<std::string>()->default_value("on"),
       "on: draw the profile's device and op variability; off: the nominal step")
      ("overlap-interference", po::value<std::string>()->default_value("on"),
       "on: compute beside a collective on another stream runs on the SMs the collective leaves "
       "(the profile's `overlap`); off: at full speed")
      ("records", po::value<std::string>()->default_value("representative"),
       "per-op records in prediction.json (of the ops that take time; the trace's memory counter shows "
       "the allocs and frees): representative (the first rank of each role, i.e. "
       "pipeline stage, and the critical rank: what `compare` joins), all (every simulated rank; "
       "fast mode simulates tensor-parallel index 0), none")
      ("trace", po::value<std::string>()->default_value("representative"),
       "ranks in trace.json: representative, all or none (no trace.json), as --records")
      ("gzip", po::bool_switch(),
       "write prediction.json.gz and trace.json.gz (gzip; Perfetto and `compare` read them)")
      ("no-records", po::bool_switch(),
       "--records none --trace none: prediction.json with the figures only, no trace.json "
       "(`compare` needs the records)")
      ("no-program-hash", po::bool_switch(),
       "skip the program's hash (SHA-256 of its JSON: up to half the command's CPU time on a large "
       "plan): prediction.json's program_sha256 is null and `compare` refuses it. For callers that "
       "read the figures only (the planner's and the studies' re-simulations pass it)");
  add_price_options(options);
  auto vm = parse_command_line(
      argc, argv, options,
      "usage: stepcast simulate --model M --topology T --plan P [--nodes N]\n"
      "       stepcast simulate --from-megatron 'ARGS'|FILE --topology T [--nodes N]\n"
      "                         [--profile F|roofline] [--allow-profile-mismatch]\n"
      "                         [--mode auto|fast|full|approx] [--out DIR] [--no-scaling]\n"
      "                         [--records representative|all|none]\n"
      "                         [--trace representative|all|none] [--gzip] [--no-records]\n"
      "                         [--no-program-hash]\n"
      "                         [--seed N] [--variability on|off] [--overlap-interference on|off]\n"
      "                         [--price-per-gpu-hour AMOUNT CURRENCY]\n"
      "Predicts one training step on SimGrid: step time and its breakdown (compute, exposed\n"
      "communication, pipeline bubble, optimizer) on the critical rank, tokens/s, MFU and HFU,\n"
      "memory per rank, and scaling efficiency against the same plan at dp_size 1.\n"
      "--mode full simulates every rank and every ring step (up to 256 devices, 8 microbatches);\n"
      "--mode fast folds what is exact to fold and scales to 16,384 devices;\n"
      "--mode approx is fast, and also costs tensor-parallel collectives analytically where\n"
      "another group (dp, pp) has members on the same node, whose NVLink contention with them\n"
      "is then not simulated, and simulates one data-parallel copy per stage for them all (its\n"
      "peers' flows mirrored; not with experts or unequal devices): within about 1% of\n"
      "fast mode where tested (README); the planner re-simulates with it.\n"
      "--mode auto (default) is fast, or approx where fast mode would simulate 256 ranks or\n"
      "more and approx fewer (seconds instead of tens of seconds or minutes); the summary and\n"
      "prediction.json's mode_choice say which ran and why. --mode fast for exact folds only.\n"
      "A topology with `heterogeneity` (speed factors per node, device or node group, link\n"
      "factors per node) also gets the same step with every factor 1, simulated beside it: the\n"
      "straggler cost is the difference, and the slowest and the critical rank are named.\n"
      "A plan with data_parallel_mode async (staleness k) also gets the same plan synchronous,\n"
      "simulated beside it: throughput of both and the staleness (prediction.json's `async`).\n"
      "With parameter_servers S, free-running workers and S servers run many steps (SimGrid\n"
      "actors); the step is one global batch at their steady-state throughput, and `async`\n"
      "adds each worker's step, the staleness the servers saw and their busy share.\n"
      "Energy per step comes from the device's power_idle_w and power_busy_w (busy while it\n"
      "computes); --price-per-gpu-hour 2.5 USD (or 2.5 --currency USD) gives cost per step.\n"
      "Outputs (--out DIR): prediction.json, the summary first and the per-op records last, and\n"
      "trace.json (Chrome trace: Perfetto), both of the representative ranks by default.");
  if (!vm) return 0;
  claim_out_option(*vm, "simulate");
  std::string mode_name = (*vm)["mode"].as<std::string>();
  if (mode_name != "auto" && mode_name != "fast" && mode_name != "full" && mode_name != "approx") {
    throw InputError("command line: --mode '" + mode_name + "': valid: auto, fast, full, approx");
  }
  auto on_off = [&](const char* option) {
    const std::string value = (*vm)[option].as<std::string>();
    if (value != "on" && value != "off") {
      throw InputError(std::string("command line: --") + option + " '" + value + "': valid: on, off");
    }
    return value == "on";
  };
  const bool variability = on_off("variability"), overlap_interference = on_off("overlap-interference");
  Scope records_scope = parse_scope(*vm, "records"), trace_scope = parse_scope(*vm, "trace");
  if ((*vm)["no-records"].as<bool>()) {
    if (!(*vm)["records"].defaulted() || !(*vm)["trace"].defaulted()) {
      throw InputError("command line: --no-records with --records or --trace: valid: one of them "
                       "(--no-records is --records none --trace none)");
    }
    records_scope = trace_scope = Scope::none;
  }
  const bool gzip = (*vm)["gzip"].as<bool>();
  const std::optional<Price> price = price_from(*vm);
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
  SimulateOptions sim_options;
  sim_options.allow_profile_mismatch = (*vm)["allow-profile-mismatch"].as<bool>();
  sim_options.variability = variability;
  sim_options.overlap_interference = overlap_interference;
  sim_options.seed = (*vm)["seed"].as<uint64_t>();
  sim_options.mode = mode_name == "full"     ? SimMode::full
                     : mode_name == "approx" ? SimMode::approx
                     : mode_name == "fast"   ? SimMode::fast
                                             : SimMode::automatic;
  sim_options.detail_all = records_scope == Scope::all || trace_scope == Scope::all;
  // Records are kept only for the files that hold them (10^7 of them for a deep pipeline).
  sim_options.keep_records =
      vm->count("out") > 0 && (records_scope != Scope::none || trace_scope != Scope::none);
  // The dp_size = 1 reference runs in a child process beside this one's simulation (forked
  // before any thread or SimGrid engine of this process).
  const bool scaling = !(*vm)["no-scaling"].as<bool>() && in.plan.dp_size > 1;
  std::optional<ScalingReference> reference;
  if (scaling) reference.emplace(in, profile, sim_options);
  std::unique_ptr<ForkedChild> uniform = fork_uniform_reference(in, profile, sim_options);
  std::unique_ptr<ForkedChild> synchronous = fork_synchronous_reference(in, profile, sim_options);
  auto wall_start = std::chrono::steady_clock::now();
  // The program's hash (its JSON text through SHA-256) on the other core, following the
  // lowering role by role, then beside the simulation. Declared in this order, the future's
  // destructor (which waits for the thread) runs before the program and the progress go.
  StepProgram program;
  ProgramProgress lowered;
  std::future<std::string> program_sha256;
  if (!(*vm)["no-program-hash"].as<bool>()) {
    program_sha256 = std::async(std::launch::async, [&program, &lowered] {
      run_behind_main_work();  // needed when the simulation has ended
      return write_program_json(program, nullptr, &lowered);
    });
  }
  lower_program_into(program, in.model, in.topology, in.plan, lowered);
  MemoryReport memory = memory_report(program, in.topology);
  if (!memory.fits) {
    std::cerr << "warning: the plan does not fit in memory (peak " << format_bytes(memory.peak_bytes_max)
              << " + reserved " << format_bytes(memory.reserved_bytes) << " > "
              << format_bytes(memory.capacity_bytes) << "); simulating anyway, fits: false\n";
  }
  SimulationOutput sim = simulate_program(program, in.topology, profile, sim_options);
  if (program_sha256.valid()) program.program_sha256 = program_sha256.get();
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
  // Over every device the plan holds (parameter servers too).
  result.mfu = model_flops / sim.step_time_s / (double(program.ranks()) * peak);
  result.hfu = stats.matrix_flops_per_step / sim.step_time_s / (double(program.ranks()) * peak);
  result.memory = memory_to_json(memory);
  // One set of records for both outputs when they hold the same ranks (the default).
  const bool trace_holds_records = trace_scope == records_scope;
  result.ops = trace_holds_records ? take_records(records_scope, sim) : records_of(records_scope, sim);
  result.program_sha256 = program.program_sha256;
  Json envelope = output_envelope("simulate", in);
  result.inputs = envelope["inputs"];
  result.inputs["profile"] = profile_to_json(profile);
  result.inputs["profile_file"] = profile.file;
  result.inputs["profile_origin"] = profile_choice.origin;
  const std::string mode_ran = !sim.auto_mode.applied                  ? mode_name
                               : sim.auto_mode.chosen == SimMode::approx ? "approx"
                                                                         : "fast";
  result.extra = {{"mode", mode_ran},
                  {"mode_requested", mode_name},
                  {"mode_choice", sim.auto_mode.applied ? Json(auto_mode_choice(sim.auto_mode)) : Json(nullptr)},
                  {"mode_detail", sim.mode_description},
                  {"simulated_ranks", sim.simulated_ranks.size()},
                  {"detail_ranks", records_scope == Scope::all              ? sim.detail_ranks
                                   : records_scope == Scope::representative ? sim.representative_ranks
                                                                            : std::vector<int64_t>{}},
                  {"activities", sim.activities},
                  {"simulation_wall_s", wall_s},
                  {"op_records", describe(records_scope)},
                  {"trace_ranks", describe(trace_scope)},
                  {"variability",
                   {{"applied", sim.variability},
                    {"seed", sim_options.seed},
                    {"device_speed_cv", profile.variability.device_speed_cv},
                    {"op_time_cv", profile.variability.op_time_cv}}},
                  {"overlap_interference",
                   {{"applied", sim.overlap_interference},
                    {"sms", profile.overlap.sms},
                    {"collective_ctas_intra_node", profile.overlap.ctas_intra_node},
                    {"collective_ctas_inter_node", profile.overlap.ctas_inter_node}}},
                  {"measured_collective_corrections",
                   {{"collectives", sim.corrected_collectives},
                    {"factor_min", sim.correction_min},
                    {"factor_max", sim.correction_max}}}};
  if (program.moe.num_experts > 0) {
    result.extra["moe"] = {{"routing_draws", sim.moe_draws},
                           {"routing_seed", program.moe.routing_seed},
                           {"load_ratio_mean", sim.moe_load_ratio_mean},
                           {"load_ratio_max", sim.moe_load_ratio_max},
                           {"routed_tokens", sim.moe_routed_tokens},
                           {"dropped_tokens", sim.moe_dropped_tokens}};
  }
  Json heterogeneity;
  if (uniform) {
    heterogeneity = heterogeneity_json(in.topology, sim, uniform->value());
    result.extra["heterogeneity"] = heterogeneity;
  }
  Json async;
  if (synchronous) {
    async = async_json(in.plan, sim, synchronous->value(), double(program.tokens_per_step));
    result.extra["async"] = async;
  }
  const Json energy = energy_json(in.topology, sim, price, program.ranks(), double(program.tokens_per_step));
  result.extra["energy_per_step_j"] = energy["energy_per_step_j"];
  result.extra["energy"] = energy;
  if (!(*vm)["no-scaling"].as<bool>()) {
    if (in.plan.dp_size == 1) {
      result.scaling_efficiency = 1.0;
    } else {
      double per_device = result.tokens_per_s / double(program.ranks());
      result.scaling_efficiency = per_device / reference->tokens_per_s_per_device();
    }
  }

  std::cout << "stepcast simulate: " << model_label(in.model) << " on " << in.topology.name << " ("
            << program.ranks() << " devices), plan " << in.plan.name << dp_size_note(in.plan) << ", mode "
            << (sim.auto_mode.applied ? "(auto) " : "") << sim.mode_description << "\nprofile " << profile_choice.describe() << "\n";
  std::cout << "step time " << result.step_time_s << " s (critical rank " << result.critical_rank
            << "): compute " << result.breakdown.compute_s << ", exposed comm "
            << result.breakdown.exposed_comm_s << ", bubble " << result.breakdown.bubble_s
            << ", optimizer " << result.breakdown.optimizer_s;
  if (sim.variability) {
    std::cout << ", variability " << result.breakdown.variability_s << " (seed " << sim_options.seed << ")";
  }
  if (sim.overlap_interference) {
    std::cout << ", overlap interference " << result.breakdown.overlap_interference_s;
  }
  std::cout << "\n";
  if (program.moe.num_experts > 0) {
    size_t samples = 0;
    for (const auto& layer : program.moe.routing_samples) samples = std::max(samples, layer.size());
    std::cout << "experts: " << sim.moe_draws << " routing draws (seed " << program.moe.routing_seed
              << (samples > 0 ? ", replaying a run's " + std::to_string(samples) + " samples per layer" : "")
              << "), the most loaded ep rank takes " << sim.moe_load_ratio_mean << "× the mean on average (at most "
              << sim.moe_load_ratio_max << "×)";
    if (program.moe.expert_capacity_rows > 0) {
      std::cout << ", " << sim.moe_dropped_tokens << " of " << sim.moe_routed_tokens
                << " routed token copies dropped over capacity";
    }
    std::cout << "\n";
  }
  if (sim.corrected_collectives > 0) {
    std::cout << "measured collective tables corrected " << sim.corrected_collectives
              << " collectives (factor " << sim.correction_min << " to " << sim.correction_max << ")\n";
  }
  std::cout << heterogeneity_summary(heterogeneity) << async_summary(async) << energy_summary(energy);
  std::cout << "tokens/s " << result.tokens_per_s << ", MFU " << result.mfu << ", HFU "
            << result.hfu << ", peak memory " << format_bytes(memory.peak_bytes_max)
            << (memory.fits ? " (fits)" : " (DOES NOT FIT)");
  if (result.scaling_efficiency) std::cout << ", scaling efficiency " << *result.scaling_efficiency;
  std::cout << "\nsimulated " << sim.simulated_ranks.size() << " ranks, " << sim.activities
            << " activities in " << wall_s << " s\n";
  if (sim.auto_mode.applied && sim.auto_mode.chosen == SimMode::approx) {
    std::cout << "note: " << auto_mode_choice(sim.auto_mode) << "\n";
  } else if (sim.tp_fold_declined) {
    std::cout << "note: fast mode simulated every tensor-parallel rank: another group has members on the same "
                 "nodes, sharing their NVLink with the tp collectives; --mode approx folds each tp group into one "
                 "rank"
              << (sim.approx_folds_dp ? " and the data-parallel copies into one" : "") << " (" << sim.approx_ranks << " ranks instead of "
              << sim.simulated_ranks.size() << ", that contention then not simulated: README: `--mode approx`)\n";
  } else if (sim.approx_folds_dp && sim.simulated_ranks.size() >= 256) {
    std::cout << "note: --mode approx would simulate " << sim.approx_ranks << " ranks instead of "
              << sim.simulated_ranks.size()
              << ": one data-parallel copy per stage, its peers' flows mirrored (within 1% of fast mode where "
                 "tested: README: `--mode approx`)\n";
  }
  if (vm->count("out")) {
    std::string dir = (*vm)["out"].as<std::string>();
    const std::string suffix = gzip ? ".json.gz" : ".json";
    // The two files on the two cores.
    std::future<void> trace_written;
    if (trace_scope != Scope::none) {
      trace_written = std::async(std::launch::async, [&] {
        std::vector<OpRecord> own;
        if (!trace_holds_records) own = records_of(trace_scope, sim);
        const std::vector<OpRecord>& traced = trace_holds_records ? result.ops : own;
        write_output_stream(dir, "trace" + suffix,
                            [&](std::ostream& out) { write_chrome_trace(out, program, traced); });
      });
    }
    // The records are of the ops that take time (sim_outcome.cpp): an alloc or a free happens as its deps
    // end, the trace's memory counter shows them, and `compare` joins neither.
    write_output_stream(dir, "prediction" + suffix,
                        [&](std::ostream& out) { write_step_result_json(out, result); });
    if (trace_written.valid()) trace_written.get();
    std::cout << "wrote " << dir << "/prediction" << suffix;
    if (trace_scope != Scope::none) std::cout << " and " << dir << "/trace" << suffix;
    std::cout << (records_scope == Scope::none ? " (no per-op records)" : "") << "\n";
  }
  keep_until_exit(std::move(program));  // its last use: its memory goes with the process
  return 0;
}

}  // namespace stepcast::cli
