// Shared input loading and output envelope for the commands; see inputs.hpp.
#include "inputs.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <random>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "errors.hpp"
#include "gzip_file.hpp"
#include "megatron_import.hpp"
#include "version.hpp"

namespace stepcast::cli {

namespace {

// Where shipped inputs live: the repository of a build tree (build/stepcast: the executable's
// folder's parent), an install (PREFIX/bin/stepcast: PREFIX/share/stepcast), the working directory.
std::vector<std::filesystem::path> shipped_roots() {
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe");
  std::filesystem::path prefix = exe.parent_path().parent_path();
  return {prefix, prefix / "share" / "stepcast", std::filesystem::current_path()};
}

}  // namespace

std::optional<std::string> shipped_path(const std::string& relative) {
  std::error_code ec;
  if (std::filesystem::exists(relative, ec)) return relative;
  for (const std::filesystem::path& root : shipped_roots()) {
    if (std::filesystem::exists(root / relative, ec)) return (root / relative).string();
  }
  return std::nullopt;
}

std::vector<std::string> shipped_names(const std::string& folder) {
  std::set<std::string> names;
  std::error_code ec;
  for (const std::filesystem::path& root : shipped_roots()) {
    if (!std::filesystem::is_directory(root / folder, ec)) continue;
    for (const auto& entry : std::filesystem::directory_iterator(root / folder, ec)) {
      if (entry.path().extension() == ".json") names.insert(entry.path().stem().string());
    }
    break;
  }
  return {names.begin(), names.end()};
}

std::string resolve_input(const std::string& arg, const std::string& folder, const std::string& option) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(arg, ec) || arg.find('/') != std::string::npos || arg.size() < 1 ||
      (arg.size() > 5 && arg.compare(arg.size() - 5, 5, ".json") == 0)) {
    return arg;  // a path: the loader says what is wrong with it
  }
  std::set<std::string> names;
  for (const fs::path& root : shipped_roots()) {
    fs::path candidate = root / folder / (arg + ".json");
    if (fs::is_regular_file(candidate, ec)) return candidate.string();
    if (names.empty() && fs::is_directory(root / folder, ec)) {
      for (const auto& entry : fs::directory_iterator(root / folder, ec)) {
        if (entry.path().extension() == ".json") names.insert(entry.path().stem().string());
      }
    }
  }
  std::string valid = "a file path";
  if (!names.empty()) {
    valid += ", or a shipped name:";
    for (const auto& n : names) valid += " " + n;
  }
  throw InputError("command line: --" + option + " '" + printable_excerpt(arg, 80) + "': no such file, and no shipped " +
                   folder + "/" + printable_excerpt(arg, 80) + ".json; valid: " + valid);
}

std::string input_file(const po::variables_map& vm, const std::string& name) {
  static const std::map<std::string, std::string> folders = {
      {"model", "models"}, {"topology", "topologies"}, {"plan", "examples"}};
  return resolve_input(vm[name].as<std::string>(), folders.at(name), name);
}

const char* const kFromMegatronHelp =
    "Megatron-LM arguments ('--num-layers 32 --hidden-size 4096 ...') or a launch script file "
    "holding them: the model and plan, instead of --model and --plan (dp_size = devices / "
    "(tp·pp·cp)); flags stepcast cannot model are refused by name";

void add_input_options(po::options_description& options) {
  options.add_options()
      ("model", po::value<std::string>(), "model config JSON (models/*.json), or a shipped name")
      ("topology", po::value<std::string>()->required(), "cluster topology JSON (topologies/*.json)")
      ("plan", po::value<std::string>(),
       "parallelization plan JSON (examples/*.json); without dp_size, dp_size = devices / (tp·pp·cp)")
      ("from-megatron", po::value<std::string>(), kFromMegatronHelp)
      ("nodes", po::value<int>(), "override the topology's num_nodes");
  add_seq_length_option(options);
}

MegatronInputs megatron_inputs(const po::variables_map& vm) {
  for (const char* other : {"model", "plan", "seq-length"}) {
    if (vm.count(other)) {
      throw InputError(std::string("command line: --") + other + " with --from-megatron: valid: one of them "
                       "(the arguments give the model, the plan and the sequence length)");
    }
  }
  std::string arg = vm["from-megatron"].as<std::string>();
  std::error_code ec;
  const bool file = std::filesystem::is_regular_file(arg, ec);
  std::string source = file ? arg : "--from-megatron";
  std::string name = file ? std::filesystem::path(arg).stem().string() : "megatron";
  std::string text = file ? read_text_file(arg) : arg;
  MegatronImport imported = import_megatron_arguments(text, source, name);
  MegatronInputs in{parse_model(imported.model, source), parse_plan(imported.plan, source),
                    {imported.world_size, imported.world_from}};
  if (!imported.ignored.empty()) {
    std::cerr << "note: " << source << ": flags that change neither time nor memory of a step, not modelled:";
    for (const auto& flag : imported.ignored) std::cerr << " " << flag;
    std::cerr << "\n";
  }
  return in;
}

