// Pipeline schedules as pure functions: the ordered list of forward and backward passes one
// pipeline stage performs in a step. Megatron's conventions: microbatches 0..m-1, model chunks
// (virtual stages) 0..v-1 on each stage; stage p's chunk c is virtual stage c·pp_size + p.
// The lowering turns these actions into ops; nothing here knows about ops, time or memory.
#pragma once

#include <cstdint>
#include <vector>

namespace stepcast {

// Serialised as "gpipe", "1f1b", "interleaved_1f1b" (to_string lives in plan.hpp).
enum class ScheduleKind { gpipe, one_f_one_b, interleaved_1f1b };

struct PassAction {
  bool forward = true;   // false: backward
  int64_t microbatch = 0;
  int64_t chunk = 0;     // model chunk on this stage, 0..virtual_pp_size-1
  bool operator==(const PassAction&) const = default;
};

struct ScheduleShape {
  int64_t pp_size = 1;
  int64_t virtual_pp_size = 1;
  int64_t num_microbatches = 1;
};

// Actions of pipeline stage `stage` in execution order: warm-up forwards, then steady state
// (one forward, then one backward), then cool-down backwards. gpipe: all forwards, then all
// backwards (microbatches in the same order); 1f1b: Megatron's schedule without interleaving;
// interleaved_1f1b: Megatron's classic interleaved schedule, where the k-th forward runs chunk
// (k/pp) % v on microbatch (k/(pp·v))·pp + k % pp and the k-th backward the same microbatch on
// chunk v-1-(k/pp) % v. Every stage runs its forwards (and its backwards) in the same order.
// Throws InputError for sizes < 1, a stage outside [0, pp_size), virtual_pp_size > 1
// without interleaved_1f1b, or interleaved_1f1b with num_microbatches % pp_size != 0 (plans
// are checked by validate_plan first).
std::vector<PassAction> schedule_actions(ScheduleKind kind, const ScheduleShape& shape,
                                         int64_t stage);

// The k-th forward (forward true) or backward pass of a stage under interleaved_1f1b (no checks).
PassAction interleaved_action(const ScheduleShape& shape, int64_t k, bool forward);

// Number of warm-up forward passes Megatron runs on `stage` before its first backward:
// gpipe m; 1f1b min(pp-stage-1, m); interleaved min(2·(pp-stage-1) + (v-1)·pp, m·v), or all
// m·v when m == pp (Megatron then runs every forward first). With v = 1 the interleaved
// schedule keeps its own formula, so it warms up twice as deep as 1f1b.
int64_t warmup_forwards(ScheduleKind kind, const ScheduleShape& shape, int64_t stage);

// Largest number of (microbatch, chunk) forward passes whose backward has not yet run,
// at any point of the stage's action list: the activation sets held at once.
int64_t max_in_flight(const std::vector<PassAction>& actions);

// Bubble fraction of a schedule under uniform costs (forward = backward = 1 slot per chunk):
// gpipe and 1f1b (p-1)/(m+p-1); interleaved (p-1)/(v·m+p-1).
double ideal_bubble_fraction(ScheduleKind kind, const ScheduleShape& shape);

// Which dp rank and microbatch sample `sample_index` (0..global_batch_size-1) of a step belongs to,
// and the inverse. Global index of sample s of step k is k·global_batch_size + s. Within a step,
// microbatch j of dp rank d holds samples (j·dp_size + d)·micro_batch_size + [0, micro_batch_size).
struct SampleSlot {
  int64_t dp_rank = 0;
  int64_t microbatch = 0;
  int64_t offset = 0;  // position inside the microbatch
};
SampleSlot sample_slot(int64_t sample_index, int64_t micro_batch_size, int64_t dp_size);
int64_t global_sample_index(int64_t step, int64_t global_batch_size, const SampleSlot& slot,
                            int64_t micro_batch_size, int64_t dp_size);

// Layers per virtual stage, in virtual-stage order 0..S-1 (S = pp_size·virtual_pp_size; chunk c
// of stage p is virtual stage c·pp_size + p). When L % S != 0, every virtual stage gets ceil(L/S)
// and the surplus is taken one layer at a time from the first, last, second, second-to-last...
// virtual stages (Llama 3: 126 layers on 16 stages → first and last hold 7, the rest 8).
// Throws InputError when L < S (a virtual stage would be empty).
std::vector<int64_t> default_layers_per_stage(int64_t num_layers, int64_t num_virtual_stages);

// Layers per virtual stage for pipeline stages of unequal speed (plan --heterogeneous):
// stage_speed[p] is stage p's compute speed (its slowest device's factor). Each stage first
// gets one layer per chunk; every further layer goes to the stage whose time would grow least,
// the smallest (layers + 1) / speed (ties to the earlier stage), which minimises the largest
// layers / speed; a stage's layers are then split over its virtual_pp_size chunks as evenly
// as they go, the earlier chunks taking the remainder. Throws InputError when num_layers <
// pp_size · virtual_pp_size or a speed is not positive.
std::vector<int64_t> speed_balanced_layers_per_stage(int64_t num_layers, int64_t virtual_pp_size,
                                                     const std::vector<double>& stage_speed);

}  // namespace stepcast
