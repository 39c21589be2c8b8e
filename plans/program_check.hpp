// Invariants every StepProgram must satisfy, checked by walking it (tests run this on many plans;
// `stepcast lower --check` runs it on one). Returns the violations found, empty when the program
// is sound:
//  - ids are list indices; deps point to earlier ops of the same role;
//  - every buffer an op reads or writes is live (allocated before, not yet freed); transient
//    buffers are freed by the end of the step, persistent ones never; a free follows (through
//    its deps) every op that used the buffer since its allocation;
//  - every op has a signature (op_signature.hpp) its operands fit: their count, and the dtype and
//    element count (from the op's batch, m, n, k) of each buffer against its slot's rules;
//  - every send has the matching recv on the peer's role (same tag and bytes), and the sends from
//    a stage to a neighbour are in the same order as that neighbour's receives (MPI's
//    non-overtaking matching needs nothing else);
//  - every member of a group issues the same collectives (kind, bytes, algorithm) in the same
//    order; groups that span roles (pp, embedding, model, world) are compared role by role;
//  - all roles together finish under eager sends: no dependency cycle across ranks (deadlock).
#pragma once

#include <string>
#include <vector>

#include "program.hpp"

namespace stepcast {

std::vector<std::string> check_program(const StepProgram& program);

// Whether every rank can run its ops strictly in list order on one thread (what the CPU
// executor does) with sends that do not block and receives that do: no deadlock across ranks.
std::vector<std::string> check_list_order_progress(const StepProgram& program);

}  // namespace stepcast