void add_seq_length_option(po::options_description& options) {
  options.add_options()
      ("seq-length", po::value<int64_t>(),
       "train at N tokens per sequence (default: the model's seq_length, else its "
       "max_position_embeddings; beyond those only with rotary positions and rope_scaling)");
}

ModelConfig load_model_option(const po::variables_map& vm) {
  std::optional<int64_t> seq_length;
  if (vm.count("seq-length")) seq_length = vm["seq-length"].as<int64_t>();
  ModelConfig model = load_model(input_file(vm, "model"), seq_length);
  if (model.seq_length_from != "seq_length" && model.seq_length_from != "--seq-length") {
    std::cerr << "note: " << model.file << ": training at " << model.seq_length << " tokens per sequence, its "
              << model.seq_length_from << " (the config has no seq_length; --seq-length N to choose)\n";
  }
  if (!model.ignored_keys.empty()) {
    std::cerr << "note: " << model.file << ": keys that change neither shapes nor FLOPs here, not modelled:";
    for (const auto& key : model.ignored_keys) std::cerr << " " << key;
    std::cerr << "\n";
  }
  return model;
}

std::string model_label(const ModelConfig& model) {
  return model.name + " (sequence " + std::to_string(model.seq_length) + ")";
}

std::string child_seq_length_argument(const ModelConfig& model) {
  return model.seq_length_from == "--seq-length" ? " --seq-length " + std::to_string(model.seq_length) : "";
}

Inputs load_inputs(const po::variables_map& vm, const PlanWorld& given_world) {
  std::optional<int> nodes;
  if (vm.count("nodes")) nodes = vm["nodes"].as<int>();
  Inputs in;
  PlanWorld world = given_world;  // else the topology's devices, unless a launch line gives its own
  if (vm.count("from-megatron")) {
    MegatronInputs megatron = megatron_inputs(vm);
    in.model = megatron.model;
    in.plan = megatron.plan;
    if (megatron.world.size > 0) world = megatron.world;
  } else {
    for (const char* option : {"model", "plan"}) {
      if (!vm.count(option)) {
        throw InputError(std::string("command line: the option '--") + option +
                         "' is required but missing (or --from-megatron ARGS|FILE) (see --help)");
      }
    }
    in.model = load_model_option(vm);
  }
  in.topology = load_topology(input_file(vm, "topology"), nodes);
  if (!vm.count("from-megatron")) in.plan = load_plan(input_file(vm, "plan"));
  validate_plan(in.plan, in.model, in.topology, world);
  if (in.plan.dp_size_derived) {
    std::cerr << "note: " << in.plan.file << ": no dp_size: dp_size = " << in.plan.dp_size << ", the "
              << in.plan.dp_size_world << " devices of " << (world.size > 0 ? world.from : in.topology.file)
              << " / (tp_size · pp_size" << (in.plan.cp_size > 1 ? " · context_parallel_size" : "") << " = "
              << in.plan.dp_size_world / in.plan.dp_size << "), as Megatron-LM derives it\n";
  }
  return in;
}

std::string dp_size_note(const Plan& plan) {
  if (!plan.dp_size_derived) return "";
  return ", dp_size " + std::to_string(plan.dp_size) + " derived (" + std::to_string(plan.dp_size_world) +
         " devices / tp·pp·cp = " + std::to_string(plan.dp_size_world / plan.dp_size) + ")";
}

void add_profile_options(po::options_description& options, const std::string& what) {
  options.add_options()
      ("profile", po::value<std::string>(),
       ("device profile " + what + ": a profiles/*.json file or one `stepcast profile` wrote, or "
        "'roofline' for the datasheet peaks alone; default: the profile the topology names "
        "(its 'profile' key)").c_str())
      ("allow-profile-mismatch", po::bool_switch(),
       "accept a profile measured on another device than the topology's");
}

ProfileChoice profile_from(const po::variables_map& vm, const Topology& topology) {
  std::optional<std::string> option;
  if (vm.count("profile")) option = vm["profile"].as<std::string>();
  bool allow = vm.count("allow-profile-mismatch") && vm["allow-profile-mismatch"].as<bool>();
  ProfileChoice choice = choose_profile(option, topology, allow);
  if (!choice.warning.empty()) std::cerr << "warning: " << choice.warning << "\n";
  if (allow && !choice.profile.is_roofline && choice.profile.device != topology.node.device.name) {
    std::cerr << "warning: costing device \"" << topology.node.device.name << "\" with profile "
              << choice.profile.file << " of device \"" << choice.profile.device
              << "\" (--allow-profile-mismatch)\n";
  }
  return choice;
}

Json profile_json(const ProfileChoice& choice) {
  return {{"name", choice.profile.name}, {"file", choice.profile.file}, {"origin", choice.origin}};
}

std::string child_profile_arguments(const ProfileChoice& choice, const po::variables_map& vm) {
  std::string out = " --profile " + shell_quote(choice.argument);
  if (vm.count("allow-profile-mismatch") && vm["allow-profile-mismatch"].as<bool>()) {
    out += " --allow-profile-mismatch";
  }
  return out;
}

