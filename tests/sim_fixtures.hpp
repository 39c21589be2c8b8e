// Hand-built StepPrograms and topologies for the simulator's closed-form tests.
#pragma once

#include <string>
#include <vector>

#include "json_input.hpp"
#include "profile.hpp"
#include "program.hpp"
#include "schedule.hpp"
#include "topology.hpp"

namespace stepcast::test {

// A topology JSON with `nodes` × `per_node` devices: NVSwitch-like intra-node links of
// `intra_bw` with `intra_latency`, `nics` NICs per node of `nic_bw`, fat tree.
inline Json star_topology_json(int nodes, int per_node, double intra_bw, double intra_latency,
                               int nics, double nic_bw, double nic_latency,
                               double oversubscription = 1.0, double switch_latency = 0) {
  return {{"name", "test-star"},
          {"num_nodes", nodes},
          {"node",
           {{"devices_per_node", per_node},
            {"device",
             {{"name", "test-device"},
              {"peak_flops_per_s", {{"fp32", 1e12}, {"bf16", 1e12}}},
              {"memory_bytes", 1e12},
              {"memory_bandwidth_bytes_per_s", 1e12},
              {"runtime_allowance_bytes", 0},
              {"memory_reserved_bytes", 0}}},
            {"intra_node",
             {{"kind", "nvswitch"}, {"bandwidth_bytes_per_s", intra_bw}, {"latency_s", intra_latency}}}}},
          {"fabric",
           {{"kind", "fat_tree"},
            {"nics_per_node", nics},
            {"nic_bandwidth_bytes_per_s", nic_bw},
            {"nic_latency_s", nic_latency},
            {"switch_latency_s", switch_latency},
            {"oversubscription", oversubscription},
            {"switch_radix", 64}}}};
}

inline Topology parse_test_topology(const Json& j) { return parse_topology(j, "test-topology.json"); }

// An empty program on a tp × dp × pp grid with one role per stage.
inline StepProgram empty_program(int64_t tp, int64_t dp, int64_t pp, int64_t per_node,
                                 int64_t microbatches = 1) {
  StepProgram p;
  p.tp_size = tp;
  p.dp_size = dp;
  p.pp_size = pp;
  p.devices_per_node = per_node;
  p.num_microbatches = microbatches;
  p.tokens_per_step = 1;
  p.plan = {{"param_dtype", "fp32"}};
  p.roles.resize(pp);
  for (int64_t s = 0; s < pp; ++s) {
    p.roles[s].index = int32_t(s);
    p.roles[s].pp_stage = s;
    p.roles[s].chunks_virtual_stages = {s};
  }
  return p;
}

inline int32_t push_op(Role& role, Op op) {
  op.id = int32_t(role.ops.size());
  role.ops.push_back(std::move(op));
  return role.ops.back().id;
}

inline Op collective_op(OpKind kind, GroupKind group, Algorithm algorithm, double bytes,
                        Stream stream, std::vector<int32_t> deps = {}) {
  Op op;
  op.kind = kind;
  op.group = group;
  op.algorithm = algorithm;
  op.bytes = bytes;
  op.stream = stream;
  op.deps = std::move(deps);
  return op;
}

// A compute op lasting `seconds` under the roofline on the test device (fp32 vector peak 1e12).
inline Op compute_op(double seconds, std::vector<int32_t> deps = {}) {
  Op op;
  op.kind = OpKind::activation;
  op.flops = seconds * 1e12;
  op.deps = std::move(deps);
  return op;
}

// A measured profile (not the roofline) on `t` that runs in order, as a CPU's: fp32 GEMMs at the
// roofline's figures and `tables`, fp32, as its measured tables. What the in-order tests of
// operand reuse cost with.
inline DeviceProfile in_order_measured_profile(const Topology& t, const std::string& name, MeasuredTables tables) {
  DeviceProfile p = roofline_profile(t);
  p.is_roofline = false;
  p.name = name;
  p.gemm[Dtype::fp32] = GemmEfficiency{};
  p.execution_in_order = true;
  tables.dtype = Dtype::fp32;
  p.measured = std::move(tables);
  return p;
}

}  // namespace stepcast::test
