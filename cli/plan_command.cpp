// `stepcast plan`: searches every plan of a model on a cluster (plans/search.hpp), re-times the
// most promising with `simulate --mode approx` in child processes (one SimGrid engine per process,
// two at a time) and writes the best as plan files, with Megatron-LM's arguments, plans.json
// (every candidate, pruned ones with their reason) and a report (Markdown and HTML).
#include <algorithm>
#include <chrono>
#include <limits>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "child_simulate.hpp"
#include "pruned_reasons.hpp"
#include "distributed_simulations.hpp"
#include "commands.hpp"
#include "energy.hpp"
#include "errors.hpp"
#include "inputs.hpp"
#include "plan_heterogeneous.hpp"
#include "plan_replica_balance.hpp"
#include "planner_common.hpp"
#include "planner_report.hpp"
#include "search.hpp"
#include "simulate_extras.hpp"
#include "deepspeed_export.hpp"
#include "summary.hpp"
#include "torchtitan_export.hpp"

namespace stepcast::cli {

namespace {

// `simulated_peak`: simulate's peak of a plan it ran (> 0), which adds the arena's placement to
// the live peak the screen walked (memory.hpp).
Json candidate_json(const Candidate& c, const ModelConfig& model, double simulated_peak = 0) {
  Json j;
  j["name"] = c.plan.name;
  j["plan"] = plan_to_json(c.plan);
  j["megatron_runnable"] = megatron_arguments(c.plan, model).runnable;
  j["estimate_step_time_s"] = c.estimate.step_time_s;
  j["estimate"] = {{"compute_s", c.estimate.compute_s},     {"tp_comm_s", c.estimate.tp_comm_s},
                   {"pp_comm_s", c.estimate.pp_comm_s},     {"bubble_s", c.estimate.bubble_s},
                   {"dp_comm_s", c.estimate.dp_comm_s},     {"optimizer_s", c.estimate.optimizer_s},
                   {"critical_stage", c.estimate.critical_stage}};
  j["step_time_s"] = c.step_time_s ? *c.step_time_s : c.estimate.step_time_s;
  j["step_time_source"] = c.step_time_s ? "simulate" : "quick_estimate";
  if (!c.evaluation_error.empty()) j["evaluation_error"] = c.evaluation_error;
  if (simulated_peak > 0) {
    j["peak_bytes_max"] = simulated_peak;
  } else if (c.peak_exact) {
    j["peak_bytes_max"] = c.peak_bytes_max;
  } else {
    j["peak_bytes_lower_bound"] = c.peak_lower_bytes;
    j["peak_bytes_upper_bound"] = c.peak_upper_bytes;
  }
  j["capacity_bytes"] = c.capacity_bytes;
  j["comm_bytes_per_rank_max"] = c.estimate.comm_bytes_per_rank_max;
  return j;
}

Json pruned_json(const Candidate& c) {
  Json j;
  j["name"] = c.plan.name;
  j["reason"] = c.pruned;
  j["detail"] = c.pruned_detail;
  if (c.pruned == "does not fit in memory") {
    j[c.peak_is_lower_bound ? "peak_bytes_lower_bound" : "peak_bytes_max"] = c.peak_bytes_max;
  }
  return j;
}

// With three or more plans simulated: how the quick estimate ranks them against simulate.
void print_estimate_quality(const std::vector<Candidate>& ranked) {
  std::vector<double> estimate, simulated;
  const Candidate* best = nullptr;
  const Candidate* first = nullptr;  // the estimate's first among the simulated
  for (const auto& c : ranked) {
    if (!c.step_time_s) continue;
    estimate.push_back(c.estimate.step_time_s);
    simulated.push_back(*c.step_time_s);
    if (!best || *c.step_time_s < *best->step_time_s) best = &c;
    if (!first || c.estimate.step_time_s < first->estimate.step_time_s) first = &c;
  }
  if (estimate.size() < 3) return;
  double rho = spearman_rank_correlation(estimate, simulated);
  std::cout << "estimate against simulate over " << estimate.size()
            << " simulated plans: Spearman rank correlation " << fixed(rho, 3)
            << "; the estimate's first (" << first->plan.name << ") simulates at "
            << fixed(*first->step_time_s, 4) << " s, simulate's best (" << best->plan.name
            << ") at " << fixed(*best->step_time_s, 4) << " s: "
            << (first == best ? "the same plan"
                              : "within " + fixed(100 * (*first->step_time_s / *best->step_time_s - 1), 2) + "%")
            << "\n";
}

}  // namespace

int run_plan(int argc, char** argv, SimulationRunner& runner) {
  po::options_description options("stepcast plan options");
  options.add_options()
      ("model", po::value<std::string>(), "model config JSON (models/*.json), or a shipped name")
      ("topology", po::value<std::string>()->required(), "cluster topology JSON (topologies/*.json)")
      ("from-megatron", po::value<std::string>(),
       "Megatron-LM arguments or a launch script holding them, instead of --model: the model, and "
       "the global batch, attention and dropout unless given here; the launch line's own plan is "
       "ranked too (launch-line)")
      ("nodes", po::value<int>(), "override the topology's num_nodes")
      ("global-batch-size", po::value<int64_t>(), "global batch size (sequences per step; required without --from-megatron)")
      ("top", po::value<int64_t>()->default_value(5), "plans to report and write")
      ("evaluate", po::value<std::string>(), "plans to re-simulate, best first: a count or 'all' (default 2·top)")
      ("evaluate-stride", po::value<int64_t>()->default_value(0),
       "also re-simulate every S-th plan after those (a sample over the whole ranking, to study "
       "the estimate)")
      ("simulate-budget-s", po::value<double>()->default_value(0),
       "start no re-simulation after this many seconds of the command (0: no limit); plans "
       "left keep their estimate")
      ("objective", po::value<std::string>()->default_value("time"),
       "time (fastest first), memory (smallest peak per device first), energy (fewest joules per "
       "step first: needs the topology's device power) or cost (cheapest step first: needs "
       "--price-per-gpu-hour; every candidate uses every device, so it is the time order)")
      ("max-memory-fraction", po::value<double>()->default_value(1.0),
       "a plan fits when peak + reserved ≤ this fraction of the device's memory")
      ("include-gpipe", po::bool_switch(), "also search the gpipe schedule")
      ("heterogeneous", po::bool_switch(),
       "on a topology of unequal devices: search each pipeline plan also with its layers per stage in "
       "proportion to its stages' speeds, and report the gain over the even split")
      ("megatron-runnable", po::bool_switch(),
       "search only plans Megatron-LM can run as simulated (the others are pruned with the "
       "reason their NN-NAME.megatron.txt would give)")
      ("fp8", po::value<std::string>()->default_value("none"),
       "fp8 of every candidate: none, e4m3 or hybrid (FP8 linear layers; needs a device with an FP8 peak)")
      ("fp8-recipe", po::value<std::string>()->default_value("delayed"),
       "fp8_recipe of every candidate with --fp8: delayed (Megatron's default), tensorwise (current scaling), "
       "mxfp8 (an E8M0 scale per 32 elements; a device with mxfp8) or blockwise (an fp32 scale per 128 elements, "
       "weights per 128x128 tile; a device with fp8_blockwise)")
      ("fp8-param-gather", po::bool_switch(),
       "candidates with sharded optimizer state (ZeRO-1, 2 or 3) keep their layers' linear weights in FP8 only "
       "and gather them so (Megatron-LM's --fp8-param-gather; delayed or tensorwise recipes)")
      ("attention", po::value<std::string>()->default_value("flash"), kAttentionHelp)
      ("dropout", po::value<double>(), kDropoutHelp)
      ("jobs", po::value<int>()->default_value(2), "worker threads and concurrent simulations (on each rank under mpirun)")
      ("out", po::value<std::string>(),
       "write DIR/plans.json, DIR/NN-NAME.json plan files, their Megatron-LM arguments and "
       "DIR/report.md, DIR/report.html, and the report's tables as DIR/best-plans.csv and DIR/pruned.csv");
  add_profile_options(options, "for the estimate and the simulations");
  add_price_options(options);
  add_seq_length_option(options);
  add_moe_search_options(options);
  add_sim_mode_option(options);
  auto vm = parse_command_line(
      argc, argv, options,
      "usage: stepcast plan --model M --topology T --global-batch-size B [--nodes N] [--top K]\n"
      "       stepcast plan --from-megatron 'ARGS'|FILE --topology T [--global-batch-size B] ...\n"
      "                     [--evaluate E|all] [--evaluate-stride S] [--simulate-budget-s T]\n"
      "                     [--objective time|memory|energy|cost] [--max-memory-fraction F]\n"
      "                     [--price-per-gpu-hour AMOUNT CURRENCY]\n"
      "                     [--attention materialized|flash] [--fp8 none|e4m3|hybrid]\n"
      "                     [--fp8-recipe delayed|tensorwise|mxfp8|blockwise] [--fp8-param-gather]\n"
      "                     [--dropout P]\n"
      "                     [--include-gpipe] [--heterogeneous]\n"
      "                     [--ep LIST] [--etp LIST] [--moe-dispatcher alltoall|allgather|both]\n"
      "                     [--moe-capacity-factor F] [--moe-routing-skew S | --moe-routing-histogram F]\n"
      "                     [--megatron-runnable]\n"
      "                     [--profile F|roofline] [--allow-profile-mismatch] [--jobs J]\n"
      "                     [--sim-mode approx|fast] [--out DIR]\n"
      "Enumerates every plan (tp, pp, dp, ZeRO stage, hybrid sharding in a node, micro batch,\n"
      "schedule and virtual stages, recompute, sequence parallelism; with flash attention and\n"
      "sequences of 16,384 tokens or more, context parallelism over the p2p ring, allgather and\n"
      "a2a; for a mixture of experts, the expert-parallel and expert-tensor-parallel sizes and\n"
      "the token dispatcher) using every device, prunes\n"
      "what cannot run with the reason (counts per reason), ranks the rest with a quick\n"
      "estimate and re-simulates the\n"
      "best E (simulate --mode approx, or --sim-mode fast, in child processes). Memory\n"
      "verdicts are `stepcast\n"
      "memory`'s: decided from per-stage bounds, walking the stages near the limit (a mixture\n"
      "of experts: from its persistent bytes, then walking every stage). Each plan\n"
      "written has its Megatron-LM launch line (NN-NAME.megatron.txt); plans.json says per plan\n"
      "whether Megatron-LM can run it as simulated (megatron_runnable), and --megatron-runnable\n"
      "prunes those it cannot; and its TorchTitan job config (NN-NAME.torchtitan.toml,\n"
      "torchtitan_runnable and torchtitan_notes in plans.json); and its DeepSpeed config\n"
      "(NN-NAME.deepspeed.json: batch sizes, precision, ZeRO; deepspeed_runnable, deepspeed_notes).\n"
      "--heterogeneous (a topology with \"heterogeneity\"): beside each\n"
      "pipeline plan the search holds its layers per stage by its stages' speeds (NAME-hb; a\n"
      "stage's speed: its slowest device), reports each balanced plan's gain over its even twin,\n"
      "and tries simulated even plans part of the way (-hb2, -hb4) where the balanced split did\n"
      "not fit. The estimate slows every stage by its slowest device. Beside each data-parallel\n"
      "plan (ZeRO-0 or 1, no experts) whose replicas differ in speed, the search also holds its\n"
      "microbatches split over the replicas by their speeds (NAME-hm, microbatches_per_replica;\n"
      "a replica's speed: its slowest device), reports its gain over equal replicas, and tries\n"
      "the split on simulated plans without one (adopted where it fits and is faster)." +
          std::string(kSpreadHelp));
  if (!vm) return 0;
  claim_out_option(*vm, "plan");
  auto wall_start = std::chrono::steady_clock::now();
  std::optional<int> nodes;
  if (vm->count("nodes")) nodes = (*vm)["nodes"].as<int>();
  std::optional<MegatronInputs> imported;
  if (vm->count("from-megatron")) imported = megatron_inputs(*vm);
  if (!imported && !vm->count("model")) {
    throw InputError("command line: the option '--model' is required but missing (or --from-megatron ARGS|FILE) (see --help)");
  }
  ModelConfig model = imported ? imported->model : load_model_option(*vm);
  refuse_moe_options_on_dense(*vm, model);
  Topology topology = load_topology(input_file(*vm, "topology"), nodes);
  SearchSpace space = search_space_from(*vm, model);
  std::string dropout_source = dropout_from(*vm, model);
  check_routing_histogram(space.moe, "command line", "--moe-routing-histogram", model);
  if (imported) {  // the launch line's batch, attention and dropout, unless given here
    if (imported->world.size > 0) resolve_dp_size(imported->plan, imported->world.size, imported->world.from);
    resolve_dp_size(imported->plan, topology.num_devices(), topology.file);
    if (!vm->count("global-batch-size")) space.global_batch_size = imported->plan.global_batch_size;
    if ((*vm)["attention"].defaulted()) space.attention_impl = imported->plan.attention_impl;
    if (!vm->count("dropout")) {
      space.dropout = imported->plan.dropout;
      dropout_source = "the launch line";
    }
  } else if (!vm->count("global-batch-size")) {
    throw InputError("command line: the option '--global-batch-size' is required but missing (see --help)");
  }
  space.megatron_runnable_only = (*vm)["megatron-runnable"].as<bool>();
  int64_t top = (*vm)["top"].as<int64_t>();
  int64_t evaluate_count = 2 * top;
  if (vm->count("evaluate")) {
    std::string text = (*vm)["evaluate"].as<std::string>();
    bool ok = text == "all";
    if (ok) {
      evaluate_count = std::numeric_limits<int64_t>::max();
    } else {
      try {
        size_t used = 0;
        evaluate_count = std::stoll(text, &used);
        ok = used == text.size();
      } catch (const std::exception&) {  // not a number, or beyond a long long
      }
    }
    if (!ok) throw InputError("command line: --evaluate '" + text + "': valid: a count >= 0 or 'all'");
  }
  int64_t evaluate_stride = (*vm)["evaluate-stride"].as<int64_t>();
  double budget_s = (*vm)["simulate-budget-s"].as<double>();
  int jobs = (*vm)["jobs"].as<int>();
  const std::string sim_mode = sim_mode_from(*vm);
  std::string objective_name = (*vm)["objective"].as<std::string>();
  if (objective_name != "time" && objective_name != "memory" && objective_name != "energy" &&
      objective_name != "cost") {
    throw InputError("command line: --objective '" + objective_name + "': valid: time, memory, energy, cost");
  }
  const std::optional<Price> price = price_from(*vm);
  if (objective_name == "cost" && !price) {
    throw InputError("command line: --objective cost without a price; valid: --price-per-gpu-hour AMOUNT CURRENCY "
                     "(e.g. 2.5 USD), or another --objective");
  }
  const DeviceSpec& device = topology.node.device;
  if (objective_name == "energy" && !device.has_power()) {
    throw_input_error(topology.file, "node.device.power_busy_w", "absent",
                      "--objective energy needs the device's power while busy and idle",
                      "node.device.power_idle_w, power_busy_w and power_source (watts, with a source), or "
                      "another --objective");
  }
  if (space.global_batch_size < 1) {
    throw InputError("command line: --global-batch-size " + std::to_string(space.global_batch_size) + ": valid: >= 1");
  }
  if (!(space.max_memory_fraction > 0 && space.max_memory_fraction <= 1)) {
    throw InputError("command line: --max-memory-fraction: valid: in (0, 1]");
  }
  if (!(space.dropout >= 0 && space.dropout < 1)) {
    throw InputError("command line: --dropout: valid: in [0, 1)");
  }
  if (top < 1 || jobs < 1 || evaluate_count < 0 || evaluate_stride < 0 || budget_s < 0) {
    throw InputError("command line: --top and --jobs must be >= 1, --evaluate, --evaluate-stride "
                     "and --simulate-budget-s >= 0");
  }
  const bool heterogeneous = (*vm)["heterogeneous"].as<bool>();
  if (heterogeneous && topology.heterogeneity.empty()) {
    throw_input_error(topology.file, "heterogeneity", "absent", "--heterogeneous balances plans for unequal devices",
                      "a \"heterogeneity\" object (node_groups, node or device compute_speed_factor), or plan "
                      "without --heterogeneous");
  }
  check_cluster_memory(model, topology);
  ProfileChoice profile_choice = profile_from(*vm, topology);
  const DeviceProfile& profile = profile_choice.profile;

  std::cout << "stepcast plan: " << model_label(model) << " on " << topology.name << " ("
            << topology.num_nodes << " nodes × " << topology.node.devices_per_node << " = "
            << topology.num_devices() << " devices), global batch " << space.global_batch_size
            << ", profile " << profile_choice.describe() << "\n"
            << "  " << attention_and_dropout(space, dropout_source) << "\n";
  std::vector<Candidate> candidates = enumerate_candidates(model, topology, space);
  if (heterogeneous) {
    add_speed_balanced_candidates(candidates, model, topology);
    add_replica_balanced_candidates(candidates, model, topology);  // the -hb plans' too
  }
  // The launch line's own plan, searched and ranked beside the others ("launch-line").
  if (imported) {
    Candidate own;
    own.plan = imported->plan;
    own.plan.name = "launch-line";
    try {
      validate_plan(own.plan, model, topology, imported->world);
    } catch (const InputError& e) {
      own.pruned = "the launch line's plan: invalid";
      own.pruned_detail = e.what();
    }
    // The estimate costs every candidate at the search's one dtype.
    if (own.kept() && !candidates.empty() && own.plan.param_dtype != candidates.front().plan.param_dtype) {
      own.pruned = "the launch line's plan: another dtype than the search's";
      own.pruned_detail = std::string("its ") + to_string(own.plan.param_dtype) + " against the search's " +
                          to_string(candidates.front().plan.param_dtype) + "; simulate --from-megatron times it";
    }
    candidates.push_back(own);
  }
  int64_t valid = 0;
  for (const auto& c : candidates) valid += c.kept();
  std::cout << candidates.size() << " candidates, " << valid << " pass validation\n";
  if (valid == 0) refuse_no_valid_plan(candidates, model, topology, space);
  ComputeCostModel cost_model(topology.node.device, candidates.front().plan.param_dtype, profile, topology.file,
                              to_string(model.norm), candidates.front().plan.cross_entropy_loss_fusion);
  if (space.fp8.enabled()) cost_model.use_fp8(topology.node.device, topology.file);
  check_candidates(candidates, model, topology, space, cost_model, jobs,
                   progress_printer("memory and estimate"));
  auto counts = pruned_counts(candidates);
  const auto reasons_in_words = pruned_reasons_in_words(candidates);
  const auto counts_in_words = pruned_counts_in_words(candidates);
  int64_t fitting = 0, walked_stages = 0, walked_candidates = 0;
  for (const auto& c : candidates) {
    fitting += c.kept();
    walked_stages += c.walked_stages;
    walked_candidates += c.walked_stages > 0;
  }
  std::cout << fitting << " plans fit; pruned:\n";
  // Each reason with the range of every value it took, and its first plan's own message as the
  // example.
  std::map<std::string, const Candidate*> example;
  for (const auto& c : candidates) {
    if (!c.kept() && !example.count(c.pruned)) example[c.pruned] = &c;
  }
  for (const auto& [reason, n] : counts) {
    std::cout << "  " << std::setw(6) << n << "  " << reasons_in_words.at(reason) << "\n";
    const Candidate* e = example.at(reason);
    if (e->pruned_detail != reason && !e->pruned_detail.empty()) {
      bool named = e->pruned_detail.rfind("candidate ", 0) == 0;  // validation's messages name it
      std::cout << "          e.g. " << (named ? "" : e->plan.name + ": ") << e->pruned_detail << "\n";
    }
  }
  std::cout << "memory: " << valid - walked_candidates << " verdicts from the bounds alone, "
            << walked_candidates << " after walking " << walked_stages << " stages\n";
  if (fitting == 0) refuse_no_fit(candidates, model, topology, space);

  std::vector<Candidate> pruned;
  for (auto& c : candidates) {
    if (!c.kept()) pruned.push_back(c);
  }
  Objective objective = objective_name == "memory" ? Objective::memory
                        : objective_name == "energy" ? Objective::energy
                                                     : Objective::time;  // cost: the time order
  const int64_t devices = topology.num_devices();
  if (device.has_power()) {
    for (auto& c : candidates) {
      if (c.kept()) c.estimate_energy_j = estimate_energy_j(c.estimate, devices, device.power_idle_w, device.power_busy_w);
    }
  }
  if (objective == Objective::memory) {
    resolve_smallest_peaks(candidates, std::max(top, evaluate_count), model, topology, jobs);
  }
  auto search_end = std::chrono::steady_clock::now();
  ChildSimulator simulator(model, child_profile_arguments(profile_choice, *vm), runner, jobs, sim_mode);
  const std::string over_budget = "not simulated: over --simulate-budget-s";
  Evaluator evaluate = [&](const Plan& plan) {
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
    if (budget_s > 0 && elapsed > budget_s) throw std::runtime_error(over_budget);
    return simulator.simulate(plan.name, plan, topology).step_time_s;
  };
  std::vector<Candidate> ranked =
      search(std::move(candidates), evaluate, evaluate_count, runner.threads(jobs),
             progress_printer("simulate --mode " + sim_mode), objective, evaluate_stride);
  auto simulate_end = std::chrono::steady_clock::now();
  for (auto& c : ranked) {
    if (auto sim = simulator.result(c.plan.name); sim && c.step_time_s) c.energy_per_step_j = sim->energy_per_step_j;
  }
  // Simulate's peak of a plan it ran (the arena's placement on top of the screen's live peak,
  // memory.hpp); 0 for a plan it did not run.
  auto simulated_peak = [&](const Candidate& c) -> double {
    const auto sim = simulator.result(c.plan.name);
    return sim ? std::max(0.0, sim->peak_bytes_max) : 0.0;
  };
  // The peak a row shows: simulate's where it ran the plan, the screen's otherwise.
  auto shown_peak = [&](const Candidate& c) {
    const double simulated = simulated_peak(c);
    return simulated > 0 ? simulated : c.peak_bytes_max;
  };
  if (objective == Objective::energy) rank_by_energy(ranked);
  print_estimate_quality(ranked);
  // A plan simulate finds too big (the screen leaves the arena's placement to it) ranks after every
  // other, in its order; the warning below names it.
  std::stable_partition(ranked.begin(), ranked.end(), [&](const Candidate& c) {
    const auto sim = simulator.result(c.plan.name);
    return !sim || sim->fits;
  });
  if (imported) {
    for (size_t i = 0; i < ranked.size(); ++i) {
      if (ranked[i].plan.name != "launch-line") continue;
      const Candidate& c = ranked[i];
      std::cout << "the launch line's plan (launch-line) ranks " << i + 1 << " of " << ranked.size()
                << ": " << fixed(c.step_time_s ? *c.step_time_s : c.estimate.step_time_s, 3) << " s ("
                << (c.step_time_s ? "simulated" : "estimated") << "), the first "
                << fixed(ranked[0].step_time_s ? *ranked[0].step_time_s : ranked[0].estimate.step_time_s, 3)
                << " s\n";
    }
    for (const Candidate& c : pruned) {
      if (c.plan.name == "launch-line") std::cout << "the launch line's plan is pruned: " << c.pruned_detail << "\n";
    }
  }
  std::vector<BalancedPlan> balanced;
  std::vector<ReplicaBalance> replicas;
  if (heterogeneous) {
    balanced = balance_for_speed(ranked, model, topology, simulator, runner.threads(jobs));
    print_balance(balanced);
    replicas = balance_replicas(ranked, model, topology, simulator, runner.threads(jobs));
    print_replica_balance(replicas);
  }
  int64_t shown = std::min<int64_t>(top, int64_t(ranked.size()));
  for (int64_t i = 0; i < shown; ++i) resolve_peak(ranked[size_t(i)], model, topology);

  std::cout << "\n" << std::left << std::setw(44) << "plan" << std::right << std::setw(11)
            << "step s" << std::setw(6) << "src" << std::setw(12) << "tokens/s" << std::setw(7)
            << "MFU" << std::setw(11) << "peak" << std::setw(11) << "headroom"
            << "  comm per rank (tp / dp / pp / other)"
            << (device.has_power() ? "  J/step" : "") << (price ? "  " + price->currency + "/step" : "") << "\n";
  const double allowed = space.max_memory_fraction * topology.node.device.memory_bytes;
  std::vector<PlanReportRow> rows;
  Json top_json = Json::array();
  std::string out_dir = vm->count("out") ? (*vm)["out"].as<std::string>() : "";
  for (int64_t i = 0; i < shown; ++i) {
    const Candidate& c = ranked[size_t(i)];
    double step = c.step_time_s ? *c.step_time_s : c.estimate.step_time_s;
    PlanReportRow row;
    row.rank = i + 1;
    row.name = c.plan.name;
    row.step_time_s = step;
    row.simulated = c.step_time_s.has_value();
    row.estimate_s = c.estimate.step_time_s;
    row.tokens_per_s = tokens_per_step(model, c.plan) / step;
    row.mfu = model_flops_utilization(model, topology, c.plan, step);
    row.peak_bytes = shown_peak(c);
    row.headroom_bytes = allowed - row.peak_bytes - c.reserved_bytes;
    if (device.has_power()) row.energy_j = c.energy_per_step_j ? *c.energy_per_step_j : c.estimate_energy_j;
    if (price) row.cost = cost_per_step(price->per_gpu_hour, devices, step);
    for (const auto& [kind, b] : c.estimate.comm_bytes_per_rank_max) {
      if (kind == "tp") row.comm_tp_bytes = b;
      else if (kind == "dp" || kind == "dp_shard" || kind == "dp_replica") row.comm_dp_bytes += b;
      else if (kind == "pp") row.comm_pp_bytes = b;
      else row.comm_other_bytes += b;
    }
    std::cout << std::left << std::setw(44) << c.plan.name << std::right << std::setw(11)
              << fixed(step, 3) << std::setw(6) << (row.simulated ? "sim" : "est") << std::setw(12)
              << fixed(row.tokens_per_s, 0) << std::setw(7) << fixed(row.mfu, 3) << std::setw(11)
              << format_bytes(row.peak_bytes) << std::setw(11) << format_bytes(row.headroom_bytes)
              << "  " << format_bytes(row.comm_tp_bytes) << " / " << format_bytes(row.comm_dp_bytes)
              << " / " << format_bytes(row.comm_pp_bytes) << " / "
              << format_bytes(row.comm_other_bytes);
    if (row.energy_j) std::cout << "  " << fixed(*row.energy_j, 0);
    if (row.cost) std::cout << "  " << fixed(*row.cost, 4);
    std::cout << "\n";
    Json j = candidate_json(c, model, simulated_peak(c));
    j["rank"] = i + 1;
    j["tokens_per_s"] = row.tokens_per_s;
    j["mfu"] = row.mfu;
    j["headroom_bytes"] = row.headroom_bytes;
    if (row.energy_j) {
      j["energy_per_step_j"] = *row.energy_j;
      j["energy_source"] = c.energy_per_step_j ? "simulate" : "estimate";
    }
    if (row.cost) {
      j["cost_per_step"] = *row.cost;
      j["currency"] = price->currency;
    }
    MegatronArguments megatron = megatron_arguments(c.plan, model);
    j["megatron_arguments"] = megatron.arguments;
    j["megatron_notes"] = megatron.notes;
    TorchTitanConfig titan = torchtitan_config(c.plan, model);
    j["torchtitan_runnable"] = titan.runnable;
    j["torchtitan_notes"] = titan.notes;
    DeepSpeedConfig deepspeed = deepspeed_config(c.plan, model);
    j["deepspeed_runnable"] = deepspeed.runnable;
    j["deepspeed_notes"] = deepspeed.notes;
    if (!out_dir.empty()) {
      std::ostringstream stem;
      stem << std::setw(2) << std::setfill('0') << i + 1 << "-" << c.plan.name;
      write_output_file(out_dir, stem.str() + ".json", plan_to_json(c.plan).dump(2) + "\n");
      std::ostringstream args;
      args << "# Megatron-LM arguments for " << c.plan.name << "\n";
      if (!megatron.runnable) args << "# NOT RUNNABLE as simulated: see the notes\n";
      for (const auto& n : megatron.notes) args << "# note: " << n << "\n";
      for (size_t k = 0; k < megatron.arguments.size(); ++k) {
        args << megatron.arguments[k] << (k + 1 < megatron.arguments.size() ? " \\\n" : "\n");
      }
      write_output_file(out_dir, stem.str() + ".megatron.txt", args.str());
      std::ostringstream toml;
      toml << "# TorchTitan job config for " << c.plan.name << " (torchtitan/config/job_config.py)\n";
      if (!titan.runnable) toml << "# NOT RUNNABLE as simulated: see the notes\n";
      for (const auto& n : titan.notes) toml << "# note: " << n << "\n";
      write_output_file(out_dir, stem.str() + ".torchtitan.toml", toml.str() + titan.toml);
      // The config alone (DeepSpeed reads no comments): its notes are plans.json's.
      write_output_file(out_dir, stem.str() + ".deepspeed.json", deepspeed.config.dump(2) + "\n");
      j["plan_file"] = stem.str() + ".json";
      row.plan_file = stem.str() + ".json";
    }
    rows.push_back(row);
    top_json.push_back(j);
  }
  for (const auto& c : ranked) {
    if (!c.evaluation_error.empty() && c.evaluation_error != over_budget) {
      std::cerr << "warning: simulating " << c.plan.name << " failed: " << c.evaluation_error << "\n";
    }
    if (auto sim = simulator.result(c.plan.name); sim && !sim->fits) {
      std::cerr << "warning: " << c.plan.name << ": simulate says it does not fit in memory\n";
    }
  }
  double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  double search_s = std::chrono::duration<double>(search_end - wall_start).count();
  double simulate_s = std::chrono::duration<double>(simulate_end - search_end).count();
  int64_t simulated = 0;
  for (const auto& c : ranked) simulated += c.step_time_s.has_value();
  std::cout << "searched " << ranked.size() + pruned.size() << " candidates in " << fixed(search_s, 1)
            << " s (enumerate, memory, estimate); " << simulated << " re-simulated in "
            << fixed(simulate_s, 1) << " s; " << fixed(wall_s, 1) << " s in all\n";
  if (!out_dir.empty()) {
    Json out = planner_envelope("plan", model, topology, sim_mode,
                    {{"global_batch_size", space.global_batch_size},
                     {"objective", objective_name},
                     {"price_per_gpu_hour", price ? Json(price->per_gpu_hour) : Json(nullptr)},
                     {"currency", price ? Json(price->currency) : Json(nullptr)},
                     {"max_memory_fraction", space.max_memory_fraction},
                     {"attention_impl", to_string(space.attention_impl)},
                     {"dropout", space.dropout},
                     {"dropout_from", dropout_source},
                     {"megatron_runnable_only", space.megatron_runnable_only},
                     {"profile", profile_json(profile_choice)}});
    out["top"] = top_json;
    if (heterogeneous) {
      out["heterogeneous"] = balance_json(balanced);
      out["heterogeneous_replicas"] = replica_balance_json(replicas);
    }
    Json all = Json::array();
    for (const auto& c : ranked) all.push_back(candidate_json(c, model, simulated_peak(c)));
    out["plans"] = all;
    Json pruned_all = Json::array();
    for (const auto& c : pruned) pruned_all.push_back(pruned_json(c));
    out["pruned"] = pruned_all;
    out["pruned_counts"] = counts;
    out["memory_walked_stages"] = walked_stages;
    out["search_wall_s"] = search_s;
    out["simulate_wall_s"] = simulate_s;
    out["wall_s"] = wall_s;
    write_output_file(out_dir, "plans.json", out.dump(1) + "\n");
    PlanReport report;
    report.sim_mode = sim_mode;
    report.title = "stepcast plan: " + model.name + " on " + std::to_string(topology.num_devices()) +
                   " × " + topology.node.device.name + ", global batch " +
                   std::to_string(space.global_batch_size);
    report.objective = objective_name;
    report.currency = price ? price->currency : "";
    report.candidates = int64_t(ranked.size() + pruned.size());
    report.pruned_counts = counts_in_words;
    report.rows = rows;
    for (const auto& c : ranked) {
      report.all_estimates_s.push_back(c.estimate.step_time_s);
      report.all_peaks_bytes.push_back(shown_peak(c));
      report.all_names.push_back(c.plan.name);
    }
    report.capacity_bytes = allowed;
    report.wall_s = wall_s;
    write_plan_report(out_dir, report);
    std::cout << "wrote " << out_dir << "/plans.json, report.md, report.html, best-plans.csv, pruned.csv and " << top_json.size()
              << " plan files\n";
  }
  return 0;
}

}  // namespace stepcast::cli
