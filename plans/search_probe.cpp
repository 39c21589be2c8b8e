// The planner's probes, memory bounds and probe estimate; see search_probe.hpp. The parameter
// groups, buckets and gathers below follow plans/lower_role.hpp's RoleLowering step by step (tests
// compare every figure with the lowered program).
#include "search_probe.hpp"

#include <algorithm>
#include <cmath>

#include "collective.hpp"
#include "collective_cost.hpp"
#include "lower.hpp"
#include "lower_context.hpp"
#include "memory.hpp"
#include "schedule.hpp"
#include "search.hpp"
#include "search_fp8_step.hpp"
#include "stage_layout.hpp"

namespace stepcast {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A one-node topology big enough for `world` ranks (as layer_activation_bytes builds): memory
// does not depend on where ranks sit.
Topology one_node(int64_t world) {
  Topology t;
  t.name = "probe";
  t.num_nodes = 1;
  t.node.devices_per_node = int(world);
  t.node.intra_node.bandwidth_bytes_per_s = 1;
  t.fabric.nics_per_node = 1;
  t.fabric.nic_bandwidth_bytes_per_s = 1;
  t.fabric.switch_radix = 2;
  return t;
}

// One layer's forward then backward on a role of its own: the transient level's maximum.
double layer_peak_bytes(const ModelConfig& model, const Plan& plan) {
  Topology topology = one_node(plan.world_size());
  LowerContext ctx(model, topology, plan);
  Role role;
  RoleBuilder rb(role);
  OpEmitter e(ctx, rb, 0);
  rb.alloc("weights.L0", BufferClass::weights, ctx.act, {ctx.layer_params_local()}, Phase::forward,
           true);
  rb.alloc("grads.L0", BufferClass::grads, ctx.grad, {ctx.layer_params_local()}, Phase::forward,
           true);
  const std::string w8 = alloc_probe_fp8_state(rb, ctx);  // (persistent: counted with the weights)
  std::vector<int64_t> local = {ctx.s_local, ctx.b, ctx.h};
  rb.alloc("x_in", BufferClass::activations, ctx.act, local, Phase::forward);
  std::string out = emit_layer_forward(e, OpSite{Phase::forward, 0, 0, 0}, "x_in",
                                       {"weights.L0", "", w8}, KeepMode::per_plan);
  rb.free(out, Phase::forward);  // the next layer's input: freed by that layer's backward
  rb.alloc("g", BufferClass::activations, ctx.act, local, Phase::backward);
  emit_layer_backward(e, OpSite{Phase::backward, 0, 0, 0}, "x_in", "g",
                      {"weights.L0", "grads.L0", w8, ctx.fp8_weights_transposed ? fp8_transposed_copy_name("L0") : ""});
  double level = 0, peak = 0;
  for (const Op& op : role.ops) {
    if (op.persistent) continue;
    if (op.kind == OpKind::alloc) level += op.bytes;
    if (op.kind == OpKind::free) level -= op.bytes;
    peak = std::max(peak, level);
  }
  return peak;
}

LayerProbe build_probe(const ModelConfig& model, const Topology& topology, const Plan& plan) {
  LayerProbe probe;
  Plan one = plan;
  one.pp_size = 1;
  one.dp_size = 1;
  one.microbatches_per_replica.clear();
  one.num_distributed_optimizer_instances = 1;
  probe.kept_bytes = layer_activation_bytes(model, one);
  probe.layer_peak_bytes = layer_peak_bytes(model, one);
  // Two stages of one layer each, one microbatch, no data parallelism: stage 0 holds the
  // embedding and layer 0, stage 1 layer 1 and the loss.
  ModelConfig two = model;
  two.num_hidden_layers = 2;
  Plan p = plan;
  p.pp_size = 2;
  p.dp_size = 1;
  p.microbatches_per_replica.clear();
  p.zero_stage = 0;
  p.num_distributed_optimizer_instances = 1;
  p.schedule = ScheduleKind::one_f_one_b;
  p.virtual_pp_size = 1;
  p.global_batch_size = p.micro_batch_size;
  p.overlap_grad_reduce = false;
  p.overlap_param_gather = false;
  p.layers_per_stage = {1, 1};
  Topology big = topology;
  int64_t per_node = topology.node.devices_per_node;
  big.num_nodes = std::max<int64_t>(topology.num_nodes, ceil_div(p.world_size(), per_node));
  StepProgram program = lower_program(two, big, p);
  for (const Role& role : program.roles) {
    for (const Op& op : role.ops) {
      if (op.kind == OpKind::alloc && op.buffer.rfind("comm.send.", 0) == 0) probe.send_staging = true;
      if (op.microbatch != 0) continue;
      if (!is_compute(op.kind) && !is_collective(op.kind) && !is_cp_ring_transfer(op)) continue;
      // A layer's own collectives only: under context parallelism dp × cp > 1 even here, and the
      // probe's gradient reductions over dp_cp are the stage's, costed below.
      if (is_collective(op.kind) && op.group != GroupKind::tp && op.group != GroupKind::cp) continue;
      if (op.layer >= 0) {
        if (role.pp_stage == 0) probe.layer_ops.push_back(op);
      } else if (role.pp_stage == 0) {
        probe.embedding_ops.push_back(op);
      } else {
        probe.loss_ops.push_back(op);
      }
    }
  }
  return probe;
}

}  // namespace

