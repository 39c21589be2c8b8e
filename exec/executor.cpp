// The executor (executor.hpp): one rank's run on a backend — the memory baseline, the resume,
// the timed, warm-up and instrumented steps, checkpoints — and rank 0's StepResult from every
// rank's records. The interpreter of the program is interpreter.hpp's.
#include "executor.hpp"

#include <malloc.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>

#include "checkpoint_run.hpp"
#include "cpu_backend.hpp"
#include "errors.hpp"
#include "host_memory.hpp"
#include "interpreter.hpp"
#include "lower.hpp"
#include "memory.hpp"
#include "parameter_server_run.hpp"
#include "mpi_check.hpp"
#include "program_inputs.hpp"
#include "program_stats.hpp"
#include "units.hpp"
#include "watchdog.hpp"

namespace stepcast {

Json hyperparameters_json(const RunOptions& options) {
  return {{"lr", options.lr},
          {"beta1", options.beta1},
          {"beta2", options.beta2},
          {"eps", options.adam_eps},
          {"weight_decay", options.weight_decay},
          {"max_grad_norm", options.max_grad_norm},
          {"seed", options.seed}};
}

namespace {

const BackendWrapper* g_backend_wrapper = nullptr;

// run_with_backend on inputs already read from the program.
constexpr int64_t kRoutingSampleSteps = 64;

// Rank 0: the routing of the run from every rank's counts (`routed`: [layer · E + expert] over the
// steps; `samples`: [step, microbatch, layer, copies per expert] in turn): per MoE layer, the
// total, and the samples, one per (step, microbatch, expert block) — the ep·etp ranks of a stage
// whose tokens meet at the experts, whose copies add up.
void moe_routing_of_run(const StepProgram& program, const ModelConfig& model,
                        const std::vector<std::vector<double>>& routed,
                        const std::vector<std::vector<double>>& samples, RunOutput& output) {
  const int64_t E = program.moe.num_experts, L = model.num_hidden_layers;
  std::vector<double> total(size_t(L * E), 0.0);
  for (const std::vector<double>& v : routed) {
    for (size_t i = 0; i < v.size() && i < total.size(); ++i) total[i] += v[i];
  }
  const RankGrid grid = program.grid();
  // (layer, step, microbatch, stage, block) → copies per expert
  std::map<std::array<int64_t, 5>, std::vector<int64_t>> blocks;
  for (size_t rk = 0; rk < samples.size() && int64_t(rk) < grid.world_size(); ++rk) {  // (not servers)
    const int64_t block = grid.stage_index(int64_t(rk)) / (grid.ep_size() * grid.etp_size());
    const int64_t stage = grid.coord(int64_t(rk)).pp;
    const std::vector<double>& v = samples[rk];
    for (size_t i = 0; i + size_t(3 + E) <= v.size(); i += size_t(3 + E)) {
      std::vector<int64_t>& sum = blocks[{int64_t(v[i + 2]), int64_t(v[i]), int64_t(v[i + 1]), stage, block}];
      sum.resize(size_t(E), 0);
      for (int64_t e = 0; e < E; ++e) sum[size_t(e)] += std::llround(v[i + 3 + size_t(e)]);
    }
  }
  for (int64_t l = model.first_k_dense_replace; l < L; ++l) {
    output.moe_tokens_per_expert.emplace_back();
    for (int64_t e = 0; e < E; ++e) {
      output.moe_tokens_per_expert.back().push_back(std::llround(total[size_t(l * E + e)]));
    }
    output.moe_routing_samples.emplace_back();
    for (auto it = blocks.lower_bound({l, INT64_MIN, INT64_MIN, INT64_MIN, INT64_MIN});
         it != blocks.end() && it->first[0] == l; ++it) {
      output.moe_routing_samples.back().push_back(it->second);
    }
  }
}

template <class T, class G, class W>
RunOutput run_on_backend(const StepProgram& program, const ModelConfig& model, const Plan& plan,
                         const Topology& topology, const RunOptions& options, Backend<T, G, W>& backend_ref) {
  int rank = 0, size = 0;
  STEPCAST_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  STEPCAST_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size));
  RunOutput output;
  Backend<T, G, W>* backend = &backend_ref;
  Interpreter<T, G, W> interpreter(program, model, plan, options, rank, *backend);
  const CheckpointShardLayout layout = checkpoint_shard_layout(program, plan);
  ControlChannel control(options.watchdog_s);  // before the memory baseline: not step memory
  // Per-op records of the instrumented step: measurement machinery, faulted in before the
  // memory baseline (no allocation inside the step).
  std::vector<OpRecord> records(program.role_of_rank(rank).ops.size());
  records.clear();
  // The routing's samples (MoE): the first kRoutingSampleSteps steps' (bounded, so that a long run
  // does not hold them all), also allocated before the baseline.
  interpreter.reserve_moe_routing(std::min<int64_t>(options.steps, kRoutingSampleSteps));
  // ---- measured memory, host backends (see warm_up_host_memory; a device backend reports its
  // allocator's peak): measured = anonymous memory after the steps − here, after the warm-up
  // step and before the arena (VmHWM over the steps − VmRSS here beside it). The peak counts from after the arena is
  // allocated and the parameters are initialised (their transient host copies are not step memory).
  const bool host_memory = backend->device_peak_bytes() < 0;
  interpreter.index_arena();
  if (host_memory) malloc_trim(0);
  double rss_before = resident_bytes("VmRSS:");
  double mapped_before = resident_bytes("RssFile:") + resident_bytes("RssShmem:");
  double anonymous_before = host_memory ? exact_anonymous_bytes() : 0;
  interpreter.create_arena();
  int64_t first_step = 0;
  if (!options.resume_dir.empty()) {
    CheckpointInfo info;
    // Every rank verifies the pointer and the manifest, and its own file; if anything fails on
    // any rank, every rank refuses the checkpoint.
    control.agree("reading the checkpoint in " + options.resume_dir, [&] {
      info = find_checkpoint(options.resume_dir, program.program_sha256, layout, size);
      CheckpointIdentity identity{rank, size, info.step, program.program_sha256};
      read_rank_checkpoint(info.path, info.manifest.files.at(size_t(rank)), identity, interpreter.state_buffers());
    });
    interpreter.upload_state();
    first_step = info.step;
    if (rank == 0 && !options.quiet) {
      std::cout << "resumed from " << info.path << " after step " << info.step << "\n";
    }
  }
  output.first_step = first_step;
  double tokens_per_step = double(program.tokens_per_step);
  output.losses.reserve(size_t(options.steps));
  output.moe_dropped_tokens.reserve(size_t(options.steps));
  output.step_times_s.reserve(size_t(options.steps));
  int64_t steps = options.steps - first_step;  // --steps is the step to stop after
  if (steps < 1) {
    throw InputError("--steps " + std::to_string(options.steps) + ": the checkpoint already has " +
                     std::to_string(first_step) + " steps; valid: more than " + std::to_string(first_step));
  }
  // The first step run warms up; the last (when there are 3 or more) is instrumented; the rest
  // are timed. k counts the steps of this run; the step index is first_step + k.
  int64_t instrumented = steps >= 3 ? steps - 1 : -1;
  double heap_after_first = 0;
  if (host_memory) {
    malloc_trim(0);
    reset_peak_resident_bytes();  // the peak from here on: the steps
  }
  for (int64_t k = 0; k < steps; ++k) {
    control.barrier("the start of step " + std::to_string(first_step + k + 1));
    double heap_before = double(mallinfo2().uordblks);
    double start = backend->now_s();
    double local_loss = interpreter.step(first_step + k, k == instrumented ? &records : nullptr, start);
    double local_time = backend->now_s() - start;
    // Heap bytes the step left allocated (our code allocates nothing after step 1; what remains
    // is the MPI library's own request and buffer pools).
    if (k >= 1) heap_after_first += double(mallinfo2().uordblks) - heap_before;
    const std::string after = "the end of step " + std::to_string(first_step + k + 1);
    double step_time = control.max(local_time, after);
    double loss_sum = control.sum(local_loss, after);
    double loss = loss_sum / tokens_per_step;
    output.losses.push_back(loss);
    if (program.moe.num_experts > 0) {
      output.moe_dropped_tokens.push_back(int64_t(control.sum(double(interpreter.moe_dropped_tokens()), after)));
    }
    output.step_times_s.push_back(step_time);
    // Every rank clips with the same all-reduced norm; the spread says whether they agreed.
    const double norm_max = control.max(interpreter.last_grad_norm(), after),
                 norm_min = -control.max(-interpreter.last_grad_norm(), after);
    output.grad_norms.push_back(norm_max);
    if (norm_max > 0) {
      output.grad_norm_rank_spread = std::max(output.grad_norm_rank_spread, (norm_max - norm_min) / norm_max);
    }
    if (rank == 0 && !options.quiet) {
      std::cout << "step " << first_step + k + 1 << "/" << options.steps << "  loss " << loss << "  step time "
                << step_time << " s  grad norm " << interpreter.last_grad_norm()
                << (k == 0              ? "  (warm-up)"
                    : k == instrumented ? "  (instrumented)"
                                        : "")
                << "\n"
                << std::flush;
    }
    int64_t done = first_step + k + 1;
    if (options.checkpoint_every > 0 && done % options.checkpoint_every == 0) {
      save_checkpoint(
          program, plan, options.checkpoint_dir, done, control, [&] { return interpreter.download_state(); },
          [&] { backend->reached(RunPoint::checkpoint_write); });
      if (rank == 0 && !options.quiet) std::cout << "checkpoint after step " << done << "\n";
    }
  }
  output.heap_growth_after_first_step_bytes = heap_after_first;
  // A device backend measures its own memory. (The host's high-water mark leaves out the
  // file-backed and shared pages first faulted in during the steps, which no allocation made.)
  // The measured peak on the host: the anonymous pages the steps added, counted exactly at their
  // end — every page a step touches stays resident (the arena is never returned; our code
  // allocates nothing in a step, the heap figure above checks it), so the end holds the peak.
  // The kernel's high-water mark is reported beside it: it also sees pages freed again within a
  // step, but through the approximate counters.
  double mapped_growth = resident_bytes("RssFile:") + resident_bytes("RssShmem:") - mapped_before;
  if (backend->device_peak_bytes() >= 0) {
    output.measured_peak_bytes = backend->device_peak_bytes();
  } else {
    output.measured_peak_bytes = exact_anonymous_bytes() - anonymous_before;
    output.resident_high_water_bytes = resident_bytes("VmHWM:") - rss_before - std::max(0.0, mapped_growth);
  }

