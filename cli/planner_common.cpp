// Shared pieces of the planner's commands; see planner_common.hpp.
#include "planner_common.hpp"

#include <cmath>
#include <iomanip>
#include <iostream>
#include <memory>
#include <set>
#include <sstream>

#include "errors.hpp"
#include "inputs.hpp"
#include "pruned_reasons.hpp"
#include "summary.hpp"

namespace stepcast::cli {

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

void check_cluster_memory(const ModelConfig& model, const Topology& topology) {
  double params = double(parameter_count(model));
  double need = 16.0 * params;  // bf16 weights and grads, fp32 master and Adam moments
  double have = double(topology.num_devices()) * topology.node.device.memory_bytes;
  if (need > have) {
    int64_t nodes_needed = int64_t(std::ceil(need / (topology.node.device.memory_bytes *
                                                     double(topology.node.devices_per_node))));
    throw InputError(model.file + ": the model's " + fixed(params / 1e9, 2) +
                     "e9 parameters need at least 16 bytes each (" + format_bytes(need) +
                     ") of model state, more than the cluster's " +
                     std::to_string(topology.num_devices()) + " devices hold together (" +
                     format_bytes(have) + "); valid: --nodes " + std::to_string(nodes_needed) +
                     " or more, or a smaller model");
  }
}

void add_moe_search_options(po::options_description& options) {
  options.add_options()
      ("ep", po::value<std::string>(),
       "mixtures of experts: expert-parallel sizes tried, a comma list (default every divisor of the "
       "experts that, times etp, divides a stage's tp·cp·dp ranks)")
      ("etp", po::value<std::string>(),
       "mixtures of experts: expert-tensor-parallel sizes tried, a comma list (default 1 and tp)")
      ("moe-dispatcher", po::value<std::string>()->default_value("both"),
       "mixtures of experts: token dispatchers tried, alltoall, allgather or both")
      ("moe-capacity-factor", po::value<double>(),
       "mixtures of experts: every candidate's moe_expert_capacity_factor (> 0; default dropless)")
      ("moe-routing-skew", po::value<double>(),
       "mixtures of experts: every candidate's routing, skewed with this Zipf exponent (>= 0; default uniform)")
      ("moe-routing-histogram", po::value<std::string>(),
       "mixtures of experts: every candidate's routing from a histogram file (a row per MoE layer and "
       "samples to replay, as `stepcast run --out DIR` writes DIR/moe-routing.json; or one row)")
      ("moe-lowered", po::value<int64_t>()->default_value(64),
       "mixtures of experts: candidates are lowered exactly (memory walked, estimate from the program) in the "
       "order of a cheap screen until this many fit; the rest are pruned with their rank (0: lower every one)");
}

namespace {

const char* const kMoeOptions[] = {"ep", "etp", "moe-capacity-factor", "moe-routing-skew", "moe-routing-histogram",
                                   "moe-skew-sweep"};

std::vector<int64_t> parse_size_list(const std::string& option, const std::string& text) {
  std::vector<int64_t> out;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    int64_t value = 0;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || value < 1) {
      throw InputError("command line: --" + option + " '" + text + "': '" + item +
                       "' is not a size; valid: a comma list of integers >= 1, e.g. 1,8,64");
    }
    out.push_back(value);
  }
  if (out.empty()) throw InputError("command line: --" + option + " '': valid: a comma list of integers >= 1");
  return out;
}

