// The memory model. Per rank, it is the walk over the role's alloc/free ops in program order:
// memory_<class>_bytes are the bytes of each class live at the rank's peak instant; then
// memory_placement_bytes, what the arena the executors place those buffers in (arena_plan.hpp)
// takes beyond that live peak (alignment, and gaps no layout packed); and the topology's runtime
// allowance (CUDA context, library workspaces, NCCL/MPI buffers) as memory_runtime_bytes. One
// computation: the numbers that predict memory are the allocations the executor makes.
// fits ⇔ peak_bytes_max + reserved_bytes ≤ capacity_bytes. The planner's search screens on the
// walk alone (walk_role_memory: its stages' peaks come from shortened programs, whose placement
// differs), so its peaks are lower than this report's by the placement.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "json_input.hpp"
#include "program.hpp"
#include "topology.hpp"

namespace stepcast {

// ZeRO's model-state bytes for Ψ parameters over dp ranks (Rajbhandari et al. §3.1, §5):
// weights in param_dtype, gradients in grad_dtype, optimizer = Adam's two moments plus an fp32
// master copy when weights are 16-bit (K = 12 with bf16/fp16 weights). Stage 1 shards the
// optimizer, 2 also gradients, 3 also weights.
struct ModelStateBytes {
  double weights = 0;
  double grads = 0;
  double optimizer = 0;
  double total() const { return weights + grads + optimizer; }
};
ModelStateBytes zero_model_state_bytes(double parameters, int zero_stage, int64_t dp_size,
                                       Dtype param_dtype, Dtype grad_dtype);

struct RankMemory {
  std::vector<std::pair<int64_t, int64_t>> ranks;  // inclusive ranges of ranks alike
  int64_t stage = 0;
  double weights_bytes = 0;
  double grads_bytes = 0;
  double optimizer_bytes = 0;
  double activations_bytes = 0;
  double workspace_bytes = 0;
  double comm_bytes = 0;
  double placement_bytes = 0;  // the arena's extent over the live peak (memory_report only)
  double runtime_bytes = 0;
  double peak_bytes = 0;
  int32_t peak_op = -1;  // id of the op after which the peak is reached
};

struct MemoryReport {
  std::vector<RankMemory> ranks;  // one entry per role
  double peak_bytes_max = 0;
  double reserved_bytes = 0;
  double capacity_bytes = 0;
  bool fits = false;
};

// Walks one role's ops; returns the class bytes at the live peak (placement and runtime not
// included).
RankMemory walk_role_memory(const Role& role);
MemoryReport memory_report(const StepProgram& program, const Topology& topology);
Json memory_to_json(const MemoryReport& report);

}  // namespace stepcast