  // The routing of the run: token copies per expert in each MoE layer, summed over the ranks
  // (each routes its own tokens; a pipeline stage's ranks only its layers).
  if (program.moe.num_experts > 0) {
    std::vector<std::vector<double>> routed = control.gather(interpreter.moe_routed_by_layer(), "the routing counts");
    std::vector<std::vector<double>> samples =
        control.gather(interpreter.moe_routing_samples(), "the routing counts of each microbatch");
    if (rank == 0) moe_routing_of_run(program, model, routed, samples, output);
  }
  // Per-op records and measured memory to rank 0.
  std::vector<double> mine;
  mine.reserve(4 + records.size() * 5);
  mine.push_back(output.measured_peak_bytes);
  mine.push_back(output.resident_high_water_bytes);
  mine.push_back(output.heap_growth_after_first_step_bytes);
  mine.push_back(double(interpreter.arena_extent_bytes()));
  for (const OpRecord& o : records) {
    for (double v : {double(o.rank), double(o.id), o.start_s, o.end_s, o.ready_s}) mine.push_back(v);
  }
  backend->reached(RunPoint::records_gather);
  std::vector<std::vector<double>> gathered = control.gather(mine, "gathering the per-op records");
  std::vector<double> peaks, growth, high_water, extents, all;
  for (const std::vector<double>& v : gathered) {
    peaks.push_back(v.at(0));
    high_water.push_back(v.at(1));
    growth.push_back(v.at(2));
    extents.push_back(v.at(3));
    all.insert(all.end(), v.begin() + 4, v.end());
  }
  if (rank != 0) return output;

