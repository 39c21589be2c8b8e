// program_inputs.hpp: the program's model, plan and topology JSON through the input readers.
#include "program_inputs.hpp"

namespace stepcast {

ProgramInputs program_inputs(const StepProgram& program) {
  std::string name = "program " + (program.program_sha256.empty()
                                       ? std::string("(not hashed)")
                                       : program.program_sha256.substr(0, 12));
  ProgramInputs in;
  in.model = parse_model(program.model, name + " model");
  in.topology = parse_topology(program.topology, name + " topology");
  in.plan = parse_plan(program.plan, name + " plan");
  validate_plan(in.plan, in.model, in.topology);
  return in;
}

}  // namespace stepcast
