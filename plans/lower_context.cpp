// LowerContext (the shapes of a lowering) and OpEmitter (one op of each kind into a role, with
// its bytes, flops and collective algorithm): shared by the lowering files (lower_context.hpp).
#include "lower_context.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include "errors.hpp"
#include "lower.hpp"
#include "schedule.hpp"

namespace stepcast {

namespace {

// The expert shapes of moe.hpp's MoeShape; dropless buffers hold the worst load the routing draws
// of this step put on one rank (every microbatch, every MoE layer, every ep rank).
LowerContext::MoeShape moe_shape(const ModelConfig& m, const Plan& p, int64_t tokens) {
  LowerContext::MoeShape x;
  x.tokens = tokens;
  x.top_k = p.moe.top_k;
  x.experts = m.num_experts;
  x.ep = p.moe.ep_size;
  x.etp = std::max<int64_t>(1, p.moe.etp_size);
  x.experts_local = x.experts / x.ep;
  x.width_local = m.moe_intermediate_size / x.etp;
  x.shared_local = m.n_shared_experts * m.moe_intermediate_size / p.tp_size;
  const int64_t routed = tokens * x.top_k * x.ep * x.etp;  // N: token-copies of an expert block
  x.rows_per_expert = (routed + x.experts - 1) / x.experts;
  if (!p.moe.dropless()) {
    x.capacity = expert_capacity(tokens * x.top_k, x.experts, p.moe.capacity_factor);
    x.send_rows = x.experts * x.capacity;
    x.expert_rows = x.experts_local * x.capacity * x.ep * x.etp;
    // The mean rows an expert computes: its capacity from each rank of the block, padded, or at
    // most that of the copies the routing keeps.
    const int64_t capacity_rows = x.capacity * x.ep * x.etp;
    x.rows_per_expert = p.moe.pad_to_capacity ? capacity_rows : std::min(x.rows_per_expert, capacity_rows);
  } else if (p.moe.dropless_any_routing) {
    x.send_rows = tokens * x.top_k;
    x.expert_rows = routed;  // every copy of the expert block on one rank's experts
  } else {
    x.send_rows = tokens * x.top_k;
    const int64_t microbatches = p.moe.draw_microbatches > 0    ? p.moe.draw_microbatches
                                 : p.moe.draw_microbatches == 0 ? p.num_microbatches()
                                                                : 0;
    auto size_for = [&](const std::vector<int64_t>& counts) {
      for (int64_t r = 0; r < x.ep; ++r) {
        int64_t load = 0;
        for (int64_t e = r * x.experts_local; e < (r + 1) * x.experts_local; ++e) load += counts[size_t(e)];
        x.expert_rows = std::max(x.expert_rows, load);
      }
    };
    for (int64_t l = m.first_k_dense_replace; l < m.num_hidden_layers && microbatches > 0; ++l) {
      const std::vector<std::vector<int64_t>>& samples = routing_samples(p.moe, l);
      if (!samples.empty()) {  // replayed: the heaviest of every sample the draws may pick
        for (const std::vector<int64_t>& sample : samples) size_for(scale_routing(sample, routed));
        continue;
      }
      const std::vector<double> shares = routing_shares(p.moe, x.experts, l);
      for (int64_t mb = 0; mb < microbatches; ++mb) size_for(draw_routing(shares, routed, p.moe.seed, mb, l));
    }
  }
  x.recv_rows = (x.expert_rows + x.etp - 1) / x.etp;
  x.expert_rows = x.recv_rows * x.etp;
  return x;
}

}  // namespace

LowerContext::LowerContext(const ModelConfig& m, const Topology& topo, const Plan& p)
    : model(m), topology(topo), plan(p),
      grid(p.tp_size, p.dp_size, p.pp_size, p.order, p.dp_shard_size(), p.cp_size, p.moe.ep_size,
           m.is_moe() ? std::max<int64_t>(1, p.moe.etp_size) : 1),
      links(link_figures(topo)), shards(p.zero_stage, p.dp_cp_size(), p.dp_shard_size()),
      expert_shards(p.zero_stage, grid.edp_size(), grid.edp_shard_size()) {
  cp = p.cp_size;
  s_full = m.seq_length;
  s = m.seq_length / cp;
  b = p.micro_batch_size;
  h = m.hidden_size;
  t = p.tp_size;
  d = m.head_dim();
  f = m.intermediate_size;
  s_local = p.sequence_parallel ? s / t : s;
  heads_local = m.num_attention_heads / t;
  kv_local = m.num_key_value_heads / t;
  qkv_width = (heads_local + 2 * kv_local) * d;
  f_local = f / t;
  vocab_padded = padded_vocab_size(m, t);
  vocab_local = vocab_padded / t;
  act = p.activation_dtype();
  grad = p.grad_dtype;
  wide = act == Dtype::fp64 ? Dtype::fp64 : Dtype::fp32;
  dropout = p.dropout > 0;
  fp8 = p.fp8.enabled();
  block_scaled = p.fp8.block_scaled();
  fp8_transposed = fp8 && (block_scaled || topo.node.device.fp8_transposed_copies);
  fp8_weights_transposed = fp8 && (p.fp8.mx() || topo.node.device.fp8_transposed_copies);
  const bool e5m2 = p.fp8.format == Fp8Format::hybrid;
  if (p.fp8.mx()) {
    fp8_forward = fp8_weights = Dtype::mxfp8_e4m3;
    fp8_backward = e5m2 ? Dtype::mxfp8_e5m2 : Dtype::mxfp8_e4m3;
  } else if (p.fp8.blockwise()) {
    fp8_forward = Dtype::fp8_block_e4m3;
    fp8_backward = e5m2 ? Dtype::fp8_block_e5m2 : Dtype::fp8_block_e4m3;
    fp8_weights = Dtype::fp8_tile_e4m3;
  } else {
    fp8_forward = fp8_weights = Dtype::fp8_e4m3;
    fp8_backward = e5m2 ? Dtype::fp8_e5m2 : Dtype::fp8_e4m3;
  }
  fp8_slots = fp8_slot_layout(m, p);
  num_virtual_stages = p.pp_size * p.virtual_pp_size;
  if (m.is_moe()) moe = moe_shape(m, p, s_local * b);
}

LowerContext LowerContext::ulysses_view() const {
  LowerContext u = *this;
  u.s = s_full;
  u.s_local = s_full;
  u.heads_local = heads_local / cp;
  u.kv_local = kv_local / cp;
  u.qkv_width = qkv_width / cp;
  u.cp = 1;
  return u;
}

OpEmitter& OpEmitter::ulysses() {
  if (!ulysses_) {
    ulysses_ctx_ = std::make_unique<LowerContext>(ctx_.ulysses_view());
    ulysses_ = std::make_unique<OpEmitter>(*ulysses_ctx_, rb_, first_rank_);
  }
  return *ulysses_;
}

int64_t LowerContext::norm_params() const {
  return model.norm == NormKind::layernorm ? 2 * h : h;
}

int64_t LowerContext::layer_params_local() const {
  int64_t gated = model.mlp == MlpKind::swiglu ? 2 : 1;
  int64_t column = h * qkv_width + gated * h * f_local;                  // qkv, mlp_up (+gate)
  int64_t row = heads_local * d * h + f_local * h;                       // attn_out, mlp_down
  int64_t column_bias = model.use_bias ? qkv_width + gated * f_local : 0;
  return column + row + column_bias + layer_sp_replicated();
}

int64_t LowerContext::layer_linear_weights() const {
  int64_t gated = model.mlp == MlpKind::swiglu ? 2 : 1;
  return h * qkv_width + gated * h * f_local + heads_local * d * h + f_local * h;
}

int64_t LowerContext::layer_weights_local(int64_t layer) const {
  return plan.fp8.param_gather ? layer_params_local(layer) - layer_linear_weights() : layer_params_local(layer);
}

int64_t LowerContext::layer_sp_replicated() const {
  int64_t row_bias = model.use_bias ? 2 * h : 0;  // attn_out and mlp_down biases
  return 2 * norm_params() + row_bias;
}

int64_t LowerContext::layer_params_local(int64_t layer) const {
  if (!model.is_moe_layer(layer)) return layer_params_local();
  int64_t gated = model.mlp == MlpKind::swiglu ? 2 : 1;
  int64_t attention = h * qkv_width + heads_local * d * h + (model.use_bias ? qkv_width : 0);
  int64_t shared = (gated + 1) * h * moe.shared_local + (model.use_bias ? gated * moe.shared_local : 0);
  return attention + shared + layer_sp_replicated(layer);
}

int64_t LowerContext::layer_sp_replicated(int64_t layer) const {
  if (!model.is_moe_layer(layer)) return layer_sp_replicated();
  const bool shared = moe.shared_local > 0;
  int64_t row_bias = model.use_bias ? (shared ? 2 : 1) * h : 0;  // attn_out (and shared mlp_down) biases
  int64_t router = moe.experts * h + (model.use_bias ? moe.experts : 0);  // replicated over tp
  return 2 * norm_params() + row_bias + router;
}

int64_t LowerContext::expert_params_local() const {
  int64_t gated = model.mlp == MlpKind::swiglu ? 2 : 1;
  int64_t one = (gated + 1) * h * moe.width_local + (model.use_bias ? gated * moe.width_local + h : 0);
  return moe.experts_local * one;
}

int64_t LowerContext::first_layer(int64_t vs) const {
  int64_t first = 0;
  for (int64_t i = 0; i < vs; ++i) first += plan.layers_per_stage[i];
  return first;
}

namespace {
// The kinds whose FP8 codes a forward keeps for its backward's wgrad, indexed 0..3.
int32_t saved_input_index(Fp8Slot kind) {
  switch (kind) {
    case Fp8Slot::qkv_x: return 0;
    case Fp8Slot::attn_out_x: return 1;
    case Fp8Slot::mlp_x: return 2;
    case Fp8Slot::mlp_down_x: return 3;
    default: return -1;
  }
}
constexpr int64_t kSavedInputKinds = 4;

// The most microbatches one model chunk of one stage holds at once (forward run, backward not):
// per chunk, not schedule.hpp's max_in_flight over all chunks, which under interleaving can pass
// the 2·pp microbatches the planner's memory path lowers.
int64_t most_microbatches_held(const Plan& plan) {
  const ScheduleShape shape{plan.pp_size, plan.virtual_pp_size, plan.num_microbatches()};
  int64_t most = 1;
  for (int64_t stage = 0; stage < plan.pp_size; ++stage) {
    std::vector<int64_t> held(size_t(plan.virtual_pp_size), 0);
    for (const PassAction& a : schedule_actions(plan.schedule, shape, stage)) {
      int64_t& n = held[size_t(a.chunk)];
      n += a.forward ? 1 : -1;
      most = std::max(most, n);
    }
  }
  return most;
}
}  // namespace

Fp8SlotLayout fp8_slot_layout(const ModelConfig& model, const Plan& plan) {
  Fp8SlotLayout l;
  if (!plan.fp8.enabled()) return l;
  l.layers = model.num_hidden_layers;
  l.current = plan.fp8.current();
  if (l.current) {
    l.inputs = most_microbatches_held(plan);
    if (model.is_moe()) l.experts_local = model.num_experts / plan.moe.ep_size;
  }
  return l;
}

int64_t Fp8SlotLayout::dense_count() const {
  return layers * (kFp8SlotsPerLayer + (current ? kSavedInputKinds * inputs : 0));
}

int64_t Fp8SlotLayout::count() const {
  return dense_count() + layers * experts_local * (kFp8SlotsPerLayer + kSavedInputKinds * inputs);
}

int32_t Fp8SlotLayout::slot(int64_t layer, int64_t microbatch, Fp8Slot kind) const {
  const int32_t input = saved_input_index(kind);
  int64_t at = layer * kFp8SlotsPerLayer + kind;
  if (current && input >= 0) {
    STEPCAST_CHECK(microbatch >= 0, "an FP8 input's slot for microbatch " + std::to_string(microbatch));
    at = layers * kFp8SlotsPerLayer + (layer * kSavedInputKinds + input) * inputs + microbatch % inputs;
  }
  STEPCAST_CHECK(at >= 0 && at < count(), "an FP8 slot in range");
  return int32_t(at);
}

int32_t Fp8SlotLayout::first_slot(int64_t layer, bool experts) const {
  if (!experts || experts_local == 0) return int32_t(layer * kFp8SlotsPerLayer);
  return int32_t(dense_count() + layer * kFp8SlotsPerLayer * experts_local);
}

int32_t Fp8SlotLayout::expert_slot(int64_t layer, int64_t microbatch, Fp8Slot kind) const {
  if (experts_local == 0) return slot(layer, microbatch, kind);  // delayed: the layer's
  const int32_t input = saved_input_index(kind);
  int64_t at = first_slot(layer, true) + kind * experts_local;
  if (input >= 0) {
    STEPCAST_CHECK(microbatch >= 0, "an expert FP8 input's slot for microbatch " + std::to_string(microbatch));
    at = dense_count() + layers * kFp8SlotsPerLayer * experts_local +
         ((layer * kSavedInputKinds + input) * inputs + microbatch % inputs) * experts_local;
  }
  STEPCAST_CHECK(at >= 0 && at + experts_local <= count(), "an expert FP8 slot in range");
  return int32_t(at);
}

Fp8WeightsCast fp8_weights_cast(double linear, Dtype act, bool current) {
  const double reads = current ? 2 : 1;
  return {(2 * reads + 1) * linear, linear * (reads * dtype_bytes(act) + 1), 2 * linear};
}

Fp8WeightsCast block_weights_cast(double linear, Dtype act, Dtype weights) {
  const double copy = storage_bytes(weights, linear);
  return {3.0 * linear, linear * dtype_bytes(act) + copy, is_mx_storage(weights) ? copy : 2 * copy};
}

std::string alloc_probe_fp8_state(RoleBuilder& rb, const LowerContext& ctx) {
  if (!ctx.fp8) return "";
  rb.alloc("fp8w.L0", BufferClass::weights, ctx.fp8_weights, {ctx.layer_params_local()}, Phase::forward, true);
  if (ctx.fp8_weights_transposed) {
    rb.alloc(fp8_transposed_copy_name("L0"), BufferClass::weights, ctx.fp8_weights, {ctx.layer_params_local()},
             Phase::forward, true);
  }
  for (const char* meta : {"fp8.scale", "fp8.amax"}) {
    if (ctx.block_scaled) continue;
    rb.alloc(meta, BufferClass::weights, ctx.wide, {ctx.fp8_slots.count()}, Phase::forward, true);
  }
  return "fp8w.L0";
}

// ---- OpEmitter ----

double OpEmitter::buffer_bytes(const std::vector<BufferName>& names) const {
  double total = 0;
  for (const auto& n : names) total += rb_.live_bytes(n);
  return total;
}

// An op of `kind` on `stream` at the site `at` (phase, layer, microbatch, chunk), named `name`.
Op OpEmitter::op_at(const OpSite& at, OpKind kind, Stream stream, OpName name) {
  Op op;
  op.kind = kind;
  op.stream = stream;
  op.phase = at.phase;
  op.name = name;
  op.layer = at.layer;
  op.microbatch = at.microbatch;
  op.chunk = at.chunk;
  return op;
}

int32_t OpEmitter::gemm(const OpSite& at, OpName name, Grad grad,
                        int64_t m, int64_t n, int64_t k, std::vector<BufferName> inputs,
                        std::vector<BufferName> outputs) {
  Op op = op_at(at, OpKind::gemm, Stream::compute, name);
  op.grad = grad;
  op.batch = 1;
  op.m = m;
  op.n = n;
  op.k = k;
  op.flops = 2.0 * double(m) * double(n) * double(k);
  // Operands in the activation dtype; a weight gradient is accumulated in the gradient dtype.
  double out_bytes = grad == Grad::wgrad ? dtype_bytes(ctx_.grad) : dtype_bytes(ctx_.act);
  op.bytes = (double(m) * k + double(k) * n) * dtype_bytes(ctx_.act) + double(m) * n * out_bytes;
  op.inputs = std::move(inputs);
  op.outputs = std::move(outputs);
  return rb_.emit(std::move(op), waits_for_p2p({}));
}

int32_t OpEmitter::linear(const OpSite& at, OpName name, Grad grad, int64_t m, int64_t n, int64_t k,
                          std::vector<BufferName> inputs, std::vector<BufferName> outputs, Fp8Slot a,
                          Fp8Slot b) {
  // A device that reads FP8 operands row-wise only (fp8_transposed) takes a wgrad's x [k, m] and
  // d_y [k, n] as transposed copies (x_t, d_y_t), which the CUDA backend's cuBLASLt TN GEMM reads:
  // one made already (d_y's by its fp8_cast_transpose; x's by fp8_transposed where wgrads share
  // it) or one made here by fp8_transposed and freed after the GEMM.
  std::vector<BufferName> transposed;
  if (ctx_.block_scaled && grad == Grad::wgrad) {
    // Block-scaled: the wgrad reads x's and d_y's column-wise copies; the caller passes x's (kept
    // from the forward), d_y's is its cast's "_T" output.
    STEPCAST_CHECK(inputs.size() == 2 && rb_.is_live(fp8_transposed_operand_name(inputs[1])),
                   "a block-scaled wgrad reads x and d_y's column-wise copy");
    inputs[1] = fp8_transposed_operand_name(inputs[1]);
  } else if (ctx_.fp8 && ctx_.fp8_transposed && grad == Grad::wgrad) {
    STEPCAST_CHECK(inputs.size() == 2, "an FP8 wgrad reads x and d_y");
    for (size_t i = 0; i < 2; ++i) {
      const std::string t = fp8_transposed_operand_name(inputs[i]);
      if (!rb_.is_live(t)) transposed.push_back(fp8_transposed(at, inputs[i], k));
      inputs.push_back(t);
    }
  }
  int32_t id = gemm(at, name, grad, m, n, k, std::move(inputs), std::move(outputs));
  for (const std::string& t : transposed) rb_.free(t, at.phase);
  if (ctx_.fp8) mark_fp8(id, at, a, b);
  return id;
}

void OpEmitter::mark_fp8(int32_t id, const OpSite& at, Fp8Slot a, Fp8Slot b, bool experts) {
  Op& op = const_cast<Op&>(rb_.role().ops[size_t(id)]);
  const Fp8SlotLayout& slots = ctx_.fp8_slots;
  op.fp8_slots = {experts ? slots.expert_slot(at.layer, at.microbatch, a) : slots.slot(at.layer, at.microbatch, a),
                  experts ? slots.expert_slot(at.layer, at.microbatch, b) : slots.slot(at.layer, at.microbatch, b)};
  const double out_bytes = op.grad == Grad::wgrad ? dtype_bytes(ctx_.grad) : dtype_bytes(ctx_.act);
  const double m = double(op.m), n = double(op.n), k = double(op.k);
  // (operands as the forward's: the weight's tiles carry fewer scale bytes; negligible either way)
  op.bytes = storage_bytes(ctx_.fp8_forward, m * k + k * n) + m * n * out_bytes;
}

std::string OpEmitter::fp8_transposed(const OpSite& at, const std::string& x8, int64_t rows) {
  const std::string t = fp8_transposed_operand_name(x8);
  const double elements = rb_.live_bytes(x8) / dtype_bytes(rb_.live_dtype(x8));
  const int64_t cols = int64_t(elements) / rows;
  STEPCAST_CHECK(rows > 0 && double(rows) * double(cols) == elements,
                 x8 + ": " + std::to_string(elements) + " FP8 elements are not " + std::to_string(rows) + " rows");
  rb_.alloc(t, BufferClass::workspace, rb_.live_dtype(x8), {cols, rows}, at.phase);
  int32_t id = compute(at, OpKind::activation, OpName::fp8_transpose, 0, {x8}, {t});
  Op& op = const_cast<Op&>(rb_.role().ops[size_t(id)]);
  op.m = rows;  // the operand's rows, written as the copy's columns
  op.n = cols;
  return t;
}

std::string OpEmitter::block_cast(const OpSite& at, const std::string& x, const std::string& name, int32_t slot,
                               bool gradient, BufferClass buffer_class, bool columnwise) {
  const OpShape shape = rb_.live_shape(x);
  const Dtype format = gradient ? ctx_.fp8_backward : ctx_.fp8_forward;
  const double elements = buffer_bytes({x}) / dtype_bytes(ctx_.act);
  const int64_t cols = shape.empty() ? 1 : shape.back();
  std::vector<BufferName> outputs = {name};
  rb_.alloc(name, columnwise ? BufferClass::workspace : buffer_class, format, shape, at.phase);
  if (columnwise) {
    outputs.push_back(fp8_transposed_operand_name(name));
    rb_.alloc(outputs.back(), buffer_class, format, shape, at.phase);
  }
  // Each block's |x|, maximum and scaled rounding: three flops an element a copy (x read once).
  int32_t id = compute(at, OpKind::activation, columnwise ? OpName::fp8_cast_transpose : OpName::fp8_cast,
                       3 * elements * double(outputs.size()), {x}, outputs);
  Op& op = const_cast<Op&>(rb_.role().ops[size_t(id)]);
  op.fp8_slots = {slot, -1};
  op.m = int64_t(elements) / cols;
  op.n = cols;
  return name;
}

std::string OpEmitter::fp8_cast(const OpSite& at, const std::string& x, const std::string& name, Fp8Slot kind,
                                BufferClass buffer_class, bool amax_over_tp, bool transposed,
                                const std::string& counts) {
  const int32_t slot = counts.empty() ? ctx_.fp8_slots.slot(at.layer, at.microbatch, kind)
                                      : ctx_.fp8_slots.expert_slot(at.layer, at.microbatch, kind);
  if (ctx_.block_scaled) return block_cast(at, x, name, slot, is_gradient_slot(kind), buffer_class, transposed);
  const double elements = buffer_bytes({x}) / dtype_bytes(ctx_.act);
  std::vector<BufferName> outputs = {name, "fp8.amax"};
  if (!ctx_.plan.fp8.delayed()) {  // current scaling: x's amax (read once), then the cast's scale from it
    std::vector<BufferName> amax_inputs = {x, "fp8.amax"};
    if (!counts.empty()) amax_inputs.push_back(counts);
    int32_t id = compute(at, OpKind::activation, OpName::fp8_absmax, 2 * elements, amax_inputs, {"fp8.amax"});
    const_cast<Op&>(rb_.role().ops[size_t(id)]).fp8_slots = {slot, -1};
    if (amax_over_tp) {
      id = collective(at, OpKind::all_reduce, GroupKind::tp, Stream::compute, OpName::fp8_amax,
                      double(dtype_bytes(ctx_.wide)), {"fp8.amax"}, {"fp8.amax"});
      if (id >= 0) const_cast<Op&>(rb_.role().ops[size_t(id)]).fp8_slots = {slot, -1};
    }
    outputs.push_back("fp8.scale");
  }
  const Dtype format = is_gradient_slot(kind) ? ctx_.fp8_backward : ctx_.fp8_forward;
  rb_.alloc(name, buffer_class, format, rb_.live_shape(x), at.phase);
  transposed = transposed && ctx_.fp8_transposed;
  int64_t rows = 0, cols = 0;  // of x, where the cast also writes its codes transposed
  if (transposed) {
    cols = rb_.live_shape(x).empty() ? 1 : rb_.live_shape(x).back();
    rows = int64_t(elements) / std::max<int64_t>(1, cols);
    const std::string t = fp8_transposed_operand_name(name);
    rb_.alloc(t, BufferClass::workspace, format, {cols, rows}, at.phase);
    outputs.insert(outputs.begin() + 1, t);
  }
  // |x|, its maximum, the scaled rounding: three flops an element (its bytes: x read, the codes
  // written, row-wise and, with `transposed`, transposed as well, in one pass as TE's kernel).
  std::vector<BufferName> inputs = {x, "fp8.scale", "fp8.amax"};
  if (!counts.empty()) inputs.push_back(counts);
  int32_t id = compute(at, OpKind::activation, transposed ? OpName::fp8_cast_transpose : OpName::fp8_cast,
                       3 * elements, std::move(inputs), outputs);
  Op& op = const_cast<Op&>(rb_.role().ops[size_t(id)]);
  op.fp8_slots = {slot, -1};
  if (transposed) {
    op.m = rows;
    op.n = cols;
  }
  return name;
}

int32_t OpEmitter::compute(const OpSite& at, OpKind kind, OpName name, double flops,
                           std::vector<BufferName> inputs, std::vector<BufferName> outputs,
                           const std::vector<int32_t>& extra_deps) {
  Op op = op_at(at, kind, Stream::compute, name);
  op.flops = flops;
  // Bytes moved: activation buffers read and written; parameter buffers count only where the
  // op is the optimizer (see emit_optimizer), not for a norm reading a whole layer's weights.
  double moved = 0;
  for (const auto& v : {std::cref(inputs), std::cref(outputs)}) {
    for (const auto& n : v.get()) {
      if (n.rfind("weights.", 0) == 0 || n.rfind("grads.", 0) == 0 || n.rfind("wfull.", 0) == 0 ||
          n.rfind("gradfull.", 0) == 0 || n.rfind("gradmb.", 0) == 0 || n.rfind("fp8.", 0) == 0) {  // (FP8 scales: a few bytes)
        continue;
      }
      moved += rb_.live_bytes(n);
    }
  }
  op.bytes = moved;
  op.inputs = std::move(inputs);
  op.outputs = std::move(outputs);
  return rb_.emit(std::move(op), waits_for_p2p(extra_deps));
}

std::vector<int32_t> OpEmitter::waits_for_p2p(std::vector<int32_t> extra) {
  extra.insert(extra.end(), unwaited_p2p_.begin(), unwaited_p2p_.end());
  unwaited_p2p_.clear();
  return extra;
}

int32_t OpEmitter::attention(const OpSite& at, OpName name, double flops,
                             std::vector<BufferName> inputs, std::vector<BufferName> outputs) {
  int32_t id = compute(at, OpKind::attention, name, flops, std::move(inputs), std::move(outputs));
  Op& op = const_cast<Op&>(rb_.role().ops[id]);
  op.batch = ctx_.b * ctx_.heads_local;
  op.m = ctx_.s;
  op.n = ctx_.s;
  op.k = ctx_.d;
  return id;
}

int32_t OpEmitter::cp_attention(const OpSite& at, OpName name, double flops, int64_t kv_rows,
                                std::vector<BufferName> inputs, std::vector<BufferName> outputs) {
  int32_t id = attention(at, name, flops, std::move(inputs), std::move(outputs));
  const_cast<Op&>(rb_.role().ops[size_t(id)]).n = kv_rows;
  return id;
}

int64_t OpEmitter::group_size(GroupKind group) const {
  return int64_t(ctx_.grid.group(group, first_rank_).size());
}

int32_t OpEmitter::collective(const OpSite& at, OpKind kind, GroupKind group, Stream stream,
                              OpName name, double bytes,
                              std::vector<BufferName> inputs, std::vector<BufferName> outputs,
                              const std::vector<int32_t>& extra_deps) {
  GroupShape shape = group_shape(ctx_.grid, group, first_rank_, ctx_.topology.node.devices_per_node);
  if (shape.size <= 1) return -1;
  Op op = op_at(at, kind, stream, name);
  op.group = group;
  op.bytes = bytes;
  op.algorithm = choose_algorithm(kind, bytes, shape, ctx_.links);
  // On a host (ranks on CPU cores sharing memory), the scratch the CPU backend packs and
  // receives chunks in: a comm buffer of the program, live around the op alone, written by it
  // (its last output; see is_comm_scratch), so `memory` and the simulator count it and the
  // executor takes it from the arena. NCCL works in place; its buffers are runtime memory.
  // (all_to_all exchanges straight between its buffers.)
  std::string scratch;
  if (ctx_.topology.node.intra_node.kind == IntraNodeKind::shared_memory && kind != OpKind::all_to_all) {
    const std::string& payload = outputs.empty() ? inputs.at(0) : outputs.at(0);
    Dtype dtype = rb_.live_dtype(payload);
    int64_t elements = int64_t(bytes / dtype_bytes(dtype) + 0.5);
    scratch = comm_scratch_prefix() + std::string(to_string(name)) + "." + std::to_string(rb_.last_op() + 2);  // op id
    rb_.alloc(scratch, BufferClass::comm, dtype,
              {collective_scratch_elements(kind, op.algorithm, shape, elements)}, at.phase);
    outputs.push_back(scratch);
  }
  op.inputs = std::move(inputs);
  op.outputs = std::move(outputs);
  int32_t id = rb_.emit(std::move(op), stream == Stream::compute ? waits_for_p2p(extra_deps) : extra_deps);
  if (!scratch.empty()) rb_.free(scratch, at.phase);
  return id;
}

int32_t OpEmitter::p2p(const OpSite& at, OpKind kind, Peer peer, int64_t tag, double bytes,
                       const std::string& buffer, const std::string& staging, bool pipeline, bool tp_slice) {
  Op op = op_at(at, kind, Stream::p2p, kind == OpKind::send ? OpName::send : OpName::recv);
  op.peer = peer;
  if (tp_slice) op.group = GroupKind::tp;
  if (tag < 0 || tag > kMaxTag) {
    throw InputError("plan: its pipeline and context-parallel transfers need tags up to " + std::to_string(tag) +
                     " (one per microbatch, virtual stage, layer and ring step), beyond the " +
                     std::to_string(kMaxTag) + " an MPI tag holds: valid: fewer microbatches per step "
                     "(global_batch_size / (micro_batch_size · dp_size)) or virtual stages");
  }
  op.tag = int32_t(tag);
  op.bytes = bytes;
  if (kind == OpKind::send) op.inputs = {buffer};
  else op.outputs = {buffer};
  if (!staging.empty()) op.outputs = {staging};  // a send writes its staging copy
  int32_t id = rb_.emit(std::move(op));
  if (pipeline && !ctx_.plan.overlap_p2p_comm) unwaited_p2p_.push_back(id);
  return id;
}

double gradient_pass_bytes(Dtype act, Dtype grad) {
  if (dtype_bytes(act) >= 4) return dtype_bytes(grad);
  double bytes = 4;                                           // the norm's read of the main gradients
  if (dtype_bytes(grad) < 4) bytes += dtype_bytes(grad) + 4;  // the cast
  if (act == Dtype::fp16) bytes += 8;                         // unscale and check
  return bytes;
}

// Without a master copy the weights' read is left out, as the CPU profile's adamw points
// (exec/profiler.cpp) count it.
double adamw_spared_bytes(Dtype act) { return dtype_bytes(act) < 4 ? 4 + dtype_bytes(act) : 0; }

Fp8WeightsCast fp8_param_cost(double shard, Dtype wide, bool cast) {
  return {(cast ? 3 : 1) * shard, shard * (dtype_bytes(wide) + (cast ? 1 : 0)), 0};
}

double adamw_bytes(Dtype act, Dtype grad) {
  if (dtype_bytes(act) >= 4) return dtype_bytes(grad) + 2 * 2 * 4.0 + dtype_bytes(act);
  return 4 + 2 * 3 * 4.0 + 4 + dtype_bytes(act);
}

}  // namespace stepcast
