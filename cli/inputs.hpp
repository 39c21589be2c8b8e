// Loading the three inputs every planning command takes (--model, --topology, --plan, --nodes)
// and the options they share; the JSON envelope every output file carries.
#pragma once

#include <boost/program_options.hpp>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "model.hpp"
#include "plan.hpp"
#include "profile.hpp"
#include "topology.hpp"

namespace stepcast::cli {

namespace po = boost::program_options;

struct Inputs {
  ModelConfig model;
  Topology topology;
  Plan plan;
};

// The file an input option names: `arg` itself when it is a file or a path; a bare name
// ("llama3-8b") is the shipped FOLDER/NAME.json of the repository this stepcast was built in
// (build/stepcast), of an install (PREFIX/share/stepcast) or of the working directory, in that
// order. InputError naming the option and the shipped names when there is none.
std::string resolve_input(const std::string& arg, const std::string& folder, const std::string& option);
// The shipped names of FOLDER ("models": "gpt2-124m", "llama3-8b", ...), where resolve_input
// finds them.
std::vector<std::string> shipped_names(const std::string& folder);
// A file shipped with stepcast, by its path in the repository ("scripts/mpirun",
// "data/corpus/shakespeare.txt"): as given where it exists from the working directory, else under
// the build tree's repository, else under PREFIX/share/stepcast; nullopt where none has it.
std::optional<std::string> shipped_path(const std::string& relative);
// The value of option `name` (model, topology, plan) through resolve_input.
std::string input_file(const po::variables_map& vm, const std::string& name);

// Adds --model, --topology, --plan, --from-megatron, --nodes, --seq-length to `options`.
void add_input_options(po::options_description& options);
// --from-megatron's help text (plan and the commands of add_input_options share it).
extern const char* const kFromMegatronHelp;
// The model and plan of --from-megatron ARGS|FILE (a launch script when a file of that name
// exists, else the arguments themselves), the plan not validated; InputError with --model,
// --plan or --seq-length beside it, or for arguments stepcast cannot model. Prints the flags
// accepted and not modelled.
struct MegatronInputs {
  ModelConfig model;
  Plan plan;
  PlanWorld world;  // torchrun's world when the text gives it (dp_size follows it), else empty
};
MegatronInputs megatron_inputs(const po::variables_map& vm);
// Adds --seq-length (for commands that take --model without add_input_options).
void add_seq_length_option(po::options_description& options);
// The model of --model, at --seq-length when given; prints where the sequence length came from
// when it defaulted to the model's positions, and the config keys accepted but not modelled.
ModelConfig load_model_option(const po::variables_map& vm);
// "NAME (sequence N)": how every command's summary names the model.
std::string model_label(const ModelConfig& model);
// " --seq-length N" when the model's sequence length came from --seq-length: for child processes.
std::string child_seq_length_argument(const ModelConfig& model);
// Loads and validates them; InputError on anything wrong. A plan without dp_size takes
// world / (tp·pp·cp) (plan.hpp), the world being `world` when given (run: mpirun's), a launch
// line's (--from-megatron), else the topology's devices; a note says so.
Inputs load_inputs(const po::variables_map& vm, const PlanWorld& world = {});
// ", dp_size N derived (W devices / tp·pp·cp = T)" for a plan whose dp_size was derived; "" else.
std::string dp_size_note(const Plan& plan);
// Adds --profile and --allow-profile-mismatch; `what` says what the profile costs.
void add_profile_options(po::options_description& options, const std::string& what);
// The profile of --profile FILE|roofline, else the topology's (choose_profile); prints the
// choice's warning, if any, to stderr.
ProfileChoice profile_from(const po::variables_map& vm, const Topology& topology);
// {name, file, origin} of the choice, for output files.
Json profile_json(const ProfileChoice& choice);
// " --profile ARG [--allow-profile-mismatch]" for a child process of a command given `vm`.
std::string child_profile_arguments(const ProfileChoice& choice, const po::variables_map& vm);
// Parses argv for a command; prints its --help and returns nullopt when asked.
std::optional<po::variables_map> parse_command_line(int argc, char** argv,
                                                    const po::options_description& options,
                                                    const std::string& usage);
// {schema_version, command, stepcast_version, git_commit}: the head of every output file.
Json envelope_head(const std::string& command);
// envelope_head and inputs{files, model, topology, plan as read}.
Json output_envelope(const std::string& command, const Inputs& inputs);
// `s` quoted for /bin/sh (child processes: re-simulations).
std::string shell_quote(const std::string& s);

// Now as ISO 8601 UTC ("2026-11-30T18:42:59Z"), for reports.
std::string utc_now();
// Creates DIR, checks that it is writable and takes DIR/.stepcast.lock for this process until it
// exits: a second command writing the same folder meanwhile is refused (InputError naming the
// first), so two commands never mix their files. Called before any work, so a folder that cannot
// be written fails at once. `command` names this one in the lock, `option` the folder in errors.
void claim_output_dir(const std::string& dir, const std::string& command,
                      const std::string& option = "--out");
// claim_output_dir of --out, when given.
void claim_out_option(const po::variables_map& vm, const std::string& command);
// Creates DIR and writes DIR/NAME atomically (a temporary name of this process, renamed);
// InputError if it cannot.
void write_output_file(const std::string& dir, const std::string& name, const std::string& text);
// The same for a writer that streams its text (no copy of a large output in memory), compressed
// with gzip where NAME ends in ".gz".
void write_output_stream(const std::string& dir, const std::string& name,
                         const std::function<void(std::ostream&)>& write);

// Keeps `value` until the process exits instead of freeing it now: for a command's (or a forked
// child's) last use of a structure of 10^6 small allocations, a program's ops and their names,
// which take a tenth of a second to free one by one and go back with the process's memory at once.
template <class T>
void keep_until_exit(T&& value) {
  static_cast<void>(new std::decay_t<T>(std::forward<T>(value)));
}

}  // namespace stepcast::cli
