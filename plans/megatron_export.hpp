// A plan as a Megatron-LM launch line: the model's shape and the plan's parallel layout as the
// flags of Megatron-LM's pretrain_gpt.py, written so that its own argument validation accepts
// them (megatron/training/arguments.py validate_args, TransformerConfig.__post_init__). Not the
// data, optimizer or learning-rate flags: the plan does not choose them.
// Where Megatron-LM cannot run the plan as simulated, `runnable` is false and a note says why.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model.hpp"
#include "plan.hpp"

namespace stepcast {

struct MegatronArguments {
  std::vector<std::string> arguments;  // one flag per entry, with its value ("--hidden-size 4096")
  std::vector<std::string> notes;      // what the flags cannot say: environment, data, reasons
  bool runnable = true;                // false: Megatron-LM would run a different plan, or none
};

// Megatron-LM's arguments for a validated plan (layers_per_stage resolved) of `model`.
MegatronArguments megatron_arguments(const Plan& plan, const ModelConfig& model);

// Megatron's --pipeline-model-parallel-layout for layers per virtual stage (in virtual-stage
// order, chunk c of stage p at c·pp + p, as Megatron's layout lists them): stages split by '|',
// 'E' (embedding) first, 'L' (loss) last, 't' per decoder layer, "t*n" for n of them.
// {2, 1, 3} → "Et*2|t|t*3L".
std::string megatron_pipeline_layout(const std::vector<int64_t>& layers_per_stage);

}  // namespace stepcast
