// The forked dp_size = 1 reference simulation; see scaling_reference.hpp. The child answers
// "ok TOKENS_PER_S_PER_DEVICE" or "error MESSAGE" (forked_child.hpp).
#include "scaling_reference.hpp"

#include <algorithm>
#include <cmath>
#include <exception>
#include <numeric>
#include <sstream>

#include "lower.hpp"

namespace stepcast::cli {

namespace {

// The child's work: its answer line.
std::string simulate_reference(const Inputs& in, const DeviceProfile& profile,
                               SimulateOptions options) {
  try {
    Json plan_json = plan_to_json(in.plan);
    plan_json["dp_size"] = 1;
    plan_json["num_distributed_optimizer_instances"] = 1;  // one replica: nothing to shard it across
    plan_json["global_batch_size"] = in.plan.global_batch_size / in.plan.dp_size;
    if (in.plan.unequal_microbatches()) {  // one replica of the mean microbatches
      plan_json.erase("microbatches_per_replica");
      const int64_t unit = in.plan.schedule == ScheduleKind::interleaved_1f1b ? in.plan.pp_size : 1;
      const double mean = double(in.plan.global_batch_size / in.plan.micro_batch_size) / double(in.plan.dp_size);
      const int64_t units = std::max<int64_t>(1, std::llround(mean / double(unit)));
      plan_json["global_batch_size"] = units * unit * in.plan.micro_batch_size;
    }
    plan_json["name"] = in.plan.name + "-dp1";
    if (in.model.is_moe()) {  // experts over the tp·cp ranks left: the largest ep and etp that still fit
      const int64_t stage = in.plan.tp_size * in.plan.cp_size;
      const int64_t etp = std::gcd(in.plan.moe.etp_size, stage);
      plan_json["expert_tensor_parallel_size"] = etp;
      plan_json["expert_model_parallel_size"] = std::gcd(in.plan.moe.ep_size, stage / etp);
    }
    Plan plan = parse_plan(plan_json, in.plan.file + " (the dp_size = 1 reference)");
    validate_plan(plan, in.model, in.topology);
    StepProgram program = lower_program(in.model, in.topology, plan);
    options.detail_ranks.clear();
    options.detail_all = false;
    options.keep_records = false;  // the step time is all it answers
    SimulationOutput sim = simulate_program(program, in.topology, profile, options);
    std::ostringstream answer;
    answer.precision(17);
    // Per device: the reference's every rank (tp · cp · pp, and parameter servers).
    answer << "ok " << double(program.tokens_per_step) / sim.step_time_s / double(program.ranks());
    keep_until_exit(std::move(program));  // the child ends with _exit (forked_child.hpp)
    return answer.str();
  } catch (const std::exception& e) {
    return std::string("error ") + e.what();
  }
}

}  // namespace

ScalingReference::ScalingReference(const Inputs& in, const DeviceProfile& profile,
                                   const SimulateOptions& options)
    : child_(
          [&] {
            run_behind_main_work();  // needed only when the simulation beside it has ended
            return simulate_reference(in, profile, options);
          },
          "the dp_size = 1 reference simulation") {}

double ScalingReference::tokens_per_s_per_device() { return child_.value(); }

}  // namespace stepcast::cli
