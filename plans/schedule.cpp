// Pipeline schedules as action lists, following Megatron's schedules.py (the classic
// forward_backward_pipelining_{without,with}_interleaving), plus the sample → (dp rank,
// microbatch) mapping and the default layer split. Counts only: no time, memory or ops.
#include "schedule.hpp"

#include <algorithm>
#include <string>

#include "errors.hpp"

namespace stepcast {

namespace {

std::string describe(const ScheduleShape& shape) {
  return "pp_size " + std::to_string(shape.pp_size) + ", virtual_pp_size " +
         std::to_string(shape.virtual_pp_size) + ", num_microbatches " +
         std::to_string(shape.num_microbatches);
}

void check_shape(ScheduleKind kind, const ScheduleShape& shape, int64_t stage) {
  if (shape.pp_size < 1 || shape.virtual_pp_size < 1 || shape.num_microbatches < 1) {
    throw InputError("schedule shape (" + describe(shape) +
                                "): every size must be >= 1");
  }
  if (stage < 0 || stage >= shape.pp_size) {
    throw InputError("pipeline stage " + std::to_string(stage) + " outside [0, " +
                                std::to_string(shape.pp_size) + ")");
  }
  if (kind != ScheduleKind::interleaved_1f1b && shape.virtual_pp_size != 1) {
    throw InputError("schedule shape (" + describe(shape) +
                                "): virtual_pp_size > 1 needs the interleaved_1f1b schedule");
  }
  if (kind == ScheduleKind::interleaved_1f1b && shape.num_microbatches % shape.pp_size != 0) {
    throw InputError("schedule shape (" + describe(shape) +
                                "): interleaved_1f1b needs num_microbatches divisible by pp_size");
  }
}

}  // namespace

// Megatron's interleaved numbering: the k-th forward (or backward) pass of a stage runs chunk
// (k / pp) % v — reversed for backward — on the next microbatch of that chunk, so pp consecutive
// microbatches go through one chunk before the stage moves to the next chunk.
PassAction interleaved_action(const ScheduleShape& shape, int64_t k, bool forward) {
  const int64_t pp = shape.pp_size, v = shape.virtual_pp_size;
  int64_t chunk = (k / pp) % v;
  if (!forward) chunk = v - 1 - chunk;
  return PassAction{forward, (k / (pp * v)) * pp + k % pp, chunk};
}

int64_t warmup_forwards(ScheduleKind kind, const ScheduleShape& shape, int64_t stage) {
  check_shape(kind, shape, stage);
  const int64_t pp = shape.pp_size, m = shape.num_microbatches;
  switch (kind) {
    case ScheduleKind::gpipe:
      return m;
    case ScheduleKind::one_f_one_b:
      return std::min(pp - stage - 1, m);
    case ScheduleKind::interleaved_1f1b: {
      const int64_t total = m * shape.virtual_pp_size;
      // With exactly pp microbatches Megatron runs every forward before any backward.
      if (m == pp) return total;
      return std::min((pp - stage - 1) * 2 + (shape.virtual_pp_size - 1) * pp, total);
    }
  }
  return 0;
}

std::vector<PassAction> schedule_actions(ScheduleKind kind, const ScheduleShape& shape,
                                         int64_t stage) {
  const int64_t warmup = warmup_forwards(kind, shape, stage);  // checks the shape
  const int64_t total = shape.num_microbatches * shape.virtual_pp_size;  // passes each way
  auto pass = [&](int64_t k, bool forward) {
    if (kind == ScheduleKind::interleaved_1f1b) return interleaved_action(shape, k, forward);
    return PassAction{forward, k, 0};
  };
  std::vector<PassAction> actions;
  actions.reserve(2 * total);
  for (int64_t k = 0; k < warmup; ++k) actions.push_back(pass(k, true));
  const int64_t remaining = total - warmup;  // steady state: one forward, then one backward
  for (int64_t k = 0; k < remaining; ++k) {
    actions.push_back(pass(warmup + k, true));
    actions.push_back(pass(k, false));
  }
  for (int64_t k = remaining; k < total; ++k) actions.push_back(pass(k, false));  // cool-down
  return actions;
}

int64_t max_in_flight(const std::vector<PassAction>& actions) {
  int64_t in_flight = 0, peak = 0;
  for (const PassAction& a : actions) {
    in_flight += a.forward ? 1 : -1;
    peak = std::max(peak, in_flight);
  }
  return peak;
}

double ideal_bubble_fraction(ScheduleKind kind, const ScheduleShape& shape) {
  const double p = static_cast<double>(shape.pp_size);
  const double m = static_cast<double>(shape.num_microbatches);
  const double v = kind == ScheduleKind::interleaved_1f1b
                       ? static_cast<double>(shape.virtual_pp_size)
                       : 1.0;
  return (p - 1) / (v * m + p - 1);
}

SampleSlot sample_slot(int64_t sample_index, int64_t micro_batch_size, int64_t dp_size) {
  if (sample_index < 0 || micro_batch_size < 1 || dp_size < 1) {
    throw InputError("sample_slot: sample_index " + std::to_string(sample_index) +
                                ", micro_batch_size " + std::to_string(micro_batch_size) +
                                ", dp_size " + std::to_string(dp_size) +
                                ": index must be >= 0 and sizes >= 1");
  }
  const int64_t slot = sample_index / micro_batch_size;  // j·dp_size + d
  return SampleSlot{slot % dp_size, slot / dp_size, sample_index % micro_batch_size};
}

int64_t global_sample_index(int64_t step, int64_t global_batch_size, const SampleSlot& slot,
                            int64_t micro_batch_size, int64_t dp_size) {
  return step * global_batch_size + (slot.microbatch * dp_size + slot.dp_rank) * micro_batch_size +
         slot.offset;
}

std::vector<int64_t> default_layers_per_stage(int64_t num_layers, int64_t num_virtual_stages) {
  const int64_t S = num_virtual_stages, L = num_layers;
  if (S < 1 || L < S) {
    throw InputError("default_layers_per_stage: num_layers " + std::to_string(L) +
                                " on " + std::to_string(S) +
                                " virtual stages; valid: num_layers >= virtual stages >= 1");
  }
  std::vector<int64_t> layers(S, (L + S - 1) / S);
  int64_t surplus = layers[0] * S - L;  // < S, so each virtual stage loses at most one layer
  for (int64_t i = 0; surplus > 0; ++i, --surplus) {
    // first, last, second, second-to-last, ...
    const int64_t index = i % 2 == 0 ? i / 2 : S - 1 - i / 2;
    --layers[index];
  }
  return layers;
}

std::vector<int64_t> speed_balanced_layers_per_stage(int64_t num_layers, int64_t virtual_pp_size,
                                                     const std::vector<double>& stage_speed) {
  const int64_t pp = int64_t(stage_speed.size()), v = virtual_pp_size;
  if (pp < 1 || v < 1 || num_layers < pp * v) {
    throw InputError("speed_balanced_layers_per_stage: num_layers " + std::to_string(num_layers) + " on " +
                     std::to_string(pp) + " stages of " + std::to_string(v) +
                     " chunks; valid: num_layers >= stages x chunks >= 1");
  }
  for (double s : stage_speed) {
    if (!(s > 0)) throw InputError("speed_balanced_layers_per_stage: a stage speed of " + std::to_string(s) +
                                   "; valid: > 0");
  }
  std::vector<int64_t> per_stage(size_t(pp), v);
  for (int64_t left = num_layers - pp * v; left > 0; --left) {
    size_t best = 0;
    for (size_t p = 1; p < per_stage.size(); ++p) {
      if (double(per_stage[p] + 1) / stage_speed[p] < double(per_stage[best] + 1) / stage_speed[best]) best = p;
    }
    ++per_stage[best];
  }
  std::vector<int64_t> layers(size_t(pp * v));
  for (int64_t p = 0; p < pp; ++p) {
    for (int64_t c = 0; c < v; ++c) layers[size_t(c * pp + p)] = per_stage[size_t(p)] / v + (c < per_stage[size_t(p)] % v);
  }
  return layers;
}

}  // namespace stepcast
