// A plan as a TorchTitan job config (TOML): the parallel degrees, pipeline schedule and split,
// batch sizes, mixed precision, activation checkpointing and Float8 of TorchTitan's JobConfig
// (torchtitan/config/job_config.py of TorchTitan 0.2.2), for its llama3 model.
// Not the data, optimizer, learning-rate or checkpoint sections: the plan does not choose them.
// Where TorchTitan cannot run the plan as simulated (a model it has no flavor of, ZeRO-1, Megatron's
// selective recompute, delayed FP8 scaling, ...), `runnable` is false and a note says why.
#pragma once

#include <string>
#include <vector>

#include "model.hpp"
#include "plan.hpp"

namespace stepcast {

struct TorchTitanConfig {
  std::string toml;                // the job config, sections [job] to [float8]
  std::vector<std::string> notes;  // what the config cannot say, and why it is not runnable
  bool runnable = true;            // false: TorchTitan would run a different plan, or none
};

// TorchTitan's job config for a validated plan (layers_per_stage resolved) of `model`.
TorchTitanConfig torchtitan_config(const Plan& plan, const ModelConfig& model);

}  // namespace stepcast
