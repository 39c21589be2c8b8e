// stepcast's command-line front end (stepcast_main; the executable's main is stepcast.cpp): dispatches to a subcommand and turns errors into messages
// and exit codes (2: bad input, 3: internal error — a bug to report, 1: anything else).
#include <algorithm>
#include <cstring>
#include <functional>
#include <new>
#include <iostream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "distributed_simulations.hpp"
#include "errors.hpp"
#include "json_input.hpp"
#include "version.hpp"

namespace {

using stepcast::cli::SimulationRunner;

// A command runs alone (run), or runs many simulations through a runner (run_spread: spread over
// the ranks when an MPI launcher started it, distributed_simulations.hpp).
struct Command {
  const char* name;
  int (*run)(int, char**);
  const char* summary;
  int (*run_spread)(int, char**, SimulationRunner&) = nullptr;
};

const std::vector<Command> kCommands = {
    {"memory", stepcast::cli::run_memory,
     "bytes per rank by class at its peak, and whether the plan fits"},
    {"lower", stepcast::cli::run_lower,
     "write the plan's StepProgram (program.json) and summarise it"},
    {"simulate", stepcast::cli::run_simulate,
     "predict step time, breakdown, MFU, memory and scaling on SimGrid"},
    {"run", stepcast::cli::run_run,
     "train the plan for real under mpirun (CPU backend) and measure it"},
    {"plan", nullptr,
     "search every plan, prune what cannot run, rank and re-simulate the best", stepcast::cli::run_plan},
    {"compare-strategies", nullptr,
     "pure DP, ZeRO-1/2/3, TP, PP and the best 3D plan side by side", stepcast::cli::run_compare_strategies},
    {"scale", nullptr,
     "strong or weak scaling of a plan over node counts: speedup, efficiency, Amdahl", stepcast::cli::run_scale},
    {"compare", stepcast::cli::run_compare, "join a prediction and a measurement op by op: the errors"},
    {"profile", stepcast::cli::run_profile,
     "measure this machine's kernels and links under mpirun: a device profile"},
    {"validate", nullptr,
     "run a sweep end to end (simulate, run, compare): report.md and report.html", stepcast::cli::run_validate},
    {"goodput", stepcast::cli::run_goodput,
     "time to train N tokens with failures: checkpoint interval, lost work, restarts"},
    {"contention", stepcast::cli::run_contention,
     "several jobs on one cluster sharing its fabric: each job's step alone and with the others"},
    {"calibrate", stepcast::cli::run_calibrate,
     "fit a profile's GEMM, memory, link, overhead and jitter figures to measured runs"},
    {"completion", stepcast::cli::run_completion,
     "print the bash completion script (source <(stepcast completion bash))"},
};

void print_help() {
  std::cout << "stepcast " << stepcast::stepcast_version() << " (git " << stepcast::stepcast_git_commit()
            << "): plan, predict and run distributed transformer training\n\n"
            << "usage: stepcast <command> [options]   (stepcast <command> --help for its options)\n\n"
            << "commands:\n";
  size_t width = 0;
  for (const auto& c : kCommands) width = std::max(width, std::strlen(c.name) + 2);
  for (const auto& c : kCommands) std::cout << "  " << c.name << std::string(width - std::strlen(c.name), ' ') << c.summary << "\n";
  std::cout << "\ninputs: --model models/*.json, --topology topologies/*.json, --plan examples/*.json\n"
            << "(paths or shipped names), or --from-megatron 'ARGS'|SCRIPT for the model and plan of a\n"
            << "Megatron-LM launch line; a plan without dp_size uses every device (world / tp·pp·cp).\n"
            << "--nodes N overrides the topology's node count. Exit codes: 0 ok, 2 bad input,\n"
            << "3 internal error. Man page: stepcast.1; bash completion: stepcast completion bash.\n";
}

// Runs `body`; its errors as one line each under `head`, and their exit codes (2: bad input, 3: a bug).
int reporting_errors(const std::string& head, const std::function<int()>& body) {
  try {
    return body();
  } catch (const stepcast::InputError& e) {
    stepcast::write_stderr_line(head + "error: " + e.what() + "\n");
    return stepcast::kInputErrorExitCode;
  } catch (const std::bad_alloc&) {
    stepcast::write_stderr_line(head + "out of memory\n");
    return 3;
  } catch (const std::exception& e) {
    // Anything but an InputError is a bug of stepcast: input is checked before it is used.
    stepcast::write_stderr_line(head + "internal error (please report): " + e.what() + "\n");
    return 3;
  }
}

}  // namespace

std::vector<std::string> stepcast::cli::command_names() {
  std::vector<std::string> names;
  for (const auto& c : kCommands) names.push_back(c.name);
  return names;
}

int stepcast::cli::stepcast_main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" ||
      std::string(argv[1]) == "help") {
    print_help();
    return argc < 2 ? stepcast::kInputErrorExitCode : 0;
  }
  std::string name = argv[1];
  if (name == "--version") {
    std::cout << "stepcast " << stepcast::stepcast_version() << " (git "
              << stepcast::stepcast_git_commit() << ")\n";
    return 0;
  }
  // Each message is written whole in one write: ranks of an MPI job share the stream.
  const std::string head = "stepcast " + stepcast::printable_excerpt(name, 40) + ": ";
  return reporting_errors(head, [&] {
    for (const auto& c : kCommands) {
      if (name != c.name) continue;
      if (!c.run_spread) return c.run(argc - 1, argv + 1);
      if (stepcast::cli::launched_job_size() == 1) {
        stepcast::cli::LocalRunner local;
        return c.run_spread(argc - 1, argv + 1, local);
      }
      // Rank 0 runs the command, the other ranks its simulations; errors reported on rank 0, once.
      return stepcast::cli::run_spread(name, argc - 1, argv + 1, [&](SimulationRunner& runner) {
        return reporting_errors(head, [&] { return c.run_spread(argc - 1, argv + 1, runner); });
      });
    }
    std::vector<std::string> names;
    for (const auto& c : kCommands) names.push_back(c.name);
    stepcast::write_stderr_line("stepcast: unknown command '" + stepcast::printable_excerpt(name, 40) +
                                "' (closest: '" + stepcast::closest_name(name, names) +
                                "'); see stepcast --help\n");
    return stepcast::kInputErrorExitCode;
  });
}
