// `stepcast validate --sweep S`: runs a sweep end to end — for each point, `simulate` in a child
// process, the executor launched R times through scripts/mpirun with one rank per core, compare of
// the prediction with the median run — and writes validate.json, report.md and report.html. A point
// that fails is recorded with its message and the sweep goes on. `--sweep published` predicts
// published multi-GPU results instead (cli/validate_published.cpp).
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <csignal>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>

#include "commands.hpp"
#include "errors.hpp"
#include "inputs.hpp"
#include "machine_canary.hpp"
#include "planner_report.hpp"
#include "plan.hpp"
#include "profile.hpp"
#include "profiler.hpp"
#include "validate_published.hpp"
#include "validate_report.hpp"
#include "validate_sweep.hpp"
#include "version.hpp"

namespace stepcast::cli {

namespace fs = std::filesystem;

namespace {

const char* const kUsage =
    "usage: stepcast validate --sweep S [--out DIR] [--repeats R] [--profile F]\n"
    "       stepcast validate --sweep published [--out DIR] [--rows A,B,...] [--profile-dir D]\n"
    "                                           [--baseline PUBLISHED_JSON] [--jobs J]\n"
    "       mpirun -np N stepcast validate --sweep published ...   (or srun: its simulations over the ranks)\n"
    "Runs a sweep end to end: for each point, simulate (with the sweep's device profile, or one\n"
    "measured first with `stepcast profile`), run the executor R times under scripts/mpirun\n"
    "--bind-to core (one rank per core, one BLAS thread), and compare the prediction with the\n"
    "median run. Prints a line per point and writes DIR/validate.json, DIR/report.md and\n"
    "DIR/report.html; each point's outputs are in DIR/points/NAME/. A point whose runs' spread,\n"
    "(max - min) / median, exceeds 2.5% is flagged and left out of the step-time summary, and so is\n"
    "one around whose runs the machine ran more than 5% faster or slower than when the profile was\n"
    "measured (a fixed fp32 GEMM and a fixed softmax timed then and before and after each point;\n"
    "'machine' is the one further from its speed then). A point\n"
    "that fails is recorded with its message and the sweep goes on (exit code 1 at the end).\n"
    "A sweep with \"netns\" runs across a cluster on this machine (scripts/netns-cluster.sh, root):\n"
    "brought up at each point's link_rate (and uplink_rate: two leaves joined by an uplink of that\n"
    "rate; nics_per_node: that many NICs a node), profiled across its nodes (at netns.link_rate,\n"
    "one NIC, no uplink; then the inter-node link alone at each other rate a point's links or\n"
    "uplink run at: profile --add-links-to), down at the end.\n"
    "The sweep file: see README (validate). `--sweep published` predicts the published multi-GPU\n"
    "results in data/published.json from the shipped profiles (made of component measurements, never\n"
    "of these results), and checks every component figure of those profiles against the cost\n"
    "model (a section per profile and family). Under mpirun -np N or srun --mpi=pmix, --sweep\n"
    "published spreads its simulations over the ranks, --jobs at a time on each, rank 0 writing\n"
    "every output (README \"Running a study across a cluster\"); a sweep file refuses to.";

// scripts/mpirun of the build tree's repository or of the install (shipped_path).
std::string repository_file(const std::string& relative) {
  if (auto path = shipped_path(relative)) return fs::absolute(*path).string();
  throw std::runtime_error("cannot find " + relative + " next to this stepcast, in its install's share/stepcast" +
                           " or in the working directory: run stepcast from its repository or install");
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

struct ChildResult {
  int exit_code = 0;  // -1: killed by a signal
  std::string log;    // the log file
};

// Runs `command` through /bin/sh with stdout and stderr into `log`. An interrupt (Ctrl-C reaches
// the child; system() ignores it here) stops the sweep rather than failing one point.
ChildResult run_child(const std::string& command, const std::string& log) {
  int status = std::system((command + " >" + shell_quote(log) + " 2>&1").c_str());
  if ((WIFSIGNALED(status) && WTERMSIG(status) == SIGINT) ||
      (WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGINT)) {
    throw std::runtime_error("interrupted (" + command.substr(0, command.find(' ')) + ")");
  }
  ChildResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.log = log;
  return r;
}

// What went wrong, from a failed child's log: its error lines (or, when none say "error", its last
// lines), with the exit status and where the whole log is.
std::string failure_message(const std::string& what, const ChildResult& child) {
  std::vector<std::string> lines, errors;
  std::istringstream text(read_text(child.log));
  for (std::string line; std::getline(text, line);) {
    if (line.empty()) continue;
    lines.push_back(line);
    std::string lower = line;
    for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
    if (lower.find("error") != std::string::npos || lower.find("killing") != std::string::npos ||
        lower.find("exited on signal") != std::string::npos) {
      errors.push_back(line);
    }
  }
  const std::vector<std::string>& shown = errors.empty() ? lines : errors;
  std::ostringstream out;
  out << what << " exited with "
      << (child.exit_code < 0 ? "a signal" : "code " + std::to_string(child.exit_code));
  size_t first = shown.size() > 6 ? shown.size() - 6 : 0;
  for (size_t i = first; i < shown.size(); ++i) out << (i == first ? ": " : "\n") << shown[i];
  out << " (log: " << child.log << ")";
  return out.str();
}

std::string seconds_text(double s) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(1) << s << " s";
  return out.str();
}

struct Tools {
  std::string stepcast;  // this executable
  std::string mpirun;    // scripts/mpirun, or a netns cluster's mpirun
  std::string bind = " --bind-to core";  // a cluster's agent pins each node to its own cores
  std::string topology_file;             // the points' topology: the sweep's, or the cluster's
};

// What a point asks of the netns cluster: its links' rate, an uplink between two leaves (empty:
// none) and the NICs of each node.
struct ClusterShape {
  std::string rate, uplink;
  int64_t nics = 1;
  auto operator<=>(const ClusterShape&) const = default;
};

// The netns cluster of a sweep in one shape (scripts/netns-cluster.sh up, idempotent): its files
// in DIR/cluster-RATE[-uplink-RATE][-nics-K]; `tools` then launches through it with its topology.
Tools cluster_tools(const Tools& base, const SweepCluster& c, const ClusterShape& s, const std::string& dir) {
  const std::string& rate = s.rate;
  const std::string& uplink = s.uplink;
  const std::string shape = "cluster-" + rate + (uplink.empty() ? "" : "-uplink-" + uplink) +
                            (s.nics == 1 ? "" : "-nics-" + std::to_string(s.nics));
  std::string folder = fs::absolute(dir + "/" + shape).string();
  ChildResult up = run_child("bash " + shell_quote(repository_file("scripts/netns-cluster.sh")) +
                                 " up --name " + shell_quote(c.name) + " --nodes " + std::to_string(c.nodes) +
                                 " --ranks-per-node " + std::to_string(c.ranks_per_node) + " --link-rate " +
                                 shell_quote(rate) + (uplink.empty() ? "" : " --uplink-rate " + shell_quote(uplink)) +
                                 " --nics-per-node " + std::to_string(s.nics) + " --out " + shell_quote(folder),
                             dir + "/" + shape + ".log");
  if (up.exit_code != 0) throw InputError(failure_message("netns-cluster.sh up", up));
  Tools t = base;
  t.mpirun = folder + "/mpirun";
  t.bind = "";
  t.topology_file = folder + "/topology.json";
  return t;
}

bool cluster_is_up(const SweepCluster& c) {
  return std::system(("bash " + shell_quote(repository_file("scripts/netns-cluster.sh")) + " status --name " +
                      shell_quote(c.name) + " >/dev/null 2>&1").c_str()) == 0;
}

// Measures this machine's profile into DIR/profile.json with `ranks` ranks bound to cores (on a
// cluster: across its nodes, the inter-node link against its topology).
std::string measure_profile(const Tools& tools, const std::string& dir, int64_t ranks, bool quick) {
  std::string file = dir + "/profile.json";
  std::cout << "measuring this machine's profile (" << ranks << " ranks" << (quick ? ", quick" : "")
            << ") ... " << std::flush;
  auto start = std::chrono::steady_clock::now();
  std::string topology = tools.bind.empty() ? " --topology " + shell_quote(tools.topology_file) : "";
  ChildResult r = run_child(shell_quote(tools.mpirun) + " -np " + std::to_string(ranks) + tools.bind +
                                " " + shell_quote(tools.stepcast) + " profile --backend cpu" +
                                (quick ? " --quick" : "") + topology + " --out " + shell_quote(file),
                            dir + "/profile.log");
  if (r.exit_code != 0) {
    std::cout << "failed\n";
    throw std::runtime_error(failure_message("stepcast profile", r));
  }
  std::cout << "done in "
            << seconds_text(std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
                                .count())
            << ": " << file << "\n";
  return file;
}

// Adds the inter-node link measured at `rate` (the cluster of `tools` shaped at it) to the
// profile in `profile_file` (profile --add-links-to): a shaped link's share differs by rate.
void add_link_rate(const Tools& tools, const std::string& dir, const std::string& rate, int64_t ranks, bool quick,
                   const std::string& profile_file) {
  std::cout << "measuring the inter-node link at " << rate << " ... " << std::flush;
  ChildResult r = run_child(shell_quote(tools.mpirun) + " -np " + std::to_string(ranks) + " " +
                                shell_quote(tools.stepcast) + " profile --backend cpu" + (quick ? " --quick" : "") +
                                " --topology " + shell_quote(tools.topology_file) + " --add-links-to " +
                                shell_quote(profile_file) + " --out " + shell_quote(profile_file),
                            dir + "/profile-links-" + rate + ".log");
  if (r.exit_code != 0) {
    std::cout << "failed\n";
    throw std::runtime_error(failure_message("stepcast profile --add-links-to", r));
  }
  std::cout << "done\n";
}

ValidatePoint failed_point(const SweepPoint& point, const std::string& stage,
                           const std::string& message) {
  ValidatePoint p;
  p.name = point.name;
  p.ranks = point.ranks;
  p.steps = point.steps;
  p.plan = plan_to_json(point.plan);
  p.failed_stage = stage;
  p.failure = message;
  return p;
}

StepResult read_step_result(const std::string& file) {
  return step_result_from_json(load_json_file(file), file);
}

// The executor on `point` (`inputs`: its --model, --topology and --plan) into `out_dir`, as every
// run of a point goes: mpirun one rank per core, the CPU backend, the point's steps.
ChildResult run_executor(const Tools& tools, const SweepPoint& point, const std::string& inputs,
                         const std::string& out_dir) {
  return run_child(shell_quote(tools.mpirun) + " -np " + std::to_string(point.ranks) + tools.bind + " " +
                       shell_quote(tools.stepcast) + " run" + inputs + " --backend cpu --steps " +
                       std::to_string(point.steps) + " --quiet --out " + shell_quote(out_dir),
                   out_dir + ".log");
}

// The --model, --topology and --plan arguments of `point` with `plan_file`.
std::string point_inputs(const Tools& tools, const SweepPoint& point, const std::string& plan_file) {
  return " --model " + shell_quote(point.model_file) + " --topology " + shell_quote(tools.topology_file) +
         " --plan " + shell_quote(plan_file);
}

// After simulate: the executor `repeats` times, then compare with the median run. The first run
// that fails ends the point; a file a child wrote that does not read back fails its stage.
ValidatePoint run_and_compare(const Tools& tools, const SweepPoint& point, const std::string& inputs,
                              const std::string& prediction_file, int64_t repeats,
                              const std::string& dir) {
  std::string stage = "run";
  try {
    std::vector<StepResult> measurements;
    std::vector<std::string> measurement_files;
    for (int64_t k = 1; k <= repeats; ++k) {
      std::string run_dir = dir + "/run-" + std::to_string(k);
      ChildResult run = run_executor(tools, point, inputs, run_dir);
      if (run.exit_code != 0) {
        std::string what = "run " + std::to_string(k) + "/" + std::to_string(repeats) +
                           ": mpirun stepcast run";
        ValidatePoint p = failed_point(point, "run", failure_message(what, run));
        p.predicted_step_time_s = read_step_result(prediction_file).step_time_s;
        return p;
      }
      measurement_files.push_back(run_dir + "/measurement.json");
      measurements.push_back(read_step_result(measurement_files.back()));
    }
    stage = "compare";
    ValidatePoint p = evaluate_point(point, read_step_result(prediction_file), prediction_file,
                                     measurements, measurement_files);
    if (p.compare) {
      write_output_file(dir, "compare.json", compare_to_json(*p.compare).dump(2) + "\n");
      std::ostringstream markdown;
      write_compare_markdown(markdown, *p.compare);
      write_output_file(dir, "compare.md", markdown.str());
    }
    return p;
  } catch (const InputError& e) {
    return failed_point(point, stage, e.what());
  }
}

// Simulates, runs and compares one point in `dir` (emptied first).
ValidatePoint run_point(const Tools& tools, const SweepPoint& point,
                        const std::string& profile_file, int64_t repeats, const std::string& dir) {
  auto start = std::chrono::steady_clock::now();
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::string plan_file = point.plan_file;
  if (plan_file.empty()) {  // inline: the plan as the sweep resolved it
    plan_file = dir + "/plan.json";
    std::ofstream(plan_file) << point.plan_json.dump(2) << "\n";
  }
  std::string inputs = point_inputs(tools, point, plan_file);
  if (point.measured_routing) {
    // The routing measured by a run of the plan (dropless: with buffers for any routing, which the
    // run cannot overflow; the routing does not depend on them), then the plan with that routing,
    // whose dropless buffers the measured samples size.
    const std::string routing_dir = dir + "/routing-run";
    Json routing_plan = point.plan_json;
    if (point.plan.moe.dropless()) routing_plan["moe_dropless_buffers"] = "any_routing";
    std::ofstream(dir + "/routing-plan.json") << routing_plan.dump(2) << "\n";
    ChildResult run =
        run_executor(tools, point, point_inputs(tools, point, dir + "/routing-plan.json"), routing_dir);
    if (run.exit_code != 0) {
      ValidatePoint p = failed_point(point, "routing run", failure_message("mpirun stepcast run (routing)", run));
      p.dir = dir;
      return p;
    }
    Json plan = point.plan_json;
    plan["moe_routing"] = "histogram";
    plan["moe_routing_histogram"] = "routing-run/moe-routing.json";  // (relative to the plan)
    plan_file = dir + "/plan.json";
    std::ofstream(plan_file) << plan.dump(2) << "\n";
    inputs = point_inputs(tools, point, plan_file);
  }
  std::string profile_arg = profile_file.empty() ? "" : " --profile " + shell_quote(profile_file);
  ChildResult sim = run_child(shell_quote(tools.stepcast) + " simulate" + inputs + profile_arg +
                                  " --no-scaling --out " + shell_quote(dir + "/prediction"),
                              dir + "/simulate.log");
  ValidatePoint result =
      sim.exit_code != 0
          ? failed_point(point, "simulate", failure_message("stepcast simulate", sim))
          : run_and_compare(tools, point, inputs, dir + "/prediction/prediction.json", repeats, dir);
  result.dir = dir;
  if (point.measured_routing) {  // the plan as predicted and run
    result.plan["moe_routing"] = "histogram";
    result.plan["moe_routing_histogram"] = "routing-run/moe-routing.json";
  }
  result.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace

int run_validate(int argc, char** argv, SimulationRunner& runner) {
  po::options_description options("stepcast validate options");
  options.add_options()
      ("sweep", po::value<std::string>()->required(),
       "sweep file (sweeps/*.json), or `published`")
      ("out", po::value<std::string>(),
       "output folder (default out/validate/NAME, NAME the sweep's name): validate.json, report.md, "
       "report.html and a CSV per table of report.md (points.csv, summary.csv, ...)")
      ("repeats", po::value<int64_t>(),
       "executor runs per point (default: the sweep's `repeats`, else 3)")
      ("profile", po::value<std::string>(),
       "device profile for the predictions, instead of the sweep's `profile`")
      ("profile-dir", po::value<std::string>(),
       "with --sweep published: the profiles from this folder instead of profiles/ (ablations)")
      ("baseline", po::value<std::string>(),
       "with --sweep published: an earlier published.json; each Table 1 row shows it beside now")
      ("figures", po::value<std::string>(),
       "with --sweep published: the published figures from this file instead of data/published.json")
      ("rows", po::value<std::string>(),
       "with --sweep published: only these rows, comma-separated (e.g. megatron-1.7b,nccl-149-dgx-a100)")
      ("jobs", po::value<int>(),
       "with --sweep published: concurrent simulations on each rank (default 2); under mpirun or srun "
       "the simulations spread over the job's ranks (README \"Running a study across a cluster\")");
  auto vm = parse_command_line(argc, argv, options, kUsage);
  if (!vm) return 0;
  std::string sweep_arg = (*vm)["sweep"].as<std::string>();
  if (sweep_arg != "published") sweep_arg = resolve_input(sweep_arg, "sweeps", "sweep");  // "cpu": sweeps/cpu.json
  if (sweep_arg == "published") {
    for (const char* option : {"repeats", "profile"}) {
      if (vm->count(option)) {
        throw InputError(std::string("command line: --") + option +
                         " does not apply to --sweep published (datasheet profiles, no runs)");
      }
    }
    std::string out = vm->count("out") ? (*vm)["out"].as<std::string>() : "out/validate/published";
    claim_output_dir(out, "validate");
    PublishedOptions published;
    if (vm->count("profile-dir")) published.profile_dir = (*vm)["profile-dir"].as<std::string>();
    if (vm->count("baseline")) published.baseline = (*vm)["baseline"].as<std::string>();
    if (vm->count("figures")) published.figures_file = (*vm)["figures"].as<std::string>();
    if (vm->count("jobs")) published.jobs = (*vm)["jobs"].as<int>();
    if (vm->count("rows")) {
      std::stringstream list((*vm)["rows"].as<std::string>());
      for (std::string name; std::getline(list, name, ',');) {
        if (!name.empty()) published.rows.push_back(name);
      }
    }
    return validate_published(out, published, runner);
  }
  for (const char* option : {"rows", "profile-dir", "baseline", "figures", "jobs"}) {
    if (vm->count(option)) {
      throw InputError(std::string("command line: --") + option + " applies to --sweep published only");
    }
  }
  if (runner.ranks() > 1) {
    throw InputError("command line: --sweep " + sweep_arg + " under an MPI launcher (" + std::to_string(runner.ranks()) +
                     " ranks): a sweep file's points launch their own mpirun; valid: start it without mpirun or "
                     "srun, or --sweep published, whose simulations spread over the ranks");
  }
  auto wall_start = std::chrono::steady_clock::now();

  // Everything that can be wrong with the input is found before anything runs.
  Sweep sweep = load_sweep(sweep_arg);
  MachineInfo machine = describe_machine();
  check_sweep_fits_cores(sweep, machine.cores);
  int64_t repeats = sweep.repeats.value_or(3);
  if (vm->count("repeats")) {
    repeats = (*vm)["repeats"].as<int64_t>();
    if (repeats < 1) throw InputError("command line: --repeats " + std::to_string(repeats) + ": valid: 1 or more");
  }
  std::string out = vm->count("out") ? (*vm)["out"].as<std::string>() : "out/validate/" + sweep.name;
  claim_output_dir(out, "validate");
  std::string profile_source = to_string(sweep.profile_source);
  std::string profile_file = sweep.profile_file;
  if (vm->count("profile")) {
    profile_source = "file";
    profile_file = (*vm)["profile"].as<std::string>();
  }
  std::vector<std::string> warnings;
  auto check_profile = [&](const std::string& file) {
    DeviceProfile profile = load_profile(file);
    check_profile_matches(profile, sweep.topology);
    if (profile.backend == "cpu") warnings = machine_differences(profile, machine, library_versions());
    for (const std::string& w : warnings) {
      std::cerr << "warning: profile " << file << " was measured on another machine type: " << w
                << "; its figures may not hold here\n";
    }
    return profile;
  };
  DeviceProfile profile;
  if (profile_source == "file") profile = check_profile(profile_file);
  if (profile_source == "roofline") {
    profile = roofline_profile(sweep.topology);
    profile_file = "roofline";  // simulate's --profile roofline, not the topology's profile
  }
  Tools tools{fs::read_symlink("/proc/self/exe").string(), repository_file("scripts/mpirun"), " --bind-to core",
              sweep.topology_file};
  // A netns sweep brings its cluster up (and down at the end unless it was up before).
  const bool cluster_was_up = sweep.netns && cluster_is_up(*sweep.netns);
  std::map<ClusterShape, Tools> at_shape;
  auto tools_for = [&](const ClusterShape& shape) -> const Tools& {
    if (!sweep.netns) return tools;
    if (!at_shape.count(shape)) at_shape.clear();  // one shape up at a time: the cluster is re-shaped
    if (!at_shape.count(shape)) at_shape[shape] = cluster_tools(tools, *sweep.netns, shape, out);
    return at_shape[shape];
  };

  std::cout << "stepcast validate: sweep " << sweep.name << " (" << sweep.points.size()
            << " points, " << repeats << (repeats == 1 ? " run" : " runs") << " each) on "
            << machine.hostname << " (" << machine.cpu_model << ", " << machine.cores
            << " cores); output " << out << "\n";
  fs::create_directories(out);
  // The machine's speed now: the reference each point's runs are compared with (machine_canary.hpp).
  const CanaryRates reference = machine_canary();
  const bool profile_measured_here = profile_source == "measure" || profile_source == "measure-quick";
  if (profile_measured_here) {
    profile_file = measure_profile(tools_for({sweep.netns ? sweep.netns->link_rate : "", "", 1}), out,
                                   sweep.netns ? sweep.netns->nodes * sweep.netns->ranks_per_node
                                               : sweep.max_ranks(),
                                   sweep.profile_source == SweepProfileSource::measure_quick);
    // Every other rate a point's links or uplink run at, measured too (in the points' order).
    std::vector<std::string> rates;
    for (const SweepPoint& point : sweep.points) {
      for (const std::string& rate : {point.link_rate, point.uplink_rate}) {
        if (sweep.netns && !rate.empty() && rate != sweep.netns->link_rate &&
            std::find(rates.begin(), rates.end(), rate) == rates.end()) {
          rates.push_back(rate);
        }
      }
    }
    for (const std::string& rate : rates) {
      add_link_rate(tools_for({rate, "", 1}), out, rate, sweep.netns->nodes * sweep.netns->ranks_per_node,
                    sweep.profile_source == SweepProfileSource::measure_quick, profile_file);
    }
    profile = check_profile(profile_file);
  }

  ValidateReport report;
  report.sweep_name = sweep.name;
  report.sweep_file = sweep.file;
  report.sweep_notes = sweep.notes;
  report.topology_file = sweep.topology_file;
  report.machine = machine;
  report.stepcast_version = stepcast_version();
  report.git_commit = stepcast_git_commit();
  report.date_utc = utc_now();
  report.command_line = "stepcast validate";
  for (int i = 1; i < argc; ++i) report.command_line += " " + std::string(argv[i]);
  report.profile_source = profile_source;
  report.profile_file = profile_file;
  report.profile_name = profile.name;
  report.profile_warnings = warnings;
  report.machine_reference_gflops = reference.gemm_gflops;
  report.machine_reference_softmax_gbps = reference.softmax_gbps;
  report.machine_reference_when = profile_measured_here ? "just before the profile was measured"
                                                        : "at the start of the sweep (the profile is older)";
  report.repeats = repeats;
  for (size_t i = 0; i < sweep.points.size(); ++i) {
    const SweepPoint& point = sweep.points[i];
    std::cout << "[" << i + 1 << "/" << sweep.points.size() << "] " << point.name << " ("
              << point.ranks << (point.ranks == 1 ? " rank" : " ranks") << ", "
              << describe_plan(plan_to_json(point.plan))
              << (point.measured_routing ? ", routing measured by a run first" : "") << "): " << std::flush;
    const CanaryRates before = machine_canary();
    ValidatePoint result =
        run_point(tools_for({point.link_rate, point.uplink_rate, point.nics_per_node}), point, profile_file, repeats,
                  out + "/points/" + point.name);
    const CanaryRates after = machine_canary();
    result.machine_speed_gemm = (before.gemm_gflops + after.gemm_gflops) / 2 / reference.gemm_gflops;
    result.machine_speed_softmax = (before.softmax_gbps + after.softmax_gbps) / 2 / reference.softmax_gbps;
    // The machine's speed: the canary further from its reference.
    result.machine_speed = std::abs(*result.machine_speed_softmax - 1) > std::abs(*result.machine_speed_gemm - 1)
                               ? result.machine_speed_softmax
                               : result.machine_speed_gemm;
    std::cout << describe_point_result(result) << " [" << seconds_text(result.wall_s) << "]"
              << std::endl;
    report.points.push_back(std::move(result));
  }
  report.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  if (sweep.netns && !cluster_was_up) {
    run_child("bash " + shell_quote(repository_file("scripts/netns-cluster.sh")) + " down --name " +
                  shell_quote(sweep.netns->name),
              out + "/cluster-down.log");
  }

  ValidateSummary summary = summarize_validate(report);
  write_output_file(out, "validate.json", validate_to_json(report).dump(2) + "\n");
  std::ostringstream markdown, page;
  write_validate_markdown(markdown, report);
  write_output_file(out, "report.md", markdown.str());
  write_csv_tables(out, markdown.str());  // points.csv, breakdown-critical-rank.csv, ...
  write_validate_html(page, report);
  write_output_file(out, "report.html", page.str());

  auto pct = [](const std::optional<double>& v) {
    std::ostringstream s;
    if (v) s << std::showpos << std::fixed << std::setprecision(1) << *v * 100 << "%";
    else s << "n/a";
    return s.str();
  };
  std::cout << "summary: " << summary.ran << " of " << summary.points << " points ran ("
            << summary.failed << " failed, " << summary.flagged << " flagged noisy or drifted); step-time "
            << "error over the unflagged: median |e| "
            << (summary.median_abs_step_time_error
                    ? pct(summary.median_abs_step_time_error).substr(1)
                    : std::string("n/a"))
            << ", largest "
            << (summary.max_abs_step_time_error
                    ? pct(summary.max_abs_step_time_error->value) + " (" +
                          summary.max_abs_step_time_error->point + ")"
                    : std::string("n/a"))
            << "; largest peak-memory error "
            << (summary.max_abs_memory_error ? pct(summary.max_abs_memory_error->value) + " (" +
                                                   summary.max_abs_memory_error->point + ")"
                                             : std::string("n/a"))
            << "; " << exposed_comm_label() << ": " << exposed_comm_count(summary)
            << (summary.max_abs_exposed_comm_error ? ", largest " + pct(summary.max_abs_exposed_comm_error->value) +
                                                         " (" + summary.max_abs_exposed_comm_error->point + ")"
                                                   : std::string())
            << "\nwrote " << out << "/validate.json, " << out << "/report.md and " << out
            << "/report.html in " << seconds_text(report.wall_s) << "\n";
  return summary.failed > 0 ? 1 : 0;
}

}  // namespace stepcast::cli
