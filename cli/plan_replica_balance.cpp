// plan --heterogeneous for data-parallel replicas; see plan_replica_balance.hpp.
#include "plan_replica_balance.hpp"

#include <algorithm>
#include <iostream>
#include <map>

#include "errors.hpp"
#include "plan_heterogeneous.hpp"
#include "planner_common.hpp"
#include "quick_estimate.hpp"
#include "replica_microbatches.hpp"
#include "units.hpp"

namespace stepcast::cli {

namespace {

constexpr const char* kSuffix = "-hm";

bool made_by_search(const std::string& name) {
  return name.size() > 3 && name.compare(name.size() - 3, 3, kSuffix) == 0;
}

}  // namespace

std::vector<int64_t> replica_balanced_microbatches(const Plan& plan, const ModelConfig& model,
                                                   const Topology& topology) {
  if (plan.dp_size < 2 || plan.zero_stage >= 2 || model.is_moe() || plan.unequal_microbatches()) return {};
  const std::vector<double> speed = replica_speeds(plan, topology);
  if (speed.empty() || std::all_of(speed.begin(), speed.end(), [&](double s) { return s == speed.front(); })) {
    return {};
  }
  const int64_t total = plan.global_batch_size / plan.micro_batch_size;
  const int64_t unit = plan.schedule == ScheduleKind::interleaved_1f1b ? plan.pp_size : 1;
  const double fill = double(plan.pp_size - 1) / double(plan.virtual_pp_size);
  std::vector<int64_t> split = speed_balanced_microbatches(total, unit, fill, speed);
  if (std::all_of(split.begin(), split.end(), [&](int64_t m) { return m == split.front(); })) return {};
  return split;
}

void add_replica_balanced_candidates(std::vector<Candidate>& candidates, const ModelConfig& model,
                                     const Topology& topology) {
  const size_t count = candidates.size();
  for (size_t i = 0; i < count; ++i) {
    const Candidate& c = candidates[i];
    if (!c.kept()) continue;
    std::vector<int64_t> split = replica_balanced_microbatches(c.plan, model, topology);
    if (split.empty()) continue;
    Candidate balanced = c;
    balanced.plan.microbatches_per_replica = split;
    balanced.plan.name += kSuffix;
    try {
      validate_plan(balanced.plan, model, topology);
    } catch (const InputError&) {
      continue;  // a split validation refuses is not searched
    }
    candidates.push_back(std::move(balanced));
  }
}

std::vector<ReplicaBalance> balance_replicas(std::vector<Candidate>& ranked, const ModelConfig& model,
                                             const Topology& topology, ChildSimulator& simulator, int threads) {
  struct Variant {
    size_t entry = 0;  // into out
    Plan plan;
    bool equal_twin = false;  // the equal replicas of a plan the search balanced: for its gain only
    std::optional<Simulated> simulated;
    std::string error;
  };
  std::vector<ReplicaBalance> out;
  std::vector<size_t> index;  // into ranked, per entry of out
  std::vector<Variant> variants;
  std::map<std::string, size_t> by_name;
  for (size_t i = 0; i < ranked.size(); ++i) by_name[ranked[i].plan.name] = i;
  for (size_t i = 0; i < ranked.size(); ++i) {
    const Candidate& c = ranked[i];
    if (c.plan.dp_size < 2 || !c.step_time_s) continue;
    ReplicaBalance b;
    if (made_by_search(c.plan.name) && c.plan.unequal_microbatches()) {
      b.equal_name = c.plan.name.substr(0, c.plan.name.size() - 3);
      b.replica_speed = replica_speeds(c.plan, topology);
      b.equal_microbatches = c.plan.global_batch_size / (c.plan.micro_batch_size * c.plan.dp_size);
      b.balanced_name = c.plan.name;
      b.balanced_microbatches = c.plan.microbatches_per_replica;
      b.balanced_step_s = c.step_time_s;
      b.adopted = true;
      b.note = "balanced by the search";
      if (auto found = by_name.find(b.equal_name); found != by_name.end() && ranked[found->second].step_time_s) {
        b.equal_step_s = *ranked[found->second].step_time_s;
      } else {
        Variant twin;
        twin.entry = out.size();
        twin.equal_twin = true;
        twin.plan = c.plan;
        twin.plan.name = b.equal_name;
        twin.plan.microbatches_per_replica.clear();
        variants.push_back(twin);
      }
      out.push_back(b);
      index.push_back(i);
      continue;
    }
    if (auto twin = by_name.find(c.plan.name + kSuffix); twin != by_name.end() && ranked[twin->second].step_time_s) {
      continue;  // reported with the search's balanced plan
    }
    std::vector<int64_t> split = replica_balanced_microbatches(c.plan, model, topology);
    if (split.empty()) continue;
    b.equal_name = c.plan.name;
    b.replica_speed = replica_speeds(c.plan, topology);
    b.equal_microbatches = c.plan.num_microbatches();
    b.equal_step_s = *c.step_time_s;
    b.balanced_microbatches = split;
    Variant v;
    v.entry = out.size();
    v.plan = c.plan;
    v.plan.microbatches_per_replica = split;
    v.plan.name = c.plan.name + kSuffix;
    try {
      validate_plan(v.plan, model, topology);
      variants.push_back(v);
    } catch (const InputError& e) {
      b.note = std::string("its split is refused: ") + e.what();
    }
    out.push_back(b);
    index.push_back(i);
  }
  parallel_for(int64_t(variants.size()), threads, [&](int64_t k) {
    Variant& v = variants[size_t(k)];
    try {
      v.simulated = simulator.simulate(v.plan.name, v.plan, topology);
    } catch (const std::exception& e) {
      v.error = e.what();
    }
  });
  for (const Variant& v : variants) {
    ReplicaBalance& b = out[v.entry];
    if (v.equal_twin) {
      if (v.simulated) b.equal_step_s = v.simulated->step_time_s;
      else b.note += "; simulating its equal replicas failed: " + v.error;
      continue;
    }
    if (!v.simulated) {
      b.note = "simulating " + v.plan.name + " failed: " + v.error;
      continue;
    }
    b.balanced_name = v.plan.name;
    b.balanced_step_s = v.simulated->step_time_s;
    if (!v.simulated->fits) {
      b.note = "its split does not fit in memory";
      continue;
    }
    if (*b.balanced_step_s >= b.equal_step_s) {
      b.note = "the split is not faster than equal replicas";
      continue;
    }
    adopt_variant(ranked[index[v.entry]], v.plan, *v.simulated);
    b.adopted = true;
  }
  rerank_simulated(ranked);
  return out;
}

void print_replica_balance(const std::vector<ReplicaBalance>& balanced) {
  std::cout << "\nbalanced for the topology's unequal devices (--heterogeneous): microbatches per data-parallel "
               "replica by replica speed\n";
  if (balanced.empty()) {
    std::cout << "  no simulated plan has data-parallel replicas of unequal speed that can take unequal "
                 "microbatches (ZeRO-0 or 1, no experts)\n";
    return;
  }
  for (const ReplicaBalance& b : balanced) {
    std::cout << "  " << b.equal_name << ": replica speeds " << speeds_text(b.replica_speed) << "; microbatches "
              << b.equal_microbatches << " each -> " << list_text(b.balanced_microbatches)
              << balance_outcome(b.equal_step_s, b.balanced_step_s, b.note.rfind("balanced by the search", 0) == 0,
                                 b.adopted, b.balanced_name, b.note)
              << "\n";
  }
}

Json replica_balance_json(const std::vector<ReplicaBalance>& balanced) {
  Json out = Json::array();
  for (const ReplicaBalance& b : balanced) {
    out.push_back({{"plan", b.equal_name},
                   {"replica_speeds", b.replica_speed},
                   {"microbatches_per_replica", b.equal_microbatches},
                   {"step_time_s", b.equal_step_s},
                   {"balanced_microbatches_per_replica", b.balanced_microbatches},
                   {"balanced_step_time_s", b.balanced_step_s ? Json(*b.balanced_step_s) : Json(nullptr)},
                   {"balanced_plan", b.balanced_step_s ? Json(b.balanced_name) : Json(nullptr)},
                   {"adopted", b.adopted},
                   {"note", b.note}});
  }
  return out;
}

}  // namespace stepcast::cli
