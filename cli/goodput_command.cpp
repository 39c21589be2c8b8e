// `stepcast goodput`: time to train N tokens when the job fails and restarts from checkpoints.
// The step time comes from the simulator (or --step-time-s), the checkpoint's size from the
// program's persistent state, its write and read time from the topology's storage figures; the
// failure model itself is plans/goodput.hpp. Writes goodput.json and prints a summary.
#include <cmath>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "checkpoint_size.hpp"
#include "commands.hpp"
#include "errors.hpp"
#include "goodput.hpp"
#include "inputs.hpp"
#include "lower.hpp"
#include "memory.hpp"
#include "program_json.hpp"
#include "simulator.hpp"
#include "summary.hpp"

namespace stepcast::cli {

namespace {

// Default restart overhead: Llama 3 405B ran with a job mean time to interrupt of about 2.5 h at
// about 90% effective training time (Dubey et al. 2024, section 3.3.4), which puts the time lost
// per interruption near 16.7 min (glennklockwood.com/garden/availability): lost work and
// checkpoints included, so an upper bound on a restart alone.
constexpr double kDefaultRestartS = 1000;

[[noreturn]] void bad_option(const std::string& option, const std::string& value, const std::string& valid) {
  throw InputError("command line: --" + option + " " + value + ": valid: " + valid);
}

std::string number_text(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

std::string duration_text(double s) {
  if (!std::isfinite(s)) return "never (failures come faster than the run can save)";
  std::ostringstream out;
  out << std::fixed << std::setprecision(2);
  if (s >= 86400) out << s / 86400 << " days";
  else if (s >= 3600) out << s / 3600 << " h";
  else out << s << " s";
  return out.str();
}

Json time_json(const GoodputTime& g, double step_time_s) {
  return {{"interval_steps", g.interval_steps},
          {"interval_s", double(g.interval_steps) * step_time_s},
          {"time_to_train_s", g.time_to_train_s},
          {"compute_s", g.compute_s},
          {"checkpoint_s", g.checkpoint_s},
          {"lost_work_s", g.lost_s},
          {"restart_reload_s", g.restart_s},
          {"failures", g.failures},
          {"checkpoints", g.checkpoints},
          {"goodput", std::isfinite(g.time_to_train_s) ? g.compute_s / g.time_to_train_s : 0.0}};
}

std::vector<int64_t> parse_step_list(const std::string& text, int64_t steps) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < 0 || v >= steps) {
      bad_option("failure-at-steps", "'" + printable_excerpt(text, 60) + "'",
                 "steps s (0-based, 0 <= s < " + std::to_string(steps) +
                     ", the run's steps) separated by commas: a failure as step s begins");
    }
    out.push_back(v);
  }
  if (out.empty()) bad_option("failure-at-steps", "''", "steps separated by commas");
  return out;
}

}  // namespace