std::optional<po::variables_map> parse_command_line(int argc, char** argv,
                                                    const po::options_description& options,
                                                    const std::string& usage) {
  po::options_description all(options);
  all.add_options()("help,h", "show this help");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(all).run(), vm);
    if (vm.count("help")) {
      std::cout << usage << "\n" << all << "\n";
      return std::nullopt;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw InputError(std::string("command line: ") + e.what() + " (see --help)");
  }
  // No option takes nan or inf (boost reads them as numbers).
  for (const auto& [name, value] : vm) {
    const double* number = boost::any_cast<double>(&value.value());
    if (number && !std::isfinite(*number)) {
      throw InputError("command line: --" + name + " " + std::to_string(*number) +
                       ": valid: a finite number (see --help)");
    }
  }
  return vm;
}

Json envelope_head(const std::string& command) {
  Json out;
  out["schema_version"] = 1;
  out["command"] = command;
  out["stepcast_version"] = stepcast_version();
  out["git_commit"] = stepcast_git_commit();
  return out;
}

Json output_envelope(const std::string& command, const Inputs& inputs) {
  Json out = envelope_head(command);
  out["inputs"] = {{"model_file", inputs.model.file},
                   {"topology_file", inputs.topology.file},
                   {"plan_file", inputs.plan.file},
                   {"model", model_to_json(inputs.model)},
                   {"topology", topology_to_json(inputs.topology)},
                   {"plan", plan_to_json(inputs.plan)}};
  return out;
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  return out + "'";
}

namespace {

// A name in `dir` unique to this process and call.
std::string temporary_name(const std::string& dir, const std::string& name) {
  static std::mt19937_64 random{std::random_device{}()};
  char suffix[64];
  std::snprintf(suffix, sizeof suffix, ".%ld.%016llx.tmp", long(::getpid()),
                (unsigned long long)random());
  return dir + "/." + name + suffix;
}

}  // namespace

void claim_output_dir(const std::string& dir, const std::string& command, const std::string& option) {
  static std::map<std::string, int> claimed;  // folder → lock descriptor, held until exit
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw InputError(option + " " + dir + ": cannot create the folder: " + ec.message());
  std::string key = std::filesystem::weakly_canonical(dir, ec).string();
  if (claimed.count(key)) return;
  // Writable: a file can be created in it (a lock file alone may be writable in a read-only
  // folder).
  std::string probe = temporary_name(dir, "write-probe");
  int probe_fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (probe_fd < 0) {
    throw InputError(option + " " + dir + ": cannot write in it: " + std::strerror(errno) +
                     "; valid: a folder this user can write (checked before any work)");
  }
  ::close(probe_fd);
  ::unlink(probe.c_str());
  std::string lock = dir + "/.stepcast.lock";
  int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw InputError(option + " " + dir + ": cannot open " + lock + ": " + std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    char holder[256] = {0};
    ssize_t n = ::pread(fd, holder, sizeof holder - 1, 0);
    ::close(fd);
    std::string note = n > 0 ? std::string(holder, size_t(n)) : "";
    note = note.substr(0, note.find('\n'));
    std::string who = note.empty() ? "another process" : printable_excerpt(note, 120);
    throw InputError(option + " " + dir + ": another stepcast command (" + who +
                     ") is writing this folder; valid: another --out, or the same once it ends");
  }
  std::string me = "stepcast " + command + ", pid " + std::to_string(long(::getpid())) + "\n";
  // The note only words another command's refusal: the lock holds without it.
  if (::ftruncate(fd, 0) == 0) (void)!::pwrite(fd, me.data(), me.size(), 0);
  claimed[key] = fd;
}

void claim_out_option(const po::variables_map& vm, const std::string& command) {
  if (vm.count("out")) claim_output_dir(vm["out"].as<std::string>(), command);
}

void write_output_file(const std::string& dir, const std::string& name, const std::string& text) {
  write_output_stream(dir, name, [&](std::ostream& out) { out << text; });
}

void write_output_stream(const std::string& dir, const std::string& name,
                         const std::function<void(std::ostream&)>& write) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw InputError("--out " + dir + ": cannot create directory: " + ec.message());
  std::string path = dir + "/" + name;
  std::string tmp = temporary_name(dir, name);
  try {
    if (has_gzip_suffix(name)) {
      GzipFileBuf buffer(tmp);
      std::ostream out(&buffer);
      write(out);
      buffer.close();
    } else {
      std::ofstream out(tmp, std::ios::binary);
      if (!out) throw InputError("--out " + dir + ": cannot write " + path + ": " + std::strerror(errno));
      write(out);
      out.close();
      if (!out) throw InputError("--out " + dir + ": write failed for " + path);
    }
  } catch (...) {
    std::filesystem::remove(tmp, ec);
    throw;
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    throw InputError("--out " + dir + ": cannot rename " + tmp + ": " + ec.message());
  }
}

std::string utc_now() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  std::ostringstream out;
  out << std::put_time(&tm, "%Y-%m-%dT%H:%M:%SZ");
  return out.str();
}

}  // namespace stepcast::cli
