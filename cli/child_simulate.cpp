// Child-process simulations; see child_simulate.hpp.
#include "child_simulate.hpp"

#include <sstream>
#include <stdexcept>

#include "errors.hpp"
#include "inputs.hpp"

namespace stepcast::cli {

ChildSimulator::ChildSimulator(const ModelConfig& model, std::string profile_arguments, SimulationRunner& runner,
                               int jobs, std::string mode)
    : profile_arguments_(std::move(profile_arguments)), runner_(runner), jobs_(jobs), mode_(std::move(mode)) {
  // The model travels as text (another node may not see the file), the same text wherever the
  // child runs: the file's own where the model was read from JSON, else the model written out
  // (a --from-megatron launch line's, even one read from a script file).
  std::error_code ec;
  if (std::filesystem::is_regular_file(model.file, ec)) {
    std::string text = read_text_file(model.file);
    try {
      parse_json_text(text, model.file);
      model_json_ = std::move(text);
      model_arguments_ = child_seq_length_argument(model);
    } catch (const InputError&) {
    }
  }
  if (model_json_.empty()) model_json_ = model_to_json(model).dump(2);
}

Simulated ChildSimulator::simulate(const std::string& key, const Plan& plan, const Topology& topology) {
  SimulationRequest request;
  request.model_json = model_json_;
  request.plan_json = plan_to_json(plan).dump(2);
  std::ostringstream arguments;
  arguments << model_arguments_ << " --topology " << shell_quote(std::filesystem::absolute(topology.file).string())
            << " --nodes " << topology.num_nodes << " --mode " << mode_ << " --no-scaling --no-records --no-program-hash"
            << profile_arguments_;
  request.arguments = arguments.str();
  SimulationOutcome outcome = runner_.run(request, jobs_);
  if (!outcome.ok()) throw std::runtime_error("simulate failed: " + outcome.log);
  Json p = parse_json_text(outcome.prediction_json, "the child's prediction.json");
  Simulated s;
  s.step_time_s = p.at("step_time_s").get<double>();
  s.tokens_per_s = p.at("tokens_per_s").get<double>();
  s.mfu = p.at("mfu").get<double>();
  const Json& b = p.at("breakdown_s");
  s.compute_s = b.at("compute").get<double>();
  s.exposed_comm_s = b.at("exposed_comm").get<double>();
  s.bubble_s = b.at("bubble").get<double>();
  s.optimizer_s = b.at("optimizer").get<double>();
  s.variability_s = b.value("variability", 0.0);
  s.overlap_interference_s = b.value("overlap_interference", 0.0);
  if (p.contains("energy_per_step_j") && !p.at("energy_per_step_j").is_null()) {
    s.energy_per_step_j = p.at("energy_per_step_j").get<double>();
  }
  if (p.contains("moe")) {
    s.moe_load_ratio_mean = p.at("moe").value("load_ratio_mean", 0.0);
    s.moe_dropped_tokens = p.at("moe").value("dropped_tokens", 0.0);
  }
  s.memory = p.at("memory");
  s.fits = s.memory.at("fits").get<bool>();
  s.peak_bytes_max = s.memory.at("peak_bytes_max").get<double>();
  std::lock_guard<std::mutex> lock(mutex_);
  results_[key] = s;
  return s;
}

std::optional<Simulated> ChildSimulator::result(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = results_.find(key);
  if (it == results_.end()) return std::nullopt;
  return it->second;
}

}  // namespace stepcast::cli
