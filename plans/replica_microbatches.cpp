// Unequal microbatches per data-parallel replica; see replica_microbatches.hpp.
#include "replica_microbatches.hpp"

#include <algorithm>
#include <limits>
#include <numeric>
#include <string>

#include "errors.hpp"
#include "json_input.hpp"
#include "plan.hpp"

namespace stepcast {

namespace {

std::string list_text(const std::vector<int64_t>& list) {
  std::string out = "[";
  for (size_t i = 0; i < list.size(); ++i) out += (i ? ", " : "") + std::to_string(list[i]);
  return out + "]";
}

}  // namespace

int64_t Plan::num_microbatches() const {
  if (unequal_microbatches()) {
    return *std::max_element(microbatches_per_replica.begin(), microbatches_per_replica.end());
  }
  return global_batch_size / (micro_batch_size * dp_size);
}

int64_t Plan::microbatches_of_replica(int64_t dp_rank) const {
  if (unequal_microbatches()) return microbatches_per_replica.at(size_t(dp_rank));
  return global_batch_size / (micro_batch_size * dp_size);
}

void read_microbatches_per_replica(ObjectReader& reader, Plan& plan) {
  const std::string key = "microbatches_per_replica";
  if (!reader.has(key)) return;
  plan.microbatches_per_replica = reader.get_int_list(key, 1);
  const int64_t limit = std::numeric_limits<int64_t>::max() / std::max<int64_t>(1, plan.micro_batch_size);
  int64_t total = 0;
  for (int64_t m : plan.microbatches_per_replica) {
    if (m > limit - total) reader.fail(key, "its samples overflow 64-bit integers", "smaller counts");
    total += m;
  }
  if (plan.microbatches_per_replica.empty()) {
    reader.fail(key, "is empty", "one count >= 1 per data-parallel replica, or no key for equal replicas");
  }
  if (plan.global_batch_size_derived) plan.global_batch_size = total * plan.micro_batch_size;
  plan.global_batch_size_derived = false;  // dp_size resolved later does not change it
}

void validate_microbatches_per_replica(Plan& plan, const ModelConfig& model) {
  std::vector<int64_t>& list = plan.microbatches_per_replica;
  if (list.empty()) return;
  const std::string key = "microbatches_per_replica";
  auto fail = [&](const std::string& why, const std::string& valid) {
    throw_input_error(plan.file, key, list_text(list), why, valid);
  };
  if (int64_t(list.size()) != plan.dp_size) {
    fail("has " + std::to_string(list.size()) + " entries for dp_size = " + std::to_string(plan.dp_size) +
             " replicas",
         "one count per data-parallel replica (" + std::to_string(plan.dp_size) + " entries)");
  }
  int64_t total = 0;
  for (int64_t m : list) total += m;  // each >= 1 and the plan's batch bounded: no overflow
  if (total * plan.micro_batch_size != plan.global_batch_size) {
    fail("sums to " + std::to_string(total) + " microbatches of micro_batch_size = " +
             std::to_string(plan.micro_batch_size) + ", " + std::to_string(total * plan.micro_batch_size) +
             " samples, not global_batch_size = " + std::to_string(plan.global_batch_size),
         "counts summing to global_batch_size / micro_batch_size" +
             (plan.global_batch_size % plan.micro_batch_size == 0
                  ? " = " + std::to_string(plan.global_batch_size / plan.micro_batch_size)
                  : std::string()) +
             " (or no global_batch_size: it is then their sum · micro_batch_size)");
  }
  if (std::all_of(list.begin(), list.end(), [&](int64_t m) { return m == list.front(); })) {
    list.clear();  // the equal plan
    return;
  }
  if (plan.schedule == ScheduleKind::interleaved_1f1b) {
    for (int64_t m : list) {
      if (m % plan.pp_size != 0) {
        fail("has " + std::to_string(m) + " microbatches on a replica, which the interleaved schedule needs to "
             "be a multiple of pp_size = " + std::to_string(plan.pp_size),
             "multiples of " + std::to_string(plan.pp_size));
      }
    }
  }
  if (plan.zero_stage >= 2) {
    fail("with zero_stage " + std::to_string(plan.zero_stage) +
             " is not supported (ZeRO-2/3 reduce or gather over the data-parallel group every microbatch, "
             "so every replica must run as many)",
         "zero_stage 0 or 1 with unequal replicas, or equal replicas");
  }
  if (model.is_moe()) {
    fail("with a mixture of experts is not supported (the expert all-to-alls of a microbatch span "
         "data-parallel replicas, so every replica must run as many)",
         "no microbatches_per_replica with " + model.file);
  }
}

int64_t microbatch_slot(const std::vector<int64_t>& per_replica, int64_t dp_size, int64_t dp_rank,
                        int64_t microbatch) {
  if (per_replica.empty()) return microbatch * dp_size + dp_rank;
  int64_t slot = 0;
  for (int64_t q = 0; q < int64_t(per_replica.size()); ++q) {
    slot += std::min(per_replica[size_t(q)], microbatch);   // rounds before this one
    if (q < dp_rank && per_replica[size_t(q)] > microbatch) ++slot;  // earlier replicas in this round
  }
  return slot;
}

std::vector<int64_t> speed_balanced_microbatches(int64_t total, int64_t unit, double fill,
                                                 const std::vector<double>& speed) {
  const int64_t n = int64_t(speed.size());
  if (unit < 1 || n < 1 || total % unit != 0 || total < unit * n) {
    throw InputError("speed_balanced_microbatches: " + std::to_string(total) + " microbatches in units of " +
                     std::to_string(unit) + " over " + std::to_string(n) +
                     " replicas; valid: a multiple of the unit, at least one unit per replica");
  }
  for (double s : speed) {
    if (!(s > 0)) throw InputError("speed_balanced_microbatches: a replica's speed is not positive");
  }
  std::vector<int64_t> out(size_t(n), unit);
  for (int64_t left = total - unit * n; left > 0; left -= unit) {
    size_t best = 0;
    double best_time = 0;
    for (size_t r = 0; r < size_t(n); ++r) {
      const double time = (double(out[r] + unit) + fill) / speed[r];
      if (r == 0 || time < best_time) {
        best = r;
        best_time = time;
      }
    }
    out[best] += unit;
  }
  return out;
}

}  // namespace stepcast
