// `stepcast validate --sweep published`; see validate_published.hpp. The rows are transcribed
// from ../shared/data/reference-figures.md; each Table 1 row is simulated in a child process
// (child_simulate.hpp: `stepcast simulate --mode fast --no-scaling`) with the shipped A100
// datasheet profile.
#include "validate_published.hpp"

#include <algorithm>
#include <atomic>
#include <map>
#include <tuple>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "child_simulate.hpp"
#include "collective.hpp"
#include "collective_cost.hpp"
#include "components.hpp"
#include "errors.hpp"
#include "html.hpp"
#include "inputs.hpp"
#include "profiler.hpp"
#include "version.hpp"

namespace stepcast::cli {

namespace fs = std::filesystem;

const std::vector<MegatronRow>& megatron_table1() {
  // name, params (B), heads, hidden, layers, TP, PP, GPUs, batch, TFLOP/s per GPU
  static const std::vector<MegatronRow> rows = {
      {"megatron-1.7b", 1.7, 24, 2304, 24, 1, 1, 32, 512, 137},
      {"megatron-3.6b", 3.6, 32, 3072, 30, 2, 1, 64, 512, 138},
      {"megatron-7.5b", 7.5, 32, 4096, 36, 4, 1, 128, 512, 142},
      {"megatron-18.4b", 18.4, 48, 6144, 40, 8, 1, 256, 1024, 135},
      {"megatron-39.1b", 39.1, 64, 8192, 48, 8, 2, 512, 1536, 138},
      {"megatron-76.1b", 76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140},
      {"megatron-145.6b", 145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148},
      {"megatron-310.1b", 310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155},
      {"megatron-529.6b", 529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163},
      {"megatron-1008b", 1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163},
  };
  return rows;
}

double megatron_iteration_flops(const MegatronRow& row) {
  const double B = double(row.batch), s = double(kMegatronSeqLength), l = double(row.layers),
               h = double(row.hidden), V = double(kMegatronVocab);
  return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
}

Json megatron_model_json(const MegatronRow& row) {
  std::ostringstream notes;
  notes << "Narayanan et al., SC'21, Table 1 row " << row.params_billion << "B: " << row.layers
        << " layers, hidden " << row.hidden << ", " << row.heads
        << " heads; V = 51,200 and s = 2048 (section 5.1). GPT architecture as Megatron-LM's.";
  return {{"name", row.name},
          {"notes", notes.str()},
          {"hidden_size", row.hidden},
          {"num_hidden_layers", row.layers},
          {"num_attention_heads", row.heads},
          {"intermediate_size", 4 * row.hidden},
          {"vocab_size", kMegatronVocab},
          {"max_position_embeddings", kMegatronSeqLength},
          {"seq_length", kMegatronSeqLength},
          {"norm_type", "layernorm"},
          {"mlp_type", "gelu"},
          {"position_embedding_type", "learned"},
          {"use_bias", true},
          {"tie_word_embeddings", true}};
}

int64_t megatron_virtual_pp_size(const MegatronRow& row) {
  if (row.pp == 1) return 1;
  int64_t layers_per_stage = row.layers / row.pp;
  return layers_per_stage % 2 == 0 ? 2 : layers_per_stage;
}

std::string megatron_plan_rule() {
  return "TP and PP as Table 1; dp = GPUs / (TP·PP); micro batch 1 (Table 1 does not state it; "
         "1 is the one size that divides every row's batch into a multiple of PP microbatches, as "
         "the interleaved schedule needs); interleaved 1F1B with 2 model chunks per stage "
         "(one layer per chunk where a stage's layers are odd: 76.1B, 529.6B), 1F1B without a "
         "pipeline; "
         "full recompute; fp16 weights, activations and gradients (Megatron-LM's --fp16 with its "
         "local DDP, 2021); ZeRO 0; the data-parallel all-reduce after the backward pass; "
         "materialized attention (no FlashAttention in 2021); dropout 0.1; no sequence "
         "parallelism (introduced after SC'21).";
}

Json megatron_plan_json(const MegatronRow& row) {
  int64_t v = megatron_virtual_pp_size(row);
  return {{"name", row.name + "-sc21"},
          {"notes", "Plan rule of `stepcast validate --sweep published`: " + megatron_plan_rule()},
          {"tp_size", row.tp},
          {"pp_size", row.pp},
          {"dp_size", row.dp()},
          {"zero_stage", 0},
          {"micro_batch_size", 1},
          {"global_batch_size", row.batch},
          {"schedule", row.pp > 1 ? "interleaved_1f1b" : "1f1b"},
          {"virtual_pp_size", v},
          {"recompute", "full"},
          {"sequence_parallel", false},
          {"dtype", "fp16"},
          {"grad_dtype", "fp16"},
          {"attention_impl", "materialized"},
          {"dropout", 0.1},
          {"overlap_grad_reduce", false},
          {"overlap_param_gather", false}};
}

const std::vector<NcclRow>& nccl_table() {
  constexpr double GB = 1e9, GiB = 1073741824.0, MiB = 1048576.0;
  const std::string a100 = "dgx-a100-80gb", a100p = "a100-sxm4-80gb";
  const std::string largest = "the largest size (8 GiB assumed: the source gives the peak only)";
  static const std::vector<NcclRow> rows = {
      {"nccl-149-dgx-a100", "DGX A100, 8 GPUs, NVLink3 (12 links x 25 GB/s per direction)",
       "nccl-tests #149, NVIDIA maintainer (PRIMARY)", a100, a100p, 1, 0, 0, 8 * GiB,
       "8 GiB: \"needs messages of at least 8 GB\"", 230 * GB, ""},
      {"nccl-149-hpe-a100", "HPE Apollo 8x A100 80GB, 1 node", "nccl-tests #149, user (PRIMARY)",
       a100, a100p, 1, 0, 0, 1 * GiB, "1 GiB: the user's log (-e 1G)", 200 * GB, ""},
      {"nccl-175-a100", "8x A100, 1 node", "nccl-tests #175, user log (PRIMARY)", a100, a100p, 1,
       0, 0, 8 * GiB, largest, 232.54 * GB, ""},
      {"nccl-178-a100", "8x A100, 1 node", "nccl-tests #178, user (PRIMARY)", a100, a100p, 1, 0, 0,
       8 * GiB, largest, 208 * GB, ""},
      {"nccl-175-2node", "2 nodes x 8 A100, 4 x 200 Gb/s IB per node",
       "nccl-tests #175, user log (PRIMARY)", a100, a100p, 2, 0, 4, 8 * GiB, largest, 86 * GB,
       ""},
      {"nccl-119-3node", "3 servers x 8 A100-40GB, 4 HDR IB each (peak; average 84.8 GB/s)",
       "nccl-tests #119, user (PRIMARY)", a100, a100p, 3, 0, 4, 128 * MiB,
       "128 MiB: the user's log (-e 128M), where the peak is", 96 * GB, ""},
      {"nccl-212-h100-ring", "8x H100, ring algorithm (NCCL_ALGO=Ring)",
       "nccl-tests #212, NVIDIA maintainer (PRIMARY)", "dgx-h100", "h100-sxm", 1, 0, 0, 8 * GiB,
       largest, 370 * GB,
       "NCCL_ALGO=Ring forced: the profile's measured table is NCCL's own choice (NVLink SHARP), "
       "and its intra-node fraction cites this figure"},
      {"nccl-212-h100-nvls", "8x H100 with NVLink SHARP (NVLS), all_reduce",
       "nccl-tests #212, NVIDIA maintainer (PRIMARY)", "dgx-h100", "h100-sxm", 1, 0, 0, 8 * GiB,
       largest, 480 * GB, ""},
      {"nccl-290-h100", "8x H100, 1 node, all_reduce (expected)",
       "nccl-tests #290, NVIDIA maintainer (PRIMARY)", "dgx-h100", "h100-sxm", 1, 0, 0, 8 * GiB,
       largest, 476 * GB, ""},
      {"nccl-272-h200", "8x H200, 1 node, NCCL 2.20.3, all_reduce (peak)",
       "nccl-tests #272, user (PRIMARY)", "h200-1gpu", "h200-sxm", 1, 8, 0, 8 * GiB, largest,
       475 * GB, ""},
  };
  return rows;
}

Topology nccl_row_topology(const NcclRow& row, const Topology& shipped) {
  Topology t = shipped;
  t.num_nodes = int(row.nodes);
  if (row.devices_per_node > 0) t.node.devices_per_node = int(row.devices_per_node);
  if (row.nics_per_node > 0) t.fabric.nics_per_node = int(row.nics_per_node);
  return t;
}

NcclPrediction predict_nccl(const NcclRow& row, const Topology& topology,
                            const DeviceProfile& profile) {
  Topology system = apply_link_fractions(nccl_row_topology(row, topology), profile);
  LinkFigures links = link_figures(system);
  GroupShape shape;
  shape.nodes = row.nodes;
  shape.members_per_node = system.node.devices_per_node;
  shape.size = shape.nodes * shape.members_per_node;
  NcclPrediction p;
  Algorithm algorithm = choose_algorithm(OpKind::all_reduce, row.bytes, shape, links);
  CollectiveCostModel model(profile, nccl_row_topology(row, topology));
  double r = model.correction(OpKind::all_reduce, algorithm, row.bytes, shape);
  p.algorithm = to_string(algorithm);
  if (const MeasuredCollective* table = model.table_for(OpKind::all_reduce, shape)) {
    std::ostringstream label;
    label << p.algorithm << " × " << std::setprecision(3) << r << " (" << table->shape.size << " ranks on "
          << table->shape.nodes << (table->shape.nodes == 1 ? " node" : " nodes") << ", " << table->source << ")";
    p.algorithm = label.str();
  }
  p.time_s = model.time_s(OpKind::all_reduce, algorithm, row.bytes, shape);
  p.algbw_bytes_per_s = row.bytes / p.time_s;
  p.busbw_bytes_per_s = p.algbw_bytes_per_s * bus_bandwidth_factor(OpKind::all_reduce, shape.size);
  return p;
}

double relative_error(double predicted, double published) {
  return (predicted - published) / published;
}

double mean_absolute(const std::vector<double>& errors) {
  if (errors.empty()) return std::numeric_limits<double>::quiet_NaN();
  double sum = 0;
  for (double e : errors) sum += std::abs(e);
  return sum / double(errors.size());
}

namespace {

struct MegatronResult {
  const MegatronRow* row = nullptr;
  int64_t nodes = 0;
  bool ok = false;
  std::string failure;
  double step_time_s = 0;
  double tflops_per_gpu = 0;
  Json breakdown = Json::object();
  double mfu = 0;
  bool fits = false;
  double peak_bytes_max = 0;
  double wall_s = 0;
  double published_time_s() const {
    return megatron_iteration_flops(*row) / (row->published_tflops_per_gpu * 1e12 * double(row->gpus));
  }
  double error() const { return relative_error(tflops_per_gpu, row->published_tflops_per_gpu); }
  double time_error() const { return relative_error(step_time_s, published_time_s()); }
};

struct NcclResult {
  const NcclRow* row = nullptr;
  NcclPrediction predicted;
  double error() const {
    return relative_error(predicted.busbw_bytes_per_s, row->published_busbw_bytes_per_s);
  }
};

// The repository holding topologies/ and profiles/: this executable's folder's parent
// (build/stepcast, build-*/stepcast), else the working directory.
fs::path repository_root() {
  fs::path exe = fs::read_symlink("/proc/self/exe");
  for (fs::path candidate : {exe.parent_path().parent_path(), fs::current_path()}) {
    if (fs::exists(candidate / "topologies" / "dgx-a100-80gb.json")) return candidate;
  }
  throw std::runtime_error("cannot find topologies/dgx-a100-80gb.json next to " + exe.string() +
                           " or in the working directory: run stepcast from its repository");
}

std::string fixed(double v, int digits) {
  if (!std::isfinite(v)) return "n/a";
  std::ostringstream out;
  out << std::fixed << std::setprecision(digits) << v;
  return out.str();
}

std::string percent(double fraction) {
  if (!std::isfinite(fraction)) return "n/a";
  std::ostringstream out;
  out << std::showpos << std::fixed << std::setprecision(1) << 100 * fraction << "%";
  return out.str();
}


std::string plan_summary(const MegatronRow& row) {
  std::ostringstream out;
  out << "tp " << row.tp << " pp " << row.pp << " dp " << row.dp();
  int64_t v = megatron_virtual_pp_size(row);
  if (row.pp > 1) out << ", interleaved v " << v;
  out << ", mb 1, " << row.batch / row.dp() << " microbatches, full recompute";
  return out.str();
}

std::string row_config(const MegatronRow& row) {
  std::ostringstream out;
  out << row.params_billion << "B: h " << row.hidden << ", l " << row.layers << ", a " << row.heads
      << ", B " << row.batch << ", " << row.gpus << " GPUs";
  return out.str();
}

// One Table 1 row: the model and plan files under `inputs`, simulated in a child process by
// ChildSimulator (which removes the child's prediction: thousands of ranks' op records).
MegatronResult simulate_row(const MegatronRow& row, const fs::path& inputs, const fs::path& repo,
                            const std::string& profile_file) {
  MegatronResult r;
  r.row = &row;
  r.nodes = (row.gpus + 7) / 8;
  auto start = std::chrono::steady_clock::now();
  try {
    ModelConfig model = load_model((inputs / (row.name + ".model.json")).string());
    Topology topology =
        load_topology((repo / "topologies" / "dgx-a100-80gb.json").string(), int(r.nodes));
    Plan plan = load_plan((inputs / (row.name + ".plan.json")).string());
    validate_plan(plan, model, topology);
    ChildSimulator child(model, " --profile " + shell_quote(profile_file));
    Simulated s = child.simulate(row.name, plan, topology);
    r.step_time_s = s.step_time_s;
    r.tflops_per_gpu = megatron_iteration_flops(row) / (r.step_time_s * double(row.gpus)) / 1e12;
    r.breakdown = {{"compute", s.compute_s},
                   {"exposed_comm", s.exposed_comm_s},
                   {"bubble", s.bubble_s},
                   {"optimizer", s.optimizer_s},
                   {"variability", s.variability_s}};
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

void check_row_names(const PublishedOptions& options) {
  std::set<std::string> known;
  for (const auto& r : megatron_table1()) known.insert(r.name);
  for (const auto& r : nccl_table()) known.insert(r.name);
  for (const std::string& name : options.rows) {
    if (known.count(name)) continue;
    std::string valid;
    for (const std::string& k : known) valid += (valid.empty() ? "" : ", ") + k;
    throw InputError("command line: --rows: unknown row '" + name + "'; valid: " + valid);
  }
}

double breakdown_value(const Json& breakdown, const char* key) {
  return breakdown.contains(key) ? breakdown.at(key).get<double>() : 0.0;
}

Json profile_record(const std::string& path, const fs::path& repo) {
  DeviceProfile p = load_profile(path);
  return {{"file", fs::relative(path, repo).string()}, {"name", p.name}, {"device", p.device},
          {"backend", p.backend}, {"profile", profile_to_json(p)}};
}

// One profile's component figures predicted by the cost model (components.hpp).
struct ComponentSection {
  std::string profile_file;  // relative to the repository
  std::string topology_file;
  std::vector<ComponentCheck> checks;
  std::map<std::string, FamilyErrors> summary() const { return errors_by_family(checks); }
};

struct Report {
  std::vector<MegatronResult> megatron;
  std::vector<NcclResult> nccl;
  std::vector<ComponentSection> components;
  Json baseline;  // name → {error, breakdown_s} of an earlier report; null when none
  std::string baseline_file;
  Json profiles = Json::array();
  MachineInfo machine;
  std::string created_utc;
  double wall_s = 0;

  double megatron_mean() const {
    std::vector<double> e;
    for (const auto& r : megatron) {
      if (r.ok) e.push_back(r.error());
    }
    return mean_absolute(e);
  }
  double nccl_mean() const {
    std::vector<double> e;
    for (const auto& r : nccl) {
      if (r.row->excluded.empty()) e.push_back(r.error());
    }
    return mean_absolute(e);
  }
  double overall_mean() const {
    std::vector<double> e;
    for (const auto& r : megatron) {
      if (r.ok) e.push_back(r.error());
    }
    for (const auto& r : nccl) {
      if (r.row->excluded.empty()) e.push_back(r.error());
    }
    return mean_absolute(e);
  }
};

Json report_json(const Report& report) {
  Json out;
  out["schema_version"] = 1;
  out["command"] = "validate --sweep published";
  out["stepcast_version"] = stepcast_version();
  out["git_commit"] = stepcast_git_commit();
  out["created_utc"] = report.created_utc;
  out["machine"] = {{"hostname", report.machine.hostname},
                    {"cpu_model", report.machine.cpu_model},
                    {"cores", report.machine.cores}};
  out["source"] = "../shared/data/reference-figures.md";
  out["profiles"] = report.profiles;
  out["error_definition"] = "(predicted - published) / published; means of absolute values";
  out["megatron_plan_rule"] = megatron_plan_rule();
  Json rows = Json::array();
  for (const auto& r : report.megatron) {
    const MegatronRow& row = *r.row;
    Json j = {{"name", row.name},
              {"params_billion", row.params_billion},
              {"heads", row.heads},
              {"hidden", row.hidden},
              {"layers", row.layers},
              {"tp", row.tp},
              {"pp", row.pp},
              {"dp", row.dp()},
              {"gpus", row.gpus},
              {"nodes", r.nodes},
              {"batch", row.batch},
              {"plan", megatron_plan_json(row)},
              {"flops_per_iteration", megatron_iteration_flops(row)},
              {"published",
               {{"tflops_per_gpu", row.published_tflops_per_gpu},
                {"iteration_time_s", r.published_time_s()}}},
              {"ok", r.ok},
              {"simulation_wall_s", r.wall_s}};
    if (r.ok) {
      j["predicted"] = {{"tflops_per_gpu", r.tflops_per_gpu},
                        {"iteration_time_s", r.step_time_s},
                        {"breakdown_s", r.breakdown},
                        {"mfu", r.mfu},
                        {"fits", r.fits},
                        {"peak_bytes_max", r.peak_bytes_max}};
      j["error"] = r.error();
      j["iteration_time_error"] = r.time_error();
    } else {
      j["failure"] = r.failure;
    }
    rows.push_back(j);
  }
  out["megatron"] = rows;
  out["megatron_mean_abs_error"] = report.megatron_mean();
  Json nccl = Json::array();
  for (const auto& r : report.nccl) {
    const NcclRow& row = *r.row;
    Json j = {{"name", row.name},
              {"system", row.system},
              {"source", row.source},
              {"topology", "topologies/" + row.topology + ".json"},
              {"profile", "profiles/" + row.profile + ".json"},
              {"nodes", row.nodes},
              {"gpus", row.nodes * (row.devices_per_node > 0 ? row.devices_per_node : 8)},
              {"bytes", row.bytes},
              {"bytes_note", row.bytes_note},
              {"published_busbw_bytes_per_s", row.published_busbw_bytes_per_s},
              {"predicted",
               {{"algorithm", r.predicted.algorithm},
                {"time_s", r.predicted.time_s},
                {"algbw_bytes_per_s", r.predicted.algbw_bytes_per_s},
                {"busbw_bytes_per_s", r.predicted.busbw_bytes_per_s}}},
              {"error", r.error()},
              {"in_mean", row.excluded.empty()}};
    if (!row.excluded.empty()) j["excluded"] = row.excluded;
    nccl.push_back(j);
  }
  out["nccl"] = nccl;
  out["nccl_mean_abs_error"] = report.nccl_mean();
  Json sections = Json::array();
  for (const ComponentSection& c : report.components) {
    Json summary = Json::object();
    for (const auto& [family, s] : c.summary()) {
      summary[family] = {{"points", s.points}, {"median_abs_error", s.median_abs_error},
                         {"largest_abs_error", s.largest_abs_error}};
    }
    Json points = Json::array();
    for (const ComponentCheck& k : c.checks) {
      points.push_back({{"family", k.family}, {"what", k.what}, {"source", k.source}, {"method", k.method},
                        {"measured_s", k.measured_s}, {"predicted_s", k.predicted_s},
                        {"error", k.relative_error()}});
    }
    sections.push_back({{"profile", c.profile_file}, {"topology", c.topology_file}, {"summary", summary},
                        {"points", points}});
  }
  out["components"] = sections;
  if (!report.baseline_file.empty()) out["baseline"] = report.baseline_file;
  out["mean_abs_error"] = report.overall_mean();
  out["wall_s"] = report.wall_s;
  // JSON has no NaN: a mean over no rows is null.
  for (const char* key : {"megatron_mean_abs_error", "nccl_mean_abs_error", "mean_abs_error"}) {
    if (!std::isfinite(out[key].get<double>())) out[key] = nullptr;
  }
  return out;
}

std::string md_cell(std::string s) {
  for (size_t i = 0; (i = s.find('|', i)) != std::string::npos; i += 2) s.replace(i, 1, "\\|");
  return s;
}

std::string report_markdown(const Report& report) {
  std::ostringstream md;
  md << "# Published multi-GPU results: predicted against published\n\n"
     << "`stepcast validate --sweep published`: rows from `../shared/data/reference-figures.md`, "
     << "predicted from the shipped datasheet profiles, never fitted to these results. "
     << "Error = (predicted − published) / published; means are of absolute errors.\n\n"
     << "Made on " << report.created_utc << ", stepcast " << stepcast_version() << " (git "
     << stepcast_git_commit() << "), machine " << report.machine.hostname << " ("
     << report.machine.cpu_model << ", " << report.machine.cores << " cores), in "
     << fixed(report.wall_s, 0) << " s.\n\nProfiles:";
  for (const auto& p : report.profiles) {
    md << " `" << p.at("file").get<std::string>() << "` (" << p.at("name").get<std::string>() << ")";
  }
  md << ".\n\n## Megatron-LM SC'21 Table 1 (throughput per GPU)\n\n"
     << "Topology `topologies/dgx-a100-80gb.json` with `--nodes` = GPUs / 8, profile "
     << "`profiles/a100-sxm4-80gb.json`, `simulate --mode fast`. TFLOP/s per GPU = eq. 3's FLOPs "
     << "(recompute counted, as the paper counts them) / (predicted iteration time × GPUs); the "
     << "published iteration time is eq. 3 / (published TFLOP/s × GPUs).\n\n"
     << "Plan rule: " << megatron_plan_rule() << "\n\n"
     << "| row | config | plan | predicted TFLOP/s/GPU | predicted iteration s | published "
        "TFLOP/s/GPU | published iteration s | error | compute / exposed comm / bubble / optimizer / "
        "variability s | fits |\n"
     << "|---|---|---|---:|---:|---:|---:|---:|---|---|\n";
  auto parts = [](const Json& b) {
    return fixed(breakdown_value(b, "compute"), 2) + " / " + fixed(breakdown_value(b, "exposed_comm"), 2) +
           " / " + fixed(breakdown_value(b, "bubble"), 2) + " / " + fixed(breakdown_value(b, "optimizer"), 2) +
           " / " + fixed(breakdown_value(b, "variability"), 2);
  };
  for (const auto& r : report.megatron) {
    const MegatronRow& row = *r.row;
    md << "| " << row.name << " | " << row_config(row) << " | " << plan_summary(row) << " | ";
    if (r.ok) {
      md << fixed(r.tflops_per_gpu, 1) << " | " << fixed(r.step_time_s, 2) << " | "
         << fixed(row.published_tflops_per_gpu, 0) << " | " << fixed(r.published_time_s(), 2)
         << " | " << percent(r.error()) << " | " << parts(r.breakdown) << " | "
         << (r.fits ? "yes" : "NO") << " |\n";
    } else {
      md << "failed | | " << fixed(row.published_tflops_per_gpu, 0) << " | "
         << fixed(r.published_time_s(), 2) << " | | " << md_cell(r.failure.substr(0, 200))
         << " | |\n";
    }
  }
  md << "\nMean absolute error over the Table 1 rows: **" << fixed(100 * report.megatron_mean(), 1) << "%**.\n";
  if (!report.baseline.is_null()) {
    md << "\n### Before and after\n\nBefore: " << report.baseline_file << ". Breakdown parts in seconds: "
       << "compute / exposed comm / bubble / optimizer / variability.\n\n"
       << "| row | error before | error now | breakdown before | breakdown now |\n|---|---:|---:|---|---|\n";
    for (const auto& r : report.megatron) {
      if (!r.ok || !report.baseline.contains(r.row->name)) continue;
      const Json& b = report.baseline.at(r.row->name);
      md << "| " << r.row->name << " | " << percent(b.at("error").get<double>()) << " | " << percent(r.error())
         << " | " << parts(b.at("breakdown_s")) << " | " << parts(r.breakdown) << " |\n";
    }
  }
  md << "\n## nccl-tests all_reduce bus bandwidth\n\n"
     << "Predicted by the collective cost model (`plans/collective_cost.hpp`: the algorithm lowering "
     << "would choose and its α-β time on the topology after the profile's link fractions, times the "
     << "correction of the profile's measured table nearest in span, named in the algorithm column); "
     << "busbw = algbw · 2(n−1)/n (nccl-tests).\n\n"
     << "| row | system | source | message | algorithm | predicted busbw GB/s | published GB/s | "
        "error | in mean |\n"
     << "|---|---|---|---|---|---:|---:|---:|---|\n";
  for (const auto& r : report.nccl) {
    const NcclRow& row = *r.row;
    md << "| " << row.name << " | " << md_cell(row.system) << " | " << md_cell(row.source) << " | "
       << md_cell(row.bytes_note) << " | " << r.predicted.algorithm << " | "
       << fixed(r.predicted.busbw_bytes_per_s / 1e9, 1) << " | "
       << fixed(row.published_busbw_bytes_per_s / 1e9, 1) << " | " << percent(r.error()) << " | "
       << (row.excluded.empty() ? "yes" : "no: " + md_cell(row.excluded)) << " |\n";
  }
  md << "\nMean absolute error over the nccl-tests rows in the mean: **"
     << fixed(100 * report.nccl_mean(), 1) << "%**. Over every row in a mean: **"
     << fixed(100 * report.overall_mean(), 1) << "%**.\n";
  md << "\n## Component figures of the profiles\n\nEvery published component figure a profile holds, "
     << "predicted by the cost model that uses it (`plans/components.hpp`): GEMM points the shape model was "
     << "fitted to, by the model; table points (GEMM grids, memory-bound kernels, fused attention, "
     << "collectives), each by its table without it (leave-one-out). Error = (predicted − measured) / "
     << "measured time; sources are the keys of the profile's `sources`.\n";
  for (const ComponentSection& c : report.components) {
    md << "\n### `" << c.profile_file << "` (on `" << c.topology_file << "`)\n\n"
       << "| family | points | median abs error | largest abs error |\n|---|---:|---:|---:|\n";
    for (const auto& [family, t] : c.summary()) {
      md << "| " << family << " | " << t.points << " | " << fixed(100 * t.median_abs_error, 1) << "% | "
         << fixed(100 * t.largest_abs_error, 1) << "% |\n";
    }
    md << "\n<details><summary>every point</summary>\n\n| family | figure | source | method | measured us | "
          "predicted us | error |\n|---|---|---|---|---:|---:|---:|\n";
    for (const ComponentCheck& k : c.checks) {
      md << "| " << k.family << " | " << md_cell(k.what) << " | " << k.source << " | " << k.method << " | "
         << fixed(k.measured_s * 1e6, 2) << " | " << fixed(k.predicted_s * 1e6, 2) << " | "
         << percent(k.relative_error()) << " |\n";
    }
    md << "\n</details>\n";
  }
  return md.str();
}

std::string report_html(const Report& report) {
  using namespace stepcast::html;
  std::ostringstream body;
  body << heading("Published multi-GPU results: predicted against published", 1)
       << paragraph("stepcast validate --sweep published, " + report.created_utc + ", stepcast " +
                    stepcast_version() + " (git " + stepcast_git_commit() + "), machine " +
                    report.machine.hostname + " (" + report.machine.cpu_model + ", " +
                    std::to_string(report.machine.cores) + " cores). Rows from "
                    "../shared/data/reference-figures.md, predicted from the shipped datasheet "
                    "profiles, never fitted to them. Error = (predicted - published) / published.");
  std::vector<Point> points;
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> categories;
  std::vector<double> compute, comm, bubble, optimizer;
  for (const auto& r : report.megatron) {
    const MegatronRow& row = *r.row;
    if (r.ok) {
      points.push_back({row.published_tflops_per_gpu, r.tflops_per_gpu, row.name});
      categories.push_back(row.name);
      compute.push_back(breakdown_value(r.breakdown, "compute"));
      comm.push_back(breakdown_value(r.breakdown, "exposed_comm"));
      bubble.push_back(breakdown_value(r.breakdown, "bubble"));
      optimizer.push_back(breakdown_value(r.breakdown, "optimizer"));
    }
    rows.push_back({row.name, row_config(row), plan_summary(row),
                    r.ok ? fixed(r.tflops_per_gpu, 1) : "failed",
                    r.ok ? fixed(r.step_time_s, 2) : "", fixed(row.published_tflops_per_gpu, 0),
                    fixed(r.published_time_s(), 2), r.ok ? percent(r.error()) : r.failure});
  }
  body << heading("Megatron-LM SC'21 Table 1: TFLOP/s per GPU")
       << paragraph("Plan rule: " + megatron_plan_rule())
       << table({"row", "config", "plan", "predicted TFLOP/s/GPU", "predicted iteration s",
                 "published TFLOP/s/GPU", "published iteration s", "error"},
                rows)
       << paragraph("Mean absolute error: " + fixed(100 * report.megatron_mean(), 1) + "%.");
  ChartOptions scatter;
  scatter.title = "TFLOP/s per GPU: predicted against published (band ±10%)";
  scatter.x_label = "published TFLOP/s per GPU";
  scatter.y_label = "predicted TFLOP/s per GPU";
  body << scatter_chart(scatter, points, 0.10);
  ChartOptions bars;
  bars.title = "Predicted iteration time by part (critical rank)";
  bars.x_label = "row";
  bars.y_label = "seconds";
  body << stacked_bars(bars, categories,
                       {{"compute", compute}, {"exposed comm", comm}, {"bubble", bubble},
                        {"optimizer", optimizer}});
  std::vector<std::vector<std::string>> nccl_rows;
  std::vector<Point> nccl_points;
  for (const auto& r : report.nccl) {
    const NcclRow& row = *r.row;
    nccl_rows.push_back({row.name, row.system, row.source, row.bytes_note, r.predicted.algorithm,
                         fixed(r.predicted.busbw_bytes_per_s / 1e9, 1),
                         fixed(row.published_busbw_bytes_per_s / 1e9, 1), percent(r.error()),
                         row.excluded.empty() ? "yes" : "no: " + row.excluded});
    nccl_points.push_back({row.published_busbw_bytes_per_s / 1e9, r.predicted.busbw_bytes_per_s / 1e9,
                           row.name});
  }
  body << heading("nccl-tests all_reduce bus bandwidth")
       << table({"row", "system", "source", "message", "algorithm", "predicted busbw GB/s",
                 "published GB/s", "error", "in mean"},
                nccl_rows)
       << paragraph("Mean absolute error over the rows in the mean: " +
                    fixed(100 * report.nccl_mean(), 1) + "%; over every row in a mean: " +
                    fixed(100 * report.overall_mean(), 1) + "%.");
  ChartOptions busbw;
  busbw.title = "all_reduce busbw: predicted against published (band ±10%)";
  busbw.x_label = "published GB/s";
  busbw.y_label = "predicted GB/s";
  body << scatter_chart(busbw, nccl_points, 0.10);
  std::vector<std::vector<std::string>> component_rows;
  for (const ComponentSection& c : report.components) {
    for (const auto& [family, t] : c.summary()) {
      component_rows.push_back({c.profile_file, family, std::to_string(t.points),
                                fixed(100 * t.median_abs_error, 1) + "%", fixed(100 * t.largest_abs_error, 1) + "%"});
    }
  }
  body << heading("Component figures of the profiles")
       << paragraph("Each published component figure a profile holds, predicted by the cost model that uses "
                    "it: fitted GEMM points by the model, table points by their table without them "
                    "(leave-one-out). published.md lists every point with its source.")
       << table({"profile", "family", "points", "median abs error", "largest abs error"}, component_rows);
  return page("stepcast: published results", body.str());
}

}  // namespace

int validate_published(const std::string& out_dir) {
  return validate_published(out_dir, PublishedOptions{});
}

int validate_published(const std::string& out_dir, const PublishedOptions& options) {
  check_row_names(options);
  if (options.jobs < 1) throw InputError("command line: --jobs must be >= 1");
  auto wall_start = std::chrono::steady_clock::now();
  fs::path repo = repository_root();
  fs::path profiles = options.profile_dir.empty() ? repo / "profiles" : fs::path(options.profile_dir);
  std::string a100_profile = (profiles / "a100-sxm4-80gb.json").string();
  Report report;
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
  for (const NcclRow& row : nccl_table()) {
    if (!selected(options, row.name)) continue;
    std::string topology_file = (repo / "topologies" / (row.topology + ".json")).string();
    std::string profile_file = (profiles / (row.profile + ".json")).string();
    topology_of_profile[profile_file] = topology_file;
    Topology topology = load_topology(topology_file);
    DeviceProfile profile = load_profile(profile_file);
    check_profile_matches(profile, topology);
    profiles_used.insert(profile_file);
    NcclResult r{&row, predict_nccl(row, topology, profile)};
    std::cout << "nccl  " << std::left << std::setw(20) << row.name << std::right << " "
              << std::setw(13) << r.predicted.algorithm << "  predicted busbw "
              << std::setw(6) << fixed(r.predicted.busbw_bytes_per_s / 1e9, 1) << " GB/s, published "
              << std::setw(6) << fixed(row.published_busbw_bytes_per_s / 1e9, 1) << ", error "
              << std::setw(7) << percent(r.error()) << (row.excluded.empty() ? "" : "  (not in the mean)")
              << "\n";
    report.nccl.push_back(r);
  }

  // Table 1 rows: model and plan files kept under OUT_DIR/inputs, simulations in child processes.
  std::vector<const MegatronRow*> rows_to_run;
  for (const MegatronRow& row : megatron_table1()) {
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
  std::atomic<size_t> next{0};
  std::mutex print;
  size_t done = 0;
  auto worker = [&] {
    for (size_t i = next++; i < rows_to_run.size(); i = next++) {
      results[i] = simulate_row(*rows_to_run[i], inputs, repo, a100_profile);
      std::lock_guard<std::mutex> lock(print);
      const MegatronResult& r = results[i];
      ++done;
      std::cout << "[" << done << "/" << rows_to_run.size() << "] " << std::left << std::setw(16)
                << r.row->name << std::right;
      if (r.ok) {
        std::cout << " predicted " << std::setw(6) << fixed(r.tflops_per_gpu, 1)
                  << " TFLOP/s/GPU (" << fixed(r.step_time_s, 2) << " s), published "
                  << fixed(r.row->published_tflops_per_gpu, 0) << " (" << fixed(r.published_time_s(), 2)
                  << " s), error " << percent(r.error()) << "  [" << fixed(r.wall_s, 0) << " s]\n";
      } else {
        std::cout << " FAILED: " << r.failure.substr(0, 300) << "\n";
      }
      std::cout.flush();
    }
  };
  std::vector<std::thread> threads;
  for (int j = 0; j < std::min<int>(options.jobs, int(rows_to_run.size())); ++j) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
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
                  << " points, median |error| " << fixed(100 * t.median_abs_error, 1) << "%, largest "
                  << fixed(100 * t.largest_abs_error, 1) << "%\n";
      }
      report.components.push_back(std::move(section));
    }
  }
  report.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();

  write_output_file(out_dir, "published.json", report_json(report).dump(2) + "\n");
  write_output_file(out_dir, "published.md", report_markdown(report));
  write_output_file(out_dir, "published.html", report_html(report));
  std::cout << "mean absolute error: Table 1 " << fixed(100 * report.megatron_mean(), 1)
            << "%, nccl-tests " << fixed(100 * report.nccl_mean(), 1) << "%, all "
            << fixed(100 * report.overall_mean(), 1) << "%\nwrote " << out_dir << "/published.md, "
            << out_dir << "/published.json and " << out_dir << "/published.html\n";
  bool failed = false;
  for (const auto& r : report.megatron) failed |= !r.ok;
  return failed ? 1 : 0;
}

}  // namespace stepcast::cli