  StepResult& r = output.result;
  r.source = "executor";
  std::vector<double> timed(output.step_times_s.begin() + (steps > 1 ? 1 : 0),
                            output.step_times_s.begin() + (instrumented >= 0 ? instrumented : steps));
  if (timed.empty()) timed = output.step_times_s;
  r.step_time_s = median(timed);
  for (size_t i = 0; i < all.size(); i += 5) {
    r.ops.push_back({int64_t(all[i]), int32_t(all[i + 1]), all[i + 2], all[i + 3], all[i + 4]});
  }
  fill_ready_times(program, r.ops);  // clocks are aligned: every rank starts the step together
  // Breakdown on the rank whose instrumented step ended last.
  if (!r.ops.empty()) {
    std::map<int64_t, double> end_of_rank;
    double step_end = 0;
    for (const auto& o : r.ops) {
      end_of_rank[o.rank] = std::max(end_of_rank[o.rank], o.end_s);
      step_end = std::max(step_end, o.end_s);
    }
    for (const auto& [rk, e] : end_of_rank) {
      if (e == step_end) r.critical_rank = rk;
    }
    const Role& role = program.role_of_rank(r.critical_rank);
    std::vector<OpRecord> critical(role.ops.size());
    for (const auto& o : r.ops) {
      if (o.rank == r.critical_rank) critical[size_t(o.id)] = o;
    }
    r.breakdown = breakdown_of_rank(role, critical, 0, step_end);
  }
  ProgramStats stats = program_stats(program);
  double peak = topology.node.device.peak_for(plan.param_dtype, topology.file);
  double model_flops = model_flops_per_token(model) * tokens_per_step;
  r.tokens_per_s = tokens_per_step / r.step_time_s;
  r.mfu = model_flops / r.step_time_s / (double(size) * peak);
  r.hfu = stats.matrix_flops_per_step / r.step_time_s / (double(size) * peak);
  MemoryReport memory = memory_report(program, topology);
  r.memory = memory_to_json(memory);
  Json measured = Json::array();
  double measured_max = 0;
  for (int rk = 0; rk < size; ++rk) {
    measured.push_back({{"rank", rk},
                        {"measured_peak_bytes", peaks[size_t(rk)]},
                        {"heap_growth_after_first_step_bytes", growth[size_t(rk)]},
                        {"arena_extent_bytes", extents[size_t(rk)]}});
    if (high_water[size_t(rk)] >= 0) {
      measured.back()["resident_high_water_bytes"] = high_water[size_t(rk)];
    }
    measured_max = std::max(measured_max, peaks[size_t(rk)]);
  }
  r.memory["measured"] = measured;
  r.memory["measured_peak_bytes_max"] = measured_max;
  Json device = backend->device_memory();
  if (!device.empty()) r.memory["device_rank0"] = device;