void read_moe_search_options(const po::variables_map& vm, SearchSpace& space) {
  if (!vm.count("moe-dispatcher")) return;  // (a command without the options)
  if (vm.count("ep")) space.expert_parallel_sizes = parse_size_list("ep", vm["ep"].as<std::string>());
  if (vm.count("etp")) space.expert_tensor_parallel_sizes = parse_size_list("etp", vm["etp"].as<std::string>());
  space.moe_lowered_plans = vm["moe-lowered"].as<int64_t>();
  if (space.moe_lowered_plans < 0) {
    throw InputError("command line: --moe-lowered " + std::to_string(space.moe_lowered_plans) +
                     ": valid: >= 0 (0: every candidate)");
  }
  const std::string dispatcher = vm["moe-dispatcher"].as<std::string>();
  if (dispatcher == "alltoall") space.moe_dispatchers = {MoeDispatcher::alltoall};
  else if (dispatcher == "allgather") space.moe_dispatchers = {MoeDispatcher::allgather};
  else if (dispatcher != "both") {
    throw InputError("command line: --moe-dispatcher '" + dispatcher + "': valid: alltoall, allgather, both");
  }
  if (vm.count("moe-capacity-factor")) {
    double factor = vm["moe-capacity-factor"].as<double>();
    if (!(factor > 0) || !std::isfinite(factor)) {
      throw InputError("command line: --moe-capacity-factor " + fixed(factor, 3) +
                       ": valid: > 0 (leave it out for dropless)");
    }
    space.moe.capacity_factor = factor;
  }
  if (vm.count("moe-routing-skew")) {
    double skew = vm["moe-routing-skew"].as<double>();
    if (!(skew >= 0) || !std::isfinite(skew)) {
      throw InputError("command line: --moe-routing-skew " + fixed(skew, 3) + ": valid: >= 0 (0: uniform)");
    }
    space.moe.routing = skew > 0 ? RoutingKind::skew : RoutingKind::uniform;
    space.moe.skew = skew;
  }
  if (vm.count("moe-routing-histogram")) {
    const std::string file = vm["moe-routing-histogram"].as<std::string>();
    if (vm.count("moe-routing-skew")) {
      throw InputError("command line: --moe-routing-histogram " + file +
                       ": the routing is given twice (--moe-routing-skew too); valid: one of them");
    }
    read_routing_histogram(space.moe, file, "command line --moe-routing-histogram");
  }
}

}  // namespace

void refuse_moe_options_on_dense(const po::variables_map& vm, const ModelConfig& model) {
  if (model.is_moe()) return;
  std::vector<std::string> given;
  for (const char* option : kMoeOptions) {
    if (vm.count(option)) given.push_back(option);
  }
  for (const char* option : {"moe-dispatcher", "moe-lowered"}) {
    if (vm.count(option) && !vm[option].defaulted()) given.push_back(option);
  }
  if (given.empty()) return;
  throw InputError("command line: --" + given.front() + ": the model " + model.file +
                   " has no experts; valid: expert options (--ep, --etp, --moe-*) with a mixture of experts only");
}

void refuse_no_valid_plan(const std::vector<Candidate>& candidates, const ModelConfig& model,
                          const Topology& topology, const SearchSpace& space) {
  auto counts = pruned_counts_in_words(candidates);
  std::ostringstream why;
  why << "no plan is valid for --global-batch-size " << space.global_batch_size << ":";
  for (const auto& [reason, n] : counts) why << "\n  " << n << " × " << reason;
  // Nearest batch sizes some candidate accepts: each refused candidate's batch step
  // (micro_batch_size · dp_size, times pp_size for the interleaved schedule), validated.
  const int64_t b = space.global_batch_size;
  int64_t below = 0, above = 0;
  std::string below_plan, above_plan;
  for (const auto& c : candidates) {
    if (c.pruned.rfind("global_batch_size", 0) != 0) continue;
    int64_t step = c.plan.micro_batch_size * c.plan.dp_size;
    if (c.plan.schedule == ScheduleKind::interleaved_1f1b) step *= c.plan.pp_size;
    for (int64_t gbs : {b / step * step, (b / step + 1) * step}) {
      if (gbs < 1 || gbs == b) continue;
      if (gbs < b && gbs <= below) continue;
      if (gbs > b && above != 0 && gbs >= above) continue;
      Plan p = c.plan;
      p.global_batch_size = gbs;
      p.layers_per_stage.clear();
      p.grad_bucket_bytes = 0;
      try {
        validate_plan(p, model, topology);
      } catch (const InputError&) {
        continue;
      }
      if (gbs < b) below = gbs, below_plan = c.plan.name;
      else above = gbs, above_plan = c.plan.name;
    }
  }
  if (below || above) {
    why << "\nvalid: a global batch size some plan divides into micro_batch_size · dp_size "
           "(· pp_size when interleaved), e.g.";
    if (below) why << " --global-batch-size " << below << " (" << below_plan << ")";
    if (below && above) why << " or";
    if (above) why << " --global-batch-size " << above << " (" << above_plan << ")";
  }
  throw InputError(why.str());
}

