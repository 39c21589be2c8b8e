// `stepcast profile import` (nccl-tests logs and GEMM sweeps into a profile), `stepcast profile
// fit` (the GEMM shape model to a profile's published GEMM points) and `stepcast profile check`
// (every component figure of a profile against the cost model). No MPI: they read and write files.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "commands.hpp"
#include "components.hpp"
#include "errors.hpp"
#include "inputs.hpp"
#include "profile_import.hpp"

namespace stepcast::cli {

namespace {


std::string percent(double x) {
  std::ostringstream out;
  out << std::showpos << std::fixed << std::setprecision(1) << 100 * x << "%";
  return out.str();
}

// Median and largest |error| by family, and the table of checks when `rows`.
void print_checks(const std::vector<ComponentCheck>& checks, bool rows) {
  for (const ComponentCheck& c : checks) {
    if (rows) {
      std::cout << "  " << std::left << std::setw(10) << c.family << " " << std::setw(44) << c.what << std::right
                << std::setw(12) << c.measured_s * 1e6 << " us " << std::setw(12) << c.predicted_s * 1e6
                << " us " << std::setw(8) << percent(c.relative_error()) << "  " << c.method
                << (c.source.empty() ? "" : "  [" + c.source + "]") << "\n";
    }
  }
  for (const auto& [family, e] : errors_by_family(checks)) {
    std::cout << family << ": " << e.points << " points, median |error| " << std::fixed
              << std::setprecision(1) << 100 * e.median_abs_error << "%, largest "
              << 100 * e.largest_abs_error << "%\n"
              << std::defaultfloat;
  }
}

void write_profile(const DeviceProfile& profile, const std::string& out) {
  parse_profile(profile_to_json(profile), out);  // what we write must load
  write_output_file(std::filesystem::path(out).parent_path().string().empty()
                        ? "."
                        : std::filesystem::path(out).parent_path().string(),
                    std::filesystem::path(out).filename().string(), profile_to_json(profile).dump(1) + "\n");
}

void print_log(const NcclTestsLog& l) {
  std::cout << l.file << (l.run > 0 ? " (run " + std::to_string(l.run) + ")" : "") << ": " << l.collective << ", "
            << l.ranks << " ranks on " << l.nodes << (l.nodes == 1 ? " node" : " nodes") << ", " << l.points.size()
            << " sizes" << (l.nccl_version.empty() ? "" : ", NCCL " + l.nccl_version)
            << (l.coll_channels > 0 ? ", " + std::to_string(l.coll_channels) + " coll channels" : "") << ", busbw "
            << std::fixed << std::setprecision(1) << l.points.back().busbw_bytes_per_s / 1e9 << " GB/s at the largest\n"
            << std::defaultfloat;
}

int run_import(int argc, char** argv) {
  po::options_description options("stepcast profile import options");
  options.add_options()
      ("nccl-tests", po::value<std::vector<std::string>>()->multitoken(),
       "nccl-tests logs (all_reduce_perf, all_gather_perf, reduce_scatter_perf, alltoall_perf, "
       "sendrecv_perf output; a file may hold several runs one after another), each FILE or KIND:FILE")
      ("gemm-csv", po::value<std::string>(), "a GEMM sweep: m,n,k,layout,dtype,seconds|tflops[,count,source]")
      ("topology", po::value<std::string>()->required(), "the topology whose device was measured")
      ("base", po::value<std::string>(),
       "the profile to merge into (default: the one the topology names; 'none' for a new one)")
      ("name", po::value<std::string>(), "the new profile's name (default: the base's, '-imported')")
      ("out", po::value<std::string>()->required(), "write the merged profile to FILE");
  auto vm = parse_command_line(
      argc, argv, options,
      "usage: stepcast profile import [--nccl-tests LOG...] [--gemm-csv F] --topology T\n"
      "                               [--base PROFILE|none] [--name N] --out F\n"
      "Reads standard tools' outputs into a device profile: nccl-tests logs become collective\n"
      "tables by message size (ranks and nodes from the log's device lines; a log replaces the\n"
      "base's table of the same collective and span; a file of several runs gives a table each,\n"
      "and two logs of one collective and span are refused), sendrecv logs point-to-point tables, a GEMM\n"
      "CSV the GEMM points (interpolated when they form a grid, else evidence for `profile fit`).\n"
      "Truncated logs, logs of another collective than named, and rows out of shape are refused.");
  if (!vm) return 0;
  if (!vm->count("nccl-tests") && !vm->count("gemm-csv")) {
    throw InputError("command line: nothing to import; valid: --nccl-tests LOG... and/or --gemm-csv F");
  }
  Topology topology = load_topology((*vm)["topology"].as<std::string>());
  DeviceProfile base;
  std::string base_arg = vm->count("base") ? (*vm)["base"].as<std::string>() : "";
  if (base_arg == "none" || (base_arg.empty() && topology.profile_file.empty())) {
    base = roofline_profile(topology);
    base.is_roofline = false;
    base.name = topology.node.device.name + "-imported";
    base.file = (*vm)["out"].as<std::string>();
    base.gemm[Dtype::bf16] = GemmEfficiency{};
    base.gemm[Dtype::fp16] = GemmEfficiency{};
  } else {
    base = load_profile(base_arg.empty() ? topology.profile_file : base_arg);
    check_profile_matches(base, topology);
    base.name += "-imported";
  }
  if (vm->count("name")) base.name = (*vm)["name"].as<std::string>();
  std::vector<NcclTestsLog> logs;
  if (vm->count("nccl-tests")) {
    for (const std::string& arg : (*vm)["nccl-tests"].as<std::vector<std::string>>()) {
      std::string kind, file = arg;
      size_t colon = arg.find(':');
      if (colon != std::string::npos && colon > 0 && arg.find('/') > colon) {
        kind = arg.substr(0, colon);
        file = arg.substr(colon + 1);
      }
      for (NcclTestsLog& l : parse_nccl_tests_logs(read_text_file(file), file, kind)) {
        logs.push_back(std::move(l));
        print_log(logs.back());
      }
    }
  }
  std::optional<GemmCsv> gemm;
  if (vm->count("gemm-csv")) {
    std::string file = (*vm)["gemm-csv"].as<std::string>();
    gemm = parse_gemm_csv(read_text_file(file), file);
    std::cout << file << ": " << gemm->points.size() << " GEMM points (" << to_string(gemm->dtype) << "), "
              << (gemm->grid ? "a grid: interpolated" : "not a grid: fit the shape model with `profile fit`")
              << "\n";
  }
  std::vector<std::string> unused;
  DeviceProfile merged = merge_imports(base, logs, gemm ? &*gemm : nullptr, &unused);
  for (const std::string& line : unused) std::cerr << "warning: " << line << "\n";
  if (merged.overlap.modelled()) {
    std::cout << "overlap: " << merged.overlap.sms << " SMs, collectives hold " << merged.overlap.ctas_intra_node
              << " inside a node and " << merged.overlap.ctas_inter_node << " across nodes\n";
  }
  std::string out = (*vm)["out"].as<std::string>();
  merged.file = out;
  write_profile(merged, out);
  std::vector<ComponentCheck> checks = check_components(merged, topology);
  print_checks(checks, false);
  std::cout << "wrote " << out << "\n";
  return 0;
}

int run_fit(int argc, char** argv) {
  po::options_description options("stepcast profile fit options");
  options.add_options()
      ("profile", po::value<std::string>()->required(), "the profile whose GEMM points to fit")
      ("topology", po::value<std::string>()->required(), "the topology of its device (peaks)")
      ("dtype", po::value<std::string>()->default_value("bf16"), "the dtype whose GEMM figures to fit")
      ("min-outputs", po::value<double>()->default_value(1048576),
       "fit only points of at least this many output elements (m·n·count); smaller ones, one "
       "launch and a few tiles, are printed as the fitted model's predictions")
      ("out", po::value<std::string>()->required(), "write the fitted profile to FILE");
  auto vm = parse_command_line(
      argc, argv, options,
      "usage: stepcast profile fit --profile P --topology T [--dtype bf16] [--min-outputs N] --out F\n"
      "Fits the GEMM shape model (peak_fraction, output_half, k_half, latency_s: plans/profile.hpp)\n"
      "to the profile's GEMM points (measured.gemm_use \"fit\"), least squares in log time, and\n"
      "prints every point's error under it. The other 16-bit dtype takes the same figures.");
  if (!vm) return 0;
  DeviceProfile profile = load_profile((*vm)["profile"].as<std::string>());
  Topology topology = load_topology((*vm)["topology"].as<std::string>());
  check_profile_matches(profile, topology);
  std::optional<Dtype> dtype = parse_dtype((*vm)["dtype"].as<std::string>());
  if (!dtype) throw InputError("command line: --dtype '" + (*vm)["dtype"].as<std::string>() + "': valid: bf16, fp16, ...");
  double min_outputs = (*vm)["min-outputs"].as<double>();
  if (!(min_outputs >= 0)) throw InputError("command line: --min-outputs: valid: a number >= 0");
  GemmShapeFit fit = fit_gemm_shape_model(profile, topology, *dtype, min_outputs);
  print_checks(fit.points, true);
  std::cout << std::setprecision(4) << "fitted " << to_string(*dtype) << ": peak_fraction "
            << fit.efficiency.peak_fraction << ", output_half " << fit.efficiency.output_half << ", k_half "
            << fit.efficiency.k_half << ", latency_s " << fit.efficiency.latency_s << " (rms log error "
            << fit.rms_log_error << ")\n";
  profile.gemm[*dtype] = fit.efficiency;
  if (*dtype == Dtype::bf16 && profile.gemm.count(Dtype::fp16)) profile.gemm[Dtype::fp16] = fit.efficiency;
  if (*dtype == Dtype::fp16 && profile.gemm.count(Dtype::bf16)) profile.gemm[Dtype::bf16] = fit.efficiency;
  profile.gemm_tiling.reset();
  std::string out = (*vm)["out"].as<std::string>();
  profile.file = out;
  write_profile(profile, out);
  std::cout << "wrote " << out << "\n";
  return 0;
}

int run_check(int argc, char** argv) {
  po::options_description options("stepcast profile check options");
  options.add_options()
      ("profile", po::value<std::string>()->required(), "the profile to check")
      ("topology", po::value<std::string>()->required(), "the topology of its device");
  auto vm = parse_command_line(
      argc, argv, options,
      "usage: stepcast profile check --profile P --topology T\n"
      "Predicts every component figure of the profile with the cost model (fitted GEMM points by\n"
      "the model, table points by their table without them; an nccl-tests point beyond the rest\n"
      "of its table as the collective cost model extrapolates) and prints the errors.");
  if (!vm) return 0;
  DeviceProfile profile = load_profile((*vm)["profile"].as<std::string>());
  Topology topology = load_topology((*vm)["topology"].as<std::string>());
  check_profile_matches(profile, topology);
  print_checks(check_components(profile, topology), true);
  return 0;
}

}  // namespace

// Dispatched from run_profile when its first argument names one of these.
int run_profile_tool(const std::string& tool, int argc, char** argv) {
  if (tool == "import") return run_import(argc, argv);
  if (tool == "fit") return run_fit(argc, argv);
  return run_check(argc, argv);
}

}  // namespace stepcast::cli
