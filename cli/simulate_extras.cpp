// Straggler cost, energy and cost of a simulated step; see simulate_extras.hpp.
#include "simulate_extras.hpp"

#include <cctype>
#include <cmath>
#include <exception>
#include <sstream>

#include "energy.hpp"
#include "errors.hpp"
#include "lower.hpp"

namespace stepcast::cli {

namespace {

bool is_currency(const std::string& s) {
  if (s.size() != 3) return false;
  for (char c : s) {
    if (!std::isalpha(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

std::string fixed(double value, int digits) {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(digits);
  out << value;
  return out.str();
}

}  // namespace

void add_price_options(po::options_description& options) {
  options.add_options()
      ("price-per-gpu-hour", po::value<std::vector<std::string>>()->multitoken(),
       "AMOUNT [CURRENCY]: the price of one device for one hour; with a currency (here or "
       "--currency) it gives cost per step in prediction.json")
      ("currency", po::value<std::string>(), "the currency of --price-per-gpu-hour (ISO 4217: USD, EUR, ...)");
}

std::optional<Price> price_from(const po::variables_map& vm) {
  const std::string valid =
      "--price-per-gpu-hour AMOUNT CURRENCY or --price-per-gpu-hour AMOUNT --currency CURRENCY, "
      "AMOUNT a number > 0 and CURRENCY three letters (ISO 4217), e.g. --price-per-gpu-hour 2.5 USD";
  if (!vm.count("price-per-gpu-hour")) {
    if (vm.count("currency")) {
      throw InputError("command line: --currency '" + vm["currency"].as<std::string>() +
                       "' without a price; valid: " + valid);
    }
    return std::nullopt;
  }
  std::vector<std::string> words = vm["price-per-gpu-hour"].as<std::vector<std::string>>();
  std::string given;
  for (const std::string& w : words) given += (given.empty() ? "" : " ") + w;
  if (words.size() == 1) {  // "2.5 USD" quoted as one word
    std::istringstream split(words[0]);
    std::string word;
    words.clear();
    while (split >> word) words.push_back(word);
  }
  if (words.empty() || words.size() > 2) {
    throw InputError("command line: --price-per-gpu-hour '" + given + "': valid: " + valid);
  }
  Price price;
  size_t used = 0;
  try {
    price.per_gpu_hour = std::stod(words[0], &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != words[0].size() || !std::isfinite(price.per_gpu_hour) || !(price.per_gpu_hour > 0)) {
    throw InputError("command line: --price-per-gpu-hour '" + given + "': the amount '" + words[0] +
                     "' is not a number > 0; valid: " + valid);
  }
  if (words.size() == 2 && vm.count("currency")) {
    throw InputError("command line: --price-per-gpu-hour '" + given + "' and --currency '" +
                     vm["currency"].as<std::string>() + "': the currency twice; valid: " + valid);
  }
  price.currency = words.size() == 2 ? words[1] : vm.count("currency") ? vm["currency"].as<std::string>() : "";
  if (price.currency.empty()) {
    throw InputError("command line: --price-per-gpu-hour '" + given +
                     "': a price without a currency; valid: " + valid);
  }
  if (!is_currency(price.currency)) {
    throw InputError("command line: --price-per-gpu-hour '" + given + "': currency '" + price.currency +
                     "' is not three letters; valid: " + valid);
  }
  for (char& c : price.currency) c = char(std::toupper(static_cast<unsigned char>(c)));
  return price;
}

namespace {

// The step of `plan` on `topology`, simulated in a forked child that keeps no records.
std::unique_ptr<ForkedChild> fork_reference_step(const Inputs& in, Topology topology, Plan plan,
                                                 const DeviceProfile& profile, const SimulateOptions& options_in,
                                                 const char* what) {
  auto work = [&in, &profile, topology = std::move(topology), plan = std::move(plan),
               options = options_in]() mutable -> std::string {
    run_behind_main_work();  // needed only when the simulation beside it has ended
    try {
      StepProgram program = lower_program(in.model, topology, plan);
      options.detail_ranks.clear();
      options.detail_all = false;
      options.keep_records = false;  // the step time is all it answers
      SimulationOutput sim = simulate_program(program, topology, profile, options);
      std::ostringstream answer;
      answer.precision(17);
      answer << "ok " << sim.step_time_s;
      keep_until_exit(std::move(program));  // the child ends with _exit (forked_child.hpp)
      return answer.str();
    } catch (const std::exception& e) {
      return std::string("error ") + e.what();
    }
  };
  return std::make_unique<ForkedChild>(work, what);
}

}  // namespace

std::unique_ptr<ForkedChild> fork_uniform_reference(const Inputs& in, const DeviceProfile& profile,
                                                    const SimulateOptions& options) {
  if (in.topology.heterogeneity.empty()) return nullptr;
  Topology uniform = in.topology;
  uniform.heterogeneity = Heterogeneity{};
  // The same folds as the run it is subtracted from: approx keeps every data-parallel copy on
  // unequal devices, so the reference does too (its fold's error is not a straggler's cost).
  SimulateOptions same_folds = options;
  same_folds.fold_data_parallel = false;
  return fork_reference_step(in, std::move(uniform), in.plan, profile, same_folds,
                             "the uniform-topology reference simulation");
}

std::unique_ptr<ForkedChild> fork_synchronous_reference(const Inputs& in, const DeviceProfile& profile,
                                                        const SimulateOptions& options) {
  if (!in.plan.async_dp()) return nullptr;
  Plan synchronous = in.plan;
  synchronous.async_staleness = 0;
  synchronous.parameter_servers = 0;  // the same workers reducing among themselves
  return fork_reference_step(in, in.topology, std::move(synchronous), profile, options,
                             "the synchronous data-parallel reference simulation");
}

Json async_json(const Plan& plan, const SimulationOutput& sim, double sync_step_time_s, double tokens_per_step) {
  Json out = {{"staleness", plan.async_staleness},
              {"gradient_age_steps", plan.async_staleness},
              {"step_time_s", sim.step_time_s},
              {"tokens_per_s", tokens_per_step / sim.step_time_s},
              {"sync_step_time_s", sync_step_time_s},
              {"sync_tokens_per_s", tokens_per_step / sync_step_time_s},
              {"throughput_over_sync", sync_step_time_s / sim.step_time_s},
              {"definition",
               "data_parallel_mode async: the gradient of step t is all-reduced beside the compute of step t + 1 and "
               "applied staleness steps after it was computed (gradient_age_steps: the updates between the weights a "
               "gradient was computed on and those it updates); step_time_s is the steady state; sync_* is the same "
               "plan with data_parallel_mode sync, simulated beside it"}};
  const auto& ps = sim.parameter_servers;
  if (ps.servers > 0) {
    // A server applies every worker's push as one update: the age in global steps is the updates
    // between pull and apply over the workers.
    out["gradient_age_steps"] = ps.staleness_updates_mean / double(plan.dp_size);
    out["parameter_servers"] = {{"servers", ps.servers},
                                {"simulated_steps", ps.steps},
                                {"worker_step_s", ps.worker_step_s},
                                {"staleness_updates_mean", ps.staleness_updates_mean},
                                {"staleness_updates_max", ps.staleness_updates_max},
                                {"server_busy_fraction", ps.server_busy_fraction}};
    out["definition"] =
        "data_parallel_mode async with parameter_servers: free-running workers push every step's gradient to the "
        "servers, which apply each as it arrives and send the weights back, no worker more than staleness steps "
        "ahead of the slowest (stale synchronous parallelism); step_time_s is one global batch (every worker one "
        "step) at the steady state's throughput; staleness_updates_*: updates a server applied between a worker's "
        "pull and its push, gradient_age_steps their mean over the workers; sync_* is the same workers with "
        "data_parallel_mode sync, simulated beside it";
  }
  return out;
}

std::string async_summary(const Json& a) {
  if (a.is_null()) return "";
  std::ostringstream out;
  out << "asynchronous data parallelism (staleness " << a["staleness"].get<int64_t>() << "): "
      << a["tokens_per_s"].get<double>() << " tokens/s against " << a["sync_tokens_per_s"].get<double>()
      << " synchronous (step " << a["sync_step_time_s"].get<double>() << " s), "
      << fixed(a["throughput_over_sync"].get<double>(), 3) << "x the throughput; ";
  if (a.contains("parameter_servers")) {
    const Json& ps = a["parameter_servers"];
    out << ps["servers"].get<int64_t>() << " parameter server(s), busy "
        << fixed(100 * ps["server_busy_fraction"].get<double>(), 1) << "% of the time; a gradient meets "
        << fixed(ps["staleness_updates_mean"].get<double>(), 2) << " other updates on average (at most "
        << ps["staleness_updates_max"].get<int64_t>() << ")\n";
  } else {
    out << "every gradient applied " << a["gradient_age_steps"].get<int64_t>() << " step(s) late\n";
  }
  return out.str();
}

Json heterogeneity_json(const Topology& topology, const SimulationOutput& sim, double uniform_step_time_s) {
  const Heterogeneity& h = topology.heterogeneity;
  const int64_t per_node = topology.node.devices_per_node;
  Json out = {{"slowest_rank", sim.slowest_rank},
              {"slowest_node", sim.slowest_rank / per_node},
              {"slowest_speed_factor", sim.slowest_speed_factor},
              {"critical_rank", sim.critical_rank},
              {"critical_rank_speed_factor", h.compute_speed_factor(sim.critical_rank, per_node)},
              {"uniform_step_time_s", uniform_step_time_s},
              {"straggler_cost_s", sim.step_time_s - uniform_step_time_s},
              {"straggler_cost_fraction", (sim.step_time_s - uniform_step_time_s) / sim.step_time_s},
              {"definition",
               "straggler_cost_s = step_time_s - uniform_step_time_s, the same program simulated with every "
               "compute speed and link bandwidth factor 1; critical_rank ends the step (among ranks that end "
               "together, the slowest; in fast mode a folded tensor-parallel group's first rank stands for the "
               "group and takes its slowest member's factor)"}};
  if (!h.node_groups.empty()) {
    Json groups = Json::array();
    for (const NodeGroup& g : h.node_groups) {
      groups.push_back({{"nodes", g.nodes}, {"device_name", g.device_name}, {"compute_speed_factor", g.compute_speed_factor}});
    }
    out["node_groups"] = groups;
  }
  return out;
}

Json energy_json(const Topology& topology, const SimulationOutput& sim, const std::optional<Price>& price,
                 int64_t devices, double tokens_per_step) {
  const DeviceSpec& device = topology.node.device;
  Json out = Json::object();
  StepEnergy e = step_energy(sim.device_time, device.power_idle_w, device.power_busy_w);
  out["devices"] = e.devices;
  out["device_time_s"] = {{"busy", e.busy_device_s}, {"waiting", e.waiting_device_s}, {"idle", e.idle_device_s}};
  if (device.has_power()) {
    out["energy_per_step_j"] = e.energy_per_step_j;
    out["energy_per_token_j"] = e.energy_per_step_j / tokens_per_step;
    out["busy_j"] = e.busy_j;
    out["waiting_and_idle_j"] = e.other_j;
    out["mean_power_per_device_w"] = e.mean_power_w;
    out["power_idle_w"] = device.power_idle_w;
    out["power_busy_w"] = device.power_busy_w;
    out["power_source"] = device.power_source;
  } else {
    out["energy_per_step_j"] = nullptr;
    out["why_no_energy"] = "the topology's device gives no power_idle_w, power_busy_w and power_source";
  }
  out["definition"] =
      "sum over devices of busy_s * power_busy_w + (waiting_s + idle_s) * power_idle_w; busy: a compute op "
      "runs, waiting: only communication in flight, idle: nothing in flight";
  if (price) {
    const double cost = cost_per_step(price->per_gpu_hour, devices, sim.step_time_s);
    out["cost"] = {{"price_per_gpu_hour", price->per_gpu_hour},
                   {"currency", price->currency},
                   {"cost_per_step", cost},
                   {"cost_per_million_tokens", cost / tokens_per_step * 1e6}};
  }
  return out;
}

std::string heterogeneity_summary(const Json& h) {
  if (h.is_null()) return "";
  std::ostringstream out;
  out << "unequal devices: slowest rank " << h["slowest_rank"].get<int64_t>() << " (node "
      << h["slowest_node"].get<int64_t>() << ", speed " << h["slowest_speed_factor"].get<double>()
      << "), critical rank " << h["critical_rank"].get<int64_t>() << "; uniform step "
      << h["uniform_step_time_s"].get<double>() << " s, straggler cost "
      << h["straggler_cost_s"].get<double>() << " s ("
      << fixed(100 * h["straggler_cost_fraction"].get<double>(), 1) << "% of the step)\n";
  return out.str();
}

std::string energy_summary(const Json& e) {
  std::ostringstream out;
  if (!e["energy_per_step_j"].is_null()) {
    out << "energy " << e["energy_per_step_j"].get<double>() << " J per step ("
        << fixed(e["mean_power_per_device_w"].get<double>(), 1) << " W a device on average; idle "
        << e["power_idle_w"].get<double>() << " W, busy " << e["power_busy_w"].get<double>() << " W), "
        << e["energy_per_token_j"].get<double>() << " J per token\n";
  }
  if (e.contains("cost")) {
    const Json& c = e["cost"];
    out << "cost " << c["cost_per_step"].get<double>() << " " << c["currency"].get<std::string>()
        << " per step at " << c["price_per_gpu_hour"].get<double>() << " " << c["currency"].get<std::string>()
        << " per device-hour, " << c["cost_per_million_tokens"].get<double>() << " "
        << c["currency"].get<std::string>() << " per million tokens\n";
  }
  return out.str();
}

}  // namespace stepcast::cli
