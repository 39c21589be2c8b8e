// A device profile: how close one backend on one device comes to the topology's peak rates.
// Two layers:
//  - the model figures the cost model (cost_model.hpp) always has: GEMM fraction of peak (with
//    an optional shape model), fused attention's fraction, memory-bound kernels' fraction of
//    bandwidth and fixed cost per kernel, and the bus-bandwidth fraction collectives reach on
//    each link; and run-to-run variability (scale effects);
//  - measured tables (GEMM time by shape, memory-bound kernel time by bytes, fused attention
//    throughput by sequence and head dimension, collective and point-to-point time by message
//    size and span), which replace the model where they have points. `stepcast profile`
//    (exec/profiler.hpp) writes them from this machine; shipped GPU profiles hold published
//    component measurements, each point naming its entry in `sources`, never an end-to-end
//    training result.
// Times in seconds, sizes in bytes, rates in flop/s and bytes/s. Loading is strict: unknown keys,
// unsorted or duplicate points and non-positive times are refused with the file and key.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "json_input.hpp"
#include "topology.hpp"

namespace stepcast {

struct GemmEfficiency {
  double peak_fraction = 1;  // of the device's dense peak for the dtype, for large GEMMs
  double overhead_s = 0;     // fixed time per GEMM (launch, ramp-up and tail)
  // Shape model (0: none): the rate falls as O/(O + output_half) with the GEMM's output elements
  // O = m·n·count (too few tiles to fill the device) and as k/(k + k_half) with its depth (a
  // short main loop next to the tile's prologue and epilogue); fitted to the profile's published
  // GEMM points (measured.gemm_use "fit").
  double output_half = 0;
  double k_half = 0;
  // Fixed time of a GEMM kernel's body beyond overhead_s (an empty kernel's): the prologue that
  // loads its first k-tiles, the epilogue that stores its output, a lone wave's latency; what
  // sets a small GEMM's time (fitted with the shape model; 0: none).
  double latency_s = 0;
  // The highest fraction of the peak any shape reaches (0: none): a maximum-achievable-matmul
  // search's best, where the shape model, fitted to smaller shapes, would keep rising past what
  // the search found; a GEMM's rate is capped there.
  double ceiling_fraction = 0;
  // The efficiency of (m, n, k) for `count` GEMMs of that shape, in (0, 1]: the factor on
  // peak_fraction.
  double shape_efficiency(double m, double n, double k, double count = 1) const;
};

// A GPU's GEMMs run as output tiles of tile_m × tile_n (either orientation), one tile per SM at a
// time, so a GEMM takes ⌈tiles / sm_count⌉ full waves (NVIDIA, Matrix Multiplication Background
// User's Guide, §3 "Dimension quantization effects"); cost_model.hpp's gemm_wave_efficiency.
struct GemmTiling {
  int64_t sm_count = 0;
  int64_t tile_m = 0, tile_n = 0;
};

// ---- measured tables (one row per point: the median over ranks and repetitions) ----

// The three GEMMs of a linear layer, in the program's convention C[m,n] = A[m,k]·B[k,n]:
// forward y = x·Wᵀ (m tokens, n out, k in); dgrad dx = dy·W (m tokens, n in, k out);
// wgrad dW += dyᵀ·x (m in, n out, k tokens). Each has its own memory layout, so its own rate.
struct GemmPoint {
  std::string variant;  // "forward", "dgrad", "wgrad"
  int64_t m = 0, n = 0, k = 0;
  double time_s = 0;
  std::string source;   // key of DeviceProfile::sources; empty: measured by `stepcast profile`
  int64_t count = 1;    // GEMMs of this shape in one call (a batched GEMM)
  // gemm_reuse_points: the bytes each rank touched between two uses of the operands (the pool
  // the calls rotate through); 0: back to back, the operands the call's own (m·k + k·n + m·n).
  double reuse_distance_bytes = 0;
  double flops() const { return 2.0 * double(m) * double(n) * double(k) * double(count); }
};

// A memory-bound kernel family (memory_family() in cost_model.hpp names them) at one size;
// `bytes` counts what lowering counts for that op, so op.bytes looks the table up directly.
struct MemoryPoint {
  std::string family;
  double bytes = 0;
  double time_s = 0;
  std::string source;
};

// nccl-tests' columns: `bytes` is the per-rank buffer, algbw = bytes / time,
// busbw = algbw · bus_bandwidth_factor(kind, group_size).
struct CollectivePoint {
  std::string kind;       // all_reduce, reduce_scatter, all_gather, all_to_all
  // ring, tree (the program's algorithms over MPI point-to-point), mpi, nccl (whatever NCCL
  // chose: ring, tree, NVLS)
  std::string algorithm;
  int64_t group_size = 0;
  double bytes = 0;
  double time_s = 0;
  double algbw_bytes_per_s = 0;
  double busbw_bytes_per_s = 0;
  std::string source;
  int64_t nodes = 1;      // nodes the group spans (group_size / nodes members on each)
  // collective_reuse_points: the bytes each rank touched between two uses of the operands (a
  // pool of that size, its slots used in turn); 0: the same operands back to back.
  double reuse_distance_bytes = 0;
};

// One-way time of a message between two ranks of a node: half a ping-pong round trip.
struct P2pPoint {
  double bytes = 0;
  double time_s = 0;
  std::string source;
};

// Fused (flash) attention throughput at one shape, in FlashAttention's convention: flops
// 4·b·heads·s²·d forward, 2.5× that backward, halved when causal; forward_backward is the two
// together (3.5× forward).
struct AttentionPoint {
  std::string pass;  // "forward", "backward", "forward_backward"
  int64_t seq = 0, head_dim = 0;
  bool causal = true;
  double flops_per_s = 0;  // FlashAttention's convention: 4·batch·seq²·heads·head_dim a forward
                           // (halved when causal), 2.5 times that a backward
  std::string source;
  // "flash": a fused kernel (FlashAttention); "materialized": the standard attention of PyTorch
  // (batched score GEMM, softmax, value GEMM), measured whole on `batch` sequences of `heads`
  // heads, forward_backward only: it corrects the composed model of those ops (cost_model.hpp);
  // "cp_flash": a context-parallel rank's kernel over its K/V blocks (seq: its rows; the CPU
  // backend's, which masks by position: profiler.cpp), costing the ops that read a K/V block.
  std::string impl = "flash";
  int64_t batch = 0, heads = 0;  // materialized points only
};

// Run-to-run variation: each device's compute runs at a speed factor drawn once per device
// (silicon, cooling, power: its spread over devices), and each compute op's duration varies
// around its cost (its spread over repetitions). Coefficients of variation (standard deviation /
// mean) of normal distributions; zero: none.
struct Variability {
  double device_speed_cv = 0;
  double op_time_cv = 0;
};

// Compute beside a collective (the profile's "overlap"): NCCL's kernels hold whole SMs while they
// run, one CTA per channel, never shared with compute kernels; compute that overlaps a collective
// on another stream runs on the SMs left, at 1 - ctas / sms of its speed. It leaves out memory
// bandwidth and cache contention and wave tails, so it is the least the overlap costs. sms 0:
// not modelled.
struct OverlapInterference {
  int64_t sms = 0;
  int64_t ctas_intra_node = 0;  // a collective whose group is inside one node
  int64_t ctas_inter_node = 0;  // a collective whose group spans nodes
  bool modelled() const { return sms > 0; }
  double compute_speed(bool spans_nodes) const {
    return 1.0 - double(spans_nodes ? ctas_inter_node : ctas_intra_node) / double(sms);
  }
};

// The system a profile's collective tables were measured on (a node's devices and links), so
// that their correction of the α-β model is taken against that system's links, not those of the
// topology a prediction runs on (collective_cost.hpp).
struct MeasuredSystem {
  int64_t devices_per_node = 0;
  double intra_node_bandwidth_bytes_per_s = 0;  // per device, per direction (datasheet)
  double intra_node_latency_s = 0;
  int64_t nics_per_node = 0;
  double nic_bandwidth_bytes_per_s = 0;  // per NIC (datasheet)
  double nic_latency_s = 0;
  double switch_latency_s = 0;
  double oversubscription = 1;  // of the fabric it was measured on
  std::string notes;
};

struct MeasuredTables {
  // Of every GEMM and memory-bound point; bf16 and fp16 tables serve both (same width, same
  // tensor-core rate on the GPUs profiled).
  Dtype dtype = Dtype::fp32;
  // "table": the GEMM points are interpolated (GemmRateTable; they form a grid); "fit": they are
  // published evidence the GEMM shape model (gemm.<dtype>) was fitted to, checked against it by
  // `validate --sweep published`, not interpolated.
  std::string gemm_use = "table";
  Json method = Json::object();  // how it was measured (repetitions, sample time, ranks): for people
  Json fits = Json::object();    // the α-β fits behind `links` (fit_link below): for people
  std::vector<GemmPoint> gemm;
  // The GEMMs of a few shapes again with operands last touched reuse_distance_bytes earlier (a
  // CPU profile: back to back, and out of the caches as a step leaves them); `gemm` was measured
  // with its operands rotating through method.gemm_reuse.table_pool_bytes per operand.
  std::vector<GemmPoint> gemm_reuse;
  // Bytes of each operand array the `gemm` table's calls rotated through (their copies a point's
  // largest operand apart; GemmReuseTable::table_distance_bytes); 0: back to back, or not said.
  double gemm_table_pool_bytes = 0;
  std::vector<MemoryPoint> memory;
  std::vector<CollectivePoint> collectives;
  // The same collectives with operands last touched reuse_distance_bytes earlier (a CPU profile:
  // out of the caches, as a step leaves them); collectives keeps the back-to-back ones.
  std::vector<CollectivePoint> collective_reuse;
  std::vector<P2pPoint> p2p;
  // Ping-pong between ranks on two nodes (a CPU profile across hosts: scripts/netns-cluster.sh).
  std::vector<P2pPoint> p2p_inter_node;
  std::vector<AttentionPoint> attention;
  std::optional<MeasuredSystem> system;  // of the collective tables; none: the prediction's
};

// The inter-node link's fractions as measured at one more NIC rate (DeviceProfile::
// inter_node_at_rates).
struct InterNodeAtRate {
  double nic_bandwidth_bytes_per_s = 0;
  double bus_fraction = 1;                   // point-to-point sends (the ping-pong's β)
  std::optional<double> exchange_fraction;   // collectives (absent: bus_fraction)
  double collective_fraction() const { return exchange_fraction.value_or(bus_fraction); }
};

// Where a profile was measured. Fields that define the machine type: cpu_model, cores.
struct MachineInfo {
  std::string hostname;
  std::string cpu_model;  // /proc/cpuinfo's "model name"
  int64_t cores = 0;      // online logical CPUs
};

struct DeviceProfile {
  std::string name;
  std::string file;
  std::string notes;
  std::string device;   // must equal the topology's node.device.name
  std::string backend;  // "datasheet", "cpu", "cuda"
  std::map<Dtype, GemmEfficiency> gemm;
  double flash_forward_peak_fraction = 1;
  double flash_backward_peak_fraction = 1;
  double memory_bandwidth_fraction = 1;
  double kernel_overhead_s = 0;           // fixed time of every other kernel
  double intra_node_bus_fraction = 1;     // achievable fraction of the intra-node link rate
  double inter_node_bus_fraction = 1;     // achievable fraction of the NIC rate
  bool is_roofline = false;               // no profile: pure roofline on the datasheet peaks
  // How the backend runs a rank's op list (the profile's "execution" object). in_order: one
  // thread runs the ops in list order, so no stream overlaps another (the CPU backend: a
  // collective or a receive blocks it; a send is posted after copying its tensor to a staging
  // buffer). false (the default, and every GPU profile): compute, communication and pipeline
  // streams run concurrently as the program's dependencies allow.
  bool execution_in_order = false;
  bool execution_staged_sends = false;    // in_order only: each send first copies its tensor
  // Measured absolute figures: where present they replace the topology's rate × fraction.
  std::optional<double> memory_bandwidth_bytes_per_s;      // memory-bound ops without a table
  std::optional<double> intra_node_bandwidth_bytes_per_s;  // per device, per direction
  std::optional<double> intra_node_latency_s;
  // One-way latency of a path between two nodes through one switch (the inter-node ping-pong's
  // α); replaces 2·nic_latency + switch_latency of the topology (nic_latency_s = (α − switch)/2).
  std::optional<double> inter_node_latency_s;
  // Achievable fraction of the NIC rate for a collective across nodes, whose ranks send and
  // receive at once (each direction also carries the other's acknowledgements, and MPI's
  // fragments their headers); absent: inter_node_bus_fraction, which point-to-point sends keep.
  std::optional<double> inter_node_exchange_fraction;
  double collective_inter_node_fraction() const {
    return inter_node_exchange_fraction.value_or(inter_node_bus_fraction);
  }
  // The NIC rate (bytes/s) the inter-node fractions above were measured at; absent (datasheet
  // profiles): they hold at every rate. inter_node_at_rates: the same link measured at other
  // rates (`stepcast profile --add-links-to`), ascending, none at that rate. A shaped link's share
  // is not one figure for every rate: on one VM the netns cluster's TCP got 0.95 of 200 Mbit/s,
  // 0.64 of 1 Gbit/s and 0.93 of 10 Gbit/s.
  std::optional<double> inter_node_rate_bytes_per_s;
  std::vector<InterNodeAtRate> inter_node_at_rates;
  // The achievable fraction of an inter-node link of `rate` bytes/s, for point-to-point sends
  // or (`collective`) a collective's: where the profile measured several rates, log-linear in
  // log rate between the two around it and the nearest's outside them; else the profile's one.
  double inter_node_fraction_at(double rate, bool collective) const;
  // Whether a collective across nodes gets another share of some link than a send does.
  bool collective_fraction_differs() const;
  std::optional<MachineInfo> machine;
  std::map<std::string, std::string> libraries;  // e.g. openblas, mpi: name → version string
  std::optional<MeasuredTables> measured;
  std::optional<GemmTiling> gemm_tiling;  // datasheet GPU profiles: GEMM wave quantization
  Variability variability;
  std::string variability_notes;
  // The notes of the other sections ("gemm.bf16", "gemm_tiling", "flash_attention", "memory",
  // "links", "execution"), written back where they were.
  std::map<std::string, std::string> section_notes;
  OverlapInterference overlap;
  std::string overlap_notes;
  // Where the published figures come from: key → citation (repository, path and commit; paper and
  // table; issue and author). Every point's `source` names a key here.
  std::map<std::string, std::string> sources;

