// The resolved inputs a StepProgram carries (its model, plan and topology, as lowering wrote
// them), read back as the structs that built it: what an interpreter handed only the program
// knows of them. Messages about them name the program (its hash), not the files it came from.
#pragma once

#include "model.hpp"
#include "plan.hpp"
#include "program.hpp"
#include "topology.hpp"

namespace stepcast {

struct ProgramInputs {
  ModelConfig model;
  Plan plan;
  Topology topology;
};

// InputError when the program's inputs do not read back (a program.json edited by hand).
ProgramInputs program_inputs(const StepProgram& program);

}  // namespace stepcast
