// A plan as a DeepSpeed config (ds_config.json): batch sizes, precision and the ZeRO section
// (stage, communication overlap and buckets) of DeepSpeed's config
// (deepspeed/runtime/config.py, runtime/zero/config.py). Tensor, pipeline and context parallelism
// are not config keys (Megatron-DeepSpeed's launch flags, a PipelineModule, Ulysses' code): a
// plan with them is marked, with the sizes the launch must give. Where DeepSpeed cannot run the
// plan as simulated, `runnable` is false and a note says why.
#pragma once

#include <string>
#include <vector>

#include "json_input.hpp"
#include "model.hpp"
#include "plan.hpp"

namespace stepcast {

struct DeepSpeedConfig {
  Json config;                     // the ds_config.json object
  std::vector<std::string> notes;  // what the config cannot say, and why it is not runnable
  bool runnable = true;            // false: DeepSpeed would run a different plan, or none
};

// DeepSpeed's config for a validated plan of `model`.
DeepSpeedConfig deepspeed_config(const Plan& plan, const ModelConfig& model);

}  // namespace stepcast
