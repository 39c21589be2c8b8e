// Child-process simulations; see child_simulate.hpp.
#include "child_simulate.hpp"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "inputs.hpp"

namespace stepcast::cli {

ChildSimulator::ChildSimulator(const ModelConfig& model, std::string profile_arguments,
                               std::string mode)
    : model_(model), profile_arguments_(std::move(profile_arguments)), mode_(std::move(mode)) {
  // A fresh folder per instance: several may live at once in one process (validate --sweep
  // published runs one per model on two threads).
  std::string dir = (std::filesystem::temp_directory_path() /
                     ("stepcast-children-" + std::to_string(getpid()) + "-XXXXXX"))
                        .string();
  if (!mkdtemp(dir.data())) throw std::runtime_error("cannot create a folder like " + dir);
  dir_ = dir;
  // A model without a file of its own (--from-megatron): its config, written for the children.
  std::error_code ec;
  if (std::filesystem::is_regular_file(model_.file, ec)) {
    model_argument_ = " --model " + shell_quote(model_.file) + child_seq_length_argument(model_);
  } else {
    std::string file = (dir_ / "model.json").string();
    std::ofstream(file) << model_to_json(model_).dump(2);
    model_argument_ = " --model " + shell_quote(file);
  }
}

ChildSimulator::~ChildSimulator() {
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

Simulated ChildSimulator::simulate(const std::string& key, const Plan& plan,
                                   const Topology& topology) {
  std::filesystem::path dir;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    dir = dir_ / std::to_string(next_++);
  }
  std::filesystem::create_directories(dir);
  std::string plan_file = (dir / "plan.json").string();
  std::ofstream(plan_file) << plan_to_json(plan).dump(2);
  std::ostringstream cmd;
  // /proc/PID/exe still runs this binary if a rebuild replaced the file meanwhile.
  cmd << "/proc/" << getpid() << "/exe simulate" << model_argument_
      << " --topology " << shell_quote(topology.file) << " --nodes " << topology.num_nodes
      << " --plan " << shell_quote(plan_file) << " --mode " << mode_ << " --no-scaling --no-records --out "
      << shell_quote((dir / "out").string());
  cmd << profile_arguments_;
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
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
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
