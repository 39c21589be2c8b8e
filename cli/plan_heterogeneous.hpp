// plan --heterogeneous: on a topology of unequal devices (its "heterogeneity"), the search holds
// each pipeline plan also with its layers per stage in proportion to its stages' speeds
// (speed_balanced_layers_per_stage), and after the simulations each balanced plan's gain over its
// even split is reported; an even plan whose balanced split did not fit is tried part of the way.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "child_simulate.hpp"
#include "json_input.hpp"
#include "model.hpp"
#include "plan.hpp"
#include "search.hpp"
#include "topology.hpp"

namespace stepcast::cli {

struct BalancedPlan {
  std::string naive_name;  // the plan as searched (the even split)
  std::vector<int64_t> naive_layers;
  std::vector<double> stage_speed;
  double naive_step_s = 0;  // simulated
  // The fastest balanced split that fits (NAME-hb: by the speeds; NAME-hb2, -hb4: part of the way,
  // by their square and fourth roots), where one was simulated and fits.
  std::string balanced_name;
  std::vector<int64_t> balanced_layers;  // naive_layers where none fits
  std::optional<double> balanced_step_s;
  bool balanced_fits = false;
  bool adopted = false;  // it replaced the naive plan (fits and is faster)
  std::string note;      // why not adopted, where it was not
};

// Beside each valid candidate with a pipeline, its split by the stages' speeds (NAME-hb), where it
// differs from the even one and validates: the search's memory check and estimate (which slows
// each stage by its slowest device) then rank both.
void add_speed_balanced_candidates(std::vector<Candidate>& candidates, const ModelConfig& model,
                                   const Topology& topology);

// For each simulated plan of `ranked` (search's order: the simulated ones first) with a pipeline:
// a balanced one the search made (NAME-hb) gets its even twin's step (simulated where the search
// did not); an even one without a balanced twin in `ranked` (it did not fit) has its splits
// simulated (by the speeds, and by their square and fourth roots: NAME-hb, -hb2, -hb4) and is
// replaced by the fastest that fits where it beats the even split. Then the simulated plans are
// ranked again by step time. Simulations run `threads` at a time.
std::vector<BalancedPlan> balance_for_speed(std::vector<Candidate>& ranked, const ModelConfig& model,
                                            const Topology& topology, ChildSimulator& simulator, int threads);

void print_balance(const std::vector<BalancedPlan>& balanced);
Json balance_json(const std::vector<BalancedPlan>& balanced);

// Shared with plan_replica_balance.cpp.
// "a,b,c": integers, and speeds to 3 decimals.
std::string list_text(const std::vector<int64_t>& values);
std::string speeds_text(const std::vector<double>& speeds);
// The tail of a balanced plan's line: "; BEFORE s -> AFTER s (G% faster)" and how it was taken.
std::string balance_outcome(double before_s, const std::optional<double>& after_s, bool by_search, bool adopted,
                            const std::string& name, const std::string& note);
// A simulated variant replaces the candidate it balances (plan, step, energy, exact peak).
void adopt_variant(Candidate& c, const Plan& plan, const Simulated& simulated);
// The simulated plans lead `ranked` (search's order): ranks them again by step time.
void rerank_simulated(std::vector<Candidate>& ranked);

}  // namespace stepcast::cli
