// What `simulate` adds to a step on unequal devices, under asynchronous data parallelism and for
// the bill: the straggler cost (the step less the same step with every speed and link factor 1,
// simulated in a forked child), the synchronous plan's step beside an asynchronous one's (also a
// forked child), energy per step from the device's power figures, and cost per step from
// --price-per-gpu-hour.
// Results as JSON for prediction.json and as summary lines; the command prints them.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "forked_child.hpp"
#include "inputs.hpp"
#include "profile.hpp"
#include "simulator.hpp"

namespace stepcast::cli {

// --price-per-gpu-hour AMOUNT [CURRENCY] and --currency CURRENCY.
void add_price_options(po::options_description& options);
struct Price {
  double per_gpu_hour = 0;
  std::string currency;  // three letters (ISO 4217), e.g. USD
};
// nullopt without --price-per-gpu-hour; InputError for an amount that is not a number > 0, a
// price without a currency, a currency twice or without a price.
std::optional<Price> price_from(const po::variables_map& vm);

// Forks the uniform reference (the plan on the topology without its heterogeneity) where the
// topology has some; null otherwise. Call before the SimGrid engine or any thread.
std::unique_ptr<ForkedChild> fork_uniform_reference(const Inputs& in, const DeviceProfile& profile,
                                                    const SimulateOptions& options);

// Forks the synchronous reference (the plan with data_parallel_mode sync) of an asynchronous
// plan; null for a synchronous one. Call before the SimGrid engine or any thread.
std::unique_ptr<ForkedChild> fork_synchronous_reference(const Inputs& in, const DeviceProfile& profile,
                                                        const SimulateOptions& options);
// prediction.json's "async": staleness, the asynchronous and the synchronous step and throughput.
Json async_json(const Plan& plan, const SimulationOutput& sim, double sync_step_time_s, double tokens_per_step);
std::string async_summary(const Json& async);

// prediction.json's "heterogeneity": the slowest device, the critical rank, the uniform step and
// the straggler cost (step_time_s − uniform_step_time_s).
Json heterogeneity_json(const Topology& topology, const SimulationOutput& sim, double uniform_step_time_s);
// prediction.json's "energy" (null figures where the device has no power figures) and "cost".
Json energy_json(const Topology& topology, const SimulationOutput& sim, const std::optional<Price>& price,
                 int64_t devices, double tokens_per_step);
// The summary's lines for both (empty where there is nothing to say).
std::string heterogeneity_summary(const Json& heterogeneity);
std::string energy_summary(const Json& energy);

}  // namespace stepcast::cli