void refuse_no_fit(const std::vector<Candidate>& candidates, const ModelConfig& model,
                   const Topology& topology, const SearchSpace& space) {
  const Candidate* nearest = nullptr;
  for (const auto& c : candidates) {
    if (c.pruned == "does not fit in memory" &&
        (!nearest || c.peak_bytes_max < nearest->peak_bytes_max)) {
      nearest = &c;
    }
  }
  std::ostringstream why;
  why << "no plan fits in " << fixed(space.max_memory_fraction, 2) << " of "
      << format_bytes(topology.node.device.memory_bytes) << " per device";
  if (nearest) {
    why << "; the smallest peak is plan " << nearest->plan.name << " at "
        << (nearest->peak_is_lower_bound ? "at least " : "") << format_bytes(nearest->peak_bytes_max)
        << ". Checked changes to it:";
    for (const auto& s : suggest_fits(nearest->plan, model, topology, space)) {
      why << "\n  " << s.change << ": "
          << (s.fits ? "fits (peak " + format_bytes(s.peak_bytes_max) + ")"
                     : "does not fit" + (s.note.empty() ? "" : " (" + s.note + ")"));
    }
  }
  // More nodes: the whole search again (it is cheap) on 2, 4, ... 64 times the nodes.
  for (int64_t factor = 2; factor <= 64; factor *= 2) {
    Topology bigger = topology;
    bigger.num_nodes = topology.num_nodes * factor;
    std::vector<Candidate> more = enumerate_candidates(model, bigger, space);
    ComputeCostModel costs(bigger.node.device, more.front().plan.param_dtype,
                           roofline_profile(bigger), bigger.file);
    if (space.fp8.enabled()) costs.use_fp8(bigger.node.device, bigger.file);
    check_candidates(more, model, bigger, space, costs, 2, nullptr);
    const Candidate* fastest = nullptr;
    int64_t fit = 0;
    for (const auto& c : more) {
      if (!c.kept()) continue;
      ++fit;
      if (!fastest || c.estimate.step_time_s < fastest->estimate.step_time_s) fastest = &c;
    }
    if (fastest) {
      why << "\nvalid: --nodes " << bigger.num_nodes << " (" << factor << "× the nodes): " << fit
          << " plans fit at this batch size, the fastest by the quick estimate "
          << fastest->plan.name << " (at most " << format_bytes(fastest->peak_upper_bytes)
          << " per device)";
      break;
    }
    if (factor == 64) why << "\nno plan fits on up to 64× the nodes either";
  }
  throw InputError(why.str());
}

double tokens_per_step(const ModelConfig& model, const Plan& plan) {
  return double(plan.global_batch_size) * double(model.seq_length);
}

double model_flops_utilization(const ModelConfig& model, const Topology& topology, const Plan& plan,
                               double step_time_s) {
  double peak = topology.node.device.peak_for(plan.param_dtype, topology.file);
  return model_flops_per_token(model) * tokens_per_step(model, plan) / step_time_s /
         (double(plan.world_size()) * peak);
}

Json planner_envelope(const std::string& command, const ModelConfig& model,
                      const Topology& topology, const std::string& sim_mode, Json inputs) {
  Json out = envelope_head(command);
  out["simulate_mode"] = sim_mode;
  inputs["model_file"] = model.file;
  inputs["topology_file"] = topology.file;
  inputs["num_nodes"] = topology.num_nodes;
  inputs["model"] = model_to_json(model);
  inputs["topology"] = topology_to_json(topology);
  out["inputs"] = std::move(inputs);
  return out;
}

