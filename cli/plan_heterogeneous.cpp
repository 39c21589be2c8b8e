// plan --heterogeneous; see plan_heterogeneous.hpp.
#include "plan_heterogeneous.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>

#include "errors.hpp"
#include "planner_common.hpp"
#include "quick_estimate.hpp"
#include "schedule.hpp"
#include "units.hpp"

namespace stepcast::cli {

std::string list_text(const std::vector<int64_t>& values) {
  std::ostringstream out;
  for (size_t i = 0; i < values.size(); ++i) out << (i ? "," : "") << values[i];
  return out.str();
}

std::string speeds_text(const std::vector<double>& speeds) {
  std::string out;
  for (size_t i = 0; i < speeds.size(); ++i) out += (i ? "," : "") + fixed(speeds[i], 3);
  return out;
}

std::string balance_outcome(double before_s, const std::optional<double>& after_s, bool by_search, bool adopted,
                            const std::string& name, const std::string& note) {
  std::string out = "; " + fixed(before_s, 3) + " s";
  if (after_s && before_s > 0) {
    out += " -> " + fixed(*after_s, 3) + " s (" + fixed(100 * (before_s - *after_s) / before_s, 1) + "% faster)";
  }
  return out + (by_search ? ", " + note + " as " + name : adopted ? ", adopted as " + name : "; kept: " + note);
}

void adopt_variant(Candidate& c, const Plan& plan, const Simulated& simulated) {
  c.plan = plan;
  c.step_time_s = simulated.step_time_s;
  c.energy_per_step_j = simulated.energy_per_step_j;
  c.peak_bytes_max = c.peak_lower_bytes = c.peak_upper_bytes = simulated.peak_bytes_max;
  c.peak_exact = true;
}

void rerank_simulated(std::vector<Candidate>& ranked) {
  auto end = ranked.begin();
  while (end != ranked.end() && end->step_time_s) ++end;
  std::stable_sort(ranked.begin(), end,
                   [](const Candidate& a, const Candidate& b) { return *a.step_time_s < *b.step_time_s; });
}

void add_speed_balanced_candidates(std::vector<Candidate>& candidates, const ModelConfig& model,
                                   const Topology& topology) {
  const size_t count = candidates.size();
  for (size_t i = 0; i < count; ++i) {
    const Candidate& c = candidates[i];
    if (!c.kept() || c.plan.pp_size < 2) continue;
    Candidate balanced = c;
    balanced.plan.layers_per_stage = speed_balanced_layers_per_stage(model.num_hidden_layers, c.plan.virtual_pp_size,
                                                                     stage_speeds(c.plan, topology));
    if (balanced.plan.layers_per_stage == c.plan.layers_per_stage) continue;
    balanced.plan.name += "-hb";
    try {
      validate_plan(balanced.plan, model, topology);
    } catch (const InputError&) {
      continue;  // a split validation refuses is not searched
    }
    candidates.push_back(std::move(balanced));
  }
}

std::vector<BalancedPlan> balance_for_speed(std::vector<Candidate>& ranked, const ModelConfig& model,
                                            const Topology& topology, ChildSimulator& simulator, int threads) {
  // The split by the stages' speeds (power 1) and, where it may not fit (the fast stages hold more
  // layers), splits part of the way from the even one (speeds to the power 1/2 and 1/4).
  const std::vector<double> powers{1.0, 0.5, 0.25};
  struct Variant {
    size_t entry = 0;  // into out
    Plan plan;
    bool even_twin = false;  // the even split of a plan the search balanced: for its gain only
    std::optional<Simulated> simulated;
    std::string error;
  };
  std::vector<BalancedPlan> out;
  std::vector<size_t> index;  // into ranked, per entry of out
  std::vector<Variant> variants;
  std::map<std::string, size_t> by_name;  // the search's candidates
  for (size_t i = 0; i < ranked.size(); ++i) by_name[ranked[i].plan.name] = i;
  auto made_by_search = [](const std::string& name) {
    return name.size() > 3 && name.compare(name.size() - 3, 3, "-hb") == 0;
  };
  for (size_t i = 0; i < ranked.size(); ++i) {
    const Candidate& c = ranked[i];
    if (c.plan.pp_size < 2 || !c.step_time_s) continue;
    if (c.plan.unequal_microbatches()) continue;  // NAME-hm: balance_replicas reports it
    if (made_by_search(c.plan.name)) {
      // Balanced by the search (add_speed_balanced_candidates): its gain over the even split.
      BalancedPlan b;
      b.naive_name = c.plan.name.substr(0, c.plan.name.size() - 3);
      b.stage_speed = stage_speeds(c.plan, topology);
      b.balanced_name = c.plan.name;
      b.balanced_layers = c.plan.layers_per_stage;
      b.balanced_step_s = c.step_time_s;
      b.balanced_fits = b.adopted = true;
      b.note = "balanced by the search";
      Variant twin;
      twin.entry = out.size();
      twin.even_twin = true;
      twin.plan = c.plan;
      twin.plan.name = b.naive_name;
      twin.plan.layers_per_stage.clear();  // validate_plan gives the even split
      if (auto found = by_name.find(b.naive_name); found != by_name.end() && ranked[found->second].step_time_s) {
        b.naive_layers = ranked[found->second].plan.layers_per_stage;
        b.naive_step_s = *ranked[found->second].step_time_s;
      } else {
        validate_plan(twin.plan, model, topology);
        b.naive_layers = twin.plan.layers_per_stage;
        variants.push_back(twin);
      }
      out.push_back(b);
      index.push_back(i);
      continue;
    }
    if (by_name.count(c.plan.name + "-hb")) continue;  // reported with the search's balanced plan
    BalancedPlan b;
    b.naive_name = c.plan.name;
    b.naive_layers = c.plan.layers_per_stage;
    b.naive_step_s = *c.step_time_s;
    b.stage_speed = stage_speeds(c.plan, topology);
    b.balanced_layers = b.naive_layers;
    std::vector<std::vector<int64_t>> tried{b.naive_layers};
    for (double power : powers) {
      std::vector<double> speed = b.stage_speed;
      for (double& s : speed) s = std::pow(s, power);
      Variant v;
      v.entry = out.size();
      v.plan = c.plan;
      v.plan.layers_per_stage = speed_balanced_layers_per_stage(model.num_hidden_layers, c.plan.virtual_pp_size, speed);
      if (std::find(tried.begin(), tried.end(), v.plan.layers_per_stage) != tried.end()) continue;
      tried.push_back(v.plan.layers_per_stage);
      v.plan.name = c.plan.name + "-hb" + (power == 1 ? "" : std::to_string(int(std::lround(1 / power))));
      if (auto searched = by_name.find(v.plan.name); searched != by_name.end()) {
        // The search holds this split as a plan of its own: reported, not simulated again.
        const Candidate& own = ranked[searched->second];
        if (own.step_time_s) {
          b.balanced_name = v.plan.name;
          b.balanced_layers = v.plan.layers_per_stage;
          b.balanced_step_s = own.step_time_s;
          b.note = "the search ranks " + v.plan.name + " as a plan of its own";
        }
        continue;
      }
      try {
        validate_plan(v.plan, model, topology);
      } catch (const InputError&) {
        continue;  // a split validation refuses is not tried
      }
      variants.push_back(v);
    }
    if (tried.size() == 1) b.note = "its stages' speeds give the even split";
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
  // Per plan: the fastest variant that fits and beats the even split.
  std::vector<const Variant*> best(out.size(), nullptr);
  for (const Variant& v : variants) {
    BalancedPlan& b = out[v.entry];
    if (v.even_twin) {
      if (v.simulated)
        b.naive_step_s = v.simulated->step_time_s;
      else
        b.note += "; simulating its even split failed: " + v.error;
      continue;
    }
    if (!v.simulated) {
      if (b.note.empty()) b.note = "simulating " + v.plan.name + " failed: " + v.error;
      continue;
    }
    const Variant* current = best[v.entry];
    if (!v.simulated->fits) continue;
    if (!current || v.simulated->step_time_s < current->simulated->step_time_s) best[v.entry] = &v;
  }
  for (size_t e = 0; e < out.size(); ++e) {
    BalancedPlan& b = out[e];
    if (made_by_search(b.balanced_name) && b.adopted) continue;  // ranked as the search found it
    const Variant* v = best[e];
    if (!v) {
      if (b.note.empty()) b.note = "no balanced split fits in memory";
      continue;
    }
    if (b.balanced_step_s && *b.balanced_step_s <= v->simulated->step_time_s) continue;  // the search's is faster
    b.balanced_layers = v->plan.layers_per_stage;
    b.balanced_name = v->plan.name;
    b.balanced_step_s = v->simulated->step_time_s;
    b.balanced_fits = true;
    if (*b.balanced_step_s >= b.naive_step_s) {
      b.note = "no balanced split is faster than the even one";
      continue;
    }
    adopt_variant(ranked[index[e]], v->plan, *v->simulated);
    b.adopted = true;
  }
  rerank_simulated(ranked);  // with the balanced ones
  return out;
}

namespace {
bool made_by_search_note(const BalancedPlan& b) { return b.note.rfind("balanced by the search", 0) == 0; }
}  // namespace

void print_balance(const std::vector<BalancedPlan>& balanced) {
  std::cout << "\nbalanced for the topology's unequal devices (--heterogeneous): layers per stage by stage speed\n";
  if (balanced.empty()) {
    std::cout << "  no simulated plan has a pipeline: nothing to balance\n";
    return;
  }
  for (const BalancedPlan& b : balanced) {
    std::cout << "  " << b.naive_name << ": stage speeds " << speeds_text(b.stage_speed) << "; layers "
              << list_text(b.naive_layers) << " -> " << list_text(b.balanced_layers)
              << balance_outcome(b.naive_step_s, b.balanced_step_s, made_by_search_note(b), b.adopted, b.balanced_name,
                                 b.note)
              << "\n";
  }
}

Json balance_json(const std::vector<BalancedPlan>& balanced) {
  Json out = Json::array();
  for (const BalancedPlan& b : balanced) {
    out.push_back({{"plan", b.naive_name},
                   {"stage_speeds", b.stage_speed},
                   {"layers_per_stage", b.naive_layers},
                   {"step_time_s", b.naive_step_s},
                   {"balanced_layers_per_stage", b.balanced_layers},
                   {"balanced_step_time_s", b.balanced_step_s ? Json(*b.balanced_step_s) : Json(nullptr)},
                   {"balanced_plan", b.adopted || b.balanced_step_s ? Json(b.balanced_name) : Json(nullptr)},
                   {"adopted", b.adopted},
                   {"note", b.note}});
  }
  return out;
}

}  // namespace stepcast::cli