const LayerProbe& ProbeCache::get(const Plan& plan) {
  // Everything a layer's buffers depend on: cp (the tokens a rank holds, the exchange's buffers)
  // and FP8 (the kept casts) among them.
  auto key = std::make_tuple(plan.tp_size, plan.sequence_parallel, plan.micro_batch_size, int(plan.recompute),
                             int(plan.attention_impl), plan.dropout, plan.cp_size, int(plan.cp_comm_type),
                             int(plan.fp8.format), int(plan.fp8.scaling), int(plan.param_dtype),
                             plan.fp8.param_gather);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = probes_.find(key);
    if (it != probes_.end()) return *it->second;
  }
  auto probe = std::make_unique<LayerProbe>(build_probe(model_, topology_, plan));
  std::lock_guard<std::mutex> lock(mutex_);
  auto& slot = probes_[key];
  if (!slot) slot = std::move(probe);
  return *slot;
}

std::vector<StageMemoryBounds> stage_memory_bounds(const Plan& real_plan, const ModelConfig& model,
                                                   const Topology& topology,
                                                   const LayerProbe& probe) {
  Plan plan = memory_path_plan(real_plan);
  LowerContext c(model, topology, plan);
  const double act = dtype_bytes(c.act), grad = dtype_bytes(c.grad), wide = dtype_bytes(c.wide);
  const double sbh = double(c.s) * c.b * c.h, local = double(c.s_local) * c.b * c.h;
  const double logits = double(c.s) * c.b * c.vocab_local;
  const double runtime = topology.node.device.runtime_allowance_bytes;
  // Every buffer the embedding and the loss allocate for one microbatch (forward and backward),
  // and what they keep from forward to backward beyond the layers' kept activations.
  const double embedding_all = act * (2 * sbh + 3 * local) + local;
  const double embedding_kept = local * (act + 1);
  const double loss_all = logits * (2 * act + wide) + 3 * sbh * act + 3 * local * act +
                          3.0 * c.s * c.b * wide * double(c.t + 1);
  const double loss_kept = 2 * local * act + logits * wide;
  ScheduleShape shape{plan.pp_size, plan.virtual_pp_size, plan.num_microbatches()};
  std::vector<StageMemoryBounds> out;
  for (int64_t stage = 0; stage < plan.pp_size; ++stage) {
    StageLayout s = stage_layout(c, stage);
    StageMemoryBounds b;
    b.stage = stage;
    b.persistent_bytes = persistent_bytes(c, s);
    // Layers whose forward ran and backward did not, at most; passes likewise (the capped
    // schedule has the whole step's most in flight). Sends issued so far on the whole step's
    // schedule: their staging copies may all be live until its end.
    int64_t layers = 0, most_layers = 0, passes = 0, most_passes = 0;
    for (const PassAction& a : schedule_actions(plan.schedule, shape, stage)) {
      int64_t n = s.chunk_layers[size_t(a.chunk)];
      layers += a.forward ? n : -n;
      passes += a.forward ? 1 : -1;
      most_layers = std::max(most_layers, layers);
      most_passes = std::max(most_passes, passes);
    }
    double staging_lower = 0, staging_upper = 0;
    if (plan.pp_size > 1) {
      ScheduleShape whole{plan.pp_size, plan.virtual_pp_size, real_plan.num_microbatches()};
      int64_t k = 0, sends = 0;
      double best_lower = 0, best_upper = 0;
      for (const PassAction& a : schedule_actions(plan.schedule, whole, stage)) {
        int64_t vs = c.virtual_stage(stage, a.chunk);
        int64_t before = k;
        k += (a.forward ? 1 : -1) * s.chunk_layers[size_t(a.chunk)];
        // Right after a forward's last layer, before its own send: its layers' activations and
        // every earlier send's copy are live.
        if (a.forward) best_lower = std::max(best_lower, double(k) * probe.kept_bytes + double(sends) * local * act);
        bool sends_now = a.forward ? vs != c.num_virtual_stages - 1 : vs != 0;
        sends += sends_now;
        best_upper = std::max(best_upper, double(std::max(before, k)) * probe.kept_bytes +
                                              double(sends) * local * act);
      }
      staging_lower = probe.send_staging ? best_lower - double(most_layers) * probe.kept_bytes : 0;
      staging_upper = probe.send_staging ? best_upper - double(most_layers) * probe.kept_bytes : 0;
    }
    double kept = double(most_layers) * probe.kept_bytes;
    b.lower_bytes = b.persistent_bytes + kept + std::max(0.0, staging_lower) + runtime;
    double extra = probe.layer_peak_bytes + 3 * local * act + 64;
    if (s.has_first) extra += double(most_passes) * embedding_kept + embedding_all;
    if (s.has_last) extra += double(most_passes) * loss_kept + loss_all;
    double all_groups = 0, largest = 0, edge = 0, largest_layer = 0, largest_experts = 0;
    for (const Group& g : s.groups) {
      all_groups += double(g.elements);
      largest = std::max(largest, double(g.elements));
      if (g.kind == Group::layer) largest_layer = std::max(largest_layer, double(g.elements));
      else edge += double(g.elements);
      if (g.kind == Group::expert) largest_experts = std::max(largest_experts, double(g.elements));
    }
    if (plan.zero_stage >= 3) extra += (2 * largest_layer + edge) * act;  // gathered weights
    // (and the FP8 copies of a layer's and its experts', cast at each use, transposed too on such a device)
    if (plan.zero_stage >= 3 && c.fp8) {
      extra += 2 * storage_bytes(c.fp8_weights, largest_layer + largest_experts) * (c.fp8_weights_transposed ? 2 : 1);
    }
    if (plan.zero_stage >= 2) {  // full gradients waiting for their bucket's reduce_scatter
      double waiting = all_groups;
      if (plan.overlap_grad_reduce && plan.dp_size > 1) {
        waiting = std::min(all_groups, plan.grad_bucket_bytes / grad + 2 * largest);
      }
      extra += waiting * grad;
    }
    // Communication staging (comm class): every pipeline send's copy, live to the step's end, and
    // on a host topology one collective's scratch at a time, at most twice its payload (tree).
    if (plan.pp_size > 1) {
      extra += 2.0 * double(plan.num_microbatches() * plan.virtual_pp_size) * local * act;
    }
    if (topology.node.intra_node.kind == IntraNodeKind::shared_memory) {
      double payload = std::max({all_groups * std::max({act, grad, wide}), sbh * act, logits * wide});
      extra += 2 * payload + 64;
    }
    // Communication buffers: send staging copies (above, with the kept activations), and a
    // collective's scratch on shared-memory hosts, at most about its whole message.
    extra += std::max(0.0, staging_upper - std::max(0.0, staging_lower));
    if (topology.node.intra_node.kind == IntraNodeKind::shared_memory) {
      double replicated = 0;
      for (const Group& g : s.groups) replicated += double(g.sp_replicated);
      extra += 2 * (plan.grad_bucket_bytes + largest * std::max(act, grad) + replicated * grad +
                    sbh * act + 3.0 * c.s * c.b * wide * double(c.t)) + 256;
    }
    b.upper_bytes = b.lower_bytes + extra;
    out.push_back(b);
  }
  return out;
}