  r.program_sha256 = program.program_sha256;
  r.extra = {{"losses", output.losses},
             {"first_step", first_step},
             {"step_times_s", output.step_times_s},
             {"step_time_min_s", *std::min_element(timed.begin(), timed.end())},
             {"step_time_max_s", *std::max_element(timed.begin(), timed.end())},
             {"timed_steps", timed.size()},
             {"backend", backend->name()},
             {"dtype", to_string(plan.param_dtype)},
             {"grad_dtype", to_string(plan.grad_dtype)},
             {"collectives", options.collectives_mpi ? "mpi" : "program"},
             {"collective_algorithms_used", interpreter.algorithms_used()},
             {"hyperparameters", hyperparameters_json(options)}};
  // Token copies the expert capacity dropped in each step, summed over the ranks (MoE with a
  // moe_expert_capacity_factor; 0 when dropless).
  if (program.moe.num_experts > 0) r.extra["moe_dropped_tokens"] = output.moe_dropped_tokens;
  // Token copies the routing sent to each expert (dropped ones too), a row per MoE layer, over
  // the steps run and the ranks: the routing a plan's moe_routing_histogram can name
  // (moe-routing.json beside the measurement).
  if (program.moe.num_experts > 0) r.extra["moe_tokens_per_expert"] = output.moe_tokens_per_expert;
  if (!output.grad_norms.empty()) {
    r.extra["grad_norms"] = output.grad_norms;
    r.extra["grad_norm_rank_spread"] = output.grad_norm_rank_spread;
  }
  return output;
}

}  // namespace

template <class T, class G, class W>
RunOutput run_with_backend(const StepProgram& program, const RunOptions& options, Backend<T, G, W>& backend) {
  ProgramInputs in = program_inputs(program);
  return run_on_backend(program, in.model, in.plan, in.topology, options, backend);
}

template RunOutput run_with_backend<float, float, float>(const StepProgram&, const RunOptions&, Backend<float>&);
template RunOutput run_with_backend<double, double, double>(const StepProgram&, const RunOptions&, Backend<double>&);
template RunOutput run_with_backend<bf16, float, float>(const StepProgram&, const RunOptions&,
                                                        Backend<bf16, float, float>&);
template RunOutput run_with_backend<bf16, bf16, float>(const StepProgram&, const RunOptions&,
                                                       Backend<bf16, bf16, float>&);

