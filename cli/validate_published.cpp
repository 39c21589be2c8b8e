// `stepcast validate --sweep published`, the runner; see validate_published.hpp. The figures come
// from data/published.json (published_figures.hpp); each Table 1 row is simulated in a child
// process (child_simulate.hpp: `stepcast simulate --mode fast --no-scaling`) with the shipped
// A100 datasheet profile; the writers are in published_report.hpp.
#include "validate_published.hpp"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <mutex>
#include <set>

#include "child_simulate.hpp"
#include "errors.hpp"
#include "inputs.hpp"
#include "published_report.hpp"
#include "units.hpp"

namespace stepcast::cli {

namespace fs = std::filesystem;

namespace {

// The folder holding topologies/, profiles/ and data/: the build tree's repository, the install's
// share/stepcast or the working directory (shipped_path).
fs::path repository_root() {
  auto topology = shipped_path("topologies/dgx-a100-80gb.json");
  if (!topology) {
    throw std::runtime_error("cannot find topologies/dgx-a100-80gb.json next to this stepcast, in its install's "
                             "share/stepcast or in the working directory: run stepcast from its repository or install");
  }
  return fs::absolute(*topology).parent_path().parent_path();
}

// One Table 1 row: the model and plan files under `inputs`, simulated in a child process by
// ChildSimulator (which removes the child's prediction: thousands of ranks' op records).
MegatronResult simulate_row(const MegatronRow& row, const fs::path& inputs, const fs::path& repo,
                            const std::string& profile_file, SimulationRunner& runner, int jobs) {
  MegatronResult r;
  r.row = &row;
  r.nodes = row.nodes();
  auto start = std::chrono::steady_clock::now();
  try {
    ModelConfig model = load_model((inputs / (row.name + ".model.json")).string());
    Topology topology =
        load_topology((repo / "topologies" / "dgx-a100-80gb.json").string(), int(r.nodes));
    Plan plan = load_plan((inputs / (row.name + ".plan.json")).string());
    validate_plan(plan, model, topology);
    ChildSimulator child(model, " --profile " + shell_quote(profile_file), runner, jobs);
    Simulated s = child.simulate(row.name, plan, topology);
    r.step_time_s = s.step_time_s;
    r.tflops_per_gpu = megatron_iteration_flops(row) / (r.step_time_s * double(row.gpus)) / 1e12;
    r.breakdown = {{"compute", s.compute_s},
                   {"exposed_comm", s.exposed_comm_s},
                   {"bubble", s.bubble_s},
                   {"optimizer", s.optimizer_s},
                   {"variability", s.variability_s},
                   {"overlap_interference", s.overlap_interference_s}};
    r.mfu = s.mfu;
    r.fits = s.fits;
    r.peak_bytes_max = s.peak_bytes_max;
    r.ok = true;
  } catch (const std::exception& e) {
    r.failure = e.what();
  }
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

bool selected(const PublishedOptions& options, const std::string& name) {
  if (options.rows.empty()) return true;
  for (const std::string& r : options.rows) {
    if (r == name) return true;
  }
  return false;
}

void check_row_names(const PublishedOptions& options, const PublishedFigures& figures) {
  std::set<std::string> known;
  for (const auto& r : figures.megatron) known.insert(r.name);
  for (const auto& r : figures.nccl) known.insert(r.name);
  for (const std::string& name : options.rows) {
    if (known.count(name)) continue;
    std::string valid;
    for (const std::string& k : known) valid += (valid.empty() ? "" : ", ") + k;
    throw InputError("command line: --rows: unknown row '" + name + "'; valid: " + valid);
  }
}

Json profile_record(const std::string& path, const fs::path& repo) {
  DeviceProfile p = load_profile(path);
  return {{"file", fs::relative(path, repo).string()}, {"name", p.name}, {"device", p.device},
          {"backend", p.backend}, {"profile", profile_to_json(p)}};
}

}  // namespace

int validate_published(const std::string& out_dir, const PublishedOptions& options, SimulationRunner& runner) {
  if (options.jobs < 1) throw InputError("command line: --jobs must be >= 1");
  auto wall_start = std::chrono::steady_clock::now();
  fs::path repo = repository_root();
  const PublishedFigures figures = load_published_figures(
      options.figures_file.empty() ? (repo / kPublishedFiguresRelativePath).string() : options.figures_file);
  check_row_names(options, figures);
  fs::path profiles = options.profile_dir.empty() ? repo / "profiles" : fs::path(options.profile_dir);
  std::string a100_profile = (profiles / "a100-sxm4-80gb.json").string();
  PublishedReport report;
  if (!options.baseline.empty()) {
    Json before = load_json_file(options.baseline);
    if (!before.contains("megatron") || !before["megatron"].is_array()) {
      throw InputError(options.baseline + ": key 'megatron': missing; valid: a published.json of "
                       "`stepcast validate --sweep published`");
    }
    report.baseline = Json::object();
    report.baseline_file = options.baseline + " (stepcast git " + before.value("git_commit", std::string("?")) +
                           ", made " + before.value("created_utc", std::string("?")) + ")";
    for (const Json& row : before["megatron"]) {
      if (row.value("ok", false) && row.contains("predicted")) {
        report.baseline[row.at("name").get<std::string>()] = {{"error", row.at("error")},
                                                              {"breakdown_s", row.at("predicted").at("breakdown_s")}};
      }
    }
  }
  std::map<std::string, std::string> topology_of_profile;
  report.created_utc = utc_now();
  report.machine = describe_machine();

  // nccl-tests rows: pure functions, no child process.
  std::set<std::string> profiles_used;
  for (const NcclRow& row : figures.nccl) {
    if (!selected(options, row.name)) continue;
    std::string topology_file = (repo / "topologies" / (row.topology + ".json")).string();
    std::string profile_file = (profiles / (row.profile + ".json")).string();
    topology_of_profile[profile_file] = topology_file;
    Topology topology = load_topology(topology_file);
    DeviceProfile profile = load_profile(profile_file);
    check_profile_matches(profile, topology);
    profiles_used.insert(profile_file);
    NcclResult r{&row, predict_nccl(row, topology, profile), fs::relative(profile_file, repo).string()};
    std::cout << "nccl  " << std::left << std::setw(20) << row.name << std::right << " "
              << std::setw(13) << r.predicted.algorithm << "  predicted busbw "
              << std::setw(6) << fixed_or_na(r.predicted.busbw_bytes_per_s / 1e9, 1) << " GB/s, published "
              << std::setw(6) << fixed_or_na(row.published_busbw_bytes_per_s / 1e9, 1) << ", error "
              << std::setw(7) << signed_percent(r.error()) << (row.excluded.empty() ? "" : "  (not in the mean)")
              << "\n";
    report.nccl.push_back(r);
  }

  // Table 1 rows: model and plan files kept under OUT_DIR/inputs, simulations in child processes.
  std::vector<const MegatronRow*> rows_to_run;
  for (const MegatronRow& row : figures.megatron) {
    if (selected(options, row.name)) rows_to_run.push_back(&row);
  }
  fs::path inputs = fs::path(out_dir) / "inputs";
  for (const MegatronRow* row : rows_to_run) {
    write_output_file(inputs.string(), row->name + ".model.json", megatron_model_json(*row).dump(2) + "\n");
    write_output_file(inputs.string(), row->name + ".plan.json", megatron_plan_json(*row).dump(2) + "\n");
  }
  if (!rows_to_run.empty()) {
    profiles_used.insert(a100_profile);
    topology_of_profile[a100_profile] = (repo / "topologies" / "dgx-a100-80gb.json").string();
  }
  std::vector<MegatronResult> results(rows_to_run.size());
  std::mutex print;
  size_t done = 0;
  parallel_for(int64_t(rows_to_run.size()), runner.threads(options.jobs), [&](int64_t index) {
    size_t i = size_t(index);
    results[i] = simulate_row(*rows_to_run[i], inputs, repo, a100_profile, runner, options.jobs);
    std::lock_guard<std::mutex> lock(print);
    const MegatronResult& r = results[i];
    ++done;
    std::cout << "[" << done << "/" << rows_to_run.size() << "] " << std::left << std::setw(16)
              << r.row->name << std::right;
    if (r.ok) {
      std::cout << " predicted " << std::setw(6) << fixed_or_na(r.tflops_per_gpu, 1)
                << " TFLOP/s/GPU (" << fixed_or_na(r.step_time_s, 2) << " s), published "
                << fixed_or_na(r.row->published_tflops_per_gpu, 0) << " (" << fixed_or_na(r.published_time_s(), 2)
                << " s), error " << signed_percent(r.error()) << "  [" << fixed_or_na(r.wall_s, 0) << " s]\n";
    } else {
      std::cout << " FAILED: " << r.failure.substr(0, 300) << "\n";
    }
    std::cout.flush();
  });
  report.megatron = std::move(results);
  for (const std::string& p : profiles_used) {
    report.profiles.push_back(profile_record(p, repo));
    ComponentSection section;
    section.profile_file = fs::relative(p, repo).string();
    section.topology_file = fs::relative(topology_of_profile.at(p), repo).string();
    section.checks = check_components(load_profile(p), load_topology(topology_of_profile.at(p)));
    if (!section.checks.empty()) {
      for (const auto& [family, t] : section.summary()) {
        std::cout << "components " << section.profile_file << " " << family << ": " << t.points
                  << " points, median |error| " << fixed_or_na(100 * t.median_abs_error, 1) << "%, largest "
                  << fixed_or_na(100 * t.largest_abs_error, 1) << "%\n";
      }
      report.components.push_back(std::move(section));
    }
  }
  report.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();

  write_output_file(out_dir, "published.json", published_report_json(report).dump(2) + "\n");
  write_output_file(out_dir, "published.md", published_report_markdown(report));
  write_output_file(out_dir, "published.html", published_report_html(report));
  std::cout << "mean absolute error: Table 1 " << fixed_or_na(100 * report.megatron_mean(), 1)
            << "%, nccl-tests " << fixed_or_na(100 * report.nccl_mean(), 1) << "%, all "
            << fixed_or_na(100 * report.overall_mean(), 1) << "%\nwrote " << out_dir << "/published.md, "
            << out_dir << "/published.json and " << out_dir << "/published.html\n";
  bool failed = false;
  for (const auto& r : report.megatron) failed |= !r.ok;
  return failed ? 1 : 0;
}

}  // namespace stepcast::cli
