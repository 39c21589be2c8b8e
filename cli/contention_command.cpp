// `stepcast contention`: several training jobs on one cluster, each on its own nodes, their traffic
// sharing the fabric. Each job's step alone on its nodes (a forked child each, since a process
// holds one SimGrid engine) and all of them together (simulate_jobs, in this process), and the
// slowdown. Writes contention.json and prints a table.
#include <algorithm>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <memory>
#include <set>
#include <sstream>
#include <thread>

#include "commands.hpp"
#include "errors.hpp"
#include "forked_child.hpp"
#include "inputs.hpp"
#include "lower.hpp"
#include "simulator.hpp"

namespace stepcast::cli {

namespace {

struct Job {
  std::string name;
  std::vector<int64_t> nodes;
  double start_s = 0;  // when its step starts
  ModelConfig model;
  Plan plan;
  Topology topology;  // the shared one on the job's nodes.size() nodes
  std::unique_ptr<StepProgram> program;
};

// A model or plan the jobs file names: a path (relative to the file's folder, else as given), or
// a shipped name (models/NAME.json, examples/NAME.json).
std::string job_input(const ObjectReader& job, const std::string& key, const std::string& value,
                      const std::string& folder) {
  namespace fs = std::filesystem;
  const bool path_like =
      value.find('/') != std::string::npos || (value.size() > 5 && value.compare(value.size() - 5, 5, ".json") == 0);
  std::error_code ec;
  const fs::path beside = fs::path(job.file()).parent_path() / value;
  if (path_like || fs::exists(beside, ec)) {
    if (fs::path(value).is_absolute() || !fs::exists(beside, ec)) return value;
    return beside.string();
  }
  if (std::optional<std::string> shipped = shipped_path(folder + "/" + value + ".json")) return *shipped;
  std::string valid = "a path (relative to the jobs file's folder) or a shipped name:";
  for (const std::string& n : shipped_names(folder)) valid += " " + n;
  job.fail(key, "no such file, and no shipped " + folder + "/" + value + ".json", valid);
}

std::vector<Job> load_jobs(const std::string& file, const Topology& shared) {
  Json root = load_json_file(file);
  if (!root.is_object()) throw InputError(file + ": the jobs file must be a JSON object {\"jobs\": [...]}");
  ObjectReader top(root, file);
  if (!root.contains("jobs") || !root["jobs"].is_array() || root["jobs"].empty()) {
    top.fail("jobs", root.contains("jobs") ? "not a non-empty array" : "missing",
             "an array of jobs {\"name\", \"model\", \"plan\", \"nodes\": [node, ...]}");
  }
  top.accept("jobs");
  top.get_string_or("notes", "");  // text for people: read to check its type
  top.finish();
  std::vector<Job> jobs;
  std::set<std::string> names;
  std::vector<int64_t> holder(size_t(shared.num_nodes), -1);
  for (size_t i = 0; i < root["jobs"].size(); ++i) {
    const Json& j = root["jobs"][i];
    const std::string prefix = "jobs[" + std::to_string(i) + "].";
    if (!j.is_object()) throw InputError(file + ": " + prefix.substr(0, prefix.size() - 1) + ": not an object");
    ObjectReader r(j, file, prefix);
    Job job;
    job.name = r.get_string_or("name", "job" + std::to_string(i));
    if (job.name.empty() || !names.insert(job.name).second) {
      r.fail("name", "'" + job.name + "'" + (job.name.empty() ? " is empty" : ": another job has it"),
             "a name of its own for each job");
    }
    const std::string model_file = job_input(r, "model", r.get_string("model"), "models");
    const std::string plan_file = job_input(r, "plan", r.get_string("plan"), "examples");
    job.nodes = r.get_int_list("nodes", 0);
    std::optional<int64_t> seq_length = r.get_optional_int("seq_length", 1);
    job.start_s = r.get_number_in("start_s", 0, 1e6, 0);
    r.get_string_or("notes", "");  // text for people: read to check its type
    r.finish();
    if (job.nodes.empty()) r.fail("nodes", "an empty list", "the topology's nodes the job runs on");
    for (int64_t node : job.nodes) {
      if (node >= shared.num_nodes) {
        r.fail("nodes",
               "node " + std::to_string(node) + " is not in " + shared.file + " (" + std::to_string(shared.num_nodes) +
                   " nodes)",
               "nodes 0 to " + std::to_string(shared.num_nodes - 1));
      }
      if (holder[size_t(node)] >= 0) {
        r.fail("nodes",
               "node " + std::to_string(node) + " is already held by " +
                   (holder[size_t(node)] == int64_t(i) ? "this job"
                                                       : "job '" + jobs[size_t(holder[size_t(node)])].name + "'"),
               "nodes no other job holds, each once");
      }
      holder[size_t(node)] = int64_t(i);
    }
    job.model = load_model(model_file, seq_length);
    job.topology = shared;
    job.topology.num_nodes = int(job.nodes.size());
    job.plan = load_plan(plan_file);
    try {
      validate_plan(job.plan, job.model, job.topology,
                    PlanWorld{job.topology.num_devices(), file + " " + prefix + "nodes"});
    } catch (const InputError& e) {
      // The job's topology is its node list ("--nodes N" in the message: N nodes in that list).
      throw InputError(file + ": " + prefix + "nodes: the job on " + std::to_string(job.nodes.size()) +
                       " node(s): " + e.what());
    }
    jobs.push_back(std::move(job));
  }
  return jobs;
}

Json breakdown_json(const Breakdown& b) {
  return {{"compute_s", b.compute_s},         {"exposed_comm_s", b.exposed_comm_s},
          {"bubble_s", b.bubble_s},           {"optimizer_s", b.optimizer_s},
          {"variability_s", b.variability_s}, {"overlap_interference_s", b.overlap_interference_s}};
}

Json run_json(const SimulationOutput& sim, const StepProgram& program) {
  return {{"step_time_s", sim.step_time_s},
          {"tokens_per_s", double(program.tokens_per_step) / sim.step_time_s},
          {"critical_rank", sim.critical_rank},
          {"breakdown", breakdown_json(sim.breakdown)}};
}

std::string node_list(const std::vector<int64_t>& nodes) {
  std::string s;
  for (size_t i = 0; i < nodes.size(); ++i) {
    size_t k = i;
    while (k + 1 < nodes.size() && nodes[k + 1] == nodes[k] + 1) ++k;
    if (!s.empty()) s += ',';
    s += std::to_string(nodes[i]);
    if (k > i) s += (k == i + 1 ? "," : "-") + std::to_string(nodes[k]);
    i = k;
  }
  return s;
}

}  // namespace

int run_contention(int argc, char** argv) {
  po::options_description options("stepcast contention options");
  add_profile_options(options, "that costs each op of every job");
  options.add_options()("jobs", po::value<std::string>(), "the jobs file (see --help)")(
      "topology", po::value<std::string>(), "the cluster the jobs share (topologies/*.json)")(
      "nodes", po::value<int>(), "override the topology's num_nodes")(
      "mode", po::value<std::string>()->default_value("fast"), "simulate's --mode: fast, full or approx")(
      "seed", po::value<uint64_t>()->default_value(1),
      "seed of the variability draws: job i draws from seed + i, alone and shared alike")(
      "variability", po::value<std::string>()->default_value("on"),
      "on: draw the profile's device and op variability; off: the nominal steps")("out", po::value<std::string>(),
                                                                                  "write DIR/contention.json");
  auto vm = parse_command_line(
      argc, argv, options,
      "usage: stepcast contention --jobs FILE --topology T [--nodes N] [--profile F|roofline]\n"
      "                           [--allow-profile-mismatch] [--mode fast|full|approx]\n"
      "                           [--seed N] [--variability on|off] [--out DIR]\n"
      "Several training jobs on one cluster, each on its own nodes, their traffic sharing the\n"
      "fabric (NICs, leaf uplinks, router links): each job's step alone on its nodes and with the\n"
      "others, simulated together on one SimGrid platform, and the slowdown. Every job's step\n"
      "starts at time 0 unless the jobs file gives its start_s (seconds): at 0 the jobs communicate\n"
      "in phase, what a shared link costs jobs in step (the most it costs them); start_s shifts a\n"
      "job's phase against the others'. One step each. Jobs inside their own\n"
      "leaves share nothing but the spine, which is non-blocking: place them across leaves, or on an\n"
      "oversubscribed tree, to see contention.\n"
      "The jobs file: {\"jobs\": [{\"name\": \"a\", \"model\": M, \"plan\": P, \"nodes\": [0, 1]}, ...]}\n"
      "with model and plan paths (relative to the jobs file's folder) or shipped names, nodes the\n"
      "topology's nodes the job runs on (rank r on nodes[r / devices_per_node]; distinct across\n"
      "jobs), an optional seq_length and start_s; a plan without dp_size uses every device of its\n"
      "nodes. Each job's times are from its own start.\n"
      "A job's analytic costs (folded tensor-parallel collectives, latencies) use a tree of its own\n"
      "nodes; its flows take the shared topology's routes. A topology with heterogeneity is refused.\n"
      "Prints a line per job and writes DIR/contention.json (alone, shared, slowdown per job).");
  if (!vm) return 0;
  for (const char* required : {"jobs", "topology"}) {
    if (!vm->count(required)) {
      throw InputError(std::string("command line: the option '--") + required +
                       "' is required but missing (see --help)");
    }
  }
  claim_out_option(*vm, "contention");
  const std::string mode_name = (*vm)["mode"].as<std::string>();
  if (mode_name != "fast" && mode_name != "full" && mode_name != "approx") {
    throw InputError("command line: --mode '" + mode_name + "': valid: fast, full, approx");
  }
  const std::string variability = (*vm)["variability"].as<std::string>();
  if (variability != "on" && variability != "off") {
    throw InputError("command line: --variability '" + variability + "': valid: on, off");
  }
  std::optional<int> nodes;
  if (vm->count("nodes")) nodes = (*vm)["nodes"].as<int>();
  const Topology shared = load_topology(input_file(*vm, "topology"), nodes);
  const std::string jobs_file = (*vm)["jobs"].as<std::string>();
  std::vector<Job> jobs = load_jobs(jobs_file, shared);
  if (jobs.size() > 1 && !shared.heterogeneity.empty()) {
    throw InputError(shared.file +
                     ": key 'heterogeneity': its factors are per node of one job; valid: a "
                     "topology without heterogeneity when several jobs share it");
  }
  ProfileChoice profile_choice = profile_from(*vm, shared);
  const DeviceProfile& profile = profile_choice.profile;
  SimulateOptions sim_options;
  sim_options.allow_profile_mismatch = (*vm)["allow-profile-mismatch"].as<bool>();
  sim_options.variability = variability == "on";
  sim_options.mode = mode_name == "full" ? SimMode::full : mode_name == "approx" ? SimMode::approx : SimMode::fast;
  const uint64_t seed = (*vm)["seed"].as<uint64_t>();
  std::vector<SharedJob> shared_jobs;
  for (size_t i = 0; i < jobs.size(); ++i) {
    jobs[i].program = std::make_unique<StepProgram>(lower_program(jobs[i].model, jobs[i].topology, jobs[i].plan));
    shared_jobs.push_back({jobs[i].program.get(), jobs[i].nodes, seed + i, jobs[i].start_s});
  }

  // Each job alone on its nodes, in forked children (as many at once as there are cores), before
  // this process creates its engine; then all of them together here. Alone, each folds as it
  // does among the others (shared_job_options), so the slowdown is the contention alone.
  const SimulateOptions alone_options = shared_job_options(shared_jobs, shared, profile, sim_options);
  std::vector<SimulationOutput> alone(jobs.size());
  const size_t at_once = std::max(1u, std::thread::hardware_concurrency());
  for (size_t first = 0; first < jobs.size(); first += at_once) {
    std::vector<std::unique_ptr<ForkedChild>> children;
    for (size_t i = first; i < std::min(jobs.size(), first + at_once); ++i) {
      auto work = [&, i]() -> std::string {
        try {
          SimulationOutput sim = simulate_jobs({shared_jobs[i]}, shared, profile, alone_options).front();
          return "ok " + Json{{"step_time_s", sim.step_time_s},
                              {"critical_rank", sim.critical_rank},
                              {"breakdown", breakdown_json(sim.breakdown)}}
                             .dump();
        } catch (const InputError& e) {
          return std::string("input ") + e.what();
        } catch (const std::exception& e) {
          return std::string("error ") + e.what();
        }
      };
      children.push_back(std::make_unique<ForkedChild>(work, "job '" + jobs[i].name + "' alone"));
    }
    for (size_t k = 0; k < children.size(); ++k) {
      Json answer = parse_json_text(children[k]->text(), "the alone simulation's answer");
      SimulationOutput& a = alone[first + k];
      a.step_time_s = answer["step_time_s"].get<double>();
      a.critical_rank = answer["critical_rank"].get<int64_t>();
      const Json& b = answer["breakdown"];
      a.breakdown = {b["compute_s"].get<double>(),     b["exposed_comm_s"].get<double>(),
                     b["bubble_s"].get<double>(),      b["optimizer_s"].get<double>(),
                     b["variability_s"].get<double>(), b["overlap_interference_s"].get<double>()};
    }
  }
  std::vector<SimulationOutput> together = simulate_jobs(shared_jobs, shared, profile, sim_options);

  int64_t held = 0;
  for (const Job& job : jobs) held += int64_t(job.nodes.size());
  std::cout << "stepcast contention: " << jobs.size() << (jobs.size() == 1 ? " job" : " jobs") << " on " << shared.name
            << " (" << held << " of " << shared.num_nodes << " nodes), mode " << mode_name
            << (std::any_of(jobs.begin(), jobs.end(), [](const Job& j) { return j.start_s > 0; })
                    ? ", each step from its start_s"
                    : ", every step starting at time 0")
            << "\nprofile " << profile_choice.describe() << "\n";
  size_t name_width = 5, nodes_width = 7;
  for (const Job& job : jobs) {
    name_width = std::max(name_width, job.name.size() + 2);
    nodes_width = std::max(nodes_width, node_list(job.nodes).size() + 2);
  }
  std::cout << std::left << std::setw(int(name_width)) << "job" << std::setw(int(nodes_width)) << "nodes" << std::right
            << std::setw(8) << "devices" << std::setw(12) << "alone s" << std::setw(12) << "shared s" << std::setw(10)
            << "slowdown"
            << "   exposed comm alone -> shared s\n";
  Json out_jobs = Json::array();
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Job& job = jobs[i];
    const double slowdown = together[i].step_time_s / alone[i].step_time_s;
    std::cout << std::left << std::setw(int(name_width)) << job.name << std::setw(int(nodes_width))
              << node_list(job.nodes) << std::right << std::setw(8) << job.program->world_size() << std::fixed
              << std::setprecision(4) << std::setw(12) << alone[i].step_time_s << std::setw(12)
              << together[i].step_time_s << std::setprecision(3) << std::setw(9) << slowdown << "x   "
              << std::setprecision(4) << alone[i].breakdown.exposed_comm_s << " -> "
              << together[i].breakdown.exposed_comm_s << "\n"
              << std::defaultfloat;
    out_jobs.push_back(
        {{"name", job.name},
         {"nodes", job.nodes},
         {"devices", job.program->world_size()},
         {"model", job.model.name},
         {"plan", job.plan.name},
         {"plan_json", plan_to_json(job.plan)},
         {"seed", seed + i},
         {"start_s", job.start_s},
         {"alone", run_json(alone[i], *job.program)},
         {"shared", run_json(together[i], *job.program)},
         {"slowdown", slowdown},
         {"exposed_comm_added_s", together[i].breakdown.exposed_comm_s - alone[i].breakdown.exposed_comm_s}});
  }
  if (vm->count("out")) {
    Json result = envelope_head("contention");
    result["inputs"] = {{"jobs_file", jobs_file},
                        {"topology_file", shared.file},
                        {"topology", topology_to_json(shared)},
                        {"profile", profile_json(profile_choice)}};
    result["mode"] = mode_name;
    result["variability"] = variability == "on";
    result["phases"] = "each job's step starts at its start_s (default 0); its times are from that start";
    result["jobs"] = out_jobs;
    const std::string dir = (*vm)["out"].as<std::string>();
    write_output_file(dir, "contention.json", result.dump(1) + "\n");
    std::cout << "wrote " << dir << "/contention.json\n";
  }
  return 0;
}

}  // namespace stepcast::cli
