// `stepcast profile`'s measurements: with every MPI rank busy at once, as in training, each rank
// times the backend's kernels (GEMMs of a linear layer on a grid of shapes, memory-bound kernel
// families over sizes), then collectives by message and group size and point-to-point ping-pong.
// Returns the measured DeviceProfile (profile.hpp) on rank 0; prints nothing (progress goes to a
// callback). Every figure is the median over ranks and repetitions, in seconds and bytes.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend.hpp"
#include "profile.hpp"
#include "topology.hpp"

namespace stepcast {

struct ProfileOptions {
  Dtype dtype = Dtype::fp32;       // fp32 or fp64: the CPU backend's types; bf16: CUDA
  bool quick = false;              // a few points of each table (tests: a few seconds)
  double min_sample_s = 1e-3;      // one sample repeats a call until at least this long
  int repetitions = 5;             // samples per point and rank
  std::function<void(const std::string&)> progress;  // called on rank 0 only
  // CUDA: the topology's device name the profile describes and its dense bf16 peak (the flash
  // attention fractions are of it).
  std::string device_name;
  double peak_flops_per_s = 0;
  // CPU across nodes: the NIC rate of the topology the ranks run on (bytes/s, per direction), of
  // which the inter-node ping-pong's bandwidth is the achievable fraction (links.inter_node_*).
  double nic_bandwidth_bytes_per_s = 0;
  // The NICs one rank drives (the topology's NICs over its devices per node, at least 1: as the
  // simulator's platform stripes a device over them); the fractions are of that many NICs.
  double nics_per_rank = 1;
  // CPU across nodes: only the inter-node link (the ping-pong across nodes and the world's ring
  // all_gather), for `stepcast profile --add-links-to`.
  bool links_only = false;
};

// Collective over MPI_COMM_WORLD (MPI initialised). The profile is complete on rank 0; other
// ranks get the same object without points.
DeviceProfile measure_cpu_profile(const ProfileOptions& options);

// What a backend's profile measures: the GEMM grid (m, n, k each over the axis), the largest
// memory-bound and collective sizes, how collectives are labelled ("ring": the program's ring
// and tree over point-to-point; a GPU backend: "nccl"), and whether MPI's own are measured too.
struct ProfileGrid {
  std::vector<int64_t> gemm_axis, gemm_axis_quick;
  // m, n and k of the GEMMs measured again at reuse distances (the collective reuse pools' sizes,
  // and back to back; MeasuredTables::gemm_reuse); empty: none.
  std::vector<int64_t> gemm_reuse_axis;
  // Flash attention, causal: head dims × sequence lengths at batch·heads attention_b ×
  // attention_heads. A GPU's shapes must fill it (a CPU's small ones are launch-bound there, and
  // the cost model prefers this table to the profile's flash peak fractions).
  std::vector<int64_t> attention_dims = {16, 64}, attention_dims_quick = {16};
  std::vector<int64_t> attention_seqs = {16, 32, 64, 128, 256}, attention_seqs_quick = {32, 128};
  int64_t attention_b = 2, attention_heads = 2;
  // Row lengths of the memory-bound families: hidden size (norms, dropout_add), attention keys
  // (softmax), vocabulary (loss). A GPU's kernels take a block per row, so their rate depends on
  // the row length much more than a CPU's: a GPU profile measures them at GPT-scale rows.
  int64_t memory_hidden = 160, memory_softmax_cols = 80, memory_vocab = 640;
  double memory_max_bytes = 0, collective_max_bytes = 0;
  // Pool sizes per rank (bytes, ascending) at which the program's collectives are measured again
  // with operands last touched that long ago (MeasuredTables::collective_reuse); empty: none.
  std::vector<double> collective_reuse_bytes, collective_reuse_bytes_quick;
  double last_level_cache_bytes = 0;  // where they come from (sysfs; 0: not known)
  int64_t last_level_cache_sharing = 0;
  std::string collective_algorithm = "ring";
  bool mpi_collectives = false;
};
// The CPU backend's grid; its reuse pools from this machine's last-level cache and the ranks per
// node (collective_reuse_pools).
ProfileGrid cpu_profile_grid(int64_t ranks_per_node);
// Pools per rank for the collective reuse points: 4 MiB · 4^i up to twice the rank's share of the
// last-level cache (cache_bytes over min(sharing_cpus, ranks_per_node); clamped to 64 MiB … 1
// GiB; 256 MiB where cache_bytes is 0), then half that and that.
std::vector<double> collective_reuse_pools(double cache_bytes, int64_t sharing_cpus, int64_t ranks_per_node);

// Makes a backend over the grid's groups (collective over MPI_COMM_WORLD); the bool asks for
// MPI's own collectives (CPU only).
template <class T, class G, class W>
using BackendFactory = std::function<std::unique_ptr<Backend<T, G, W>>(const RankGrid&, bool)>;

// The measured tables of one backend (every rank busy at once): GEMMs, memory-bound families,
// collectives and ping-pong with more than one rank. Instantiated for <float>, <double> (CPU) and
// <bf16, float, float> (CUDA).
template <class T, class G, class W>
MeasuredTables measure_tables(const ProfileOptions& options, int rank, int size,
                              int ranks_per_node, const BackendFactory<T, G, W>& factory,
                              const ProfileGrid& grid);

// Where this MPI process sits: ranks in the world and on its node, and how many nodes there are
// (collective over MPI_COMM_WORLD).
struct RankPlacement {
  int rank = 0;
  int size = 1;
  int ranks_per_node = 1;
  int nodes = 1;
};
RankPlacement place_this_rank();

// Applies the α-β fits of the measured points to `profile`: the intra-node link from the
// collectives of `intra_group` ranks in a node (else from the ping-pong), memory bandwidth and
// kernel overhead from every memory-bound kernel (not the staging copy, a plain memcpy far
// faster per byte). Returns the fits as measured.fits records them.
Json apply_measured_fits(DeviceProfile& profile, const MeasuredTables& tables, int64_t intra_group,
                         const std::string& collectives_from, const std::string& p2p_from);

// measured.method of a profile: how it was measured (placement, options, `statistic`, wall time,
// stepcast's version); a backend adds its own keys.
Json profile_method(const RankPlacement& placement, const ProfileOptions& options, const std::string& statistic,
                    double wall_s);

// This host: hostname, /proc/cpuinfo's model name, online logical CPUs.
MachineInfo describe_machine();
// openblas (openblas_get_config) and mpi (MPI_Get_library_version, first line).
std::map<std::string, std::string> library_versions();
// MemTotal of /proc/meminfo, bytes; 0 when unreadable.
double host_memory_bytes();

// The ping-pong's peer of `rank` among `size` ranks in blocks of `stride` (block 2j with block
// 2j+1, rank for rank), or −1 where it sits out. Inside a node (stride 1) every pair at once;
// across nodes (stride = ranks per node) local rank 0's pair alone: β is one flow on an idle link,
// as the topology's NIC is, and ranks sharing a NIC share it in the model, not in this figure (two
// pairs at once on one 100 Mbit/s NIC read 0.487 of it, one alone 0.954).
int ping_pong_peer(int rank, int size, int stride);

// A collective's share of the NIC rate across nodes, from measured ring all_gathers of
// `group_size` ranks, one a node: each rank sends and receives (n−1)/n of the buffer over its NIC
// at once; the marginal rate between the two largest sizes, over `nic_bandwidth_bytes_per_s`
// (clamped to 1e-3 … 1). nullopt with fewer than two such sizes or no rate.
std::optional<double> inter_node_exchange_fraction(const std::vector<CollectivePoint>& points, int64_t group_size,
                                                   double nic_bandwidth_bytes_per_s);

// A topology of this machine from a measured CPU profile: `nodes` nodes of `ranks_per_node`
// devices ("cpu-core"); the dtype's peak = the fastest measured GEMM rate; memory bandwidth = the
// profile's fitted bandwidth; intra-node bandwidth and latency = its link fit; memory =
// `host_memory_bytes` / ranks_per_node. The figures' origins are in its notes (returned JSON).
Json measured_cpu_topology(const DeviceProfile& profile, int nodes, int ranks_per_node,
                           double host_memory_bytes);

}  // namespace stepcast