namespace {

// How quick_estimate costs collectives (uncontended_collective_s) and the links it sends on.
struct CollectiveCosts {
  const ComputeCostModel& compute;
  CollectiveCostModel collectives;
  LinkFigures lowering_links;  // the figures lowering chooses algorithms with

  double op_s(const Op& op, const GroupShape& shape) const {
    return uncontended_collective_op_s(compute, collectives, op, shape);
  }
  // A collective lowering would emit on `shape`: its algorithm as lowering chooses it.
  double new_s(OpKind kind, double bytes, const GroupShape& shape) const {
    if (shape.size <= 1) return 0;
    Algorithm algorithm = choose_algorithm(kind, bytes, shape, lowering_links);
    return uncontended_collective_s(compute, collectives, kind, algorithm, bytes, shape);
  }
};

// Bytes one rank sends in a probe's op list, by group kind ("tp"; "cp": its collectives and ring).
struct ProbeBytes {
  double tp = 0, cp = 0;
};

// Compute and exposed tp and cp communication seconds of a probe's op list (microbatch 0), as
// quick_estimate's stage_times reads them (the ring through CpRingClock).
StageTimes op_list_times(const std::vector<Op>& ops, const GroupShape& tp, const GroupShape& cp, CpRingClock ring,
                         const ComputeCostModel& cost_model, const CollectiveCosts& collective, ProbeBytes* bytes) {
  StageTimes t;
  *bytes = ProbeBytes{};
  for (const Op& op : ops) {
    if (is_cp_ring_transfer(op)) {
      ring.transfer(op);
      if (op.kind == OpKind::send) bytes->cp += op.bytes;
    } else if (is_compute(op.kind)) {
      double s = cost_model.op_time_s(op);
      t.compute_mb_s += s;
      if (op.phase == Phase::backward) t.backward_mb_s += s;
      ring.compute(op, s);
    } else if (is_collective(op.kind)) {
      const bool over_cp = op.group == GroupKind::cp;
      (over_cp ? bytes->cp : bytes->tp) += op.bytes;
      double s = collective.op_s(op, over_cp ? cp : tp);
      t.tp_mb_s += s;
      if (over_cp) t.cp_mb_s += s;
      ring.compute(op, s);
    }
  }
  t.tp_mb_s += ring.exposed_s();
  t.cp_mb_s += ring.exposed_s();
  return t;
}

void add_times(StageTimes& t, const StageTimes& part, double times) {
  t.compute_mb_s += part.compute_mb_s * times;
  t.backward_mb_s += part.backward_mb_s * times;
  t.tp_mb_s += part.tp_mb_s * times;
  t.cp_mb_s += part.cp_mb_s * times;
}

}  // namespace

