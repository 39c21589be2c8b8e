// The CPU backend's profile (profiler.hpp): its grid, the measured tables made a DeviceProfile
// with the α-β fits of links and memory, and a topology written from a measured profile.
#include "profiler.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>

#include "collective.hpp"
#include "cpu_backend.hpp"
#include "errors.hpp"
#include "version.hpp"

namespace stepcast {

namespace {

constexpr double kWatchdogS = 600;

Json fit_to_json(const std::optional<LinkFit>& fit, const std::string& from) {
  if (!fit) return nullptr;
  return {{"from", from},
          {"latency_s", fit->latency_s},
          {"bandwidth_bytes_per_s", fit->bandwidth_bytes_per_s},
          {"max_relative_error", fit->max_relative_error},
          {"samples", fit->samples}};
}

// The inter-node link from its ping-pong (one-way times, sizes ascending). A least-squares α-β
// over every size is wrong here: a shaped link (tc's token bucket) passes a bucket's worth of
// bytes at once after a pause, so the mid sizes look faster than the link. β: the marginal rate
// between the two largest messages (the burst and α cancel out); α: the smallest message's time
// less its bytes at β. max_relative_error: of α + bytes/β over every point.
std::optional<LinkFit> fit_inter_node_link(const std::vector<P2pPoint>& points) {
  if (points.size() < 2) return std::nullopt;
  const P2pPoint &small = points.front(), &a = points[points.size() - 2], &b = points.back();
  if (!(b.time_s > a.time_s) || !(b.bytes > a.bytes)) return std::nullopt;
  LinkFit fit;
  fit.bandwidth_bytes_per_s = (b.bytes - a.bytes) / (b.time_s - a.time_s);
  fit.latency_s = std::max(0.0, small.time_s - small.bytes / fit.bandwidth_bytes_per_s);
  for (const P2pPoint& p : points) {
    double model = fit.latency_s + p.bytes / fit.bandwidth_bytes_per_s;
    fit.max_relative_error = std::max(fit.max_relative_error, std::abs(model - p.time_s) / p.time_s);
  }
  fit.samples = int64_t(points.size());
  return fit;
}

// The last-level cache of cpu0 (sysfs: its highest-level data or unified cache) and the CPUs
// that share it; {0, 0} where sysfs does not say.
std::pair<double, int64_t> last_level_cache() {
  const std::string base = "/sys/devices/system/cpu/cpu0/cache/index";
  std::pair<double, int64_t> best{0, 0};
  int best_level = 0;
  for (int i = 0; i < 16; ++i) {
    auto read = [&](const std::string& name) {
      std::ifstream in(base + std::to_string(i) + "/" + name);
      std::string v;
      std::getline(in, v);
      return v;
    };
    std::string level = read("level"), type = read("type"), size = read("size"), cpus = read("shared_cpu_list");
    if (level.empty() || type == "Instruction" || size.empty()) continue;
    double bytes = std::atof(size.c_str());
    if (size.back() == 'K') bytes *= 1024;
    if (size.back() == 'M') bytes *= 1024.0 * 1024;
    int64_t sharing = 0;
    std::istringstream list(cpus);
    for (std::string range; std::getline(list, range, ',');) {
      size_t dash = range.find('-');
      sharing += dash == std::string::npos ? 1 : std::atoll(range.c_str() + dash + 1) - std::atoll(range.c_str()) + 1;
    }
    if (std::atoi(level.c_str()) > best_level && bytes > 0) {
      best_level = std::atoi(level.c_str());
      best = {bytes, std::max<int64_t>(1, sharing)};
    }
  }
  return best;
}

}  // namespace

std::optional<double> inter_node_exchange_fraction(const std::vector<CollectivePoint>& points, int64_t group_size,
                                                   double nic_bandwidth_bytes_per_s) {
  if (group_size < 2 || !(nic_bandwidth_bytes_per_s > 0)) return std::nullopt;
  std::vector<P2pPoint> sent;  // what each rank's NIC carries each way, and the time
  for (const CollectivePoint& c : points) {
    if (c.kind == "all_gather" && c.algorithm == "ring" && c.group_size == group_size) {
      sent.push_back({c.bytes * double(group_size - 1) / double(group_size), c.time_s, ""});
    }
  }
  std::sort(sent.begin(), sent.end(), [](const P2pPoint& a, const P2pPoint& b) { return a.bytes < b.bytes; });
  std::optional<LinkFit> fit = fit_inter_node_link(sent);
  if (!fit) return std::nullopt;
  return std::clamp(fit->bandwidth_bytes_per_s / nic_bandwidth_bytes_per_s, 1e-3, 1.0);
}

std::vector<double> collective_reuse_pools(double cache_bytes, int64_t sharing_cpus, int64_t ranks_per_node) {
  constexpr double MiB = 1024.0 * 1024;
  double share = cache_bytes / double(std::max<int64_t>(1, std::min(sharing_cpus, ranks_per_node)));
  double top = cache_bytes > 0 ? std::clamp(2 * share, 64 * MiB, 1024 * MiB) : 256 * MiB;
  std::vector<double> pools;
  for (double x = 4 * MiB; x * 1.5 < top; x *= 4) pools.push_back(x);
  if (top / 2 > pools.back() * 1.5) pools.push_back(top / 2);
  pools.push_back(top);
  return pools;
}

ProfileGrid cpu_profile_grid(int64_t ranks_per_node) {
  ProfileGrid grid;
  auto [cache, sharing] = last_level_cache();
  grid.collective_reuse_bytes = collective_reuse_pools(cache, sharing, ranks_per_node);
  grid.collective_reuse_bytes_quick = {16.0 * (1 << 20), 64.0 * (1 << 20)};
  grid.last_level_cache_bytes = cache;
  grid.last_level_cache_sharing = sharing;
  grid.gemm_axis = {10, 14, 20, 28, 40, 80, 160, 320, 640};
  grid.gemm_axis_quick = {20, 80, 320};
  grid.gemm_reuse_axis = {20, 320};
  grid.memory_max_bytes = 16.0 * (1 << 20);
  grid.collective_max_bytes = 64.0 * (1 << 20);
  grid.collective_algorithm = "ring";
  grid.mpi_collectives = true;
  return grid;
}

Json profile_method(const RankPlacement& placement, const ProfileOptions& options, const std::string& statistic,
                    double wall_s) {
  return {{"ranks", placement.size},
          {"ranks_per_node", placement.ranks_per_node},
          {"nodes", placement.nodes},
          {"quick", options.quick},
          {"repetitions", options.repetitions},
          {"min_sample_s", options.min_sample_s},
          {"statistic", statistic},
          {"all_ranks_busy", true},
          {"wall_s", wall_s},
          {"stepcast", std::string(stepcast_version()) + " (git " + stepcast_git_commit() + ")"}};
}

Json apply_measured_fits(DeviceProfile& p, const MeasuredTables& tables, int64_t intra_group,
                         const std::string& collectives_from, const std::string& p2p_from) {
  std::optional<LinkFit> p2p = fit_link(p2p_link_samples(tables.p2p));
  std::optional<LinkFit> ring = fit_link(collective_link_samples(tables.collectives, intra_group));
  std::vector<LinkSample> memory_samples;
  for (const MemoryPoint& m : tables.memory) {
    if (m.family != "copy") memory_samples.push_back({1.0, m.bytes, m.time_s});
  }
  std::optional<LinkFit> memory = fit_link(memory_samples);
  std::optional<LinkFit> links = ring ? ring : p2p;
  if (links) {
    p.intra_node_bandwidth_bytes_per_s = links->bandwidth_bytes_per_s;
    p.intra_node_latency_s = links->latency_s;
  }
  if (memory) {
    p.memory_bandwidth_bytes_per_s = memory->bandwidth_bytes_per_s;
    p.kernel_overhead_s = memory->latency_s;
  }
  return {{"collectives", fit_to_json(ring, collectives_from)},
          {"p2p", fit_to_json(p2p, p2p_from)},
          {"memory", fit_to_json(memory, "every memory-bound point")},
          {"applied_to_links", ring ? "collectives" : (p2p ? "p2p" : "none")}};
}

DeviceProfile measure_cpu_profile(const ProfileOptions& options) {
  STEPCAST_CHECK(options.dtype == Dtype::fp32 || options.dtype == Dtype::fp64,
                 "the CPU backend computes in fp32 or fp64");
  const RankPlacement placement = place_this_rank();
  const int rank = placement.rank, size = placement.size;
  const int ranks_per_node = placement.ranks_per_node, nodes = placement.nodes;
  if (nodes > 1 && !(options.nic_bandwidth_bytes_per_s > 0)) {
    throw InputError("stepcast profile: the ranks span " + std::to_string(nodes) +
                     " hosts: --topology T is needed (the topology of these hosts, e.g. the netns "
                     "cluster's topology.json), whose NIC rate the inter-node link is measured against");
  }
  if (options.links_only && nodes < 2) {
    throw InputError("stepcast profile --add-links-to: the " + std::to_string(size) +
                     " ranks are on one host: the inter-node link needs ranks on two hosts or more "
                     "(mpirun --hostfile, e.g. the netns cluster's mpirun wrapper)");
  }

  double start = MPI_Wtime();
  MeasuredTables tables;
  auto factory = [&](auto tag) {
    using T = decltype(tag);
    return BackendFactory<T, T, T>([rank, ranks_per_node](const RankGrid& grid, bool use_mpi) {
      return make_cpu_backend<T>(grid, rank, ranks_per_node, use_mpi, kWatchdogS);
    });
  };
  const ProfileGrid grid = cpu_profile_grid(ranks_per_node);
  if (options.dtype == Dtype::fp32) {
    tables = measure_tables<float, float, float>(options, rank, size, ranks_per_node, factory(float{}), grid);
  } else {
    tables = measure_tables<double, double, double>(options, rank, size, ranks_per_node, factory(double{}), grid);
  }
  double wall_s = MPI_Wtime() - start;

  MachineInfo machine = describe_machine();
  DeviceProfile p;
  p.name = "cpu-" + machine.hostname;
  p.device = "cpu-core";
  p.backend = "cpu";
  p.machine = machine;
  p.libraries = library_versions();
  p.gemm[options.dtype] = GemmEfficiency{1.0, 0.0};
  // How the CPU backend runs a step (exec/executor.cpp): ops in list order on one thread, sends
  // posted from staging copies.
  p.execution_in_order = true;
  p.execution_staged_sends = true;
  if (rank != 0) return p;

  // Links: the intra-node path from the ring/tree collectives of a group inside one node (what
  // the simulator's intra-node flows carry), else from the ping-pong.
  // One rank per node has no intra-node link to measure: the topology's figures stay.
  int64_t intra_group = nodes == 1 ? size : (ranks_per_node >= 2 ? 2 : 0);
  tables.fits = apply_measured_fits(p, tables, intra_group,
                                    "ring and tree collectives of " + std::to_string(intra_group) + " ranks in a node",
                                    "send/recv ping-pong, one way");
  // Across nodes: the ping-pong's α is the one-way path latency, its β over the rate of the NICs
  // a rank drives the achievable fraction (TCP/IP and Ethernet headers, the shaper), kept with the
  // rate it was measured at: a shaped link's share differs by rate (--add-links-to adds others).
  if (std::optional<LinkFit> inter = fit_inter_node_link(tables.p2p_inter_node)) {
    p.inter_node_latency_s = inter->latency_s;
    const double driven = options.nic_bandwidth_bytes_per_s * options.nics_per_rank;
    p.inter_node_bus_fraction = std::clamp(inter->bandwidth_bytes_per_s / driven, 1e-3, 1.0);
    p.inter_node_rate_bytes_per_s = options.nic_bandwidth_bytes_per_s;
    tables.fits["inter_node_p2p"] = fit_to_json(
        inter, "send/recv ping-pong across nodes, one way: β between the two largest messages, α the smallest's time");
    tables.fits["inter_node_p2p"]["nic_bandwidth_bytes_per_s"] = options.nic_bandwidth_bytes_per_s;
    tables.fits["inter_node_p2p"]["nics_per_rank"] = options.nics_per_rank;
  }
  // A collective across nodes sends and receives at once: each direction also carries the
  // other's TCP acknowledgements and MPI's fragment headers, so it gets less of the NIC than the
  // ping-pong's one-way β (measured: 0.92 of the shaped rate against 0.955, at 200 Mbit/s and at
  // 1 Gbit/s). From the world group's ring all_gather (no reduction in it), one rank a node.
  if (nodes > 1 && ranks_per_node == 1) {
    p.inter_node_exchange_fraction =
        inter_node_exchange_fraction(tables.collectives, size, options.nic_bandwidth_bytes_per_s * options.nics_per_rank);
    if (p.inter_node_exchange_fraction) {
      tables.fits["inter_node_exchange"] = {
          {"from", "ring all_gather of " + std::to_string(size) +
                       " ranks, one a node: (n-1)/n of the buffer each way over the time, the marginal rate "
                       "between the two largest sizes, over the NIC's"},
          {"fraction", *p.inter_node_exchange_fraction},
          {"nic_bandwidth_bytes_per_s", options.nic_bandwidth_bytes_per_s},
          {"nics_per_rank", options.nics_per_rank}};
    }
  }
  tables.method = profile_method(placement, options,
                                 "median over every rank's samples; a sample is the mean of back-to-back calls",
                                 wall_s);
  tables.method["collective_reuse"] = {
      {"last_level_cache_bytes", grid.last_level_cache_bytes > 0 ? Json(grid.last_level_cache_bytes) : Json(nullptr)},
      {"cpus_sharing_it", grid.last_level_cache_sharing},
      {"pools_bytes", options.quick ? grid.collective_reuse_bytes_quick : grid.collective_reuse_bytes},
      {"rule", "per rank: 4 MiB·4^i below twice its share of the last-level cache (the cache over the ranks "
               "sharing it; 64 MiB … 1 GiB; 256 MiB where sysfs gives no cache), half that, and that"}};
  p.measured = std::move(tables);
  p.notes = "Measured by `stepcast profile --backend cpu` with " + std::to_string(size) + " MPI ranks busy at once (" +
            std::to_string(ranks_per_node) +
            " per node). measured holds "
            "the points; cost_model.hpp interpolates them (GEMM: log rate multilinear in log2 m, n, k, "
            "times the gemm_reuse_points' factor at each operand's reuse distance in a step; "
            "memory-bound: log bandwidth linear in log bytes; both clamped at the grid's edges). "
            "links.intra_node_* are the α-β fit of measured.fits.applied_to_links and replace the "
            "topology's intra-node figures; memory.bandwidth_bytes_per_s and kernel_overhead_s are the "
            "α-β fit of every memory-bound point, used for memory-bound ops without a table. The "
            "fractions are 1: the measured figures are absolute. execution says how the CPU backend runs "
            "a step: in list order on one thread (no stream overlaps another), sends posted from staging "
            "copies (the copy family). Flash attention is not measured (fraction 1). Across nodes, "
            "links.inter_node_latency_s is the α of the inter-node ping-pong and inter_node_bus_fraction its β "
            "over the rate of the NICs a rank drives (point-to-point sends), inter_node_exchange_fraction the "
            "ring all_gather's (collectives, whose ranks send and receive at once), both at the NIC rate "
            "inter_node_rate_bytes_per_s (other rates: inter_node_at_rates, profile --add-links-to); on one "
            "node the fabric is not measured (fraction 1).";
  return p;
}

Json measured_cpu_topology(const DeviceProfile& profile, int nodes, int ranks_per_node, double host_memory) {
  STEPCAST_CHECK(profile.measured.has_value(), "a topology from a profile without measurements");
  const MeasuredTables& t = *profile.measured;
  double peak = 0;
  for (const GemmPoint& g : t.gemm) peak = std::max(peak, g.flops() / g.time_s);
  double bandwidth = profile.memory_bandwidth_bytes_per_s.value_or(0);
  double link = profile.intra_node_bandwidth_bytes_per_s.value_or(0);
  if (!(peak > 0) || !(bandwidth > 0) || !(link > 0)) {
    throw InputError(
        "the profile lacks GEMM, memory-bound or link measurements needed for a "
        "topology (run profile with at least 2 ranks)");
  }
  std::string host = profile.machine ? profile.machine->hostname : "localhost";
  std::ostringstream notes;
  notes << "Written by `stepcast profile --topology-out` on " << host << " ("
        << (profile.machine ? profile.machine->cpu_model : "?") << ") from profile " << profile.name
        << ": one MPI rank per core, each core a device. peak_flops_per_s." << to_string(t.dtype)
        << " is the fastest measured GEMM (all ranks busy); memory_bandwidth_bytes_per_s is one "
           "rank's bandwidth from the α-β fit of the memory-bound kernels; memory_bytes is "
           "/proc/meminfo's MemTotal divided by the ranks per node; runtime_allowance_bytes "
           "256 MiB is an allowance for the MPI runtime and OpenBLAS buffers, as in "
           "localhost-cpu.json. intra_node bandwidth and latency are the profile's link fit ("
        << (t.fits.contains("applied_to_links") ? t.fits["applied_to_links"].dump() : "\"?\"")
        << "). The fabric is a placeholder (10 Gb/s NIC), unused within one node.";
  double per_device_memory = std::floor(host_memory / std::max(1, ranks_per_node));
  return {{"name", host + "-cpu-measured"},
          {"notes", notes.str()},
          {"num_nodes", nodes},
          {"node",
           {{"devices_per_node", ranks_per_node},
            {"device",
             {{"name", profile.device},
              {"peak_flops_per_s", {{to_string(t.dtype), peak}}},
              {"memory_bytes", per_device_memory},
              {"memory_bandwidth_bytes_per_s", bandwidth},
              {"runtime_allowance_bytes", 268435456},
              {"memory_reserved_bytes", 0}}},
            {"intra_node",
             {{"kind", "shared_memory"},
              {"bandwidth_bytes_per_s", link},
              {"latency_s", profile.intra_node_latency_s.value_or(0)}}}}},
          {"fabric",
           {{"kind", "fat_tree"},
            {"nics_per_node", 1},
            {"nic_bandwidth_bytes_per_s", 1.25e9},
            {"nic_latency_s", 1e-5},
            {"switch_latency_s", 1e-6},
            {"oversubscription", 1},
            {"switch_radix", 48}}}};
}

}  // namespace stepcast
