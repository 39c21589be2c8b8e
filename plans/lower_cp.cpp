// The attention core under context parallelism (Megatron-LM with Transformer Engine): a rank
// holds s = seq/cp tokens of every sequence (chunks i and 2·cp−1−i), its queries attend to the
// keys and values of the whole sequence, which the cp ranks exchange.
//
// p2p (the ring, TE's AttnFuncWithCPAndKVP2P): K/V packed from qkv travel cp−1 hops to cp_next;
// at step j a rank holds the block of cp rank (own − j) mod cp and computes its partial flash
// attention while the next block is in flight; each partial output is merged into ctx/lse by its
// log-sum-exp. Backward sends the blocks around again; each block's dK/dV accumulator travels
// with it, one hop behind, and arrives back at its owner after cp hops.
// allgather (AttnFuncWithCPAndKVAllGather): K/V gathered over cp before the one attention op,
// their gradients reduce-scattered after; backward gathers them again. Materialized attention
// uses the same gather (lower_layer.cpp: cp_score and cp_value over the gathered K/V).
// a2a (DeepSpeed-Ulysses, TE's AttnFuncWithCPAndQKVOA2A): q, k and v all-to-all exchanged so that
// a rank holds the whole sequence (in order) for 1/cp of its heads; the attention core runs there
// as without context parallelism (lower_layer.cpp, on the context's Ulysses view), and its output
// travels back; backward the same for d_ctx and d_qkv.
//
// Every attention op carries its K/V block in `kv` and `cp_step` (the ring step, −1: all blocks
// in cp rank order), n = the K/V rows; flops count the dense block, as the rest of the lowering
// counts causal attention.
#include <optional>

#include "lower_context.hpp"

