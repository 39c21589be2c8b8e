// `stepcast compare-strategies`: the same model, cluster and batch under each sharding strategy
// — pure data parallelism, ZeRO-1, -2, -3, tensor parallelism (tp = devices per node),
// pipeline parallelism — and the best 3D plan: for each, the best plan of that shape by the
// quick estimate among those that fit (else the one with the smallest peak), simulated in a
// child process; memory per GPU by class, step time, exposed communication and volume. The best
// plan's row then takes the fastest of the rows that fit in simulation (take_fastest_simulated).
#include <algorithm>
#include <cmath>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>

#include "child_simulate.hpp"
#include "distributed_simulations.hpp"
#include "commands.hpp"
#include "errors.hpp"
#include "inputs.hpp"
#include "planner_common.hpp"
#include "planner_report.hpp"
#include "search.hpp"
#include "summary.hpp"
#include "units.hpp"

namespace stepcast::cli {

namespace {

struct Strategy {
  std::string name;
  std::function<bool(const Plan&)> member;
};

std::vector<Strategy> strategies(const Topology& topology, const ModelConfig& model) {
  int64_t node = topology.node.devices_per_node;
  auto pure = [](int zero) {
    return [zero](const Plan& p) {
      return p.tp_size == 1 && p.pp_size == 1 && p.cp_size == 1 && p.zero_stage == zero &&
             p.num_distributed_optimizer_instances == 1;
    };
  };
  std::vector<Strategy> out = {
      {"pure DP", pure(0)},
      {"ZeRO-1", pure(1)},
      {"ZeRO-2", pure(2)},
      {"ZeRO-3", pure(3)},
      {"HSDP (ZeRO-3 shards in a node)",
       [](const Plan& p) {
         return p.tp_size == 1 && p.pp_size == 1 && p.cp_size == 1 && p.zero_stage == 3 &&
                p.num_distributed_optimizer_instances > 1;
       }},
      {"TP (tp " + std::to_string(node) + ") + DP",
       [node](const Plan& p) { return p.tp_size == node && p.pp_size == 1 && p.cp_size == 1 && p.zero_stage == 0; }},
      {"PP + DP",
       [](const Plan& p) { return p.tp_size == 1 && p.pp_size > 1 && p.cp_size == 1 && p.zero_stage == 0; }},
      // Context parallelism (the p2p ring) with any tp, pp and ZeRO: flash attention only.
      {"CP (ring) + 3D", [](const Plan& p) { return p.cp_size > 1; }},
  };
  if (model.is_moe()) {
    // Expert layouts, any tp, pp, dp and ZeRO: an expert-parallel group of ep·etp consecutive
    // ranks of a stage (Megatron's order) stays in a node when it has at most a node's devices.
    auto in_node = [node](const Plan& p) { return p.moe.ep_size * p.moe.etp_size <= node; };
    out.push_back({"EP 1 (every rank holds every expert)", [](const Plan& p) { return p.moe.ep_size == 1; }});
    out.push_back({"EP in a node (alltoall)", [in_node](const Plan& p) {
                     return p.moe.ep_size > 1 && in_node(p) && p.moe.dispatcher == MoeDispatcher::alltoall;
                   }});
    out.push_back({"EP across nodes (alltoall)", [in_node](const Plan& p) {
                     return p.moe.ep_size > 1 && !in_node(p) && p.moe.dispatcher == MoeDispatcher::alltoall;
                   }});
    out.push_back({"EP, allgather dispatcher", [](const Plan& p) {
                     return p.moe.ep_size > 1 && p.moe.dispatcher == MoeDispatcher::allgather;
                   }});
    out.push_back({"EP, etp 1 under tp > 1",
                   [](const Plan& p) { return p.moe.ep_size > 1 && p.moe.etp_size == 1 && p.tp_size > 1; }});
  }
  out.push_back({model.is_moe() ? "best (any layout)" : "best 3D", [](const Plan&) { return true; }});
  return out;
}

// The classic trade-off beside pure DP: its chosen plan with data_parallel_mode async (staleness
// 1; the reduction of each step's gradients beside the next step's compute, no overlap_grad_reduce),
// simulated like the others; whether it fits comes from its simulation (one more gradient copy).
void add_async_row(const StrategyRow& pure_dp, const Candidate* pick, Candidate& async_candidate,
                   std::vector<Candidate*>& chosen, std::vector<StrategyRow>& rows) {
  StrategyRow row = pure_dp;
  row.strategy = "pure DP, async (staleness 1)";
  if (!pick || pick->plan.dp_size < 2) {
    row.plan.clear();
    row.note = pick ? "dp 1: nothing to reduce" : pure_dp.note;
    chosen.push_back(nullptr);
    rows.push_back(row);
    return;
  }
  async_candidate = *pick;
  Plan& plan = async_candidate.plan;
  plan.async_staleness = 1;
  plan.overlap_grad_reduce = false;
  plan.name += "-async1";
  row.plan = plan.name;
  row.note = "every gradient applied one step late";
  if (!pick->kept()) row.note += "; " + pure_dp.note;
  chosen.push_back(&async_candidate);
  rows.push_back(row);
}

// The last row (the best plan of any shape) once every row's plan is simulated: the estimate only
// ranked them, so where another row's plan fits and simulates faster, the row takes that plan
// and its figures, saying so. Not the asynchronous row's (its training differs: stale gradients).
bool take_fastest_simulated(std::vector<StrategyRow>& rows, std::vector<Candidate*>& chosen,
                            const Candidate* async_candidate) {
  const size_t last = rows.size() - 1;
  auto usable = [&](size_t i) {
    return chosen[i] && chosen[i] != async_candidate && rows[i].simulated && rows[i].fits;
  };
  size_t fastest = last;
  for (size_t i = 0; i < last; ++i) {
    if (usable(i) && (!usable(fastest) || rows[i].step_time_s < rows[fastest].step_time_s)) fastest = i;
  }
  if (fastest == last) return false;
  const StrategyRow& estimated = rows[last];
  std::ostringstream note;
  note << "the fastest in simulation of the rows above (" << rows[fastest].strategy << "); the quick estimate's best, "
       << (estimated.plan.empty() ? std::string("none") : estimated.plan) << ", ";
  if (!estimated.plan.empty() && estimated.simulated) {
    note << "simulated at " << std::setprecision(4) << estimated.step_time_s << " s"
         << (estimated.fits ? "" : " and did not fit");
  } else {
    note << "was not simulated";
  }
  StrategyRow row = rows[fastest];
  row.strategy = estimated.strategy;
  row.note = note.str();
  rows[last] = row;
  chosen[last] = chosen[fastest];
  return true;
}

// --moe-skew-sweep LIST: Zipf exponents, each >= 0.
std::vector<double> skew_sweep_from(const po::variables_map& vm) {
  std::vector<double> skews;
  if (!vm.count("moe-skew-sweep")) return skews;
  const std::string text = vm["moe-skew-sweep"].as<std::string>();
  std::istringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    double skew = -1;
    try {
      skew = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || !(skew >= 0) || !std::isfinite(skew)) {
      throw InputError("command line: --moe-skew-sweep '" + text + "': '" + item +
                       "' is not a routing skew; valid: comma-separated Zipf exponents >= 0 (0: uniform), "
                       "e.g. 0,0.5,1,1.5");
    }
    skews.push_back(skew);
  }
  if (skews.empty()) {
    throw InputError(
        "command line: --moe-skew-sweep is empty; valid: comma-separated Zipf exponents >= 0, e.g. 0,0.5,1");
  }
  return skews;
}

// Simulates every plan from `jobs` threads, with a progress line; the failures' messages by plan name.
std::map<std::string, std::string> simulate_all(ChildSimulator& simulator, const std::vector<const Plan*>& plans,
                                                const Topology& topology, int jobs, const std::string& label) {
  std::map<std::string, std::string> errors;
  std::mutex errors_mutex;
  parallel_for(
      int64_t(plans.size()), jobs,
      [&](int64_t i) {
        const Plan& plan = *plans[size_t(i)];
        try {
          simulator.simulate(plan.name, plan, topology);
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lock(errors_mutex);
          errors[plan.name] = e.what();
        }
      },
      [&](int64_t done, int64_t total) { std::cerr << "\r" << label << ": " << done << "/" << total << std::flush; });
  std::cerr << "\n";
  return errors;
}

// Each simulated row's plan again under each skew of the sweep (a plan once, under its first
// row's strategy), from `jobs` threads.
std::vector<SkewPoint> simulate_skews(const std::vector<double>& skews, const StrategyReport& report,
                                      const std::vector<Candidate*>& chosen, ChildSimulator& simulator,
                                      const Topology& topology, int jobs) {
  std::vector<SkewPoint> points;
  std::vector<Plan> plans;
  for (size_t i = 0; i < report.rows.size(); ++i) {
    const StrategyRow& row = report.rows[i];
    bool seen = std::any_of(points.begin(), points.end(), [&](const SkewPoint& p) { return p.plan == row.plan; });
    if (!row.simulated || seen) continue;
    for (double skew : skews) {
      SkewPoint point;
      point.strategy = row.strategy;
      point.plan = row.plan;
      point.skew = skew;
      points.push_back(point);
      Plan plan = chosen[i]->plan;
      plan.moe.routing = skew > 0 ? RoutingKind::skew : RoutingKind::uniform;
      plan.moe.skew = skew;
      plan.name = row.plan + "-skew" + fixed(skew, 3);
      plans.push_back(plan);
    }
  }
  std::vector<const Plan*> pointers;
  for (const Plan& plan : plans) pointers.push_back(&plan);
  std::map<std::string, std::string> errors =
      simulate_all(simulator, pointers, topology, jobs, "routing skew: simulate");
  for (size_t i = 0; i < plans.size(); ++i) {
    SkewPoint& point = points[i];
    std::optional<Simulated> sim = simulator.result(plans[i].name);
    if (!sim) {
      point.note = "simulation failed";
      std::cerr << "warning: simulating " << plans[i].name << " failed: " << errors[plans[i].name] << "\n";
      continue;
    }
    point.simulated = true;
    point.step_time_s = sim->step_time_s;
    point.variability_s = sim->variability_s;
    point.load_ratio_mean = sim->moe_load_ratio_mean;
    point.dropped_tokens = sim->moe_dropped_tokens;
    point.peak_bytes = sim->peak_bytes_max;
    point.fits = sim->fits;
  }
  return points;
}

}  // namespace