void add_sim_mode_option(boost::program_options::options_description& options) {
  options.add_options()(
      "sim-mode", boost::program_options::value<std::string>()->default_value("approx"),
      "how plans are simulated: approx (simulate --mode approx: tensor parallelism folded also "
      "beside dp/pp groups in a node, and one data-parallel copy per stage simulated for them all; "
      "about a second per plan at 1,024 devices, within about 1% of fast where tested) or fast "
      "(exact folds only; minutes for tp 4 on 8-device nodes at 1,024 devices)");
}

std::string sim_mode_from(const boost::program_options::variables_map& vm) {
  std::string mode = vm["sim-mode"].as<std::string>();
  if (mode != "approx" && mode != "fast") {
    throw InputError("command line: --sim-mode '" + mode + "': valid: approx, fast");
  }
  return mode;
}

std::string dropout_from(const boost::program_options::variables_map& vm, const ModelConfig& model) {
  if (vm.count("dropout")) return "--dropout";
  if (!model.stated_dropout) return "Megatron-LM's default";
  std::string keys;
  for (const std::string& key : model.dropout_keys) keys += (keys.empty() ? "" : ", ") + key;
  return "the model's " + keys;
}

std::string attention_and_dropout(const SearchSpace& space, const std::string& dropout_source) {
  std::ostringstream out;
  out << "attention " << to_string(space.attention_impl) << ", dropout " << space.dropout << " (" << dropout_source
      << ")";
  return out.str();
}

SearchSpace search_space_from(const boost::program_options::variables_map& vm, const ModelConfig& model) {
  SearchSpace space;
  // Required unless --from-megatron gives it (run_plan checks).
  space.global_batch_size = vm.count("global-batch-size") ? vm["global-batch-size"].as<int64_t>() : 0;
  if (vm.count("include-gpipe")) space.include_gpipe = vm["include-gpipe"].as<bool>();
  space.max_memory_fraction = vm["max-memory-fraction"].as<double>();
  space.dropout = vm.count("dropout") ? vm["dropout"].as<double>() : model.stated_dropout.value_or(0.1);
  if (!(space.dropout >= 0 && space.dropout < 1)) {
    throw InputError("command line: --dropout " + fixed(space.dropout, 3) + ": valid: a number in [0, 1)");
  }
  std::string attention = vm["attention"].as<std::string>();
  if (attention != "materialized" && attention != "flash") {
    throw InputError("command line: --attention '" + attention + "': valid: materialized, flash");
  }
  space.attention_impl = attention == "flash" ? AttentionImpl::flash : AttentionImpl::materialized;
  std::string fp8 = vm["fp8"].as<std::string>();
  if (fp8 != "none" && fp8 != "e4m3" && fp8 != "hybrid") {
    throw InputError("command line: --fp8 '" + fp8 + "': valid: none, e4m3, hybrid");
  }
  space.fp8.format = fp8 == "e4m3" ? Fp8Format::e4m3 : fp8 == "hybrid" ? Fp8Format::hybrid : Fp8Format::none;
  std::string recipe = vm["fp8-recipe"].as<std::string>();
  const std::optional<Fp8Scaling> scaling = parse_fp8_scaling(recipe);
  if (!scaling) {
    throw InputError("command line: --fp8-recipe '" + recipe + "': valid: delayed, tensorwise, mxfp8, blockwise");
  }
  if (*scaling != Fp8Scaling::delayed && !space.fp8.enabled()) {
    throw InputError("command line: --fp8-recipe '" + recipe + "' without --fp8: valid: --fp8 e4m3 or hybrid beside "
                     "it, or no --fp8-recipe");
  }
  space.fp8.scaling = *scaling;
  space.fp8.param_gather = vm.count("fp8-param-gather") && vm["fp8-param-gather"].as<bool>();
  if (space.fp8.param_gather && !space.fp8.delayed() && !space.fp8.current()) {
    throw InputError("command line: --fp8-param-gather with --fp8 " + fp8 + " --fp8-recipe " + recipe +
                     ": valid: beside --fp8 e4m3 or hybrid with --fp8-recipe delayed or tensorwise");
  }
  read_moe_search_options(vm, space);
  return space;
}

}  // namespace stepcast::cli