namespace stepcast {

namespace {

int64_t kv_width(const LowerContext& c) { return 2 * c.kv_local * c.d; }

// Ring transfers are tagged after the pipeline's (which stay below 2 · microbatches · stages):
// one tag per (microbatch, layer, pass, step), pass 0 forward, 1 recompute, 2 backward K/V,
// 3 backward dK/dV.
int64_t cp_tag(const LowerContext& c, const OpSite& at, int64_t pass, int64_t step) {
  const int64_t base = 2 * c.plan.num_microbatches() * c.num_virtual_stages;
  const int64_t site = int64_t(at.microbatch) * c.model.num_hidden_layers + at.layer;
  return base + ((site * 4 + pass) * (c.cp + 1) + step);
}

double kv_bytes(const LowerContext& c, int64_t rows) {
  return double(rows) * double(c.b) * double(kv_width(c)) * dtype_bytes(c.act);
}

// The flash op of one K/V block (or of all of them, gathered): fields the interpreters read.
int32_t flash_block(OpEmitter& e, const OpSite& at, int64_t kv_rows, int32_t cp_step,
                    std::vector<BufferName> inputs, std::vector<BufferName> outputs, double pass_factor) {
  const LowerContext& c = e.ctx();
  double flops = pass_factor * 4.0 * c.b * c.heads_local * double(c.s) * double(kv_rows) * c.d;
  int32_t id = e.cp_attention(at, OpName::flash, flops, kv_rows, std::move(inputs), std::move(outputs));
  const_cast<Op&>(e.builder().role().ops[size_t(id)]).cp_step = cp_step;
  return id;
}

// A ring send with its host staging (freed at the end of the step, as pipeline sends' are).
void ring_send(OpEmitter& e, const OpSite& at, int64_t tag, double bytes, const std::string& buffer) {
  std::string staging;
  if (e.ctx().topology.node.intra_node.kind == IntraNodeKind::shared_memory) {
    staging = comm_scratch_prefix() + std::string("cp_send.") + to_string(at.phase) + "." + buffer;
    e.alloc(staging, BufferClass::comm, e.ctx().act, {int64_t(bytes / dtype_bytes(e.ctx().act) + 0.5)}, at.phase);
    e.defer_free(staging);
  }
  e.p2p(at, OpKind::send, Peer::cp_next, tag, bytes, buffer, staging, /*pipeline=*/false);
}

void ring_recv(OpEmitter& e, const OpSite& at, int64_t tag, double bytes, const std::string& buffer) {
  e.p2p(at, OpKind::recv, Peer::cp_prev, tag, bytes, buffer, "", /*pipeline=*/false);
}

}  // namespace

void emit_cp_gather_kv(OpEmitter& e, const OpSite& at, const std::string& qkv, const std::string& local,
                       const std::string& all) {
  const LowerContext& c = e.ctx();
  e.alloc(local, BufferClass::workspace, c.act, {c.s, c.b, kv_width(c)}, at.phase);
  e.compute(at, OpKind::activation, OpName::cp_kv_pack, 0, {qkv}, {local});
  e.alloc(all, BufferClass::workspace, c.act, {c.s_full, c.b, kv_width(c)}, at.phase);
  e.collective(at, OpKind::all_gather, GroupKind::cp, Stream::compute, OpName::cp_kv, kv_bytes(c, c.s_full),
               {local}, {all});
  e.free(local, at.phase);
}

void emit_cp_reduce_dkv(OpEmitter& e, const OpSite& at, const std::string& dkv_all, const std::string& dkv,
                        const std::string& d_qkv) {
  const LowerContext& c = e.ctx();
  e.alloc(dkv, BufferClass::workspace, c.act, {c.s, c.b, kv_width(c)}, at.phase);
  e.collective(at, OpKind::reduce_scatter, GroupKind::cp, Stream::compute, OpName::cp_dkv, kv_bytes(c, c.s_full),
               {dkv_all}, {dkv});
  e.free(dkv_all, at.phase);
  e.compute(at, OpKind::activation, OpName::cp_dkv, 0, {dkv, d_qkv}, {d_qkv});
  e.free(dkv, at.phase);
}

namespace {

// Ulysses' exchange: `x` re-laid by `split` into [cp][s, b, width/cp] blocks, block j of the send to
// (from) cp rank j, and the received blocks re-laid by `join` into `y` — allocated here after the
// all_to_all as [s_full, b, width/cp] in `y_class`, or by the caller when none is given.
void a2a_exchange(OpEmitter& e, const OpSite& at, const std::string& x, const std::string& y, int64_t width,
                  OpName split, OpName join, std::optional<BufferClass> y_class) {
  const LowerContext& c = e.ctx();
  const std::string send = y + ".a2a_send", recv = y + ".a2a_recv";
  const std::vector<int64_t> blocks = {c.cp, c.s, c.b, width / c.cp};
  e.alloc(send, BufferClass::workspace, c.act, blocks, at.phase);
  e.compute(at, OpKind::activation, split, 0, {x}, {send});
  e.alloc(recv, BufferClass::workspace, c.act, blocks, at.phase);
  e.collective(at, OpKind::all_to_all, GroupKind::cp, Stream::compute, OpName::cp_a2a,
               double(c.s) * c.b * width * dtype_bytes(c.act), {send}, {recv});
  e.free(send, at.phase);
  if (y_class) e.alloc(y, *y_class, c.act, {c.s_full, c.b, width / c.cp}, at.phase);
  e.compute(at, OpKind::activation, join, 0, {recv}, {y});
  e.free(recv, at.phase);
}

}  // namespace

void emit_a2a_to_sequence(OpEmitter& e, const OpSite& at, const std::string& x, const std::string& y, int64_t width,
                          BufferClass y_class) {
  a2a_exchange(e, at, x, y, width, OpName::cp_a2a_split_heads, OpName::cp_a2a_join_seq, y_class);
}

void emit_a2a_to_heads(OpEmitter& e, const OpSite& at, const std::string& x, const std::string& y, int64_t width) {
  a2a_exchange(e, at, x, y, width, OpName::cp_a2a_split_seq, OpName::cp_a2a_join_heads, std::nullopt);
}

void emit_cp_attention_forward(OpEmitter& e, const OpSite& at, const std::string& prefix) {
  const LowerContext& c = e.ctx();
  auto n = [&](const std::string& name) { return prefix + name; };
  const std::string qkv = n("qkv"), ctx = n("ctx"), lse = n("lse");
  if (c.plan.cp_comm_type == CpCommType::all_gather) {
    emit_cp_gather_kv(e, at, qkv, n("kv"), n("kv_all"));
    flash_block(e, at, c.s_full, -1, {qkv, n("kv_all")}, {ctx, lse}, 1.0);
    e.free(n("kv_all"), at.phase);
    return;
  }
  const int64_t pass = at.phase == Phase::recompute ? 1 : 0;
  const double bytes = kv_bytes(c, c.s);
  const std::vector<int64_t> kv_shape = {c.s, c.b, kv_width(c)};
  auto block = [&](int64_t j) { return n("kv." + std::to_string(j)); };
  e.alloc(block(0), BufferClass::workspace, c.act, kv_shape, at.phase);
  e.compute(at, OpKind::activation, OpName::cp_kv_pack, 0, {qkv}, {block(0)});
  for (int64_t j = 0; j < c.cp; ++j) {
    if (j + 1 < c.cp) {  // the next block travels while this one is computed on
      ring_send(e, at, cp_tag(c, at, pass, j), bytes, block(j));
      e.alloc(block(j + 1), BufferClass::workspace, c.act, kv_shape, at.phase);
      ring_recv(e, at, cp_tag(c, at, pass, j), bytes, block(j + 1));
    }
    if (j == 0) {
      flash_block(e, at, c.s, 0, {qkv, block(0)}, {ctx, lse}, 1.0);
    } else {
      const std::string part = n("ctx_part"), part_lse = n("lse_part");
      e.alloc(part, BufferClass::workspace, c.act, {c.s, c.b, c.heads_local * c.d}, at.phase);
      e.alloc(part_lse, BufferClass::workspace, c.wide, {c.b, c.heads_local, c.s}, at.phase);
      flash_block(e, at, c.s, int32_t(j), {qkv, block(j)}, {part, part_lse}, 1.0);
      e.compute(at, OpKind::activation, OpName::cp_merge, 4.0 * c.b * c.heads_local * c.s * (c.d + 1),
                {part, part_lse, ctx, lse}, {ctx, lse});
      e.free(part, at.phase);
      e.free(part_lse, at.phase);
    }
    e.free(block(j), at.phase);
  }
}

void emit_cp_attention_backward(OpEmitter& e, const OpSite& at, const std::string& prefix) {
  const LowerContext& c = e.ctx();
  const Phase bwd = at.phase;
  auto n = [&](const std::string& name) { return prefix + name; };
  const std::string qkv = n("qkv"), d_qkv = n("d_qkv");
  const std::vector<BufferName> saved = {qkv, n("ctx"), n("lse"), n("d_ctx")};
  // FlashAttention-2's backward recomputes the scores: 5 matmuls against the forward's 2.
  const double factor = 2.5;
  const std::vector<int64_t> kv_shape = {c.s, c.b, kv_width(c)};
  if (c.plan.cp_comm_type == CpCommType::all_gather) {
    emit_cp_gather_kv(e, at, qkv, n("bkv"), n("bkv_all"));
    std::vector<BufferName> inputs = saved;
    inputs.push_back(n("bkv_all"));
    e.alloc(n("dkv_all"), BufferClass::workspace, c.act, {c.s_full, c.b, kv_width(c)}, bwd);
    flash_block(e, at, c.s_full, -1, inputs, {d_qkv, n("dkv_all")}, factor);
    e.free(n("bkv_all"), bwd);
    emit_cp_reduce_dkv(e, at, n("dkv_all"), n("dkv"), d_qkv);
    return;
  }
  const double bytes = kv_bytes(c, c.s);
  auto block = [&](int64_t j) { return n("bkv." + std::to_string(j)); };
  auto acc = [&](int64_t j) { return n("dkv." + std::to_string(j)); };
  e.alloc(block(0), BufferClass::workspace, c.act, kv_shape, bwd);
  e.compute(at, OpKind::activation, OpName::cp_kv_pack, 0, {qkv}, {block(0)});
  // Transfers on the ring are posted in the order their peer posts the matching ones (the
  // simulator's mailboxes pair them in order): this step's accumulator, then the next block.
  for (int64_t j = 0; j < c.cp; ++j) {
    e.alloc(acc(j), BufferClass::workspace, c.act, kv_shape, bwd);
    if (j > 0) ring_recv(e, at, cp_tag(c, at, 3, j), bytes, acc(j));
    if (j + 1 < c.cp) {
      ring_send(e, at, cp_tag(c, at, 2, j), bytes, block(j));
      e.alloc(block(j + 1), BufferClass::workspace, c.act, kv_shape, bwd);
      ring_recv(e, at, cp_tag(c, at, 2, j), bytes, block(j + 1));
    }
    std::vector<BufferName> inputs = saved;
    inputs.push_back(block(j));
    if (j == 0) {  // this rank's own block starts its accumulator
      flash_block(e, at, c.s, 0, inputs, {d_qkv, acc(0)}, factor);
    } else {  // the accumulator of block (own − j) arrived from cp_prev, one hop behind its K/V
      const std::string part = n("dkv_part");
      e.alloc(part, BufferClass::workspace, c.act, kv_shape, bwd);
      inputs.push_back(d_qkv);  // dQ accumulates over the blocks
      flash_block(e, at, c.s, int32_t(j), inputs, {d_qkv, part}, factor);
      e.compute(at, OpKind::activation, OpName::cp_merge, 2.0 * c.s * c.b * kv_width(c), {part, acc(j)},
                {acc(j)});
      e.free(part, bwd);
    }
    e.free(block(j), bwd);
    ring_send(e, at, cp_tag(c, at, 3, j + 1), bytes, acc(j));
    e.free(acc(j), bwd);
  }
  // Every rank's contribution to this rank's block, after cp hops.
  e.alloc(n("dkv"), BufferClass::workspace, c.act, kv_shape, bwd);
  ring_recv(e, at, cp_tag(c, at, 3, c.cp), bytes, n("dkv"));
  e.compute(at, OpKind::activation, OpName::cp_dkv, 0, {n("dkv"), d_qkv}, {d_qkv});
  e.free(n("dkv"), bwd);
}

}  // namespace stepcast
