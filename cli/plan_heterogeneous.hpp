// plan --heterogeneous: on a topology of unequal devices (its "heterogeneity"), each simulated
// plan with a pipeline is simulated again with its layers per stage in proportion to its stages'
// speeds (speed_balanced_layers_per_stage), and the balanced plan takes its place where it is
// faster and fits; the gain over the even split is reported.
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

// For each simulated plan of `ranked` (search's order: the simulated ones first) that has a
// pipeline: simulates its speed-balanced splits and replaces the candidate's plan, step and peak
// by the fastest that fits where it beats the even split; then re-ranks the simulated plans by
// step time. The search's estimate knows the stages' speeds but costs the even split, so a plan
// that wins only once balanced may not have been simulated. Simulations run `threads` at a time.
std::vector<BalancedPlan> balance_for_speed(std::vector<Candidate>& ranked, const ModelConfig& model,
                                            const Topology& topology, ChildSimulator& simulator, int threads);

void print_balance(const std::vector<BalancedPlan>& balanced);
Json balance_json(const std::vector<BalancedPlan>& balanced);

}  // namespace stepcast::cli
