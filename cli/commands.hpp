// The subcommands. Each takes the arguments after its name and returns the process exit code.
#pragma once

#include <string>
#include <vector>

namespace stepcast::cli {

class SimulationRunner;

// The whole command line (argv[1] the subcommand): what the executable's main runs, and the
// tests' fault-injecting build of it (tests/exec/fault_main.cpp).
int stepcast_main(int argc, char** argv);

int run_memory(int argc, char** argv);
int run_lower(int argc, char** argv);
int run_simulate(int argc, char** argv);
int run_run(int argc, char** argv);
int run_compare(int argc, char** argv);
int run_profile(int argc, char** argv);
// `profile import|fit|check` (tool), argv from the tool's name on.
int run_profile_tool(const std::string& tool, int argc, char** argv);
// The commands that run many simulations take where to run them (a SimulationRunner: this
// process, or the ranks of an MPI job).
int run_plan(int argc, char** argv, SimulationRunner& runner);
int run_compare_strategies(int argc, char** argv, SimulationRunner& runner);
int run_scale(int argc, char** argv, SimulationRunner& runner);
int run_validate(int argc, char** argv, SimulationRunner& runner);
int run_calibrate(int argc, char** argv);
int run_goodput(int argc, char** argv);
int run_contention(int argc, char** argv);
int run_completion(int argc, char** argv);
// The names of the subcommands, in `stepcast --help`'s order.
std::vector<std::string> command_names();

}  // namespace stepcast::cli