QuickEstimate probe_estimate(const Plan& real_plan, const ModelConfig& model,
                             const Topology& topology, const LayerProbe& probe,
                             const ComputeCostModel& cost_model) {
  // The program quick_estimate reads is memory_path_plan's: its microbatch count decides which
  // reductions count as the step's.
  Plan plan = memory_path_plan(real_plan);
  LowerContext c(model, topology, plan);
  const CollectiveCosts collective{cost_model, simulator_collective_model(cost_model.profile(), topology), c.links};
  const int64_t per_node = topology.node.devices_per_node;
  const double act = dtype_bytes(c.act), grad = dtype_bytes(c.grad), wide = dtype_bytes(c.wide);
  const double local_bytes = double(c.s_local) * c.b * c.h * act;
  const int64_t m_lowered = plan.num_microbatches();
  const double bucket_bytes = plan.grad_bucket_bytes;
  const double gather_bucket_bytes = plan.grad_bucket_bytes / grad * act;
  // Every tp group has the same shape (tp divides the devices of a node), and every cp group
  // (cp ranks are tp apart; tp·cp either fits a node or spans whole ones).
  const GroupShape tp_shape = group_shape(c.grid, GroupKind::tp, 0, per_node);
  const GroupShape cp_shape = group_shape(c.grid, GroupKind::cp, 0, per_node);
  const CpRingClock ring = cp_ring_clock(c.grid, 0, per_node, collective.collectives);
  ProbeBytes layer_bytes, embedding_bytes, loss_bytes;
  const StageTimes layer =
      op_list_times(probe.layer_ops, tp_shape, cp_shape, ring, cost_model, collective, &layer_bytes);
  const StageTimes embedding =
      op_list_times(probe.embedding_ops, tp_shape, cp_shape, ring, cost_model, collective, &embedding_bytes);
  const StageTimes loss = op_list_times(probe.loss_ops, tp_shape, cp_shape, ring, cost_model, collective, &loss_bytes);
  const double layer_tp_bytes = layer_bytes.tp, embedding_tp_bytes = embedding_bytes.tp, loss_tp_bytes = loss_bytes.tp;
  const double m_real = double(real_plan.num_microbatches());
  std::map<std::string, double> comm_max;
  std::vector<StageTimes> stages;
  for (int64_t stage = 0; stage < plan.pp_size; ++stage) {
    StageLayout s = stage_layout(c, stage);
    int64_t rank = c.grid.rank(RankCoord{0, 0, stage});
    auto shape = [&](GroupKind kind) {
      if (kind != GroupKind::world) return group_shape(c.grid, kind, rank, per_node);
      GroupShape world;  // every rank: as group_shape counts it, without listing 16,384 ranks
      world.size = plan.world_size();
      world.nodes = ceil_div(world.size, per_node);
      world.members_per_node = world.size / world.nodes;
      return world;
    };
    // ZeRO's reductions and gathers run over the shard group (all of dp without hybrid sharding);
    // hybrid sharding adds the shards' all_reduce across the replicas.
    const bool hybrid = plan.num_distributed_optimizer_instances > 1;
    GroupShape tp = shape(GroupKind::tp),
               dp = shape(hybrid ? GroupKind::dp_shard : plan.cp_size > 1 ? GroupKind::dp_cp : GroupKind::dp);
    StageTimes t;
    t.stage = stage;
    int64_t layers = 0;
    for (int64_t n : s.chunk_layers) layers += n;
    add_times(t, layer, double(layers));
    if (s.has_first) add_times(t, embedding, 1);
    if (s.has_last) add_times(t, loss, 1);
    // Bytes this stage's rank sends per step, by group kind.
    std::map<std::string, double> comm;
    auto count = [&](const char* kind, double bytes) {
      if (bytes > 0) comm[kind] += bytes;
    };
    GroupShape replicas = shape(GroupKind::dp_replica);
    double replica_s = 0;
    int64_t replica_ops = 0;
    auto replica_reduction = [&](double bucket_shard_bytes) {
      if (!hybrid) return;
      replica_s += collective.new_s(OpKind::all_reduce, bucket_shard_bytes, replicas);
      ++replica_ops;
      count("dp_replica", bucket_shard_bytes);
    };
    const char* dp_key = hybrid ? "dp_shard" : plan.cp_size > 1 ? "dp_cp" : "dp";
    if (tp_shape.size > 1) {
      count("tp", m_real * (double(layers) * layer_tp_bytes + (s.has_first ? embedding_tp_bytes : 0) +
                            (s.has_last ? loss_tp_bytes : 0)));
    }
    count("cp", m_real * (double(layers) * layer_bytes.cp + (s.has_first ? embedding_bytes.cp : 0) +
                          (s.has_last ? loss_bytes.cp : 0)));
    // Pipeline sends of microbatch 0: forward out of every chunk but the last virtual stage,
    // backward out of every chunk but the first.
    auto send_s = [&](int64_t peer) {
      return collective.collectives.p2p_time_s(local_bytes, rank / per_node != peer / per_node);
    };
    if (plan.pp_size > 1) {
      for (int64_t chunk = 0; chunk < plan.virtual_pp_size; ++chunk) {
        if (chunk != s.last_chunk) {
          t.pp_mb_s += send_s(c.grid.pp_next(rank));
          count("pp", m_real * local_bytes);
        }
        if (chunk != s.first_chunk) {
          t.pp_mb_s += send_s(c.grid.pp_prev(rank));
          count("pp", m_real * local_bytes);
        }
      }
    }
    // Gradient buckets of one backward pass per chunk, in the order lowering fills them.
    double reduction_s = 0, reduction_bytes = 0;
    int64_t reduction_ops = 0;
    if (plan.dp_cp_size() > 1) {
      OpKind kind = plan.zero_stage == 0 ? OpKind::all_reduce : OpKind::reduce_scatter;
      for (int64_t chunk = 0; chunk < plan.virtual_pp_size; ++chunk) {
        // Lowering's order: output and final_norm, the layers last to first, position and
        // embedding.
        std::vector<const Group*> order;
        for (auto kind_first : {Group::output, Group::final_norm}) {
          for (const Group& g : s.groups) {
            if (g.chunk == chunk && g.kind == kind_first) order.push_back(&g);
          }
        }
        for (auto it = s.groups.rbegin(); it != s.groups.rend(); ++it) {
          if (it->chunk == chunk && it->kind == Group::layer) order.push_back(&*it);
        }
        for (auto kind_first : {Group::position, Group::embedding}) {
          for (const Group& g : s.groups) {
            if (g.chunk == chunk && g.kind == kind_first) order.push_back(&g);
          }
        }
        double bytes = 0, shard_bytes = 0;
        for (const Group* g : order) {
          bytes += double(g->elements) * grad;
          shard_bytes += double(c.shards.buffer_elements(ShardedState::optimizer, g->elements)) * grad;
          if (bytes >= bucket_bytes) {
            reduction_s += collective.new_s(kind, bytes, dp);
            ++reduction_ops;
            reduction_bytes += bytes;
            replica_reduction(shard_bytes);
            bytes = shard_bytes = 0;
          }
        }
        if (bytes > 0) {
          reduction_s += collective.new_s(kind, bytes, dp);
          ++reduction_ops;
          reduction_bytes += bytes;
          replica_reduction(shard_bytes);
        }
      }
    }
    double gathers_s = 0;
    int64_t gather_ops = 0;
    // fp8_param_gather: a layer's linear weights' codes in buckets of their own, a byte each (ZeRO-3:
    // gathered at each use; the layers' other tensors, whole, gathered after the step).
    const double fp8 = plan.fp8.param_gather ? double(c.layer_linear_weights()) : 0;
    const bool zero3 = plan.zero_stage == 3;
    if (plan.dp_cp_size() > 1 && (plan.zero_stage == 1 || plan.zero_stage == 2 || (zero3 && fp8 > 0))) {
      auto gather = [&](double& bytes) {
        gathers_s += collective.new_s(OpKind::all_gather, bytes, dp);
        ++gather_ops;
        count(dp_key, bytes);
        bytes = 0;
      };
      for (double unit : {act, fp8 > 0 && !zero3 ? 1.0 : 0.0}) {
        double bytes = 0;
        for (const Group& g : s.groups) {
          const double fp8_only = g.kind == Group::layer ? fp8 : 0;
          const double kept = zero3 && g.kind != Group::layer ? 0 : double(g.elements) - fp8_only;
          bytes += unit * (unit == act ? kept : fp8_only);
          if (bytes > 0 && bytes >= gather_bucket_bytes / act * unit) gather(bytes);
        }
        if (bytes > 0) gather(bytes);
      }
    }
    double zero3_s = 0;
    if (plan.dp_cp_size() > 1 && plan.zero_stage >= 3) {
      // Every group's full weights gathered before each use: layers in forward and backward,
      // the embedding in both, the position table in forward, the loss's groups in both.
      for (const Group& g : s.groups) {
        const double bytes = fp8 > 0 && g.kind == Group::layer ? fp8 : double(g.elements) * act;
        double once = collective.new_s(OpKind::all_gather, bytes, dp);
        int uses = g.kind == Group::position ? 1 : 2;
        zero3_s += once * uses;
        count(dp_key, m_real * uses * bytes);
      }
      if (c.model.tie_word_embeddings && plan.pp_size == 1) {
        // The output layer reads the embedding's gathered weights, forward and backward.
        for (const Group& g : s.groups) {
          if (g.kind == Group::embedding) {
            zero3_s += 2 * collective.new_s(OpKind::all_gather, double(g.elements) * act, dp);
            count(dp_key, m_real * 2 * double(g.elements) * act);
          }
        }
      }
    }
    count(dp_key, plan.zero_stage >= 2 ? m_real * reduction_bytes : reduction_bytes);
    if (plan.zero_stage >= 2 && plan.dp_cp_size() == 1) {
      // The full gradient is copied into the shard after every pass.
      for (const Group& g : s.groups) {
        Op op;
        op.kind = OpKind::optimizer_step;
        op.phase = Phase::backward;
        op.name = OpName::grad_accumulate;
        op.flops = double(g.elements);
        op.bytes = 3 * double(g.elements) * grad;
        double sec = cost_model.op_time_s(op);
        t.compute_mb_s += sec;
        t.backward_mb_s += sec;
      }
    }
    // FP8 under ZeRO-3: the probe (one rank, nothing sharded) casts a layer's weights once, in its
    // forward; the program casts the gathered weights at each use, a second time in the backward,
    // which also makes the transposed copy on a device that needs one (the probe's forward did).
    for (const Group& g : s.groups) {
      if (!c.fp8 || (g.kind != Group::layer && g.kind != Group::expert)) continue;
      if (!(g.kind == Group::expert ? c.expert_shards : c.shards).sharded(ShardedState::weights)) continue;
      const double linear = double(g.elements - g.sp_replicated);
      const Fp8WeightsCast cost = c.block_scaled ? block_weights_cast(linear, c.act, c.fp8_weights)  // (row-wise)
                                                 : fp8_weights_cast(linear, c.act, !plan.fp8.delayed());
      Op cast;
      cast.kind = OpKind::activation;
      cast.phase = Phase::backward;
      cast.name = OpName::fp8_weights;
      cast.flops = cost.flops;
      cast.bytes = cost.bytes;
      const double cast_s = fp8 > 0 && g.kind == Group::layer ? 0 : cost_model.op_time_s(cast);  // (codes gathered)
      t.compute_mb_s += cast_s;
      t.backward_mb_s += cast_s;
      if (!c.fp8_weights_transposed) continue;
      Op transpose = cast;
      transpose.name = OpName::fp8_weights_transpose;
      transpose.flops = plan.fp8.mx() ? cost.flops : 0;
      transpose.bytes = cost.transpose_bytes;
      t.backward_mb_s += cost_model.op_time_s(transpose);
    }
    // Sequence parallel with sharded gradients: each group's replicated part all-reduced over tp in
    // every microbatch's full gradient, on the comm stream before its bucket (lowering's grads_ready).
    double sp_grads_s = 0;
    if (plan.sequence_parallel && c.shards.sharded(ShardedState::grads)) {
      for (const Group& g : s.groups) {
        if (g.sp_replicated == 0) continue;
        sp_grads_s += collective.new_s(OpKind::all_reduce, double(g.sp_replicated) * grad, tp);
        count("tp", m_real * double(g.sp_replicated) * grad);
      }
    }
    if (m_lowered == 1) {
      // One microbatch: its reductions are the step's (quick_estimate's reading).
      t.dp_step_s = gathers_s + reduction_s + zero3_s + sp_grads_s;
      t.dp_step_ops = gather_ops + 1;
    } else if (plan.zero_stage >= 2) {
      t.dp_mb_s = reduction_s + zero3_s + sp_grads_s;
      t.zero3_mb_s = zero3_s;
      t.dp_step_s = gathers_s;
      t.dp_step_ops = gather_ops;
    } else {
      t.dp_step_s = gathers_s + reduction_s;
      t.dp_step_ops = gather_ops + reduction_ops;
    }
    // The replicas' all_reduces: once per bucket per step (quick_estimate's reading).
    t.dp_step_s += replica_s;
    t.dp_step_ops += replica_ops;
    // Step level: gradient norm and AdamW on the optimizer shard, and their collectives.
    double shard = 0;
    for (const Group& g : s.groups) {
      shard += double(c.shards.buffer_elements(ShardedState::optimizer, g.elements));
    }
    Op norm;
    norm.kind = OpKind::optimizer_step;
    norm.phase = Phase::optimizer;
    norm.name = OpName::grad_norm;
    norm.flops = 2 * shard;
    norm.bytes = gradient_pass_bytes(c.act, c.grad) * shard;
    const Fp8StepLevel fp8_step = fp8_step_level(c, s, cost_model);
    Op adamw = norm;
    adamw.name = OpName::adamw;
    adamw.flops = 14 * shard;
    adamw.bytes = adamw_bytes(c.act, c.grad) * shard - fp8_step.spared_adamw_bytes;
    t.step_level_s += cost_model.op_time_s(norm) + cost_model.op_time_s(adamw) + fp8_step.compute_s;
    for (const auto& [kind, bytes] : fp8_step.all_reduces) {  // FP8's amax maxima
      GroupShape members = shape(kind);
      t.step_level_s += collective.new_s(OpKind::all_reduce, bytes, members);
      if (members.size > 1) count(kind == GroupKind::world ? "world" : dp_key, bytes);
    }
    GroupKind norm_group = plan.zero_stage == 0 ? GroupKind::model
                           : hybrid               ? GroupKind::instance
                                                  : GroupKind::world;
    GroupShape norm_shape = shape(norm_group);
    t.step_level_s += collective.new_s(OpKind::all_reduce, wide, norm_shape);
    if (norm_shape.size > 1) count(to_string(norm_group), wide);
    if (c.model.tie_word_embeddings && plan.pp_size > 1 && (s.has_first || s.has_last)) {
      for (const Group& g : s.groups) {
        if (g.kind != Group::embedding && g.kind != Group::output) continue;
        int64_t elements = c.shards.buffer_elements(ShardedState::grads, g.elements);
        GroupShape embedding_shape = shape(GroupKind::embedding);
        t.step_level_s += collective.new_s(OpKind::all_reduce, double(elements) * grad,
                                           embedding_shape);
        if (embedding_shape.size > 1) count("embedding", double(elements) * grad);
        break;
      }
    }
    if (plan.sequence_parallel && !c.shards.sharded(ShardedState::grads)) {
      double replicated = 0;
      for (const Group& g : s.groups) replicated += double(g.sp_replicated);
      t.step_level_s += collective.new_s(OpKind::all_reduce, replicated * grad, tp);
      count("tp", replicated * grad);
    }
    for (const auto& [kind, bytes] : comm) comm_max[kind] = std::max(comm_max[kind], bytes);
    stages.push_back(t);
  }
  QuickEstimate estimate = combine_replica_times(stages, real_plan, topology);
  estimate.comm_bytes_per_rank_max = comm_max;
  return estimate;
}

}  // namespace stepcast
