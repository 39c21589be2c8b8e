// The cluster a plan runs on: a node type (devices, their peak rates and memory, the intra-node
// fabric) repeated num_nodes times, joined by an inter-node fabric. SI units in every name
// (bytes, seconds, flop/s). Pure data plus its loader; the SimGrid platform is built in sim/.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "heterogeneity.hpp"
#include "json_input.hpp"

namespace stepcast {

// Number formats of compute (fp64 … fp8) and, for a program's data buffers only, of the token
// ids and sample indices a step reads (int32, int64).
// fp8 names the FP8 tensor-core rate (peaks, profile tables); a buffer of FP8 values is fp8_e4m3
// or fp8_e5m2 (Transformer Engine's formats), or block-scaled, the same codes with their blocks'
// scales (fp8.hpp; dtype_bytes counts the codes): mxfp8_e4m3 / mxfp8_e5m2 (an E8M0 scale per 32),
// fp8_block_e4m3 / fp8_block_e5m2 (an fp32 scale per 128 along a row or down a column),
// fp8_tile_e4m3 (an fp32 scale per 128×128 tile); u8 is a one-byte mask.
enum class Dtype : uint8_t {
  fp64, fp32, tf32, bf16, fp16, fp8, int32, int64, u8, fp8_e4m3, fp8_e5m2, mxfp8_e4m3, mxfp8_e5m2,
  fp8_block_e4m3, fp8_block_e5m2, fp8_tile_e4m3
};
const char* to_string(Dtype dtype);
// Bytes per element; tf32 is stored as 4 bytes.
int dtype_bytes(Dtype dtype);
// Parses a compute dtype, "bf16", ...; nullopt for anything else (the integer ones included).
std::optional<Dtype> parse_dtype(const std::string& name);
// Parses the dtype of a program buffer: a compute dtype, int32 / int64, u8, fp8_e4m3 / fp8_e5m2.
std::optional<Dtype> parse_buffer_dtype(const std::string& name);
// fp8_e4m3 and fp8_e5m2, and their block-scaled buffers (fp8.hpp).
bool is_fp8_storage(Dtype dtype);
bool is_mx_storage(Dtype dtype);
bool is_block_scaled(Dtype dtype);  // MX, blockwise vector or tile
// The bytes of a buffer of `elements` (a block-scaled buffer's codes and their scales: fp8.hpp's
// block_bytes).
double storage_bytes(Dtype dtype, double elements);

struct DeviceSpec {
  std::string name;                               // e.g. "A100-SXM4-80GB"
  std::map<Dtype, double> peak_flops_per_s;       // dense matrix peak per dtype
  double memory_bytes = 0;                        // capacity visible to programs
  double memory_bandwidth_bytes_per_s = 0;
  double runtime_allowance_bytes = 0;             // CUDA context, library workspaces, NCCL/MPI buffers
  double memory_reserved_bytes = 0;               // held back for allocator fragmentation
  // Board power (optional: all three keys or none; only simulate's energy reads them): busy
  // while it computes, idle otherwise (communication and waiting included), and where the
  // figures come from. Not part of a program (topology_to_json leaves them out).
  double power_idle_w = 0, power_busy_w = 0;
  std::string power_source;
  // FP8 GEMMs read some operands column-wise (the weight in dgrad, input and output gradient in
  // wgrad). Hopper (and Ada) tensor cores cannot, so Transformer Engine keeps a physically
  // transposed FP8 copy beside the row-wise one; Blackwell reads column-wise natively (TE docs,
  // "Performance Considerations: Handling transposes"). Key "fp8_columnwise": "transposed" or
  // "native" (optional, default native): with transposed, FP8 plans keep each layer's transposed
  // FP8 weight copy as TE caches it (module/linear.py: the weight quantizer's columnwise usage
  // when its input requires grad, the workspace cached across microbatches).
  bool fp8_transposed_copies = false;
  // Tensor cores that take MX block-scaled FP8 operands (an E8M0 scale per 32 elements: Blackwell's
  // fifth-generation tensor cores; Hopper's take one scale per tensor). Key "mxfp8" (optional,
  // default false); a plan's fp8_recipe "mxfp8" needs it.
  bool mxfp8 = false;
  // GEMMs on blockwise-scaled FP8 operands (an fp32 scale per 128 elements or per 128×128 tile:
  // Transformer Engine's Float8BlockScaling, from compute capability 9.0, Hopper). Key
  // "fp8_blockwise" (optional, default false); a plan's fp8_recipe "blockwise" needs it.
  bool fp8_blockwise = false;
  bool has_power() const { return power_busy_w > 0; }
  // Peak for `dtype`; throws InputError naming the topology file when the device lacks it.
  double peak_for(Dtype dtype, const std::string& topology_file) const;
};

enum class IntraNodeKind { nvswitch, nvlink, pcie, shared_memory };
const char* to_string(IntraNodeKind kind);

struct IntraNodeFabric {
  IntraNodeKind kind = IntraNodeKind::nvswitch;
  double bandwidth_bytes_per_s = 0;  // per device, per direction
  double latency_s = 0;              // one hop device → switch → device
};

struct NodeSpec {
  int devices_per_node = 0;
  DeviceSpec device;
  IntraNodeFabric intra_node;
};

// fat_tree and rail_optimized: switch trees (leaves of switch_radix / 2 NICs under a spine);
// dragonfly: groups of routers joined all-to-all inside a group and by global links between
// groups (Slingshot, Aries); torus: one router per node on a 2-D or 3-D torus with wraparound
// links and dimension-order routing (TPU pods). sim/platform.cpp draws each.
enum class FabricKind { fat_tree, rail_optimized, dragonfly, torus };
const char* to_string(FabricKind kind);
// fat_tree and rail_optimized: the kinds with switch_radix and oversubscription.
bool is_switch_tree(FabricKind kind);

// Node n sits on router n / nodes_per_router; router r is router r % routers_per_group of group
// r / routers_per_group. groups · routers_per_group · nodes_per_router = num_nodes.
struct DragonflyFabric {
  int groups = 0;
  int routers_per_group = 0;
  int nodes_per_router = 0;
  double local_link_bandwidth_bytes_per_s = 0;   // between two routers of a group, per direction
  double local_link_latency_s = 0;               // cable; each router entered adds switch_latency
  double global_link_bandwidth_bytes_per_s = 0;  // between two groups (all their cables), per direction
  double global_link_latency_s = 0;
};

// Node n has coordinates x = n % d0, y = (n / d0) % d1, z = n / (d0·d1); the product of the
// dimensions is num_nodes. Each node's router links to its two neighbours in every dimension.
struct TorusFabric {
  std::vector<int> dimensions;            // 2 or 3 ring sizes, each >= 1
  double link_bandwidth_bytes_per_s = 0;  // one link between neighbours, per direction
  double link_latency_s = 0;              // one hop: router and cable
};

struct InterNodeFabric {
  FabricKind kind = FabricKind::fat_tree;
  int nics_per_node = 0;
  double nic_bandwidth_bytes_per_s = 0;  // per NIC, per direction
  double nic_latency_s = 0;              // NIC + cable, one end
  double switch_latency_s = 0;           // per switch (tree) or router (dragonfly) traversed; 0 for torus
  double oversubscription = 1.0;         // downlink:uplink bandwidth at the leaf, >= 1 (trees; 1 otherwise)
  int switch_radix = 0;                  // ports per switch; sets the number of tree levels (trees; 0 otherwise)
  DragonflyFabric dragonfly;             // kind dragonfly only
  TorusFabric torus;                     // kind torus only
};

// Where checkpoints go (optional key "storage"; only `stepcast goodput` reads it): the file
// system's bandwidth seen from one node, and optionally its aggregate limit over all nodes
// (0: none); a device's copy to host memory, for asynchronous saves (0: not given). Not part of
// a program: a training step does not depend on it, so topology_to_json leaves it out (as notes).
struct StorageSpec {
  double node_write_bandwidth_bytes_per_s = 0;
  double node_read_bandwidth_bytes_per_s = 0;
  double aggregate_write_bandwidth_bytes_per_s = 0;
  double aggregate_read_bandwidth_bytes_per_s = 0;
  double device_to_host_bandwidth_bytes_per_s = 0;
  std::string source;  // where the figures come from, for people and goodput.json
};

struct Topology {
  std::string name;
  std::string file;    // where it was loaded from (for messages)
  // The device profile the topology names ("profile": a path relative to the topology file's
  // folder), used when a command gets no --profile; profile_file is that path resolved. Both
  // empty when the topology names none. Not part of a program: the program does not depend on
  // which profile costs it.
  std::string profile;
  std::string profile_file;
  int num_nodes = 0;
  NodeSpec node;
  InterNodeFabric fabric;
  std::optional<StorageSpec> storage;
  Heterogeneity heterogeneity;  // empty: every device and link as node describes

  int64_t num_devices() const { return int64_t(num_nodes) * node.devices_per_node; }
};

// Loads and validates a topology file; `nodes_override` (from --nodes) replaces num_nodes.
Topology load_topology(const std::string& path, std::optional<int> nodes_override = std::nullopt);
Topology parse_topology(const Json& json, const std::string& file,
                        std::optional<int> nodes_override = std::nullopt);
// The fully resolved topology as JSON (same keys as the input format).
Json topology_to_json(const Topology& topology);

}  // namespace stepcast
