// Megatron-LM arguments as a stepcast model and plan: the inverse of megatron_export.hpp.
// Reads a launch line, or a launch script holding one (continuation lines, comments, quotes and
// simple `NAME=value` variables resolved), and maps pretrain_gpt.py's flags to a model config
// and plan keys. Flags that change the step and that stepcast cannot model, or that contradict
// each other, are refused by name (InputError); flags that do not change the step (data,
// optimizer hyper-parameters, logging, checkpoints) are accepted and listed. The plan has no
// dp_size: it is world / (tp·pp·cp), the world being the topology's devices (plan.hpp).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "json_input.hpp"

namespace stepcast {

// One flag of a launch line: its name without the dashes ("tensor-model-parallel-size") and its
// value ("" for a switch), in the order given.
struct MegatronFlag {
  std::string name;
  std::string value;
  bool launcher = false;  // torchrun's, srun's, mpirun's own (--nnodes, --nproc_per_node, ...)
};

// The flags of `text` in order, the launchers' marked. `source` names the text in errors.
std::vector<MegatronFlag> read_megatron_flags(const std::string& text, const std::string& source);

struct MegatronImport {
  Json model;                        // model config keys (parse_model reads them)
  Json plan;                         // plan keys, dp_size absent (derived from the world)
  std::vector<std::string> ignored;  // flags accepted that do not change the step ("--lr", ...)
  // torchrun's --nnodes × --nproc_per_node (or --nproc_per_node alone) when the text gives them
  // as numbers: the world Megatron-LM derives dp_size from. 0: not given.
  int64_t world_size = 0;
  std::string world_from;  // "torchrun --nnodes 2 --nproc_per_node 8"
};

// Model and plan of the arguments in `text`; `name` names both.
MegatronImport import_megatron_arguments(const std::string& text, const std::string& source,
                                         const std::string& name);

}  // namespace stepcast
