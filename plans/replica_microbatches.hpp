// Unequal microbatches per data-parallel replica (plan microbatches_per_replica): replicas on
// slower devices run fewer microbatches of the step's global batch, so that every replica ends
// its passes at about the same time before the gradient reduction. Every microbatch's loss is
// scaled by the step's tokens, as with equal replicas, so the summed gradient is the same.
#pragma once

#include <cstdint>
#include <vector>

namespace stepcast {

struct Plan;
struct ModelConfig;
class ObjectReader;

// Reads the plan key microbatches_per_replica (a list of counts >= 1) where present, and derives
// an absent global_batch_size from it (their sum · micro_batch_size).
void read_microbatches_per_replica(ObjectReader& reader, Plan& plan);

// Checks plan.microbatches_per_replica against the plan (dp_size entries, each >= 1, summing to
// global_batch_size / micro_batch_size; a multiple of pp_size each under the interleaved
// schedule; ZeRO-0 or 1; no experts) and empties a list whose entries are all equal. Throws
// InputError naming the plan file, the key, the value and what is valid.
void validate_microbatches_per_replica(Plan& plan, const ModelConfig& model);

// The step's microbatch slot of microbatch `microbatch` of replica `dp_rank` (slot s holds the
// step's samples s·micro_batch_size + [0, micro_batch_size)): slots go round the replicas that
// still have a microbatch, so that with equal replicas slot = microbatch · dp_size + dp_rank, as
// before. `per_replica` empty: equal replicas.
int64_t microbatch_slot(const std::vector<int64_t>& per_replica, int64_t dp_size, int64_t dp_rank,
                        int64_t microbatch);

// Microbatch counts split over replicas of speeds `speed` for `total` microbatches in units of
// `unit` (pp_size under the interleaved schedule, else 1): each replica first gets one unit, every
// further unit goes where (microbatches + unit + fill) / speed grows least (fill: the pipeline's
// fill and drain in microbatches' time, (pp_size − 1) / virtual_pp_size), ties to the earlier
// replica; which minimises the largest (microbatches + fill) / speed. Throws InputError when
// total is not a multiple of unit, or is less than a unit per replica, or a speed is not positive.
std::vector<int64_t> speed_balanced_microbatches(int64_t total, int64_t unit, double fill,
                                                 const std::vector<double>& speed);

}  // namespace stepcast
