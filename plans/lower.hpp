// Lowering: (model, topology, plan) → StepProgram. Decides everything the interpreters must not:
// the op order per role (from the schedule), the dataflow (buffers from alloc ops, deps derived
// from it), which activations are kept for backward (by recompute mode and attention_impl),
// where gradients are reduced (buckets, ZeRO stage), and the algorithm of every collective.
#pragma once

#include "model.hpp"
#include "plan.hpp"
#include "program.hpp"
#include "program_progress.hpp"
#include "role_builder.hpp"  // RoleDetail
#include "topology.hpp"

namespace stepcast {

// `plan` must have passed validate_plan. Does not check memory (see memory.hpp).
StepProgram lower_program(const ModelConfig& model, const Topology& topology, const Plan& plan);
// The same into `program` (a default-constructed one), publishing its header and each role as
// they are complete to `progress` (program_progress.hpp), for a reader on another thread; the
// progress fails if the lowering throws.
void lower_program_into(StepProgram& program, const ModelConfig& model, const Topology& topology,
                        const Plan& plan, ProgramProgress& progress);

// Pipeline stage `stage`'s role alone: the same ops as lower_program(...).roles[stage] (with
// RoleDetail::memory_walk, what a memory walk reads of them: role_builder.hpp); with unequal
// replicas, the stage of the replica that runs the most microbatches. The planner walks the
// memory of the few stages whose bounds straddle the device's limit.
Role lower_role(const ModelConfig& model, const Topology& topology, const Plan& plan,
                int64_t stage, RoleDetail detail = RoleDetail::full);

// Vocabulary padded to a multiple of tp_size so the vocab-parallel embedding and logit layer
// split evenly (Megatron pads further, to 128·tp, for kernel efficiency; we do not).
int64_t padded_vocab_size(const ModelConfig& model, int64_t tp_size);
// The parameters of the model as lowered for tp_size: parameter_count with the padded vocabulary
// (every layer and expert) — what a framework builds from an exported config.
int64_t simulated_parameter_count(const ModelConfig& model, int64_t tp_size);

// Bytes one transformer layer keeps for its backward pass for one microbatch (its input
// included), measured by lowering that single layer's forward pass with the plan's recompute,
// sequence_parallel, attention_impl and dropout: the same code that lowers the whole program.
double layer_activation_bytes(const ModelConfig& model, const Plan& plan);

}  // namespace stepcast
