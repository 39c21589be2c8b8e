// `stepcast scale`: one plan over several node counts. Strong scaling keeps the global batch
// and grows dp_size with the devices; --weak keeps the batch per dp rank (the global batch
// grows with dp_size). Each point is simulated (--sim-mode, approx by default) in a child process. Speedup is
// the throughput ratio against the smallest run, efficiency = speedup · devices₀ / devices.
// Amdahl's serial fraction f is the least-squares fit of 1/speedup = f + (1 − f)·x with
// x = devices₀ / devices: f = Σ(1 − x)(1/S − x) / Σ(1 − x)² (closed form of the 1-parameter
// linear fit; f < 0 means superlinear points).
#include <cmath>
#include <iomanip>
#include <iostream>
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

std::vector<int64_t> parse_node_list(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    long long v = 0;
    bool ok = false;
    try {
      size_t used = 0;
      v = std::stoll(item, &used);
      ok = used == item.size() && v >= 1;
    } catch (const std::exception&) {  // not a number, or beyond a long long
    }
    if (!ok) {
      throw InputError("command line: --nodes '" + text + "': '" + item +
                       "' is not a node count; valid: a comma-separated list of integers >= 1, "
                       "e.g. 1,2,4,8");
    }
    out.push_back(v);
  }
  if (out.empty()) throw InputError("command line: --nodes is empty; valid: e.g. 1,2,4,8");
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace

