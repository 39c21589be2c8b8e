// The forked dp_size = 1 reference simulation; see scaling_reference.hpp. The child answers on a
// pipe with one line: "ok TOKENS_PER_S_PER_DEVICE" or "error MESSAGE".
#include "scaling_reference.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <numeric>
#include <exception>
#include <iostream>
#include <sstream>
#include <stdexcept>

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
    SimulationOutput sim = simulate_program(program, in.topology, profile, options);
    std::ostringstream answer;
    answer.precision(17);
    answer << "ok " << double(program.tokens_per_step) / sim.step_time_s / double(plan.tp_size * plan.pp_size);
    return answer.str();
  } catch (const std::exception& e) {
    return std::string("error ") + e.what();
  }
}

}  // namespace

ScalingReference::ScalingReference(const Inputs& in, const DeviceProfile& profile,
                                   const SimulateOptions& options) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  std::cout.flush();
  std::cerr.flush();
  pid_ = fork();
  if (pid_ < 0) {
    close(fds[0]);
    close(fds[1]);
    throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  }
  if (pid_ == 0) {
    close(fds[0]);
    std::string answer = simulate_reference(in, profile, options) + "\n";
    for (size_t written = 0; written < answer.size();) {
      ssize_t n = write(fds[1], answer.data() + written, answer.size() - written);
      if (n <= 0) break;
      written += size_t(n);
    }
    _exit(0);  // no destructors, no flushing of the parent's buffers
  }
  close(fds[1]);
  from_child_ = fds[0];
}

ScalingReference::~ScalingReference() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (from_child_ >= 0) close(from_child_);
}

double ScalingReference::tokens_per_s_per_device() {
  std::string answer;
  char buffer[4096];
  ssize_t n;
  while ((n = read(from_child_, buffer, sizeof buffer)) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0) answer.append(buffer, size_t(n));
  }
  close(from_child_);
  from_child_ = -1;
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  if (answer.rfind("ok ", 0) == 0) return std::stod(answer.substr(3));
  if (answer.rfind("error ", 0) == 0) {
    throw std::runtime_error("the dp_size = 1 reference simulation failed: " + answer.substr(6));
  }
  std::ostringstream why;
  why << "the dp_size = 1 reference simulation failed: its process ended without an answer ("
      << (WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status))
                              : "exit " + std::to_string(WEXITSTATUS(status)))
      << ")";
  throw std::runtime_error(why.str());
}

}  // namespace stepcast::cli