int run_compare_strategies(int argc, char** argv, SimulationRunner& runner) {
  po::options_description options("stepcast compare-strategies options");
  options.add_options()
      ("model", po::value<std::string>()->required(), "model config JSON (models/*.json)")
      ("topology", po::value<std::string>()->required(), "cluster topology JSON (topologies/*.json)")
      ("nodes", po::value<int>(), "override the topology's num_nodes")
      ("global-batch-size", po::value<int64_t>()->required(), "global batch size (sequences per step)")
      ("max-memory-fraction", po::value<double>()->default_value(1.0),
       "a plan fits when peak + reserved ≤ this fraction of the device's memory")
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
      ("jobs", po::value<int>()->default_value(2), "concurrent simulations (on each rank under mpirun)")
      ("moe-skew-sweep", po::value<std::string>(),
       "mixtures of experts: simulate each row's plan again with its routing skewed by each Zipf exponent of "
       "this list (e.g. 0,0.5,1,1.5): a routing-skew table, and a chart in report.html")
      ("out", po::value<std::string>(), "write DIR/strategies.json, DIR/report.md, DIR/report.html and the table as DIR/strategies.csv");
  add_profile_options(options, "for the estimate and the simulations");
  add_seq_length_option(options);
  add_moe_search_options(options);
  add_sim_mode_option(options);
  auto vm = parse_command_line(
      argc, argv, options,
      "usage: stepcast compare-strategies --model M --topology T --global-batch-size B [--nodes N]\n"
      "                                   [--max-memory-fraction F] [--profile F|roofline]\n"
      "                                   [--allow-profile-mismatch]\n"
      "                                   [--ep LIST] [--etp LIST] [--moe-dispatcher D]\n"
      "                                   [--moe-capacity-factor F] [--moe-routing-skew S | --moe-routing-histogram F]\n"
      "                                   [--moe-skew-sweep LIST]\n"
      "                                   [--sim-mode approx|fast] [--jobs J] [--out DIR]\n"
      "Side by side on the same model, cluster and batch: pure data parallelism (and the same plan\n"
      "asynchronous: data_parallel_mode async, staleness 1), ZeRO-1, -2, -3,\n"
      "tensor parallelism (a node), pipeline parallelism (each with data parallelism over the\n"
      "rest), context parallelism (cp 2-8 over the ring; not with --attention materialized) and the best plan. Each strategy's row is its best plan by the quick estimate\n"
      "among those that fit (else the one with the smallest peak), simulated (--mode approx):\n"
      "memory per GPU by class, step time, exposed communication, bubble, communication volume\n"
      "per rank, and whether it fits. The best plan's row then takes another row's plan where that\n"
      "one fits and simulates faster (not the asynchronous one), saying so.\n"
      "A mixture of experts adds expert-layout rows (EP 1, EP in a\n"
      "node, EP across nodes, the allgather dispatcher, etp 1 under tp) with the estimate's\n"
      "dispatch and combine time, its routing imbalance and the simulation's variation;\n"
      "--moe-skew-sweep simulates each row's plan again under each routing skew of a list." +
          std::string(kSpreadHelp));
  if (!vm) return 0;
  claim_out_option(*vm, "compare-strategies");
  std::optional<int> nodes;
  if (vm->count("nodes")) nodes = (*vm)["nodes"].as<int>();
  ModelConfig model = load_model_option(*vm);
  refuse_moe_options_on_dense(*vm, model);
  Topology topology = load_topology(input_file(*vm, "topology"), nodes);
  SearchSpace space = search_space_from(*vm, model);
  check_routing_histogram(space.moe, "command line", "--moe-routing-histogram", model);
  const std::vector<double> skews = skew_sweep_from(*vm);
  // The CP row at any sequence length (the plain search tries cp from 16k tokens on).
  if (space.attention_impl == AttentionImpl::flash) space.context_parallel_sizes = {1, 2, 4, 8};
  int jobs = (*vm)["jobs"].as<int>();
  if (space.global_batch_size < 1 || jobs < 1 ||
      !(space.max_memory_fraction > 0 && space.max_memory_fraction <= 1)) {
    throw InputError("command line: valid: --global-batch-size >= 1, --jobs >= 1, "
                     "--max-memory-fraction in (0, 1]");
  }
  check_cluster_memory(model, topology);
  ProfileChoice profile_choice = profile_from(*vm, topology);
  const DeviceProfile& profile = profile_choice.profile;
  std::cout << "stepcast compare-strategies: " << model_label(model) << " on " << topology.name << " ("
            << topology.num_devices() << " devices), global batch " << space.global_batch_size
            << ", profile " << profile_choice.describe() << "\n"
            << "  " << attention_and_dropout(space, dropout_from(*vm, model)) << "\n";

  std::vector<Candidate> candidates = enumerate_candidates(model, topology, space);
  int64_t valid = 0;
  for (const auto& c : candidates) valid += c.kept();
  if (valid == 0) refuse_no_valid_plan(candidates, model, topology, space);
  ComputeCostModel cost_model(topology.node.device, candidates.front().plan.param_dtype, profile,
                              topology.file, to_string(model.norm),
                              candidates.front().plan.cross_entropy_loss_fusion);
  if (space.fp8.enabled()) cost_model.use_fp8(topology.node.device, topology.file);
  check_candidates(candidates, model, topology, space, cost_model, jobs,
                   progress_printer("memory and estimate"));

  StrategyReport report;
  report.sim_mode = sim_mode_from(*vm);
  report.title = "stepcast compare-strategies: " + model.name + " on " +
                 std::to_string(topology.num_devices()) + " × " + topology.node.device.name +
                 ", global batch " + std::to_string(space.global_batch_size);
  report.capacity_bytes = space.max_memory_fraction * topology.node.device.memory_bytes;
  std::vector<Candidate*> chosen;
  Candidate async_candidate;  // the pure-DP plan, asynchronous (add_async_row)
  ProbeCache probes(model, topology);
  for (const Strategy& s : strategies(topology, model)) {
    StrategyRow row;
    row.strategy = s.name;
    row.moe = model.is_moe();
    Candidate* best = nullptr;
    Candidate* smallest = nullptr;
    std::map<std::string, int64_t> reasons;
    for (auto& c : candidates) {
      if (!s.member(c.plan)) continue;
      if (c.kept()) {
        if (!best || c.estimate.step_time_s < best->estimate.step_time_s) best = &c;
      } else if (c.pruned == "does not fit in memory") {
        if (!smallest || c.peak_bytes_max < smallest->peak_bytes_max) smallest = &c;
      } else {
        ++reasons[c.pruned];
      }
    }
    Candidate* pick = best ? best : smallest;
    if (pick) {
      row.plan = pick->plan.name;
      row.fits = pick->kept();
      if (!row.fits) {
        row.note = "smallest peak of the strategy; " + pick->pruned_detail;
        pick->estimate = candidate_estimate(pick->plan, model, topology, probes, cost_model);
      }
      for (const auto& [kind, b] : pick->estimate.comm_bytes_per_rank_max) row.comm_volume_bytes += b;
      row.ep_comm_estimate_s = pick->estimate.ep_comm_s;
      row.imbalance_estimate_s = pick->estimate.expert_imbalance_s;
    } else {
      row.note = "no valid plan";
      int64_t most = 0;
      for (const auto& [reason, n] : reasons) {
        if (n > most) most = n, row.note = "no valid plan: " + reason;
      }
    }
    chosen.push_back(pick);
    report.rows.push_back(row);
    if (s.name == "pure DP") add_async_row(row, pick, async_candidate, chosen, report.rows);
  }
  // Simulate each distinct chosen plan, `jobs` at a time.
  const std::string& sim_mode = report.sim_mode;
  ChildSimulator simulator(model, child_profile_arguments(profile_choice, *vm), runner, jobs, sim_mode);
  std::vector<const Plan*> distinct;
  for (Candidate* c : chosen) {
    if (c && std::find(distinct.begin(), distinct.end(), &c->plan) == distinct.end()) distinct.push_back(&c->plan);
  }
  std::map<std::string, std::string> errors =
      simulate_all(simulator, distinct, topology, runner.threads(jobs), "simulate --mode " + sim_mode);
  for (size_t i = 0; i < report.rows.size(); ++i) {
    StrategyRow& row = report.rows[i];
    if (!chosen[i]) continue;
    auto sim = simulator.result(row.plan);
    if (!sim) {
      row.note += (row.note.empty() ? "" : "; ") + std::string("simulation failed");
      row.peak_bytes = chosen[i]->peak_bytes_max;
      continue;
    }
    row.simulated = true;
    if (chosen[i] == &async_candidate) row.fits = sim->memory.value("fits", false);  // its own gradient copies
    row.step_time_s = sim->step_time_s;
    row.exposed_comm_s = sim->exposed_comm_s;
    row.bubble_s = sim->bubble_s;
    row.mfu = sim->mfu;
    row.energy_j = sim->energy_per_step_j;
    row.variability_s = sim->variability_s;
    const Json* peak_rank = nullptr;
    for (const auto& r : sim->memory.at("ranks")) {
      if (!peak_rank || r.at("peak_bytes").get<double>() > peak_rank->at("peak_bytes").get<double>()) {
        peak_rank = &r;
      }
    }
    if (peak_rank) {
      row.weights_bytes = peak_rank->at("memory_weights_bytes").get<double>();
      row.grads_bytes = peak_rank->at("memory_grads_bytes").get<double>();
      row.optimizer_bytes = peak_rank->at("memory_optimizer_bytes").get<double>();
      row.activations_bytes = peak_rank->at("memory_activations_bytes").get<double>();
      row.workspace_bytes = peak_rank->at("memory_workspace_bytes").get<double>();
      row.comm_bytes = peak_rank->at("memory_comm_bytes").get<double>();
      row.placement_bytes = peak_rank->at("memory_placement_bytes").get<double>();
      row.runtime_bytes = peak_rank->at("memory_runtime_bytes").get<double>();
      row.peak_bytes = peak_rank->at("peak_bytes").get<double>();
    }
  }
  for (const auto& [name, e] : errors) std::cerr << "warning: simulating " << name << " failed: " << e << "\n";
  const bool best_replaced = take_fastest_simulated(report.rows, chosen, &async_candidate);
  if (!skews.empty()) report.skew_points = simulate_skews(skews, report, chosen, simulator, topology, runner.threads(jobs));

  // Columns as wide as their longest entry.
  size_t name_width = 9, plan_width = 5;
  for (const auto& row : report.rows) {
    name_width = std::max(name_width, row.strategy.size() + 2);
    plan_width = std::max(plan_width, row.plan.size() + 2);
  }
  const int nw = int(name_width), pw = int(plan_width);
  std::cout << "\n" << std::left << std::setw(nw) << "strategy" << std::setw(pw) << "plan"
            << std::right << std::setw(5) << "fits" << std::setw(11) << "weights" << std::setw(11)
            << "grads" << std::setw(11) << "optim" << std::setw(11) << "activ" << std::setw(11)
            << "ws+comm" << std::setw(11) << "peak" << std::setw(9) << "step s" << std::setw(9)
            << "exp.comm" << std::setw(9) << "bubble" << std::setw(12) << "comm/rank"
            << (topology.node.device.has_power() ? "      J/step" : "")
            << (model.is_moe() ? "  a2a est  imb est  variat." : "") << "\n";
  for (const auto& row : report.rows) {
    std::cout << std::left << std::setw(nw) << row.strategy << std::setw(pw)
              << (row.plan.empty() ? "-" : row.plan) << std::right;
    if (row.plan.empty()) {
      std::cout << "  " << row.note << "\n";
      continue;
    }
    std::cout << std::setw(5) << (row.fits ? "yes" : "no");
    for (double b : {row.weights_bytes, row.grads_bytes, row.optimizer_bytes, row.activations_bytes,
                     row.workspace_bytes + row.comm_bytes, row.peak_bytes}) {
      std::cout << std::setw(11) << format_bytes(b);
    }
    if (row.simulated) {
      std::cout << std::setw(9) << fixed(row.step_time_s, 3) << std::setw(9)
                << fixed(row.exposed_comm_s, 3) << std::setw(9) << fixed(row.bubble_s, 3);
    } else {
      std::cout << std::setw(27) << "(not simulated)";
    }
    std::cout << std::setw(12) << format_bytes(row.comm_volume_bytes);
    if (row.energy_j) std::cout << std::setw(12) << fixed(*row.energy_j, 0);
    if (row.moe) {
      std::cout << std::setw(9) << fixed(row.ep_comm_estimate_s, 3) << std::setw(9)
                << fixed(row.imbalance_estimate_s, 3) << std::setw(9)
                << (row.simulated ? fixed(row.variability_s, 3) : std::string("-"));
    }
    std::cout << "\n";
  }
  if (best_replaced) std::cout << report.rows.back().strategy << ": " << report.rows.back().note << "\n";
  if (model.is_moe()) {
    std::cout << "a2a est: the quick estimate's dispatch and combine collectives (exposed); imb est: the expert "
                 "GEMMs on the busiest ep rank beyond the ops as lowered (expected rows per expert); variat.: the "
                 "simulation's routing draws and "
                 "run-to-run variation (critical rank)\n";
  }
  if (!report.skew_points.empty()) {
    std::cout << "\nrouting skew (moe_routing \"skew\", expert e's share ∝ 1/(e+1)^skew):\n"
              << std::left << std::setw(nw) << "strategy" << std::right << std::setw(7) << "skew" << std::setw(10)
              << "step s" << std::setw(9) << "vs first" << std::setw(11) << "load ratio" << std::setw(10)
              << "dropped" << std::setw(11) << "peak" << "\n";
    std::map<std::string, double> first;
    for (const SkewPoint& p : report.skew_points) {
      std::cout << std::left << std::setw(nw) << p.strategy << std::right << std::setw(7) << fixed(p.skew, 2);
      if (!p.simulated) {
        std::cout << "  " << p.note << "\n";
        continue;
      }
      first.emplace(p.plan, p.step_time_s);
      std::cout << std::setw(10) << fixed(p.step_time_s, 3) << std::setw(8)
                << fixed(100 * (p.step_time_s / first.at(p.plan) - 1), 1) << "%" << std::setw(11)
                << fixed(p.load_ratio_mean, 2) << std::setw(10) << fixed(p.dropped_tokens, 0) << std::setw(11)
                << format_bytes(p.peak_bytes) << (p.fits ? "" : "  (does not fit)") << "\n";
    }
  }
  std::cout << "memory by class at the peak rank; weights..ws+comm exclude the arena's placement (simulated plans)"
               " and the runtime allowance ("
            << format_bytes(topology.node.device.runtime_allowance_bytes) << "), included in peak\n";
  if (vm->count("out")) {
    std::string dir = (*vm)["out"].as<std::string>();
    Json out = planner_envelope("compare-strategies", model, topology, report.sim_mode,
                                {{"global_batch_size", space.global_batch_size},
                                 {"max_memory_fraction", space.max_memory_fraction},
                                 {"profile", profile_json(profile_choice)}});
    Json rows = Json::array();
    for (const auto& r : report.rows) {
      // A row not simulated (nothing fits) has no timing: null, as the routing-skew rows write it.
      auto simulated_or_null = [&](double v) { return r.simulated ? Json(v) : Json(nullptr); };
      rows.push_back({{"strategy", r.strategy}, {"plan", r.plan}, {"fits", r.fits}, {"note", r.note},
                      {"simulated", r.simulated},
                      {"memory_weights_bytes", r.weights_bytes}, {"memory_grads_bytes", r.grads_bytes},
                      {"memory_optimizer_bytes", r.optimizer_bytes},
                      {"memory_activations_bytes", r.activations_bytes},
                      {"memory_workspace_bytes", r.workspace_bytes}, {"memory_comm_bytes", r.comm_bytes},
                      {"memory_placement_bytes", r.placement_bytes},
                      {"memory_runtime_bytes", r.runtime_bytes}, {"peak_bytes", r.peak_bytes},
                      {"step_time_s", simulated_or_null(r.step_time_s)},
                      {"exposed_comm_s", simulated_or_null(r.exposed_comm_s)},
                      {"bubble_s", simulated_or_null(r.bubble_s)}, {"comm_bytes_per_rank", r.comm_volume_bytes},
                      {"mfu", simulated_or_null(r.mfu)},
                      {"ep_comm_estimate_s", r.moe ? Json(r.ep_comm_estimate_s) : Json(nullptr)},
                      {"expert_imbalance_estimate_s", r.moe ? Json(r.imbalance_estimate_s) : Json(nullptr)},
                      {"variability_s", simulated_or_null(r.variability_s)},
                      {"energy_per_step_j", r.energy_j ? Json(*r.energy_j) : Json(nullptr)}});
    }
    out["strategies"] = rows;
    if (!report.skew_points.empty()) {
      Json skew_rows = Json::array();
      for (const SkewPoint& p : report.skew_points) {
        skew_rows.push_back({{"strategy", p.strategy}, {"plan", p.plan}, {"skew", p.skew}, {"simulated", p.simulated},
                             {"note", p.note},
                             {"step_time_s", p.simulated ? Json(p.step_time_s) : Json(nullptr)},
                             {"variability_s", p.simulated ? Json(p.variability_s) : Json(nullptr)},
                             {"load_ratio_mean", p.simulated ? Json(p.load_ratio_mean) : Json(nullptr)},
                             {"dropped_tokens", p.simulated ? Json(p.dropped_tokens) : Json(nullptr)},
                             {"peak_bytes", p.simulated ? Json(p.peak_bytes) : Json(nullptr)},
                             {"fits", p.fits}});
      }
      out["routing_skew"] = skew_rows;
    }
    write_output_file(dir, "strategies.json", out.dump(2) + "\n");
    write_strategy_report(dir, report);
    std::cout << "wrote " << dir << "/strategies.json, report.md, report.html, strategies.csv"
              << (report.skew_points.empty() ? "" : ", routing-skew.csv") << "\n";
  }
  return 0;
}

}  // namespace stepcast::cli
