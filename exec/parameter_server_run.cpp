// Parameter servers on the CPU backend; see parameter_server_run.hpp.
#include "parameter_server_run.hpp"

#include <malloc.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <memory>

#include "cpu_kernels.hpp"
#include "errors.hpp"
#include "host_memory.hpp"
#include "interpreter.hpp"
#include "memory.hpp"
#include "mpi_check.hpp"
#include "mpi_collectives.hpp"
#include "param_layout.hpp"
#include "parameter_server.hpp"
#include "program_stats.hpp"
#include "units.hpp"
#include "watchdog.hpp"

namespace stepcast {

namespace {

// What a server measured.
struct ServerStats {
  int64_t updates = 0;
  int64_t aged = 0;  // the pushes of the second half, whose staleness is counted
  double age_sum = 0;
  int64_t age_max = 0;
  double busy_s = 0;
  double bytes = 0;  // its buffers
};

template <class T>
class Server {
 public:
  Server(const StepProgram& program, const ModelConfig& model, const RunOptions& options, int64_t server)
      : program_(program), options_(options), server_(server), role_(program.role_of_rank(program.world_size() + server)) {
    const int64_t servers = program.parameter_servers;
    for (const Op& op : role_.ops) {
      if (op.kind != OpKind::alloc) continue;
      int64_t elements = 1;
      for (int64_t d : op.shape) elements *= d;
      buffers_[op.buffer].assign(size_t(elements), T(0));
      stats_.bytes += double(elements) * double(sizeof(T));
      if (!op.persistent || op.buffer.rfind("weights.", 0) != 0) continue;
      // The group's slice of the initial weights, as every worker draws them.
      const std::string group = op.buffer.substr(8);
      const GroupLayout layout = param_group_layout(model, 1, group);
      auto [first, last] = server_slice(layout.elements, servers, server);
      STEPCAST_CHECK(last - first == elements, "server " + std::to_string(server) + ": " + op.buffer +
                                                   " is not the group's slice");
      std::vector<T>& w = buffers_[op.buffer];
      for (const TensorSlice& tensor : layout.tensors) {
        const int64_t a = std::max(first, tensor.offset), z = std::min(last, tensor.offset + tensor.elements());
        if (a >= z) continue;
        const TensorInitializer init(model, 1, 0, group, tensor, options.seed);
        for (int64_t e = a; e < z; ++e) {
          const int64_t local = e - tensor.offset;
          w[size_t(e - first)] = T(init.at(local / tensor.cols, local % tensor.cols));
        }
      }
      layouts_[group] = layout;
      slices_[group] = {first, last};
    }
  }

  ServerStats run(int64_t workers, int64_t steps) {
    std::vector<int64_t> pushed(size_t(workers), 0), version(size_t(workers), 0);
    std::vector<char> waiting(size_t(workers), 0);
    for (int64_t v = 0; v < workers; ++v) send_weights(v, version);  // the initial weights
    for (int64_t k = 0; k < workers * steps; ++k) {
      const int64_t w = handle_push();
      if (pushed[size_t(w)] >= steps / 2) {  // the steady state, as the simulator reads it
        const int64_t age = stats_.updates - version[size_t(w)];
        stats_.age_sum += double(age);
        stats_.age_max = std::max(stats_.age_max, age);
        ++stats_.aged;
      }
      ++stats_.updates;
      if (++pushed[size_t(w)] < steps) waiting[size_t(w)] = 1;
      for (int64_t v = 0; v < workers; ++v) {
        if (waiting[size_t(v)] && ssp_may_start(pushed, pushed[size_t(v)], program_.async_staleness)) {
          send_weights(v, version);
          waiting[size_t(v)] = 0;
        }
      }
    }
    finish();
    return stats_;
  }

 private:
  // The role's receives (the norm from any worker, then that worker's slices) and its AdamW.
  int64_t handle_push() {
    int64_t worker = -1;
    for (const Op& op : role_.ops) {
      if (op.kind == OpKind::recv) {
        std::vector<T>& b = buffers_.at(op.outputs.at(0));
        MPI_Status status;
        STEPCAST_MPI(MPI_Recv(b.data(), int(b.size()), mpi_type<T>(), worker < 0 ? MPI_ANY_SOURCE : int(worker),
                              int(op.tag), MPI_COMM_WORLD, &status));
        worker = status.MPI_SOURCE;
      } else if (op.kind == OpKind::optimizer_step) {
        STEPCAST_CHECK(op.name == OpName::adamw, std::string("a server's op ") + to_string(op.name));
        const double start = MPI_Wtime();
        adamw(op);
        stats_.busy_s += MPI_Wtime() - start;
      }
    }
    return worker;
  }

