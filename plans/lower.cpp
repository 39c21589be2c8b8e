// Lowering of a plan into the StepProgram: one role per pipeline stage (RoleLowering, lower_role.hpp),
// and the bytes one layer keeps for backward. The op emitter is in lower_context.cpp, the
// role's passes in lower_role.cpp, lower_embedding_loss.cpp and lower_grads.cpp, layer internals
// in lower_layer.cpp.
#include "lower.hpp"

#include "lower_role.hpp"

namespace stepcast {

int64_t padded_vocab_size(const ModelConfig& model, int64_t tp_size) {
  return (model.vocab_size + tp_size - 1) / tp_size * tp_size;
}

int64_t simulated_parameter_count(const ModelConfig& model, int64_t tp_size) {
  ModelConfig padded = model;
  padded.vocab_size = padded_vocab_size(model, tp_size);
  return parameter_count(padded);
}

StepProgram lower_program(const ModelConfig& model, const Topology& topology, const Plan& plan) {
  StepProgram program;
  ProgramProgress progress;  // no reader
  lower_program_into(program, model, topology, plan, progress);
  return program;
}

void lower_program_into(StepProgram& program, const ModelConfig& model, const Topology& topology,
                        const Plan& plan, ProgramProgress& progress) {
  struct FailUnlessDone {  // a reader waiting on a lowering that threw is released
    ProgramProgress& progress;
    bool done = false;
    ~FailUnlessDone() {
      if (!done) progress.fail();
    }
  } guard{progress};
  LowerContext ctx(model, topology, plan);
  program.model = model_to_json(model);
  program.topology = topology_to_json(topology);
  program.topology.erase("profile");  // the program does not depend on what costs it
  program.plan = plan_to_json(plan);
  program.tp_size = plan.tp_size;
  program.dp_size = plan.dp_size;
  program.cp_size = plan.cp_size;
  program.dp_shard_size = plan.dp_shard_size();
  program.pp_size = plan.pp_size;
  if (model.is_moe()) {
    program.ep_size = plan.moe.ep_size;
    program.etp_size = plan.moe.etp_size;
    program.moe = ProgramMoe{model.num_experts, plan.moe.top_k, plan.moe.capacity_factor,
                             routing_shares(plan.moe, model.num_experts), plan.moe.seed,
                             ctx.moe.tokens * ctx.moe.top_k * ctx.moe.ep * ctx.moe.etp,
                             ctx.moe.capacity * ctx.moe.ep * ctx.moe.etp, plan.moe.pad_to_capacity,
                             plan.moe.drop_by_probs && !plan.moe.dropless(), {}, {}};
    if (!plan.moe.samples.empty()) {
      program.moe.routing_samples.resize(size_t(model.num_hidden_layers));
      for (int64_t l = model.first_k_dense_replace; l < model.num_hidden_layers; ++l) {
        program.moe.routing_samples[size_t(l)] = routing_samples(plan.moe, l);
      }
    }
    if (routing_per_layer(plan.moe)) {
      program.moe.layer_routing_shares.resize(size_t(model.num_hidden_layers));
      for (int64_t l = model.first_k_dense_replace; l < model.num_hidden_layers; ++l) {
        program.moe.layer_routing_shares[size_t(l)] = routing_shares(plan.moe, model.num_experts, l);
      }
    }
  }
  program.order = plan.order;
  program.devices_per_node = topology.node.devices_per_node;
  program.num_microbatches = plan.num_microbatches();
  program.microbatches_per_replica = plan.microbatches_per_replica;
  program.index_replica_classes();
  program.tokens_per_step = plan.global_batch_size * model.seq_length;
  program.async_staleness = plan.async_staleness;
  program.fp8 = plan.fp8;
  program.fp8_slots = fp8_slot_layout(model, plan).count();
  // One role per pipeline stage of each replica class (unequal replicas: one class per count),
  // then the parameter servers' roles: all of them now, so that a reader's roles do not move.
  const std::vector<int64_t> classes = program.class_microbatches();
  const size_t worker_roles = classes.size() * size_t(plan.pp_size);
  program.parameter_servers = plan.parameter_servers;
  program.roles.resize(worker_roles + size_t(plan.parameter_servers));
  progress.header_ready();
  for (size_t c = 0; c < classes.size(); ++c) {
    for (int64_t p = 0; p < plan.pp_size; ++p) {
      const size_t index = c * size_t(plan.pp_size) + size_t(p);
      Role& role = program.roles[index];
      role.index = int32_t(index);
      role.pp_stage = p;
      role.num_microbatches = classes[c];
      // Stages hold about as many ops as each other (10^5 and more, a few hundred bytes each):
      // room for the previous stage's count and some, so that the list is not copied as it grows.
      if (p > 0) role.ops.reserve(program.roles[index - 1].ops.size() * 9 / 8);
      RoleLowering(ctx, role).lower();
      progress.roles_done(index + 1);
    }
  }
  for (int32_t j = 0; j < int32_t(plan.parameter_servers); ++j) {  // after the workers' roles
    const size_t index = worker_roles + size_t(j);
    Role& role = program.roles[index];
    role.index = int32_t(index);
    role.server = j;
    role.num_microbatches = program.num_microbatches;
    RoleLowering(ctx, role).lower_server(j);
    progress.roles_done(index + 1);
  }
  guard.done = true;
}

Role lower_role(const ModelConfig& model, const Topology& topology, const Plan& plan,
                int64_t stage, RoleDetail detail) {
  LowerContext ctx(model, topology, plan);
  Role role;
  role.index = int32_t(stage);
  role.pp_stage = stage;
  role.num_microbatches = plan.num_microbatches();  // unequal replicas: the busiest one's
  RoleLowering(ctx, role, detail).lower();
  return role;
}

double layer_activation_bytes(const ModelConfig& model, const Plan& plan) {
  // A one-node topology big enough for the plan; only the collectives' algorithm depends on it.
  Topology topology;
  topology.name = "layer_activation_bytes";
  topology.num_nodes = 1;
  topology.node.devices_per_node = int(plan.world_size());
  topology.node.intra_node.bandwidth_bytes_per_s = 1;
  topology.fabric.nics_per_node = 1;
  topology.fabric.nic_bandwidth_bytes_per_s = 1;
  topology.fabric.switch_radix = 2;
  LowerContext ctx(model, topology, plan);
  Role role;
  RoleBuilder rb(role);
  OpEmitter e(ctx, rb, 0);
  rb.alloc("weights.L0", BufferClass::weights, ctx.act, {ctx.layer_params_local()}, Phase::forward,
           true);
  rb.alloc("x_in", BufferClass::activations, ctx.act, {ctx.s_local, ctx.b, ctx.h}, Phase::forward);
  const std::string w8 = alloc_probe_fp8_state(rb, ctx);
  OpSite at{Phase::forward, 0, 0, 0};
  std::string out = emit_layer_forward(e, at, "x_in", {"weights.L0", "", w8}, KeepMode::per_plan);
  // What is still allocated, less the weights and the output (the next layer's input).
  double live = 0;
  for (const Op& op : role.ops) {
    if (op.persistent) continue;
    if (op.kind == OpKind::alloc) live += op.bytes;
    if (op.kind == OpKind::free) live -= op.bytes;
  }
  return live - rb.live_bytes(out);
}

}  // namespace stepcast
