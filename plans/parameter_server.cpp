// Parameter servers; see parameter_server.hpp.
#include "parameter_server.hpp"

#include <algorithm>
#include <string>

#include "errors.hpp"
#include "json_input.hpp"
#include "plan.hpp"

namespace stepcast {

void read_parameter_servers(ObjectReader& reader, Plan& plan) {
  if (!reader.has("parameter_servers")) return;
  if (!plan.async_dp()) {
    reader.fail("parameter_servers",
                "is given, but data_parallel_mode is \"sync\" (parameter servers apply each worker's gradient as it "
                "arrives)",
                "no parameter_servers, or data_parallel_mode \"async\"");
  }
  plan.parameter_servers = reader.get_int("parameter_servers", 1);
}

void validate_parameter_servers(const Plan& plan, const ModelConfig& model, const Topology& topology) {
  const std::string& f = plan.file;
  const std::string servers = std::to_string(plan.parameter_servers);
  auto refuse = [&](const std::string& why, const std::string& valid) {
    throw_input_error(f, "parameter_servers", servers, why, valid + " with parameter_servers, or no parameter_servers");
  };
  if (plan.dp_size_derived) {
    refuse("needs dp_size (the workers; the servers take " + servers + " more devices)", "dp_size in the plan");
  }
  if (plan.tp_size != 1 || plan.pp_size != 1 || plan.cp_size != 1) {
    refuse("with tp_size " + std::to_string(plan.tp_size) + ", pp_size " + std::to_string(plan.pp_size) +
               " and context_parallel_size " + std::to_string(plan.cp_size) +
               " is not supported (a worker is one rank holding the whole model)",
           "tp_size, pp_size and context_parallel_size 1");
  }
  if (plan.zero_stage != 0) {
    refuse("with zero_stage " + std::to_string(plan.zero_stage) +
               " is not supported (the servers hold the optimizer state; each worker the whole weights)",
           "zero_stage 0");
  }
  if (model.is_moe()) refuse("with a mixture of experts (" + model.file + ") is not supported", "a dense model");
  if (plan.fp8.enabled()) refuse("with fp8 is not supported", "no fp8");
  if (plan.unequal_microbatches()) refuse("with microbatches_per_replica is not supported", "equal replicas");
  if (plan.overlap_param_gather) refuse("with overlap_param_gather is not supported", "overlap_param_gather false");
  const int64_t devices = int64_t(topology.num_devices());
  if (plan.dp_size + plan.parameter_servers > devices) {
    refuse("needs dp_size + parameter_servers = " + std::to_string(plan.dp_size + plan.parameter_servers) +
               " devices (workers, then servers), and " + topology.file + " has " + std::to_string(devices),
           "at most " + std::to_string(devices) + " workers and servers (or more nodes: --nodes)");
  }
}

std::pair<int64_t, int64_t> server_slice(int64_t elements, int64_t servers, int64_t server) {
  const int64_t base = elements / servers, extra = elements % servers;
  const int64_t first = server * base + std::min(server, extra);
  return {first, first + base + (server < extra ? 1 : 0)};
}

bool ssp_may_start(const std::vector<int64_t>& pushes, int64_t step, int64_t staleness) {
  if (pushes.empty()) return true;
  return *std::min_element(pushes.begin(), pushes.end()) >= step - staleness;
}

}  // namespace stepcast