  void adamw(const Op& op) {
    const double norm = std::sqrt(double(buffers_.at("grad_norm_sq").at(0)));
    const double clip = cpu::clip_coefficient(norm, options_.max_grad_norm);
    cpu::AdamW config{options_.lr, options_.beta1, options_.beta2, options_.adam_eps, 0.0};
    for (const std::string& name : op.outputs) {
      if (name.rfind("weights.", 0) != 0) continue;
      const std::string group = name.substr(8);
      std::vector<T>& w = buffers_.at(name);
      std::vector<T>& g = buffers_.at("grads." + group);
      std::vector<T>& state = buffers_.at("optimizer." + group);  // [m | v]
      const size_t n = w.size();
      STEPCAST_CHECK(state.size() == 2 * n && g.size() == n, "server: " + group + "'s buffers");
      auto [first, last] = slices_.at(group);
      for (const TensorSlice& tensor : layouts_.at(group).tensors) {
        const int64_t a = std::max(first, tensor.offset), z = std::min(last, tensor.offset + tensor.elements());
        if (a >= z) continue;
        config.weight_decay = tensor.decay ? options_.weight_decay : 0.0;
        const size_t o = size_t(a - first);
        cpu::adamw_step(w.data() + o, g.data() + o, state.data() + o, state.data() + n + o, z - a, config,
                        stats_.updates + 1, clip);
      }
    }
  }

  // The role's sends (each group's weights) to worker `v`, each copied first into the worker's
  // slot of its staging (comm.ps_reply.GROUP [workers, slice]): its previous reply there has
  // arrived (the worker pushed since), so the slot is free and no update waits for a transfer.
  void send_weights(int64_t v, std::vector<int64_t>& version) {
    const int64_t workers = program_.world_size();
    size_t k = 0;
    for (const Op& op : role_.ops) {
      if (op.kind != OpKind::send) continue;
      const std::vector<T>& w = buffers_.at(op.inputs.at(0));
      std::vector<T>& staging = buffers_.at(op.outputs.at(0));
      STEPCAST_CHECK(staging.size() == w.size() * size_t(workers), "server: " + op.outputs.at(0) + "'s slots");
      if (requests_.size() <= k) requests_.emplace_back(size_t(workers), MPI_REQUEST_NULL);
      MPI_Request& request = requests_[k++][size_t(v)];
      STEPCAST_MPI(MPI_Wait(&request, MPI_STATUS_IGNORE));
      T* slot = staging.data() + size_t(v) * w.size();
      std::copy(w.begin(), w.end(), slot);
      STEPCAST_MPI(MPI_Isend(slot, int(w.size()), mpi_type<T>(), int(v), int(op.tag), MPI_COMM_WORLD, &request));
    }
    version[size_t(v)] = stats_.updates;
  }

  // Completes every reply (at the end).
  void finish() {
    for (auto& per_worker : requests_) {
      STEPCAST_MPI(MPI_Waitall(int(per_worker.size()), per_worker.data(), MPI_STATUSES_IGNORE));
    }
  }

