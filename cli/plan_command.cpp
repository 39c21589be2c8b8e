// `stepcast plan`: searches every plan of a model on a cluster (plans/search.hpp), re-times the
// most promising with `simulate --mode fast` in child processes (one SimGrid engine per process,
// two at a time) and writes the best as plan files, with Megatron-LM's arguments and plans.json.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <mutex>
#include <set>
#include <cmath>
#include <sstream>

#include "commands.hpp"
#include "errors.hpp"
#include "inputs.hpp"
#include "lower.hpp"
#include "memory.hpp"
#include "program_stats.hpp"
#include "search.hpp"
#include "summary.hpp"

namespace stepcast::cli {

namespace {

struct Simulated {
  double step_time_s = 0;
  double tokens_per_s = 0;
  double mfu = 0;
  bool fits = false;
  double peak_bytes_max = 0;
};

// Simulates a plan in a child process (`stepcast simulate --mode fast --no-scaling`).
class ChildSimulator {
 public:
  ChildSimulator(const ModelConfig& model, const Topology& topology,
                 std::optional<std::string> profile)
      : model_(model), topology_(topology), profile_(std::move(profile)) {
    dir_ = std::filesystem::temp_directory_path() / ("stepcast-plan-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  ~ChildSimulator() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  double operator()(const Plan& plan) {
    auto dir = dir_ / plan.name;
    std::filesystem::create_directories(dir);
    std::string plan_file = (dir / "plan.json").string();
    std::ofstream(plan_file) << plan_to_json(plan).dump(2);
    std::ostringstream cmd;
    // /proc/PID/exe still runs this binary if a rebuild replaced the file meanwhile.
    cmd << "/proc/" << getpid() << "/exe simulate --model "
        << shell_quote(model_.file) << " --topology " << shell_quote(topology_.file) << " --nodes "
        << topology_.num_nodes << " --plan " << shell_quote(plan_file)
        << " --mode fast --no-scaling --out " << shell_quote((dir / "out").string());
    if (profile_) cmd << " --profile " << shell_quote(*profile_);
    cmd << " >" << shell_quote((dir / "log").string()) << " 2>&1";
    if (std::system(cmd.str().c_str()) != 0) {
      std::ifstream log(dir / "log");
      std::stringstream text;
      text << log.rdbuf();
      throw std::runtime_error("simulate failed: " + text.str());
    }
    Json p = load_json_file((dir / "out" / "prediction.json").string());
    Simulated s;
    s.step_time_s = p.at("step_time_s").get<double>();
    s.tokens_per_s = p.at("tokens_per_s").get<double>();
    s.mfu = p.at("mfu").get<double>();
    s.fits = p.at("memory").at("fits").get<bool>();
    s.peak_bytes_max = p.at("memory").at("peak_bytes_max").get<double>();
    std::lock_guard<std::mutex> lock(mutex_);
    results_[plan.name] = s;
    return s.step_time_s;
  }

  std::optional<Simulated> result(const std::string& name) const {
    auto it = results_.find(name);
    if (it == results_.end()) return std::nullopt;
    return it->second;
  }

 private:
  const ModelConfig& model_;
  const Topology& topology_;
  std::optional<std::string> profile_;
  std::filesystem::path dir_;
  std::mutex mutex_;
  std::map<std::string, Simulated> results_;
};

Progress progress_printer(const std::string& what) {
  auto last = std::make_shared<int64_t>(-1);
  return [what, last](int64_t done, int64_t total) {
    int64_t percent = total == 0 ? 100 : done * 100 / total;
    if (percent / 10 != *last / 10 || done == total) {
      *last = percent;
      std::cerr << "\r" << what << ": " << done << "/" << total << " (" << percent << "%)"
                << (done == total ? "\n" : "") << std::flush;
    }
  };
}

std::string fixed(double v, int digits) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(digits) << v;
  return out.str();
}

// Exits with the reason when the model cannot fit the whole cluster even perfectly sharded.
void check_cluster_memory(const ModelConfig& model, const Topology& topology) {
  double params = double(parameter_count(model));
  double need = 16.0 * params;  // bf16 weights and grads, fp32 master and Adam moments
  double have = double(topology.num_devices()) * topology.node.device.memory_bytes;
  if (need > have) {
    int64_t nodes_needed = int64_t(std::ceil(need / (topology.node.device.memory_bytes *
                                                     double(topology.node.devices_per_node))));
    throw InputError(model.file + ": the model's " + fixed(params / 1e9, 2) +
                     "e9 parameters need at least 16 bytes each (" + format_bytes(need) +
                     ") of model state, more than the cluster's " + std::to_string(topology.num_devices()) +
                     " devices hold together (" + format_bytes(have) + "); valid: --nodes " +
                     std::to_string(nodes_needed) + " or more, or a smaller model");
  }
}

Json candidate_json(const Candidate& c, const Simulated* sim) {
  Json j;
  j["name"] = c.plan.name;
  j["plan"] = plan_to_json(c.plan);
  j["estimate_step_time_s"] = c.estimate.step_time_s;
  j["estimate"] = {{"compute_s", c.estimate.compute_s},     {"tp_comm_s", c.estimate.tp_comm_s},
                   {"pp_comm_s", c.estimate.pp_comm_s},     {"bubble_s", c.estimate.bubble_s},
                   {"dp_comm_s", c.estimate.dp_comm_s},     {"optimizer_s", c.estimate.optimizer_s},
                   {"critical_stage", c.estimate.critical_stage}};
  j["step_time_s"] = c.step_time_s ? *c.step_time_s : c.estimate.step_time_s;
  j["step_time_source"] = c.step_time_s ? "simulate" : "quick_estimate";
  if (!c.evaluation_error.empty()) j["evaluation_error"] = c.evaluation_error;
  j["peak_bytes_max"] = c.peak_bytes_max;
  j["capacity_bytes"] = c.capacity_bytes;
  if (sim) {
    j["tokens_per_s"] = sim->tokens_per_s;
    j["mfu"] = sim->mfu;
  }
  return j;
}

}  // namespace

int run_plan(int argc, char** argv) {
  po::options_description options("stepcast plan options");
  options.add_options()
      ("model", po::value<std::string>()->required(), "model config JSON (plans/models/*.json)")
      ("topology", po::value<std::string>()->required(), "cluster topology JSON (topologies/*.json)")
      ("nodes", po::value<int>(), "override the topology's num_nodes")
      ("global-batch-size", po::value<int64_t>()->required(), "global batch size (sequences per step)")
      ("top", po::value<int64_t>()->default_value(5), "plans to report and write")
      ("evaluate", po::value<int64_t>(), "plans to re-simulate (default 2·top)")
      ("objective", po::value<std::string>()->default_value("time"), "time or memory")
      ("max-memory-fraction", po::value<double>()->default_value(1.0),
       "a plan fits when peak + reserved ≤ this fraction of the device's memory")
      ("include-gpipe", po::bool_switch(), "also search the gpipe schedule")
      ("profile", po::value<std::string>(), "device profile for the estimate and the simulations")
      ("jobs", po::value<int>()->default_value(2), "worker threads and concurrent simulations")
      ("out", po::value<std::string>(), "write DIR/plans.json, DIR/NN-NAME.json plan files and their Megatron-LM arguments");
  auto vm = parse_command_line(
      argc, argv, options,
      "usage: stepcast plan --model M --topology T --global-batch-size B [--nodes N] [--top K]\n"
      "                     [--objective time|memory] [--max-memory-fraction F] [--out DIR]\n"
      "Enumerates every plan (tp, pp, dp, ZeRO stage, micro batch, schedule and virtual stages,\n"
      "recompute, sequence parallelism) using every device, prunes what cannot run with the\n"
      "reason, ranks the rest with a quick estimate and re-simulates the best (simulate --mode\n"
      "fast, in child processes).");
  if (!vm) return 0;
  auto wall_start = std::chrono::steady_clock::now();
  std::optional<int> nodes;
  if (vm->count("nodes")) nodes = (*vm)["nodes"].as<int>();
  ModelConfig model = load_model((*vm)["model"].as<std::string>());
  Topology topology = load_topology((*vm)["topology"].as<std::string>(), nodes);
  SearchSpace space;
  space.global_batch_size = (*vm)["global-batch-size"].as<int64_t>();
  space.include_gpipe = (*vm)["include-gpipe"].as<bool>();
  space.max_memory_fraction = (*vm)["max-memory-fraction"].as<double>();
  int64_t top = (*vm)["top"].as<int64_t>();
  int64_t evaluate_count = vm->count("evaluate") ? (*vm)["evaluate"].as<int64_t>() : 2 * top;
  int jobs = (*vm)["jobs"].as<int>();
  std::string objective_name = (*vm)["objective"].as<std::string>();
  if (objective_name != "time" && objective_name != "memory") {
    throw InputError("command line: --objective '" + objective_name + "': valid: time, memory");
  }
  if (space.global_batch_size < 1) {
    throw InputError("command line: --global-batch-size " + std::to_string(space.global_batch_size) + ": valid: >= 1");
  }
  if (!(space.max_memory_fraction > 0 && space.max_memory_fraction <= 1)) {
    throw InputError("command line: --max-memory-fraction: valid: in (0, 1]");
  }
  if (top < 1 || jobs < 1 || evaluate_count < 0) {
    throw InputError("command line: --top and --jobs must be >= 1, --evaluate >= 0");
  }
  check_cluster_memory(model, topology);
  std::optional<std::string> profile_file;
  if (vm->count("profile")) profile_file = (*vm)["profile"].as<std::string>();
  DeviceProfile profile = profile_file ? load_profile(*profile_file) : roofline_profile(topology);
  check_profile_matches(profile, topology);

  std::cout << "stepcast plan: " << model.name << " on " << topology.name << " ("
            << topology.num_nodes << " nodes × " << topology.node.devices_per_node << " = "
            << topology.num_devices() << " devices), global batch " << space.global_batch_size
            << ", profile " << profile.name << "\n";
  std::vector<Candidate> candidates = enumerate_candidates(model, topology, space);
  int64_t valid = 0;
  for (const auto& c : candidates) valid += c.kept();
  std::cout << candidates.size() << " candidates, " << valid << " pass validation\n";
  if (valid == 0) {
    auto counts = pruned_counts(candidates);
    bool batch = false;
    for (const auto& [reason, n] : counts) batch |= reason.rfind("global_batch_size", 0) == 0;
    std::ostringstream why;
    why << "no plan is valid for --global-batch-size " << space.global_batch_size << ":";
    for (const auto& [reason, n] : counts) why << "\n  " << n << " × " << reason;
    if (batch) {
      std::set<int64_t> dps;
      for (const auto& c : candidates) {
        if (c.pruned.rfind("global_batch_size", 0) == 0) dps.insert(c.plan.dp_size);
      }
      int64_t smallest = *dps.begin();
      int64_t up = (space.global_batch_size / smallest + 1) * smallest;
      why << "\nvalid: a global batch size divisible by micro_batch_size · dp_size for some plan;"
          << " dp_size here is one of";
      for (int64_t d : dps) why << " " << d;
      why << " (e.g. --global-batch-size " << up << ")";
    }
    throw InputError(why.str());
  }
  ComputeCostModel cost_model(topology.node.device,
                              candidates.front().plan.param_dtype, profile, topology.file);
  check_candidates(candidates, model, topology, space, cost_model, jobs,
                   progress_printer("memory and estimate"));
  auto counts = pruned_counts(candidates);
  int64_t fitting = 0;
  for (const auto& c : candidates) fitting += c.kept();
  std::cout << fitting << " plans fit; pruned:\n";
  for (const auto& [reason, n] : counts) std::cout << "  " << std::setw(6) << n << "  " << reason << "\n";

  if (fitting == 0) {
    const Candidate* nearest = nullptr;
    for (const auto& c : candidates) {
      // Prefer plans whose peak was measured on the program over lower bounds.
      if (c.pruned == "does not fit in memory" &&
          (!nearest || std::make_pair(c.peak_is_lower_bound, c.peak_bytes_max) <
                           std::make_pair(nearest->peak_is_lower_bound, nearest->peak_bytes_max))) {
        nearest = &c;
      }
    }
    std::ostringstream why;
    why << "no plan fits in " << fixed(space.max_memory_fraction, 2) << " of "
        << format_bytes(topology.node.device.memory_bytes) << " per device";
    if (nearest) {
      why << "; the smallest peak is plan " << nearest->plan.name << " at "
          << (nearest->peak_is_lower_bound ? "at least " : "")
          << format_bytes(nearest->peak_bytes_max) << ". Checked changes to it:";
      for (const auto& s : suggest_fits(nearest->plan, model, topology, space)) {
        why << "\n  " << s.change << ": "
            << (s.fits ? "fits (peak " + format_bytes(s.peak_bytes_max) + ")"
                       : "does not fit" + (s.note.empty() ? "" : " (" + s.note + ")"));
      }
    }
    throw InputError(why.str());
  }

  ChildSimulator simulator(model, topology, profile_file);
  Evaluator evaluate = [&simulator](const Plan& plan) { return simulator(plan); };
  std::vector<Candidate> ranked =
      search(std::move(candidates), evaluate, evaluate_count, jobs,
             progress_printer("simulate --mode fast"),
             objective_name == "memory" ? Objective::memory : Objective::time);

  double peak = topology.node.device.peak_for(ranked.front().plan.param_dtype, topology.file);
  std::cout << "\n" << std::left << std::setw(44) << "plan" << std::right << std::setw(11)
            << "step s" << std::setw(6) << "src" << std::setw(12) << "tokens/s" << std::setw(7)
            << "MFU" << std::setw(11) << "peak" << std::setw(11) << "headroom"
            << "  comm per rank (tp / dp / pp / other)\n";
  Json top_json = Json::array();
  std::string out_dir = vm->count("out") ? (*vm)["out"].as<std::string>() : "";
  for (int64_t i = 0; i < std::min<int64_t>(top, int64_t(ranked.size())); ++i) {
    const Candidate& c = ranked[size_t(i)];
    StepProgram program = lower_program(model, topology, c.plan);
    ProgramStats stats = program_stats(program);
    MemoryReport memory = memory_report(program, topology);
    if (std::abs(memory.peak_bytes_max - c.peak_bytes_max) > 1e-6 * memory.peak_bytes_max) {
      std::cerr << "warning: " << c.plan.name << ": the memory path's peak "
                << format_bytes(c.peak_bytes_max) << " differs from the full program's "
                << format_bytes(memory.peak_bytes_max) << "\n";
    }
    auto sim = simulator.result(c.plan.name);
    double step = c.step_time_s ? *c.step_time_s : c.estimate.step_time_s;
    double tokens_per_s = double(program.tokens_per_step) / step;
    double mfu = model_flops_per_token(model) * double(program.tokens_per_step) / step /
                 (double(program.world_size()) * peak);
    auto bytes = [&](const std::string& kind) {
      auto it = stats.comm_bytes_per_rank_max.find(kind);
      return it == stats.comm_bytes_per_rank_max.end() ? 0.0 : it->second;
    };
    double other = 0;
    for (const auto& [kind, b] : stats.comm_bytes_per_rank_max) {
      if (kind != "tp" && kind != "dp" && kind != "pp") other += b;
    }
    double allowed = space.max_memory_fraction * memory.capacity_bytes;
    std::cout << std::left << std::setw(44) << c.plan.name << std::right << std::setw(11)
              << fixed(step, 3) << std::setw(6) << (c.step_time_s ? "sim" : "est")
              << std::setw(12) << fixed(tokens_per_s, 0) << std::setw(7) << fixed(mfu, 3)
              << std::setw(11) << format_bytes(memory.peak_bytes_max) << std::setw(11)
              << format_bytes(allowed - memory.peak_bytes_max - memory.reserved_bytes) << "  "
              << format_bytes(bytes("tp")) << " / " << format_bytes(bytes("dp")) << " / "
              << format_bytes(bytes("pp")) << " / " << format_bytes(other) << "\n";
    Json j = candidate_json(c, sim ? &*sim : nullptr);
    j["rank"] = i + 1;
    j["tokens_per_s"] = tokens_per_s;
    j["mfu"] = mfu;
    j["peak_bytes_max"] = memory.peak_bytes_max;
    j["headroom_bytes"] = allowed - memory.peak_bytes_max - memory.reserved_bytes;
    j["comm_bytes_per_rank_max"] = stats.comm_bytes_per_rank_max;
    MegatronArguments megatron = megatron_arguments(c.plan, model);
    j["megatron_arguments"] = megatron.arguments;
    j["megatron_notes"] = megatron.notes;
    if (!out_dir.empty()) {
      std::ostringstream stem;
      stem << std::setw(2) << std::setfill('0') << i + 1 << "-" << c.plan.name;
      Json plan_file = plan_to_json(c.plan);
      write_output_file(out_dir, stem.str() + ".json", plan_file.dump(2) + "\n");
      std::ostringstream args;
      args << "# Megatron-LM arguments for " << c.plan.name << "\n";
      for (const auto& n : megatron.notes) args << "# note: " << n << "\n";
      for (size_t k = 0; k < megatron.arguments.size(); ++k) {
        args << megatron.arguments[k] << (k + 1 < megatron.arguments.size() ? " \\\n" : "\n");
      }
      write_output_file(out_dir, stem.str() + ".megatron.txt", args.str());
      j["plan_file"] = stem.str() + ".json";
    }
    top_json.push_back(j);
  }
  for (const auto& c : ranked) {
    if (!c.evaluation_error.empty()) {
      std::cerr << "warning: simulating " << c.plan.name << " failed: " << c.evaluation_error << "\n";
    }
    if (auto sim = simulator.result(c.plan.name); sim && !sim->fits) {
      std::cerr << "warning: " << c.plan.name << ": simulate says it does not fit in memory\n";
    }
  }
  double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  std::cout << "searched " << ranked.size() + [&] {
    int64_t n = 0;
    for (const auto& [r, k] : counts) n += k;
    return n;
  }() << " candidates in " << fixed(wall_s, 1) << " s\n";
  if (!out_dir.empty()) {
    Json out;
    out["schema_version"] = 1;
    out["command"] = "plan";
    out["inputs"] = {{"model_file", model.file}, {"topology_file", topology.file},
                     {"num_nodes", topology.num_nodes},
                     {"global_batch_size", space.global_batch_size},
                     {"objective", objective_name},
                     {"max_memory_fraction", space.max_memory_fraction},
                     {"profile", profile.name}};
    out["top"] = top_json;
    Json all = Json::array();
    for (const auto& c : ranked) {
      auto sim = simulator.result(c.plan.name);
      all.push_back(candidate_json(c, sim ? &*sim : nullptr));
    }
    out["plans"] = all;
    out["pruned_counts"] = counts;
    out["search_wall_s"] = wall_s;
    write_output_file(out_dir, "plans.json", out.dump(1) + "\n");
    std::cout << "wrote " << out_dir << "/plans.json and " << top_json.size() << " plan files\n";
  }
  return 0;
}

}  // namespace stepcast::cli