int run_scale(int argc, char** argv, SimulationRunner& runner) {
  po::options_description options("stepcast scale options");
  options.add_options()
      ("model", po::value<std::string>()->required(), "model config JSON (models/*.json)")
      ("topology", po::value<std::string>()->required(), "cluster topology JSON (topologies/*.json)")
      ("plan", po::value<std::string>()->required(), "plan JSON: tp_size, pp_size, micro batch, ... (dp_size follows the devices)")
      ("nodes", po::value<std::string>()->required(), "node counts, e.g. 1,2,4,8")
      ("weak", po::bool_switch(), "weak scaling: keep the batch per dp rank (default: strong, keep the global batch)")
      ("jobs", po::value<int>()->default_value(2), "concurrent simulations (on each rank under mpirun)")
      ("out", po::value<std::string>(), "write DIR/scale.json, DIR/report.md, DIR/report.html and the table as DIR/scale.csv");
  add_profile_options(options, "for the simulations");
  add_seq_length_option(options);
  add_sim_mode_option(options);
  auto vm = parse_command_line(
      argc, argv, options,
      "usage: stepcast scale --model M --topology T --plan P --nodes 1,2,4,... [--weak]\n"
      "                      [--profile F|roofline] [--allow-profile-mismatch] [--jobs J]\n"
      "                      [--sim-mode approx|fast] [--out DIR]\n"
      "Simulates the plan on each node count (dp_size = devices / (tp_size · pp_size ·\n"
      "context_parallel_size), the parameter servers' devices left out): strong\n"
      "scaling at the plan's global batch, or weak scaling (--weak) at its batch per dp rank.\n"
      "Prints step time, speedup and efficiency against the smallest run, the Amdahl serial\n"
      "fraction that fits them (least squares), and the terms of the step that grow (exposed\n"
      "communication, bubble)." +
          std::string(kSpreadHelp));
  if (!vm) return 0;
  claim_out_option(*vm, "scale");
  ModelConfig model = load_model_option(*vm);
  std::string topology_file = input_file(*vm, "topology");
  Plan base = load_plan(input_file(*vm, "plan"));
  std::vector<int64_t> node_counts = parse_node_list((*vm)["nodes"].as<std::string>());
  bool weak = (*vm)["weak"].as<bool>();
  int jobs = (*vm)["jobs"].as<int>();
  if (jobs < 1) throw InputError("command line: --jobs: valid: >= 1");
  if (weak && base.global_batch_size % base.dp_size != 0) {
    throw_input_error(base.file, "global_batch_size", std::to_string(base.global_batch_size),
                      "--weak keeps the batch per dp rank, and dp_size = " +
                          std::to_string(base.dp_size) + " does not divide it",
                      "a multiple of dp_size");
  }
  ProfileChoice profile_choice = profile_from(*vm, load_topology(topology_file));

  ScaleReport report;
  report.sim_mode = sim_mode_from(*vm);
  report.weak = weak;
  report.title = std::string("stepcast scale (") + (weak ? "weak" : "strong") + "): " + model.name +
                 ", plan " + base.name;
  std::vector<Topology> topologies;
  std::vector<Plan> plans;
  for (int64_t n : node_counts) {
    Topology topology = load_topology(topology_file, int(n));
    ScalePoint p;
    p.nodes = n;
    p.devices = topology.num_devices();
    Plan plan = base;
    plan.name = base.name + "-" + std::to_string(n) + "n";  // a point that fails is named as one that runs
    plan.layers_per_stage = base.layers_per_stage;
    // A replica's ranks (context parallelism's included); parameter servers take their devices first.
    int64_t model_ranks = plan.tp_size * plan.pp_size * plan.cp_size;
    const int64_t replica_devices = p.devices - plan.parameter_servers;
    try {
      if (replica_devices < model_ranks || replica_devices % model_ranks != 0) {
        throw_input_error(base.file, "tp_size", std::to_string(plan.tp_size),
                          "tp_size · pp_size · context_parallel_size = " + std::to_string(model_ranks) +
                              " does not divide the " + std::to_string(replica_devices) + " devices of " +
                              std::to_string(n) + " nodes" +
                              (plan.parameter_servers > 0 ? " left by the parameter servers" : ""),
                          "node counts whose devices tp_size · pp_size · context_parallel_size divides");
      }
      plan.dp_size = replica_devices / model_ranks;
      plan.dp_size_derived = false;  // set here, per node count
      // Hybrid sharding keeps its shard group (inside a node) and scales the replicas.
      if (base.num_distributed_optimizer_instances > 1) {
        int64_t shard = base.dp_shard_size();
        plan.num_distributed_optimizer_instances = plan.dp_size % shard == 0 ? std::max<int64_t>(1, plan.dp_size / shard) : 0;
        if (plan.num_distributed_optimizer_instances == 0) {
          throw_input_error(base.file, "num_distributed_optimizer_instances",
                            std::to_string(base.num_distributed_optimizer_instances),
                            "keeps shard groups of " + std::to_string(shard) + " dp ranks, which do not divide dp_size = " +
                                std::to_string(plan.dp_size) + " on " + std::to_string(n) + " nodes",
                            "node counts whose dp_size is a multiple of " + std::to_string(shard));
        }
      }
      if (weak) plan.global_batch_size = base.global_batch_size / base.dp_size * plan.dp_size;
      plan.grad_bucket_bytes = 0;  // Megatron's default for the new dp_size, unless the file set it
      if (base.grad_bucket_bytes > 0) plan.grad_bucket_bytes = base.grad_bucket_bytes;
      if (plan.dp_size == 1) plan.overlap_param_gather = plan.overlap_grad_reduce = false;
      validate_plan(plan, model, topology);
    } catch (const InputError& e) {
      p.error = e.what();
    }
    p.plan = plan.name;
    p.global_batch_size = plan.global_batch_size;
    report.points.push_back(p);
    topologies.push_back(topology);
    plans.push_back(plan);
  }
  std::cout << "stepcast scale: " << model_label(model) << ", plan " << base.name << " (tp " << base.tp_size
            << ", pp " << base.pp_size << "), " << (weak ? "weak" : "strong") << " scaling on "
            << report.points.size() << " node counts, profile " << profile_choice.describe() << "\n";
  ChildSimulator simulator(model, child_profile_arguments(profile_choice, *vm), runner, jobs, report.sim_mode);
  parallel_for(
      int64_t(plans.size()), runner.threads(jobs),
      [&](int64_t i) {
        ScalePoint& p = report.points[size_t(i)];
        if (!p.error.empty()) return;
        try {
          Simulated s = simulator.simulate(p.plan, plans[size_t(i)], topologies[size_t(i)]);
          p.step_time_s = s.step_time_s;
          p.tokens_per_s = s.tokens_per_s;
          p.fits = s.fits;
          p.compute_s = s.compute_s;
          p.exposed_comm_s = s.exposed_comm_s;
          p.bubble_s = s.bubble_s;
          p.optimizer_s = s.optimizer_s;
        } catch (const std::exception& e) {
          p.error = e.what();
        }
      },
      [&](int64_t done, int64_t) {
        std::cerr << "\rsimulate --mode " << report.sim_mode << ": " << done << " points" << std::flush;
      });
  std::cerr << "\n";

  const ScalePoint* first = nullptr;
  for (const auto& p : report.points) {
    if (p.error.empty()) {
      first = &p;
      break;
    }
  }
  if (!first) {
    std::ostringstream why;
    why << "no node count could be simulated:";
    for (const auto& p : report.points) why << "\n  " << p.nodes << " nodes: " << p.error;
    throw InputError(why.str());
  }
  std::vector<std::pair<double, double>> xy;
  for (auto& p : report.points) {
    if (!p.error.empty()) continue;
    p.speedup = p.tokens_per_s / first->tokens_per_s;
    p.efficiency = p.speedup * double(first->devices) / double(p.devices);
    xy.push_back({double(first->devices) / double(p.devices), 1.0 / p.speedup});
  }
  double f = amdahl_serial_fraction(xy);
  if (std::isfinite(f)) {
    report.serial_fraction = f;
    report.serial_fraction_valid = true;
  }
  std::cout << std::right << std::setw(6) << "nodes" << std::setw(8) << "devices" << std::setw(8)
            << "batch" << std::setw(10) << "step s" << std::setw(13) << "tokens/s" << std::setw(9)
            << "speedup" << std::setw(8) << "eff." << std::setw(10) << "compute" << std::setw(10)
            << "exp.comm" << std::setw(9) << "bubble" << std::setw(9) << "optim." << "\n";
  for (const auto& p : report.points) {
    std::cout << std::setw(6) << p.nodes << std::setw(8) << p.devices << std::setw(8)
              << p.global_batch_size;
    if (!p.error.empty()) {
      std::cout << "  " << p.error << "\n";
      continue;
    }
    std::cout << std::setw(10) << fixed(p.step_time_s, 3) << std::setw(13) << fixed(p.tokens_per_s, 0)
              << std::setw(9) << fixed(p.speedup, 3) << std::setw(8) << fixed(p.efficiency, 3)
              << std::setw(10) << fixed(p.compute_s, 3) << std::setw(10) << fixed(p.exposed_comm_s, 3)
              << std::setw(9) << fixed(p.bubble_s, 3) << std::setw(9) << fixed(p.optimizer_s, 3)
              << (p.fits ? "" : "  (does not fit in memory)") << "\n";
  }
  if (report.serial_fraction_valid) {
    std::cout << "Amdahl serial fraction (least squares on 1/speedup): "
              << fixed(report.serial_fraction, 4) << "\n";
  }
  const ScalePoint* last = first;
  for (const auto& p : report.points) {
    if (p.error.empty()) last = &p;
  }
  if (last != first) {
    std::cout << "terms from " << first->devices << " to " << last->devices << " devices (share of step):";
    auto share = [](double v, const ScalePoint& p) { return 100.0 * v / p.step_time_s; };
    const char* names[] = {"compute", "exposed comm", "bubble", "optimizer"};
    double a[] = {first->compute_s, first->exposed_comm_s, first->bubble_s, first->optimizer_s};
    double b[] = {last->compute_s, last->exposed_comm_s, last->bubble_s, last->optimizer_s};
    for (int k = 0; k < 4; ++k) {
      std::cout << "\n  " << std::left << std::setw(13) << names[k] << std::right
                << fixed(a[k], 3) << " s (" << fixed(share(a[k], *first), 1) << "%) -> "
                << fixed(b[k], 3) << " s (" << fixed(share(b[k], *last), 1) << "%)"
                << (share(b[k], *last) > share(a[k], *first) + 0.05 ? "  grows" : "");
    }
    std::cout << "\n";
  }
  if (vm->count("out")) {
    std::string dir = (*vm)["out"].as<std::string>();
    // The topology as read at the smallest node count; inputs.nodes lists them all.
    Json out = planner_envelope("scale", model, load_topology(topology_file, int(node_counts.front())),
                                report.sim_mode,
                                {{"plan_file", base.file}, {"plan", plan_to_json(base)},
                                 {"weak", weak}, {"nodes", node_counts},
                                 {"profile", profile_json(profile_choice)}});
    Json points = Json::array();
    for (const auto& p : report.points) {
      Json j = {{"nodes", p.nodes}, {"devices", p.devices}, {"plan", p.plan},
                {"global_batch_size", p.global_batch_size}};
      if (!p.error.empty()) {
        j["error"] = p.error;
      } else {
        j.update({{"step_time_s", p.step_time_s}, {"tokens_per_s", p.tokens_per_s},
                  {"speedup", p.speedup}, {"efficiency", p.efficiency}, {"fits", p.fits},
                  {"breakdown_s", {{"compute", p.compute_s}, {"exposed_comm", p.exposed_comm_s},
                                   {"bubble", p.bubble_s}, {"optimizer", p.optimizer_s}}}});
      }
      points.push_back(j);
    }
    out["points"] = points;
    if (report.serial_fraction_valid) out["amdahl_serial_fraction"] = report.serial_fraction;
    write_output_file(dir, "scale.json", out.dump(2) + "\n");
    write_scale_report(dir, report);
    std::cout << "wrote " << dir << "/scale.json, report.md, report.html, scale.csv\n";
  }
  return 0;
}

}  // namespace stepcast::cli