  const StepProgram& program_;
  const RunOptions& options_;
  int64_t server_;
  const Role& role_;
  std::map<std::string, std::vector<T>> buffers_;
  std::map<std::string, GroupLayout> layouts_;
  std::map<std::string, std::pair<int64_t, int64_t>> slices_;
  std::vector<std::vector<MPI_Request>> requests_;  // per send op, per worker
  ServerStats stats_;
};

}  // namespace

template <class T>
void warm_up_parameter_servers(const StepProgram& program, const ModelConfig& model, const Plan& plan,
                               const RunOptions& options, Backend<T>& backend) {
  int rank = 0;
  STEPCAST_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  const int64_t workers = program.world_size();
  ControlChannel control(options.watchdog_s);
  control.barrier("the warm-up step");
  if (rank < workers) {
    Interpreter<T, T, T> interpreter(program, model, plan, options, rank, backend);
    interpreter.create_arena();
    interpreter.step(0, nullptr, backend.now_s());
  } else {
    Server<T>(program, model, options, rank - workers).run(workers, 1);
  }
  (void)mallinfo2();
  control.barrier("the warm-up step");
}

template <class T>
RunOutput run_parameter_servers(const StepProgram& program, const ModelConfig& model, const Plan& plan,
                                const Topology& topology, const RunOptions& options, Backend<T>& backend) {
  int rank = 0, size = 0;
  STEPCAST_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  STEPCAST_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size));
  if (!options.resume_dir.empty() || options.checkpoint_every > 0) {
    throw InputError(plan.file + ": key 'parameter_servers' = " + std::to_string(plan.parameter_servers) +
                     ": checkpoints of a parameter-server run are not supported yet; valid: no --checkpoint-dir or "
                     "--resume with parameter_servers");
  }
  const int64_t workers = program.world_size(), steps = options.steps;
  const bool worker = rank < workers;
  RunOutput output;
  ControlChannel control(options.watchdog_s);
  std::unique_ptr<Interpreter<T, T, T>> interpreter;
  std::unique_ptr<Server<T>> server;
  // The baseline after the interpreter (its data loader's corpus is not step memory) and before
  // the program's buffers: the worker's arena, the server's slices and staging.
  if (worker) interpreter = std::make_unique<Interpreter<T, T, T>>(program, model, plan, options, rank, backend);
  malloc_trim(0);
  const double anonymous_before = exact_anonymous_bytes();
  double extent = 0;
  if (worker) {
    interpreter->create_arena();
    extent = double(interpreter->arena_extent_bytes());
  } else {
    server = std::make_unique<Server<T>>(program, model, options, rank - workers);
  }
  malloc_trim(0);  // the initial values' host staging, freed, is not step memory (as run_program)
  control.barrier("the start of the run");
  std::vector<double> mine{double(worker ? 0 : 1), 0, extent, 0};  // kind, peak, extent, heap growth
  const double start = MPI_Wtime();
  double heap_from = double(mallinfo2().uordblks);  // after the first step on a worker
  if (worker) {
    const double local_tokens = double(program.tokens_per_step) / double(workers);
    std::vector<double> losses, times;
    for (int64_t t = 0; t < steps; ++t) {
      const double step_start = backend.now_s();
      const double loss = interpreter->step(t, nullptr, step_start) / local_tokens;
      times.push_back(backend.now_s() - step_start);
      losses.push_back(loss);
      if (t == 0) heap_from = double(mallinfo2().uordblks);
      if (rank == 0 && !options.quiet) {
        std::cout << "step " << t + 1 << "/" << steps << "  worker 0 loss " << loss << "  step time " << times.back()
                  << " s\n"
                  << std::flush;
      }
    }
    mine[3] = double(mallinfo2().uordblks) - heap_from;
    mine.insert(mine.end(), losses.begin(), losses.end());
    mine.insert(mine.end(), times.begin(), times.end());
  } else {
    ServerStats s = server->run(workers, steps);
    mine[2] = s.bytes;
    mine[3] = double(mallinfo2().uordblks) - heap_from;
    for (double v : {double(s.updates), s.age_sum, double(s.age_max), s.busy_s, double(s.aged)}) mine.push_back(v);
  }
  const double wall_s = MPI_Wtime() - start;
  mine.push_back(wall_s);
  mine[1] = exact_anonymous_bytes() - anonymous_before;
  std::vector<std::vector<double>> gathered = control.gather(mine, "gathering the workers' and servers' figures");
  if (rank != 0) return output;

  // Rank 0: the workers' losses (mean per step), steps and throughput; the servers' staleness.
  std::vector<double> worker_step_s, step_means(size_t(steps), 0), loss_means(size_t(steps), 0);
  double rate = 0, updates = 0, aged = 0, age_sum = 0, busy = 0, wall = 0;
  int64_t age_max = 0, critical = 0;
  Json measured = Json::array();
  double measured_max = 0;
  for (size_t r = 0; r < gathered.size(); ++r) {
    const std::vector<double>& v = gathered[r];
    measured.push_back({{"rank", int64_t(r)},
                        {"measured_peak_bytes", v.at(1)},
                        {"heap_growth_after_first_step_bytes", v.at(3)},
                        {"arena_extent_bytes", v.at(2)}});
    measured_max = std::max(measured_max, v.at(1));
    wall = std::max(wall, v.back());
    if (v.at(0) == 0) {
      const double* losses = v.data() + 4;
      const double* times = losses + steps;
      // The steady state: the second half of its steps (free-running workers under a bound take
      // some steps to settle, as the simulator's do).
      std::vector<double> timed(times + (steps > 1 ? std::max<int64_t>(1, steps / 2) : 0), times + steps);
      double sum = 0;
      for (double t : timed) sum += t;
      worker_step_s.push_back(sum / double(timed.size()));
      rate += 1 / worker_step_s.back();
      if (worker_step_s.back() > worker_step_s[size_t(critical)]) critical = int64_t(r);
      for (int64_t t = 0; t < steps; ++t) {
        loss_means[size_t(t)] += losses[t] / double(workers);
        step_means[size_t(t)] += times[t] / double(workers);
      }
    } else {
      updates += v.at(4);
      age_sum += v.at(5);
      age_max = std::max(age_max, int64_t(v.at(6)));
      busy += v.at(7);
      aged += v.at(8);
    }
  }
  output.losses = loss_means;
  output.step_times_s = step_means;
  StepResult& r = output.result;
  r.source = "executor";
  r.step_time_s = double(workers) / rate;
  r.critical_rank = critical;
  const double tokens_per_step = double(program.tokens_per_step);
  const double peak = topology.node.device.peak_for(plan.param_dtype, topology.file);
  r.tokens_per_s = tokens_per_step / r.step_time_s;
  r.mfu = model_flops_per_token(model) * tokens_per_step / r.step_time_s / (double(size) * peak);
  r.hfu = program_stats(program).matrix_flops_per_step / r.step_time_s / (double(size) * peak);
  r.memory = memory_to_json(memory_report(program, topology));
  r.memory["measured"] = measured;
  r.memory["measured_peak_bytes_max"] = measured_max;
  r.program_sha256 = program.program_sha256;
  const double servers = double(program.parameter_servers);
  std::vector<double> timed(step_means.begin() + (steps > 1 ? std::max<int64_t>(1, steps / 2) : 0), step_means.end());
  r.extra = {{"losses", loss_means},
             {"first_step", 0},
             {"step_times_s", step_means},
             {"step_time_min_s", *std::min_element(timed.begin(), timed.end())},
             {"step_time_max_s", *std::max_element(timed.begin(), timed.end())},
             {"timed_steps", timed.size()},
             {"backend", backend.name()},
             {"dtype", to_string(plan.param_dtype)},
             {"grad_dtype", to_string(plan.grad_dtype)},
             {"collectives", options.collectives_mpi ? "mpi" : "program"},
             {"collective_algorithms_used", interpreter->algorithms_used()},
             {"parameter_servers",
              {{"servers", program.parameter_servers},
               {"staleness", program.async_staleness},
               {"worker_step_s", worker_step_s},
               {"updates", int64_t(updates)},
               {"staleness_updates_mean", aged > 0 ? age_sum / aged : 0.0},
               {"staleness_updates_max", age_max},
               {"server_busy_fraction", wall > 0 ? busy / (wall * servers) : 0.0},
               {"definition",
                "free-running workers under stale synchronous parallelism; step_time_s is one global batch (every "
                "worker one step) at the workers' measured throughput (their mean steps over the second half of the "
                "run, the steady state); losses are the workers' own batches', averaged per step; "
                "staleness_updates_*: updates a server applied between a worker's pull and its push, over the "
                "second half"}}},
             {"hyperparameters", hyperparameters_json(options)}};
  return output;
}

template void warm_up_parameter_servers<float>(const StepProgram&, const ModelConfig&, const Plan&,
                                               const RunOptions&, Backend<float>&);
template void warm_up_parameter_servers<double>(const StepProgram&, const ModelConfig&, const Plan&,
                                                const RunOptions&, Backend<double>&);
template RunOutput run_parameter_servers<float>(const StepProgram&, const ModelConfig&, const Plan&, const Topology&,
                                                const RunOptions&, Backend<float>&);
template RunOutput run_parameter_servers<double>(const StepProgram&, const ModelConfig&, const Plan&, const Topology&,
                                                 const RunOptions&, Backend<double>&);

}  // namespace stepcast
