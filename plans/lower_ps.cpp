// Parameter servers in the program (parameter_server.hpp): a worker's pulls of the weights'
// slices as its step starts and its pushes of the gradient norm and the gradient's slices as it
// ends, and a server's role — its slices of the weights and optimizer state, persistent, and the
// ops that handle one push: receive the norm and the slices, AdamW, send the weights' slices.
#include "lower_role.hpp"
#include "parameter_server.hpp"

namespace stepcast {

namespace {

Op& last_op(RoleBuilder& rb, int32_t id) { return const_cast<Op&>(rb.role().ops[size_t(id)]); }

}  // namespace

void RoleLowering::emit_param_pulls() {
  OpSite at{Phase::forward, -1, -1, -1};
  const int64_t servers = plan_.parameter_servers;
  for (int64_t j = 0; j < servers; ++j) {
    for (size_t g = 0; g < groups_.size(); ++g) {
      auto [first, last] = server_slice(groups_[g].elements, servers, j);
      int32_t id = e_.p2p(at, OpKind::recv, Peer::ps_server, ps_pull_tag(int64_t(g)),
                          double(last - first) * dtype_bytes(c_.act), "weights." + groups_[g].name, "", false);
      last_op(rb_, id).name = OpName::param_pull;
      last_op(rb_, id).server = int32_t(j);
    }
  }
}

void RoleLowering::emit_pushes() {
  OpSite at{Phase::optimizer, -1, -1, -1};
  // The gradient's norm over the whole model (the worker holds all of it): the servers clip by it.
  std::vector<BufferName> grads;
  double elements = 0;
  for (const auto& g : groups_) {
    grads.push_back("grads." + g.name);
    elements += double(g.elements);
  }
  rb_.alloc("grad_norm_sq", BufferClass::comm, c_.wide, {1}, Phase::optimizer);
  int32_t norm = e_.compute(at, OpKind::optimizer_step, OpName::grad_norm, 2 * elements, grads, {"grad_norm_sq"});
  last_op(rb_, norm).bytes = gradient_pass_bytes(c_.act, c_.grad) * elements;
  const int64_t servers = plan_.parameter_servers;
  for (int64_t j = 0; j < servers; ++j) {
    int32_t id = e_.p2p(at, OpKind::send, Peer::ps_server, kPsNormTag, dtype_bytes(c_.wide), "grad_norm_sq", "", false);
    last_op(rb_, id).name = OpName::norm_push;
    last_op(rb_, id).server = int32_t(j);
    for (size_t g = 0; g < groups_.size(); ++g) {
      auto [first, last] = server_slice(groups_[g].elements, servers, j);
      id = e_.p2p(at, OpKind::send, Peer::ps_server, ps_push_tag(int64_t(g)),
                  double(last - first) * dtype_bytes(c_.grad), "grads." + groups_[g].name, "", false);
      last_op(rb_, id).name = OpName::grad_push;
      last_op(rb_, id).server = int32_t(j);
    }
  }
  rb_.free("grad_norm_sq", Phase::optimizer);
}

void RoleLowering::lower_server(int32_t server) {
  collect_param_groups();
  const int64_t servers = plan_.parameter_servers;
  std::vector<int64_t> slice;
  double elements = 0;
  for (const auto& g : groups_) {
    auto [first, last] = server_slice(g.elements, servers, server);
    slice.push_back(last - first);
    elements += double(last - first);
    rb_.alloc("weights." + g.name, BufferClass::weights, c_.act, {slice.back()}, Phase::forward, true);
    rb_.alloc("optimizer." + g.name, BufferClass::optimizer, optimizer_dtype(), {slice.back(), optimizer_states(g)},
              Phase::forward, true);
    // The weights each worker's reply carries, copied at the send: a slot per worker, so that
    // the next update need not wait for a transfer (the worker's previous reply has arrived
    // before it pushes again).
    rb_.alloc(reply_staging(g), BufferClass::comm, c_.act, {plan_.dp_size, slice.back()}, Phase::forward, true);
  }
  // One push: the norm, then each group's gradient slice, in the worker's order.
  OpSite at{Phase::optimizer, -1, -1, -1};
  rb_.alloc("grad_norm_sq", BufferClass::comm, c_.wide, {1}, Phase::optimizer);
  int32_t id = e_.p2p(at, OpKind::recv, Peer::ps_worker, kPsNormTag, dtype_bytes(c_.wide), "grad_norm_sq", "", false);
  last_op(rb_, id).name = OpName::norm_push;
  std::vector<BufferName> grads, states, weights;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::string name = "grads." + groups_[g].name;
    rb_.alloc(name, BufferClass::grads, c_.grad, {slice[g]}, Phase::optimizer);
    id = e_.p2p(at, OpKind::recv, Peer::ps_worker, ps_push_tag(int64_t(g)), double(slice[g]) * dtype_bytes(c_.grad),
                name, "", false);
    last_op(rb_, id).name = OpName::grad_push;
    grads.push_back(name);
    states.push_back("optimizer." + groups_[g].name);
    weights.push_back("weights." + groups_[g].name);
  }
  std::vector<BufferName> inputs = grads;
  inputs.insert(inputs.end(), states.begin(), states.end());
  inputs.push_back("grad_norm_sq");
  std::vector<BufferName> outputs = states;
  outputs.insert(outputs.end(), weights.begin(), weights.end());
  id = e_.compute(at, OpKind::optimizer_step, OpName::adamw, 14 * elements, inputs, outputs);
  last_op(rb_, id).bytes = adamw_bytes(c_.act, c_.grad) * elements;
  for (const auto& name : grads) rb_.free(name, Phase::optimizer);
  rb_.free("grad_norm_sq", Phase::optimizer);
  // The worker's weights for its next step, from its slot of the staging.
  for (size_t g = 0; g < groups_.size(); ++g) {
    id = e_.p2p(at, OpKind::send, Peer::ps_worker, ps_pull_tag(int64_t(g)), double(slice[g]) * dtype_bytes(c_.act),
                weights[g], reply_staging(groups_[g]), false);
    last_op(rb_, id).name = OpName::param_pull;
  }
}

}  // namespace stepcast
