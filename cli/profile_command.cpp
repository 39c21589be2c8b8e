// `stepcast profile`: measures this machine under mpirun with every rank busy (exec/profiler.hpp)
// and writes the device profile (and, on request, a topology of this machine) that `simulate
// --profile` interpolates.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>

#include "commands.hpp"
#include "cost_model.hpp"
#include "errors.hpp"
#include "inputs.hpp"
#include "mpi_main.hpp"
#include "profiler.hpp"
#include "cuda_plugin_loader.hpp"

namespace stepcast::cli {

namespace fs = std::filesystem;

namespace {

void write_file(const std::string& path, const std::string& text) {
  std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  std::ofstream out(path);
  out << text;
  if (!out) throw InputError("cannot write " + path);
}

// "median 1.2%, largest 4.8% (forward 10x640x20)" over leave-one-out predictions.
std::string summarise(const std::vector<LeaveOneOut>& loo) {
  if (loo.empty()) return "no points";
  std::vector<double> errors;
  const LeaveOneOut* worst = &loo.front();
  for (const LeaveOneOut& l : loo) {
    errors.push_back(std::abs(l.relative_error()));
    if (std::abs(l.relative_error()) > std::abs(worst->relative_error())) worst = &l;
  }
  std::sort(errors.begin(), errors.end());
  size_t within = size_t(std::count_if(errors.begin(), errors.end(), [](double e) { return e <= 0.05; }));
  std::ostringstream out;
  out.precision(3);
  out << "median " << 100 * errors[errors.size() / 2] << "%, " << within << "/" << errors.size()
      << " within 5%, largest " << 100 * std::abs(worst->relative_error()) << "% (" << worst->what
      << ")";
  return out.str();
}

}  // namespace

int run_profile(int argc, char** argv) {
  if (argc > 1 && (std::string(argv[1]) == "import" || std::string(argv[1]) == "fit" ||
                   std::string(argv[1]) == "check")) {
    return run_profile_tool(argv[1], argc - 1, argv + 1);
  }
  po::options_description options("stepcast profile options");
  options.add_options()
      ("backend", po::value<std::string>()->required(),
       "cpu, or cuda (cuBLASLt GEMMs, the CUDA kernels, NCCL; one rank per GPU)")
      ("out", po::value<std::string>()->required(), "write the device profile JSON to FILE")
      ("dtype", po::value<std::string>(), "cpu: fp32 (default) or fp64; cuda: bf16 (default)")
      ("topology", po::value<std::string>(),
       "cuda: the topology whose device this GPU is (the profile takes its device name; flash "
       "attention fractions are of its bf16 peak); cpu, ranks on several hosts (netns cluster): "
       "the hosts' topology, whose NIC rate the inter-node link is measured against")
      ("add-links-to", po::value<std::string>(),
       "cpu, ranks on several hosts: measure only the inter-node link (ping-pong and ring "
       "all_gather across hosts) at --topology's NIC rate and write PROFILE with it added at that "
       "rate (links.inter_node_at_rates) to --out (which may be PROFILE)")
      ("quick", po::bool_switch(), "a few points of each table (a few seconds; for tests)")
      ("topology-out", po::value<std::string>(), "also write a topology JSON of this machine to FILE")
      ("min-sample-s", po::value<double>()->default_value(1e-3),
       "one sample repeats a call until at least this long")
      ("repetitions", po::value<int>()->default_value(5), "samples per point and rank");
  auto vm = parse_command_line(
      argc, argv, options,
      "usage: mpirun -np N stepcast profile --backend cpu --out F [--dtype fp32|fp64] [--quick]\n"
      "                                     [--topology-out T] [--topology T]\n"
      "       mpirun -np N stepcast profile --backend cpu --topology T --add-links-to P --out F\n"
      "       mpirun -np N stepcast profile --backend cuda --topology T --out F [--quick]\n"
      "Measures the machine with every rank busy at once, as in training: GEMM rate on a grid of\n"
      "shapes (on the CPU m, n, k of 20 and 320 again, back to back and with their operands a\n"
      "pool away: gemm_reuse_points, which simulate weighs by each operand's reuse distance as\n"
      "for the collectives below), fused attention (causal, and on the CPU the context-parallel\n"
      "kernel over its K/V blocks) by sequence and head size, memory-bound kernel bandwidth\n"
      "(norms, activations, softmax, AdamW) by size, collective time and bus bandwidth\n"
      "(all_reduce, reduce_scatter, all_gather; nccl-tests' algbw and busbw) by message and group\n"
      "size — on the CPU also with their operands out of cache (each call's in a pool of 4 MiB up\n"
      "to twice the rank's share of the last-level cache: collective_reuse_points, which simulate\n"
      "weighs by how long ago a step touched each operand) — and send/recv latency and bandwidth\n"
      "(across hosts too, when the ranks span several: the inter-node link's α-β, and with one\n"
      "rank a host the share of the NIC a collective gets, sending and receiving at once; needs\n"
      "--topology). Each figure is the median over ranks and repetitions. `simulate --profile F`\n"
      "interpolates them.\n"
      "A link's share of its rate is measured at the rate: --add-links-to measures one more rate\n"
      "(e.g. the netns cluster re-shaped) into a profile, and a link of another rate gets the\n"
      "measured rates' fraction log-linear in log rate between them (the nearest's outside).\n"
      "Also: stepcast profile import|fit|check --help (no mpirun): nccl-tests logs and GEMM\n"
      "sweeps into a profile, the GEMM shape model fitted to its points, its figures checked.");
  if (!vm) return 0;
  std::string backend = (*vm)["backend"].as<std::string>();
  if (backend != "cpu" && backend != "cuda") {
    throw InputError("command line: --backend '" + backend + "': valid: cpu, cuda");
  }
  const CudaPlugin* cuda = backend == "cuda" ? &load_cuda_plugin() : nullptr;
  ProfileOptions profile_options;
  std::string dtype = vm->count("dtype") ? (*vm)["dtype"].as<std::string>()
                                         : (backend == "cuda" ? "bf16" : "fp32");
  if (backend == "cpu" && dtype != "fp32" && dtype != "fp64") {
    throw InputError("command line: --dtype '" + dtype + "': valid: fp32, fp64 (the CPU backend's types)");
  }
  if (backend == "cuda" && dtype != "bf16") {
    throw InputError("command line: --dtype '" + dtype + "': valid: bf16 (the CUDA backend's compute type)");
  }
  if (backend == "cuda") {
    if (!vm->count("topology")) {
      throw InputError("command line: --backend cuda needs --topology T (the topology whose device "
                       "this GPU is, e.g. topologies/h200-1gpu.json)");
    }
    if (vm->count("topology-out")) {
      throw InputError("command line: --topology-out is for the CPU backend; valid with cuda: --topology");
    }
    Topology topology = load_topology((*vm)["topology"].as<std::string>());
    profile_options.device_name = topology.node.device.name;
    profile_options.peak_flops_per_s = topology.node.device.peak_for(Dtype::bf16, topology.file);
  }
  std::optional<DeviceProfile> links_base;
  if (vm->count("add-links-to")) {
    if (backend != "cpu" || !vm->count("topology")) {
      throw InputError("command line: --add-links-to is for --backend cpu with --topology T (the hosts' topology, "
                       "whose NIC rate the link is measured at)");
    }
    if (vm->count("topology-out")) throw InputError("command line: --add-links-to measures no topology: drop --topology-out");
    links_base = load_profile((*vm)["add-links-to"].as<std::string>());
    check_profile_matches(*links_base, load_topology((*vm)["topology"].as<std::string>()));
    profile_options.links_only = true;
  }
  if (backend == "cpu" && vm->count("topology")) {
    Topology topology = load_topology((*vm)["topology"].as<std::string>());
    profile_options.nic_bandwidth_bytes_per_s = topology.fabric.nic_bandwidth_bytes_per_s;
    profile_options.nics_per_rank = std::max(1, topology.fabric.nics_per_node / topology.node.devices_per_node);
  }
  profile_options.dtype = *parse_dtype(dtype);
  profile_options.quick = (*vm)["quick"].as<bool>();
  profile_options.min_sample_s = (*vm)["min-sample-s"].as<double>();
  profile_options.repetitions = (*vm)["repetitions"].as<int>();
  if (!(profile_options.min_sample_s > 0) || profile_options.min_sample_s > 10) {
    throw InputError("command line: --min-sample-s must be in (0, 10] seconds");
  }
  if (profile_options.repetitions < 1) throw InputError("command line: --repetitions must be >= 1");
  std::string out = (*vm)["out"].as<std::string>();

  return with_mpi("profile", argc, argv, [&](int rank, int size) {
    if (vm->count("topology-out") && size < 2) {
      throw InputError("command line: --topology-out needs the intra-node link, measured between "
                       "ranks: run mpirun -np 2 (or more) stepcast profile");
    }
    double start = MPI_Wtime();
    profile_options.progress = [start](const std::string& line) {
      std::ostringstream stamp;
      stamp << std::fixed << std::setprecision(1) << MPI_Wtime() - start;
      std::cout << "[" << stamp.str() << " s] " << line << std::endl;
    };
    if (rank == 0) {
      MachineInfo machine = describe_machine();
      std::cout << "stepcast profile: backend " << backend << " (" << dtype << "), " << size << " ranks on "
                << machine.hostname << " (" << machine.cpu_model << ", " << machine.cores
                << " cores)" << (profile_options.quick ? ", quick" : "") << std::endl;
    }
    DeviceProfile profile = cuda ? cuda->measure_profile(profile_options)
                                 : measure_cpu_profile(profile_options);
    if (rank != 0) return 0;
    if (links_base) {
      DeviceProfile merged = add_inter_node_rate(*links_base, profile);
      std::cout << std::setprecision(3) << "inter-node link at " << *profile.inter_node_rate_bytes_per_s * 8 / 1e6
                << " Mbit/s: " << profile.inter_node_bus_fraction << " of the rate point to point, "
                << profile.collective_inter_node_fraction() << " for collectives; "
                << (merged.inter_node_at_rates.size() + 1) << " rates in " << out << "\n";
      write_file(out, profile_to_json(merged).dump(1) + "\n");
      return 0;
    }
    const MeasuredTables& t = *profile.measured;
    std::cout << std::setprecision(3);
    std::cout << "leave-one-out, GEMM (" << t.gemm.size() << " points): " << summarise(gemm_leave_one_out(t.gemm))
              << "\nleave-one-out, memory-bound (" << t.memory.size()
              << " points): " << summarise(memory_leave_one_out(t.memory, profile.kernel_overhead_s)) << "\n";
    if (profile.inter_node_latency_s) {
      std::cout << "inter-node link (ping-pong fit): " << *profile.inter_node_latency_s * 1e6
                << " us, " << profile.inter_node_bus_fraction << " of the NIC's "
                << profile_options.nic_bandwidth_bytes_per_s / 1e9 << " GB/s"
                << (profile_options.nics_per_rank > 1 ? " times the " + std::to_string(int(profile_options.nics_per_rank)) +
                                                             " NICs each rank drives"
                                                       : "")
                << "\n";
    }
    if (profile.inter_node_exchange_fraction) {
      std::cout << "collectives across nodes (ring all_gather, sending and receiving at once): "
                << *profile.inter_node_exchange_fraction << " of the NIC's rate\n";
    }
    if (profile.intra_node_bandwidth_bytes_per_s) {
      std::cout << "intra-node link (" << t.fits["applied_to_links"].get<std::string>() << " fit): "
                << *profile.intra_node_bandwidth_bytes_per_s / 1e9 << " GB/s, "
                << *profile.intra_node_latency_s * 1e6 << " us\n";
    }
    if (profile.memory_bandwidth_bytes_per_s) {
      std::cout << "memory-bound kernels (fit): " << *profile.memory_bandwidth_bytes_per_s / 1e9
                << " GB/s per rank, " << profile.kernel_overhead_s * 1e6 << " us per kernel\n";
    }
    Json json = profile_to_json(profile);
    write_file(out, json.dump(1) + "\n");
    std::cout << "wrote " << out << " after " << std::fixed << std::setprecision(1)
              << MPI_Wtime() - start << " s\n" << std::defaultfloat;
    if (vm->count("topology-out")) {
      std::string path = (*vm)["topology-out"].as<std::string>();
      int ranks_per_node = t.method["ranks_per_node"].get<int>();
      Json topology = measured_cpu_topology(profile, t.method["nodes"].get<int>(), ranks_per_node,
                                            host_memory_bytes());
      // It names the profile just written, so commands given this topology cost with it.
      fs::path folder = fs::absolute(fs::path(path)).parent_path();
      topology["profile"] = fs::absolute(fs::path(out)).lexically_relative(folder).string();
      parse_topology(topology, path);  // what we write must load
      write_file(path, topology.dump(2) + "\n");
      std::cout << "wrote " << path << "\n";
    }
    return 0;
  });
}

}  // namespace stepcast::cli
