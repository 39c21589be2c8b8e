// `stepcast run`: executes the plan for real under mpirun (one MPI rank per program rank) on the
// CPU or the CUDA backend and writes measurement.json (StepResult, source executor) and
// trace.json.
#include <mpi.h>

#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <iostream>
#include <sstream>

#include "chrome_trace.hpp"
#include "commands.hpp"
#include "device_checks.hpp"
#include "errors.hpp"
#include "executor.hpp"
#include "inputs.hpp"
#include "mpi_main.hpp"
#include "lower.hpp"
#include "memory.hpp"
#include "program_json.hpp"
#include "planner_common.hpp"
#include "summary.hpp"
#include "cuda_plugin_loader.hpp"

namespace stepcast::cli {

namespace {

// A default input path relative to the repository: as given when it exists (run from the
// repository root), else next to the build folder the binary sits in.
// A path as given, else the shipped file of that repository path (the default corpus, the
// default topology) from a build tree or an install.
std::string repository_path(const std::string& relative) { return shipped_path(relative).value_or(relative); }

// --slowdown RANK:FACTOR, RANK a rank of the plan and FACTOR in [1, 100].
void parse_slowdown(const std::string& value, int64_t world_size, RunOptions& options) {
  const std::string valid = "RANK:FACTOR with RANK in [0, " + std::to_string(world_size - 1) +
                            "] (the plan's ranks) and FACTOR a number in [1, 100], e.g. --slowdown 1:2";
  const size_t colon = value.find(':');
  size_t rank_end = 0, factor_end = 0;
  long long rank = -1;
  double factor = 0;
  try {
    if (colon != std::string::npos) {
      rank = std::stoll(value.substr(0, colon), &rank_end);
      factor = std::stod(value.substr(colon + 1), &factor_end);
    }
  } catch (const std::exception&) {
    rank_end = factor_end = 0;
  }
  if (colon == std::string::npos || rank_end != colon || rank_end == 0 ||
      factor_end != value.size() - colon - 1 || factor_end == 0) {
    throw InputError("command line: --slowdown '" + value + "': not RANK:FACTOR; valid: " + valid);
  }
  if (rank < 0 || rank >= world_size) {
    throw InputError("command line: --slowdown '" + value + "': rank " + std::to_string(rank) +
                     " is not a rank of the plan; valid: " + valid);
  }
  if (!(factor >= 1 && factor <= 100)) {
    throw InputError("command line: --slowdown '" + value + "': factor " + value.substr(colon + 1) +
                     (factor > 0 && factor < 1 ? " would speed the rank up" : " is out of range") +
                     "; valid: " + valid);
  }
  options.slowdown_rank = rank;
  options.slowdown_factor = factor;
}

}  // namespace

int run_run(int argc, char** argv) {
  po::options_description options("stepcast run options");
  options.add_options()
      ("model", po::value<std::string>()->required(), "model config JSON")
      ("plan", po::value<std::string>()->required(), "parallelization plan JSON")
      ("topology", po::value<std::string>()->default_value("topologies/localhost-cpu.json"),
       "cluster topology JSON (for memory and MFU figures)")
      ("nodes", po::value<int>(), "override the topology's num_nodes")
      ("backend", po::value<std::string>()->default_value("cpu"),
       "cpu (fp32/fp64, OpenBLAS, MPI) or cuda (one GPU per rank: bf16 with fp32 master weights, "
       "or fp32; cuBLASLt, NCCL; needs --topology)")
      ("steps", po::value<int64_t>()->default_value(10), "training steps (first: warm-up; last: instrumented)")
      ("out", po::value<std::string>(), "write DIR/measurement.json and DIR/trace.json")
      ("collectives", po::value<std::string>()->default_value("program"),
       "program: each collective with the algorithm the program records, over MPI point-to-point; "
       "mpi: MPI's own collectives")
      ("corpus", po::value<std::string>()->default_value("data/corpus/shakespeare.txt"),
       "byte-level text corpus for 256-token vocabularies")
      ("lr", po::value<double>()->default_value(1e-3), "AdamW learning rate")
      ("seed", po::value<uint64_t>()->default_value(1234), "initialisation, data and dropout seed")
      ("quiet", po::bool_switch(), "no per-step lines")
      ("checkpoint-dir", po::value<std::string>(),
       "write checkpoints into DIR (checked writable, and taken for this run, before step 1)")
      ("checkpoint-every", po::value<int64_t>()->default_value(0), "checkpoint every K steps (0: never)")
      ("resume", po::value<std::string>(),
       "continue from the latest checkpoint in DIR; refused by every rank unless all of it verifies")
      ("watchdog-s", po::value<double>()->default_value(300),
       "abort the job (exit 4), naming the rank, when a rank waits longer than this on a peer: "
       "in any transfer, collective, barrier or gather, checkpoints included")
      ("slowdown", po::value<std::string>(),
       "RANK:FACTOR: a straggler; every compute op of RANK takes FACTOR (>= 1) times its measured "
       "duration, the extra spun after the op (CPU backend; compare with a topology whose "
       "heterogeneity gives that device compute_speed_factor 1 / FACTOR)");
  add_seq_length_option(options);
  auto vm = parse_command_line(
      argc, argv, options,
      "usage: mpirun -np N stepcast run --model M --plan P [--topology T] --backend cpu|cuda\n"
      "                                 [--steps S] [--out DIR] [--collectives program|mpi]\n"
      "                                 [--checkpoint-dir C --checkpoint-every K] [--resume C]\n"
      "                                 [--slowdown RANK:FACTOR]\n"
      "Trains the model with the plan's tensor, context, pipeline and data parallelism, one MPI\n"
      "rank per program rank (N = tp_size · context_parallel_size · pp_size · dp_size, plus\n"
      "parameter_servers: free-running workers, then the servers), printing loss, step time and\n"
      "gradient norm per step (with parameter servers, worker 0's; the measurement has the servers'\n"
      "staleness); measurement.json has losses and, but with parameter servers, grad_norms. A\n"
      "mixture of experts runs on either backend (expert and expert tensor parallelism, both\n"
      "dispatchers, biases, capacity under any split (dropping by the plan's moe_token_drop_policy)\n"
      "and padded to it, hybrid sharding, the model's\n"
      "norm_topk_prob; FP8 experts under both recipes; measurement.json counts\n"
      "the copies a capacity drops and the copies routed to each expert per layer, which --out also\n"
      "writes as DIR/moe-routing.json: a histogram a plan names with moe_routing_histogram).\n"
      "--backend cuda: one rank per GPU (the local rank from OpenMPI's or Slurm's environment),\n"
      "bf16 compute with fp32 master weights and AdamW (grad_dtype fp32 or bf16), or fp32;\n"
      "NCCL for every collective and transfer (NCCL_* variables apply); measured memory from\n"
      "the device. A build without the CUDA toolkit refuses it.");
  if (!vm) return 0;
  const std::string backend = (*vm)["backend"].as<std::string>();
  if (backend != "cpu" && backend != "cuda") {
    throw InputError("command line: --backend '" + backend + "': valid: cpu, cuda");
  }
  const CudaPlugin* cuda = backend == "cuda" ? &load_cuda_plugin() : nullptr;
  if (backend == "cuda" && (*vm)["topology"].defaulted()) {
    throw InputError("command line: --backend cuda needs --topology (the GPU machine, e.g. "
                     "topologies/h200-1gpu.json: its peak gives MFU, its memory the fit)");
  }
  std::string collectives = (*vm)["collectives"].as<std::string>();
  if (collectives != "program" && collectives != "mpi") {
    throw InputError("command line: --collectives '" + collectives + "': valid: program, mpi");
  }
  if ((*vm)["steps"].as<int64_t>() < 1) throw InputError("command line: --steps must be >= 1");
  if (!((*vm)["lr"].as<double>() > 0)) {
    throw InputError("command line: --lr " + std::to_string((*vm)["lr"].as<double>()) +
                     ": valid: a learning rate > 0");
  }
  if (!((*vm)["watchdog-s"].as<double>() > 0)) {
    throw InputError("command line: --watchdog-s " + std::to_string((*vm)["watchdog-s"].as<double>()) +
                     ": valid: seconds > 0 a rank may wait on a peer before the job is aborted");
  }
  if ((*vm)["checkpoint-every"].as<int64_t>() < 0) {
    throw InputError("command line: --checkpoint-every " +
                     std::to_string((*vm)["checkpoint-every"].as<int64_t>()) +
                     ": valid: K >= 1 (a checkpoint every K steps), or 0 for none");
  }
  if ((*vm)["topology"].defaulted()) {
    std::string path = repository_path((*vm)["topology"].as<std::string>());
    vm->at("topology").value() = boost::any(path);
  }
  // mpirun's world (read before MPI starts): a plan without dp_size fills it, as Megatron-LM does.
  PlanWorld world;
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}) {
    const char* value = std::getenv(name);
    if (value == nullptr) continue;
    char* end = nullptr;
    long size = std::strtol(value, &end, 10);
    if (*value != '\0' && *end == '\0' && size > 0) world = {size, std::string("mpirun's world (") + name + ")"};
    break;
  }
  Inputs in = load_inputs(*vm, world);
  RunOptions run_options;
  run_options.steps = (*vm)["steps"].as<int64_t>();
  run_options.collectives_mpi = collectives == "mpi";
  run_options.corpus_path = repository_path((*vm)["corpus"].as<std::string>());
  run_options.lr = (*vm)["lr"].as<double>();
  run_options.seed = (*vm)["seed"].as<uint64_t>();
  run_options.quiet = (*vm)["quiet"].as<bool>();
  run_options.watchdog_s = (*vm)["watchdog-s"].as<double>();
  run_options.checkpoint_every = (*vm)["checkpoint-every"].as<int64_t>();
  if (vm->count("checkpoint-dir")) run_options.checkpoint_dir = (*vm)["checkpoint-dir"].as<std::string>();
  if (vm->count("resume")) run_options.resume_dir = (*vm)["resume"].as<std::string>();
  if (vm->count("slowdown")) {
    if (backend != "cpu") {
      throw InputError("command line: --slowdown with --backend " + backend + ": valid: --backend cpu");
    }
    parse_slowdown((*vm)["slowdown"].as<std::string>(), in.plan.world_size(), run_options);
  }
  if (run_options.checkpoint_every > 0 && run_options.checkpoint_dir.empty()) {
    throw InputError("command line: --checkpoint-every needs --checkpoint-dir");
  }
  if (in.plan.parameter_server() && backend != "cpu") {
    throw InputError(in.plan.file + ": key 'parameter_servers' = " + std::to_string(in.plan.parameter_servers) +
                     ": the " + backend + " backend does not run parameter servers yet; valid: --backend cpu");
  }
  if (in.plan.parameter_server() && (run_options.checkpoint_every > 0 || !run_options.resume_dir.empty())) {
    throw InputError(in.plan.file + ": key 'parameter_servers' = " + std::to_string(in.plan.parameter_servers) +
                     ": checkpoints of a parameter-server run are not supported yet; valid: no --checkpoint-every or "
                     "--resume with parameter_servers");
  }
  return with_mpi(
      "run", argc, argv,
      [&](int rank, int size) {
    const int64_t ranks = in.plan.world_size() + in.plan.parameter_servers;
    if (size != ranks) {
      throw InputError("the plan needs " + std::to_string(ranks) +
                       " ranks (tp_size · context_parallel_size · pp_size · dp_size" +
                       (in.plan.parameter_server() ? std::string(" + parameter_servers") : std::string()) +
                       "), mpirun started " + std::to_string(size) + ": run mpirun -np " + std::to_string(ranks));
    }
    // Across hosts, the launcher's placement must be the topology's (a hostfile of other slots
    // would put ranks the program sees as one node's on two hosts).
    if (auto local = local_rank_from_environment([](const char* n) { return std::getenv(n); })) {
      std::string problem = placement_problem(rank, size, *local, in.topology.node.devices_per_node);
      if (!problem.empty()) throw InputError(problem);
    }
    // The output folder before any step: one that cannot be written fails now, not after
    // training.
    on_rank0_then_agree(
        rank, "checking the output folders",
        [&] {
          claim_out_option(*vm, "run");
          if (!run_options.checkpoint_dir.empty()) {
            claim_output_dir(run_options.checkpoint_dir, "run", "--checkpoint-dir");
          }
        },
        run_options.watchdog_s);
    StepProgram program = lower_program(in.model, in.topology, in.plan);
    hash_program(program);
    if (rank == 0) {
      MemoryReport memory = memory_report(program, in.topology);
      if (!memory.fits) {
        write_stderr_line("stepcast run: warning: the plan does not fit " + in.topology.file +
                          "'s device memory (needs " + format_bytes(memory.peak_bytes_max) + " of " +
                          format_bytes(memory.capacity_bytes) +
                          ", see `stepcast memory`); running it anyway on this machine\n");
      }
      std::cout << "stepcast run: " << model_label(in.model) << ", plan " << in.plan.name << ", " << size
                << " ranks, backend " << backend << " (" << to_string(in.plan.param_dtype)
                << ", gradients " << to_string(in.plan.grad_dtype) << "), program "
                << program.program_sha256.substr(0, 12) << "\n";
    }
    if (rank == 0 && !in.topology.heterogeneity.empty()) {
      write_stderr_line("stepcast run: warning: " + in.topology.file +
                        "'s heterogeneity is not emulated by the executor (its speed and link factors are "
                        "the simulator's); --slowdown RANK:FACTOR makes a CPU rank a straggler\n");
    }
    // What the backend cannot run, named in the input files; the run reads only the program.
    if (cuda) cuda->check_plan(in.model, in.plan);
    else check_cpu_backend(in.plan, in.topology);
    RunOutput output = cuda ? cuda->run_program(program, run_options) : run_program(program, run_options);
    if (rank != 0) return 0;
    StepResult& r = output.result;
    r.inputs = output_envelope("run", in)["inputs"];
    if (run_options.slowdown_rank >= 0) {
      r.extra["slowdown"] = {{"rank", run_options.slowdown_rank}, {"factor", run_options.slowdown_factor}};
      std::cout << "straggler: rank " << run_options.slowdown_rank << "'s compute ops took "
                << run_options.slowdown_factor << "x their measured duration (--slowdown)\n";
    }
    if (r.extra.contains("parameter_servers")) {
      const Json& ps = r.extra["parameter_servers"];
      std::cout << "parameter servers: " << ps["servers"].get<int64_t>() << ", " << ps["updates"].get<int64_t>()
                << " updates, busy " << fixed(100 * ps["server_busy_fraction"].get<double>(), 1)
                << "% of the run; a gradient met " << fixed(ps["staleness_updates_mean"].get<double>(), 2)
                << " other updates on average (at most " << ps["staleness_updates_max"].get<int64_t>()
                << "); workers' steps";
      for (double s : ps["worker_step_s"]) std::cout << " " << s;
      std::cout << " s\n";
    }
    std::cout << "step time " << r.step_time_s << " s ("
              << (r.extra.contains("parameter_servers") ? "one global batch at the workers' throughput, over "
                                                        : "median of ")
              << r.extra["timed_steps"].get<int64_t>() << (r.extra.contains("parameter_servers") ? " steps" : "")
              << "), tokens/s " << r.tokens_per_s
              << ", MFU " << r.mfu << ", measured peak "
              << format_bytes(r.memory["measured_peak_bytes_max"].get<double>()) << " (model "
              << format_bytes(r.memory["peak_bytes_max"].get<double>()) << ")\n";
    // Memory: the model's bytes by class (the arena allocates exactly these buffers) next to the
    // measured peak, which comes from the process's pages, not from our bookkeeping.
    const Json& rank0 = r.memory["ranks"][0];
    std::cout << "memory of rank 0, predicted by class:";
    for (const char* c : {"weights", "grads", "optimizer", "activations", "workspace", "comm", "placement"}) {
      std::cout << " " << c << " "
                << format_bytes(rank0["memory_" + std::string(c) + "_bytes"].get<double>());
    }
    double program_peak = rank0["peak_bytes"].get<double>() - rank0["memory_runtime_bytes"].get<double>();
    std::cout << "; peak " << format_bytes(program_peak) << " + runtime allowance "
              << format_bytes(rank0["memory_runtime_bytes"].get<double>()) << "\n"
              << "memory of rank 0, measured: " << format_bytes(r.memory["measured"][0]["measured_peak_bytes"].get<double>())
              << (backend == "cuda" ? " (the device allocator's high-water mark)"
                                    : " above the level before the arena (the process's anonymous pages)");
    // The arena holds the program's buffers at planned offsets: its extent is the model's peak
    // (the placement class is what the layout could not pack), so a difference is a defect.
    double extent = r.memory["measured"][0]["arena_extent_bytes"].get<double>();
    if (extent != program_peak) {
      std::cout << "; the arena takes " << format_bytes(extent) << ", not the model's " << format_bytes(program_peak)
                << " (a defect: please report it)";
    }
    std::cout << "\n";
    if (r.memory.contains("device_rank0")) {
      const Json& d = r.memory["device_rank0"];
      std::cout << "device of rank 0: " << d["device"].get<std::string>() << ", used at most "
                << format_bytes(d["used_high_water_bytes"].get<double>()) << " of "
                << format_bytes(d["total_bytes"].get<double>()) << " (cudaMemGetInfo), cuBLASLt workspace "
                << format_bytes(d["cublaslt_workspace_bytes"].get<double>()) << "\n";
    }
    if (vm->count("out")) {
      std::string dir = (*vm)["out"].as<std::string>();
      write_output_file(dir, "measurement.json", step_result_to_json(r).dump() + "\n");
      std::ostringstream trace;
      write_chrome_trace(trace, program, r.ops);
      write_output_file(dir, "trace.json", trace.str());
      std::string routing;
      if (r.extra.contains("moe_tokens_per_expert")) {  // the run's routing, as a plan can name it
        const Json& rows = r.extra["moe_tokens_per_expert"];
        int64_t total = 0;
        for (const Json& row : rows) {
          for (const Json& c : row) total += c.get<int64_t>();
        }
        Json histogram = {{"notes", "token copies routed to each expert (dropped ones too), a row per MoE layer, "
                                    "over the " + std::to_string(r.extra["losses"].size()) +
                                    " steps of `stepcast run` (program " + r.program_sha256.substr(0, 12) +
                                    "); samples: per MoE layer, those of each (step, microbatch, expert block) "
                                    "of the first steps, which a simulation replays. A plan names this file with "
                                    "moe_routing \"histogram\" and moe_routing_histogram"},
                          {"tokens_per_expert", rows},
                          {"total_tokens", total},
                          {"samples", output.moe_routing_samples}};
        write_output_file(dir, "moe-routing.json", histogram.dump(2) + "\n");
        routing = ", " + dir + "/moe-routing.json";
      }
      std::cout << "wrote " << dir << "/measurement.json" << routing << " and " << dir << "/trace.json\n";
    }
    return 0;
      },
      run_options.watchdog_s);
}

}  // namespace stepcast::cli