int run_goodput(int argc, char** argv) {
  po::options_description options("stepcast goodput options");
  add_input_options(options);
  add_profile_options(options, "that costs each op of the simulated step");
  options.add_options()
      ("tokens", po::value<double>(), "tokens to train (e.g. 300e9)")
      ("mtbf-hours", po::value<double>(),
       "mean time between failures of ONE NODE, hours; the job's is this / the nodes the plan "
       "occupies (any node's failure stops the job)")
      ("job-mtbf-hours", po::value<double>(),
       "mean time between failures of the WHOLE JOB, hours (a measured interruption rate: Llama 3 "
       "405B, 54 days · 24 / 419 unexpected interruptions = 3.09 h on 16,384 H100)")
      ("checkpoint-every", po::value<std::string>()->default_value("auto"),
       "auto (the interval of least expected time, from the sweep) or a number of steps")
      ("async-checkpoint", po::bool_switch(),
       "asynchronous saves: the step loop stops only to copy the state to host memory "
       "(storage.device_to_host_bandwidth_bytes_per_s); the write runs behind the steps")
      ("restart-s", po::value<double>()->default_value(kDefaultRestartS),
       "seconds from a failure to the job running again, reload excluded (default: about Llama 3's "
       "16.7 min lost per interruption, an upper bound; see README)")
      ("storage-gbps", po::value<double>(),
       "storage bandwidth per node in GB/s (10^9 bytes/s), read and write, no aggregate limit: "
       "replaces the topology's `storage`")
      ("step-time-s", po::value<double>(), "step time in seconds (a measurement): no simulation")
      ("mode", po::value<std::string>()->default_value("fast"), "simulate's --mode: fast or approx")
      ("monte-carlo", po::value<int64_t>(), "RUNS runs with seeded exponential failure draws: mean and spread")
      ("seed", po::value<uint64_t>()->default_value(1), "seed of the Monte-Carlo draws")
      ("failure-at-steps", po::value<std::string>(),
       "S1,S2,...: failures as those steps (0-based) begin, each once: the time of that run")
      ("out", po::value<std::string>(), "write DIR/goodput.json");
  auto vm = parse_command_line(
      argc, argv, options,
      "usage: stepcast goodput --model M --topology T --plan P [--nodes N] --tokens N\n"
      "                        (--mtbf-hours H | --job-mtbf-hours H)\n"
      "                        [--checkpoint-every auto|STEPS] [--async-checkpoint]\n"
      "                        [--restart-s S] [--storage-gbps G] [--step-time-s S]\n"
      "                        [--monte-carlo RUNS [--seed S]] [--failure-at-steps S1,S2,...]\n"
      "                        [--out DIR]\n"
      "Predicts the time to train N tokens with failures: the step time (simulated, nominal: no\n"
      "run-to-run variability), checkpoints of the plan's state (every rank's weights and\n"
      "optimizer state) to the topology's storage, work lost to each failure (since the last\n"
      "durable checkpoint: half an interval on average), and a restart plus a reload after each.\n"
      "Failures are exponential with the job's MTBF. Synchronous saves: the exact expectation\n"
      "(Daly 2006); asynchronous: first order. `auto` sweeps intervals (x2^(1/4) from 1 step) and\n"
      "takes the fastest; Young's and Daly's intervals are printed beside it. --monte-carlo draws\n"
      "RUNS runs (seeded: the same seed, the same result); --failure-at-steps predicts one run\n"
      "with failures at those steps (what scripts/train-with-restarts.sh does for real).");
  if (!vm) return 0;
  claim_out_option(*vm, "goodput");
  if (!vm->count("tokens")) throw InputError("command line: --tokens is required: the tokens to train (e.g. 300e9)");
  const double tokens = (*vm)["tokens"].as<double>();
  if (!(tokens > 0) || !std::isfinite(tokens)) bad_option("tokens", number_text(tokens), "tokens to train, > 0");
  if (vm->count("mtbf-hours") == vm->count("job-mtbf-hours")) {
    throw InputError("command line: give exactly one of --mtbf-hours (per node) and --job-mtbf-hours (the whole job)");
  }
  const bool per_node = vm->count("mtbf-hours") > 0;
  const std::string mtbf_option = per_node ? "mtbf-hours" : "job-mtbf-hours";
  const double mtbf_hours = (*vm)[mtbf_option].as<double>();
  if (!(mtbf_hours > 0) || !std::isfinite(mtbf_hours)) bad_option(mtbf_option, number_text(mtbf_hours), "hours > 0");
  const double restart_s = (*vm)["restart-s"].as<double>();
  if (!(restart_s >= 0) || !std::isfinite(restart_s)) bad_option("restart-s", number_text(restart_s), "seconds >= 0");
  const std::string every = (*vm)["checkpoint-every"].as<std::string>();
  int64_t every_steps = 0;  // 0: auto
  if (every != "auto") {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(every, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != every.size() || v < 1) {
      bad_option("checkpoint-every", "'" + printable_excerpt(every, 40) + "'", "auto, or a number of steps >= 1");
    }
    every_steps = v;
  }
  const std::string mode = (*vm)["mode"].as<std::string>();
  if (mode != "fast" && mode != "approx") bad_option("mode", "'" + printable_excerpt(mode, 40) + "'", "fast, approx");
  for (const char* option : {"storage-gbps", "step-time-s"}) {
    if (!vm->count(option)) continue;
    double v = (*vm)[option].as<double>();
    if (!(v > 0) || !std::isfinite(v)) bad_option(option, number_text(v), "a number > 0");
  }
  if (vm->count("monte-carlo") && (*vm)["monte-carlo"].as<int64_t>() < 1) {
    bad_option("monte-carlo", std::to_string((*vm)["monte-carlo"].as<int64_t>()), "runs >= 1");
  }

  Inputs in = load_inputs(*vm);
  StorageSpec storage;
  if (vm->count("storage-gbps")) {
    double bandwidth = (*vm)["storage-gbps"].as<double>() * 1e9;
    storage.node_write_bandwidth_bytes_per_s = storage.node_read_bandwidth_bytes_per_s = bandwidth;
    if (in.topology.storage) storage.device_to_host_bandwidth_bytes_per_s = in.topology.storage->device_to_host_bandwidth_bytes_per_s;
    storage.source = "--storage-gbps";
  } else if (in.topology.storage) {
    storage = *in.topology.storage;
  } else {
    throw InputError(in.topology.file + ": no key 'storage' (the checkpoint file system's bandwidth, "
                     "with its source): add one (see topologies/dgx-a100-80gb.json) or give --storage-gbps G "
                     "(GB/s per node)");
  }
  const bool async = (*vm)["async-checkpoint"].as<bool>();
  if (async && !(storage.device_to_host_bandwidth_bytes_per_s > 0)) {
    throw InputError(in.topology.file + ": --async-checkpoint needs storage.device_to_host_bandwidth_bytes_per_s "
                     "(the copy of a rank's state to host memory, which the steps wait for)");
  }

  StepProgram program = lower_program(in.model, in.topology, in.plan);
  hash_program(program);
  MemoryReport memory = memory_report(program, in.topology);
  if (!memory.fits) std::cerr << "warning: the plan does not fit in memory (see `stepcast memory`); predicting anyway\n";
  std::string step_source;
  double step_time_s = 0;
  if (vm->count("step-time-s")) {
    step_time_s = (*vm)["step-time-s"].as<double>();
    step_source = "--step-time-s";
  } else {
    ProfileChoice profile = profile_from(*vm, in.topology);
    SimulateOptions sim;
    sim.allow_profile_mismatch = (*vm)["allow-profile-mismatch"].as<bool>();
    sim.variability = false;
    sim.mode = mode == "approx" ? SimMode::approx : SimMode::fast;
    step_time_s = simulate_program(program, in.topology, profile.profile, sim).step_time_s;
    step_source = "simulator, mode " + mode + ", no variability, profile " + profile.describe();
  }

  GoodputInputs g;
  g.steps = int64_t(std::ceil(tokens / double(program.tokens_per_step)));
  g.step_time_s = step_time_s;
  CheckpointSize size = checkpoint_size(program);
  CheckpointTimes io = checkpoint_times(size, storage);
  g.checkpoint_write_s = io.write_s;
  g.checkpoint_snapshot_s = io.snapshot_s;
  g.async_checkpoint = async;
  g.restart_s = restart_s;
  g.reload_s = io.read_s;
  // Per node: the nodes the plan occupies (ranks fill nodes in order), any of which stops the job.
  const int64_t nodes_used = (program.ranks() + program.devices_per_node - 1) / program.devices_per_node;
  g.job_mtbf_s = mtbf_hours * 3600 / (per_node ? double(nodes_used) : 1.0);

  // δ of Young and Daly: what a checkpoint stops the steps for.
  const double cost_s = async ? g.checkpoint_snapshot_s : g.checkpoint_write_s;
  double young_s = young_interval_s(cost_s, g.job_mtbf_s), daly_s = daly_interval_s(cost_s, g.job_mtbf_s);
  Json table = Json::array();
  GoodputTime best;
  best.time_to_train_s = INFINITY;
  for (int64_t k : interval_grid(g.steps)) {
    GoodputTime e = expected_time(g, k);
    table.push_back(time_json(e, step_time_s));
    if (e.time_to_train_s < best.time_to_train_s) best = e;
  }
  const int64_t k = every_steps > 0 ? std::min(every_steps, g.steps)
                                    : (std::isfinite(best.time_to_train_s) ? best.interval_steps
                                                                           : interval_steps_of(daly_s, step_time_s, g.steps));
  GoodputTime chosen = expected_time(g, k);
  GoodputTime ideal = time_without_failures(g, k);

  Json out = output_envelope("goodput", in);
  out["tokens"] = tokens;
  out["tokens_per_step"] = program.tokens_per_step;
  out["steps"] = g.steps;
  out["step_time_s"] = step_time_s;
  out["step_time_source"] = step_source;
  out["program_sha256"] = program.program_sha256;
  out["checkpoint"] = {{"rank_bytes_max", size.rank_bytes_max}, {"node_bytes_max", size.node_bytes_max},
                       {"total_bytes", size.total_bytes}, {"write_s", io.write_s}, {"read_s", io.read_s},
                       {"snapshot_s", io.snapshot_s}, {"asynchronous", async},
                       {"what", "every rank's persistent weights and optimizer state (stepcast run's checkpoint files)"},
                       {"storage", {{"node_write_bandwidth_bytes_per_s", storage.node_write_bandwidth_bytes_per_s},
                                    {"node_read_bandwidth_bytes_per_s", storage.node_read_bandwidth_bytes_per_s},
                                    {"aggregate_write_bandwidth_bytes_per_s", storage.aggregate_write_bandwidth_bytes_per_s},
                                    {"aggregate_read_bandwidth_bytes_per_s", storage.aggregate_read_bandwidth_bytes_per_s},
                                    {"device_to_host_bandwidth_bytes_per_s", storage.device_to_host_bandwidth_bytes_per_s},
                                    {"source", storage.source}}}};
  out["failures_model"] = {{"mtbf_option", "--" + mtbf_option}, {"mtbf_hours", mtbf_hours},
                           {"meaning", per_node ? "per node; the job's is mtbf / the nodes the plan occupies" : "the whole job's"},
                           {"nodes_used", nodes_used},
                           {"job_mtbf_s", g.job_mtbf_s}, {"distribution", "exponential"},
                           {"restart_s", restart_s},
                           {"restart_source", (*vm)["restart-s"].defaulted() ? "default (README: restart overhead)" : "--restart-s"},
                           {"expectation", async ? "first order" : "exact for exponential failures (Daly 2006)"}};
  out["interval"] = {{"chosen_steps", k}, {"chosen_s", double(k) * step_time_s},
                     {"chosen_by", every_steps > 0 ? "--checkpoint-every" : "auto: the sweep's least expected time"},
                     {"checkpoint_cost_s", cost_s}, {"young_s", young_s},
                     {"young_steps", interval_steps_of(young_s, step_time_s, g.steps)},
                     {"daly_s", daly_s}, {"daly_steps", interval_steps_of(daly_s, step_time_s, g.steps)},
                     {"sweep_best_steps", best.interval_steps}};
  Json parts = time_json(chosen, step_time_s);
  for (auto it = parts.begin(); it != parts.end(); ++it) out[it.key()] = it.value();
  out["time_to_train_without_failures_s"] = ideal.time_to_train_s;
  out["interval_table"] = table;

  std::cout << "stepcast goodput: " << model_label(in.model) << " on " << in.topology.name << " ("
            << program.ranks() << " devices), plan " << in.plan.name << "\n"
            << "step time " << step_time_s << " s (" << step_source << "); " << g.steps << " steps of "
            << program.tokens_per_step << " tokens for " << tokens << " tokens\n"
            << "checkpoint: " << format_bytes(size.total_bytes) << " in all (node max "
            << format_bytes(size.node_bytes_max) << "), write " << io.write_s << " s, read " << io.read_s << " s"
            << (async ? ", snapshot " + number_text(io.snapshot_s) + " s (asynchronous)" : std::string(", synchronous"))
            << "\njob MTBF " << g.job_mtbf_s / 3600 << " h (" << (per_node ? "per-node MTBF / " + std::to_string(nodes_used) + " nodes" : std::string("given for the job"))
            << "), restart " << restart_s << " s + reload " << io.read_s << " s\n"
            << "interval: " << k << " steps (" << duration_text(double(k) * step_time_s) << ", "
            << (every_steps > 0 ? "--checkpoint-every" : "auto") << "); Young " << duration_text(young_s) << ", Daly "
            << duration_text(daly_s) << "\n"
            << "time to train " << duration_text(chosen.time_to_train_s) << " (without failures "
            << duration_text(ideal.time_to_train_s) << "): compute " << duration_text(chosen.compute_s)
            << ", checkpoints " << duration_text(chosen.checkpoint_s) << ", lost work " << duration_text(chosen.lost_s)
            << ", restarts " << duration_text(chosen.restart_s) << "; " << chosen.failures << " failures expected, goodput "
            << (std::isfinite(chosen.time_to_train_s) ? chosen.compute_s / chosen.time_to_train_s : 0.0) << "\n";

  const std::optional<std::string> no_draws =
      vm->count("monte-carlo") ? monte_carlo_refusal(g, k) : std::optional<std::string>();
  if (no_draws) {
    out["monte_carlo"] = {{"runs", (*vm)["monte-carlo"].as<int64_t>()}, {"seed", (*vm)["seed"].as<uint64_t>()},
                          {"draws", "none"}, {"skipped", *no_draws}};
    std::cout << "Monte-Carlo: " << *no_draws << "\n";
  } else if (vm->count("monte-carlo")) {
    MonteCarloResult mc = monte_carlo(g, k, (*vm)["monte-carlo"].as<int64_t>(), (*vm)["seed"].as<uint64_t>());
    out["monte_carlo"] = {{"runs", mc.runs}, {"seed", mc.seed}, {"draws", "exponential inter-arrival times, "
                          "seeded 64-bit Mersenne Twister in plain C++ (not SimGrid profiles)"},
                          {"mean_s", mc.mean_s}, {"stddev_s", mc.stddev_s}, {"min_s", mc.min_s}, {"p05_s", mc.p05_s},
                          {"p50_s", mc.p50_s}, {"p95_s", mc.p95_s}, {"max_s", mc.max_s},
                          {"mean_failures", mc.mean_failures}, {"mean_parts", time_json(mc.mean_parts, step_time_s)}};
    std::cout << "Monte-Carlo (" << mc.runs << " runs, seed " << mc.seed << "): mean " << duration_text(mc.mean_s)
              << ", stddev " << duration_text(mc.stddev_s) << ", 5-95% " << duration_text(mc.p05_s) << " to "
              << duration_text(mc.p95_s) << ", " << mc.mean_failures << " failures on average\n";
  }
  if (vm->count("failure-at-steps")) {
    std::vector<int64_t> at = parse_step_list((*vm)["failure-at-steps"].as<std::string>(), g.steps);
    ScriptedRun run = scripted_failures(g, k, at);
    out["scripted"] = {{"failure_at_steps", at}, {"steps_run", run.steps_run},
                       {"resumed_from_steps", run.resumed_from_steps}, {"time", time_json(run.time, step_time_s)}};
    std::cout << "failures at steps";
    for (int64_t s : at) std::cout << " " << s;
    std::cout << ": " << duration_text(run.time.time_to_train_s) << ", " << run.steps_run << " steps run, resumed from";
    for (int64_t s : run.resumed_from_steps) std::cout << " " << s;
    std::cout << "\n";
  }
  if (vm->count("out")) {
    std::string dir = (*vm)["out"].as<std::string>();
    write_output_file(dir, "goodput.json", out.dump(2) + "\n");
    std::cout << "wrote " << dir << "/goodput.json\n";
  }
  return 0;
}

}  // namespace stepcast::cli