namespace {

// The measured peak on the host is the kernel's count of the process's anonymous memory
// (smaps_rollup, exact), not the arena's bookkeeping: it sees every page a step touches, in the
// arena or not.
// What is not the step's — code pages faulted in, OpenBLAS's packing buffers, MPI's shared-memory
// segments and request pools — is left out by running one throwaway step first, on a throwaway
// backend and arena that are then destroyed: the baseline is the process after it (heap
// trimmed), so whatever the real backend or interpreter allocates for its steps is counted.
template <class T>
void warm_up_host_memory(const StepProgram& program, const ModelConfig& model, const Plan& plan,
                         const RunOptions& options, int rank) {
  std::unique_ptr<Backend<T>> backend =
      make_cpu_backend<T>(program.grid(), rank, program.devices_per_node, options.collectives_mpi, options.watchdog_s);
  Interpreter<T, T, T> warm_up(program, model, plan, options, rank, *backend);
  warm_up.create_arena();
  ControlChannel control(options.watchdog_s);
  control.barrier("the warm-up step");
  // As a measured step goes, instrumented, with the reductions and the formatting of the step's
  // line that follow it: the code pages of these paths are then resident in the baseline, not
  // faulted in — and perhaps dropped again — during the steps.
  std::vector<OpRecord> records;
  records.reserve(program.role_of_rank(rank).ops.size());
  double start = backend->now_s();
  double loss = warm_up.step(0, &records, start);
  double time = backend->now_s() - start;
  double max_time = control.max(time, "the end of the warm-up step");
  double loss_sum = control.sum(loss, "the end of the warm-up step");
  std::ostringstream line;
  line << "step 1/1  loss " << loss_sum << "  step time " << max_time << " s  grad norm " << warm_up.last_grad_norm()
       << "  (warm-up)\n";
  (void)mallinfo2();
  control.barrier("the warm-up step");
}

template <class T>
RunOutput run_cpu(const StepProgram& program, const ModelConfig& model, const Plan& plan, const Topology& topology,
                  const RunOptions& options) {
  int rank = 0;
  STEPCAST_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  if (program.parameter_servers > 0) {  // free-running workers and their servers
    {
      std::unique_ptr<Backend<T>> warm_up =
          make_cpu_backend<T>(program.grid(), rank, program.devices_per_node, options.collectives_mpi, options.watchdog_s);
      warm_up_parameter_servers<T>(program, model, plan, options, *warm_up);
    }
    std::unique_ptr<Backend<T>> backend =
        make_cpu_backend<T>(program.grid(), rank, program.devices_per_node, options.collectives_mpi, options.watchdog_s);
    return run_parameter_servers<T>(program, model, plan, topology, options, *backend);
  }
  warm_up_host_memory<T>(program, model, plan, options, rank);
  std::unique_ptr<Backend<T>> backend =
      make_cpu_backend<T>(program.grid(), rank, program.devices_per_node, options.collectives_mpi, options.watchdog_s);
  if (g_backend_wrapper) backend = g_backend_wrapper->wrap(std::move(backend));
  return run_on_backend<T, T, T>(program, model, plan, topology, options, *backend);
}

}  // namespace

void check_cpu_backend(const Plan& plan, const Topology& topology) {
  if (plan.param_dtype != Dtype::fp32 && plan.param_dtype != Dtype::fp64) {
    throw_input_error(plan.file, "dtype", std::string("\"") + to_string(plan.param_dtype) + "\"",
                      "the CPU backend computes in fp32 or fp64", "\"fp32\" or \"fp64\"");
  }
  if (plan.grad_dtype != plan.param_dtype) {
    throw_input_error(plan.file, "grad_dtype", std::string("\"") + to_string(plan.grad_dtype) + "\"",
                      "the CPU backend keeps gradients in the parameter dtype",
                      std::string("\"") + to_string(plan.param_dtype) + "\"");
  }
  if (topology.node.intra_node.kind != IntraNodeKind::shared_memory) {
    // Lowering gives sends and collectives their host staging and scratch only on a host
    // topology; without them the CPU backend's posted sends would read reused memory.
    throw InputError(topology.file + ": key 'node.intra_node.kind' = \"" + to_string(topology.node.intra_node.kind) +
                     "\": the CPU backend runs on a host topology (\"shared_memory\", e.g. "
                     "topologies/localhost-cpu.json)");
  }
}

void set_backend_wrapper(const BackendWrapper* wrapper) { g_backend_wrapper = wrapper; }

RunOutput run_program(const StepProgram& program, const RunOptions& options) {
  ProgramInputs in = program_inputs(program);
  check_cpu_backend(in.plan, in.topology);
  if (in.plan.param_dtype == Dtype::fp64) {
    return run_cpu<double>(program, in.model, in.plan, in.topology, options);
  }
  return run_cpu<float>(program, in.model, in.plan, in.topology, options);
}

}  // namespace stepcast