  GemmEfficiency gemm_for(Dtype dtype) const;
};

DeviceProfile load_profile(const std::string& path);
DeviceProfile parse_profile(const Json& json, const std::string& file);
// The profile as its file format: parse_profile(profile_to_json(p)) gives p back.
Json profile_to_json(const DeviceProfile& profile);
// The pure roofline: every fraction 1, no fixed costs.
DeviceProfile roofline_profile(const Topology& topology);
// Refuses (InputError) a profile of another device than the topology's, or of a CPU backend
// on a GPU topology (and the reverse); the message names both. `allow_mismatch`
// (--allow-profile-mismatch) lets another device's profile of the same backend kind through.
void check_profile_matches(const DeviceProfile& profile, const Topology& topology,
                           bool allow_mismatch = false);

// The profile a command costs with: `--profile FILE`, `--profile roofline` (the datasheet peaks,
// for what-if studies), or, without --profile, the one the topology names (its "profile" key).
// A topology that names none, or names a file that does not exist, gets the roofline and a
// warning naming what is missing.
struct ProfileChoice {
  DeviceProfile profile;
  std::string argument;  // to hand child processes as --profile: the file, or "roofline"
  std::string origin;    // "--profile", "topology", "roofline" (asked for), "none" (fallback)
  std::string warning;   // for the command to print; empty when none
  // "profiles/a100-sxm4-80gb.json (a100-sxm4-80gb, from the topology)": for summaries
  std::string describe() const;
};
ProfileChoice choose_profile(const std::optional<std::string>& option, const Topology& topology,
                             bool allow_mismatch = false);
// Whether the topology's device is a CPU core ("cpu…" name or shared-memory intra-node fabric).
bool topology_device_is_cpu(const Topology& topology);
// The topology with link bandwidths scaled by the profile's achievable bus fractions, or, where
// the profile measured them, the intra-node bandwidth and latency and the NIC latency replaced by
// its figures: what the simulator's platform is built from. The NICs and fabric links each at its
// rate's fraction (DeviceProfile::inter_node_fraction_at): point-to-point sends' (the platform's),
// or with `collective` a collective's.
Topology apply_link_fractions(const Topology& topology, const DeviceProfile& profile, bool collective = false);
// `base` with the inter-node link measured by `links` (a profile of ranks on several hosts,
// e.g. `stepcast profile --add-links-to`, at links.inter_node_rate_bytes_per_s) added at that
// rate: as base's own figures where base has none (no inter_node_rate_bytes_per_s) or was
// measured at that rate, else in inter_node_at_rates (replacing an entry at that rate).
// measured.fits.inter_node_at_rates keeps links's fits. InputError where `links` has no rate.
DeviceProfile add_inter_node_rate(const DeviceProfile& base, const DeviceProfile& links);
// "field: 'profile value' here 'this value'" for each machine-type field (cpu_model, cores) and
// library version that differs between the profile's record and `here`; empty when they agree
// or the profile records no machine.
std::vector<std::string> machine_differences(const DeviceProfile& profile, const MachineInfo& here,
                                             const std::map<std::string, std::string>& libraries);

// ---- α-β fits of measured transfers ----

// One timed transfer as a linear model in the link's latency α and inverse bandwidth 1/β:
// time_s = latency_terms·α + bytes_terms/β (p2p: 1 and bytes; a ring collective of n members
// and S bytes: steps and steps·S/n, with steps = n−1, or 2(n−1) for all_reduce).
struct LinkSample {
  double latency_terms = 1;
  double bytes_terms = 0;
  double time_s = 0;
};
struct LinkFit {
  double latency_s = 0;
  double bandwidth_bytes_per_s = 0;
  double max_relative_error = 0;  // over the samples
  int64_t samples = 0;
};
// Least squares in relative error (each residual divided by its measured time, so small and
// large messages weigh alike), α ≥ 0. nullopt with fewer than two samples or no positive β.
std::optional<LinkFit> fit_link(const std::vector<LinkSample>& samples);
// The samples of the measured points: p2p as is; ring and tree collectives of `group_size`
// members inside one node by collective.hpp's α-β times (ring: steps as above; tree all_reduce 2⌈log2 n⌉ rounds
// of the whole message).
std::vector<LinkSample> p2p_link_samples(const std::vector<P2pPoint>& points);
std::vector<LinkSample> collective_link_samples(const std::vector<CollectivePoint>& points,
                                                int64_t group_size);

}  // namespace stepcast
