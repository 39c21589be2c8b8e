// Shapes and helpers shared by the lowering files (lower_context.cpp implements them; lower.cpp
// assembles the program from one RoleLowering per stage, lower_role.hpp; lower_layer.cpp emits the
// ops of a transformer layer). Internal to plans/.
// Symbols as in the papers: s sequence, b micro batch, h hidden, t tp_size, a heads, d head_dim.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "collective.hpp"
#include "model.hpp"
#include "plan.hpp"
#include "program.hpp"
#include "role_builder.hpp"
#include "shard_layout.hpp"

namespace stepcast {

// FP8 scale slots (fp8.hpp's Fp8Slot): kFp8SlotsPerLayer per layer of the model. Under current
// scaling (tensorwise) the inputs a layer's linear layers keep for their wgrads (the *_x kinds)
// have `inputs` slots each instead, after every layer's, microbatch m on m mod inputs: the codes
// keep the scale they were cast with until their wgrad reads them, while later microbatches'
// forwards cast the same layer's inputs, as Transformer Engine keeps each saved FP8 tensor's scale
// with it. `inputs` is the most microbatches a model chunk holds at once under the schedule (its
// forward run, its backward not): those form a run of consecutive microbatches, so no two share a
// slot. A MoE layer's routed experts: under delayed scaling they share the layer's MLP slots (the
// amax maximised over them); under current scaling each local expert has its own slots, as
// Transformer Engine's grouped linear layers quantize each expert's GEMM operands with its own
// quantizer: expert_slot gives local expert 0's slot of a kind, expert l's is l after it. After
// the layers' slots and their kept inputs', slot (L·kFp8SlotsPerLayer + k)·E_l + l for layer L,
// kind k, local expert l, then the experts' kept inputs ((L·4 + input kind)·inputs + m mod
// inputs)·E_l + l (E_l = experts / ep).
struct Fp8SlotLayout {
  int64_t layers = 0;
  bool current = false;
  int64_t inputs = 1;         // (current scaling) the slots of a kept input kind of a layer
  int64_t experts_local = 0;  // (current scaling with experts) E_l
  int64_t count() const;      // the length of fp8.scale and fp8.amax (the program's fp8_slots)
  int32_t slot(int64_t layer, int64_t microbatch, Fp8Slot kind) const;
  int32_t expert_slot(int64_t layer, int64_t microbatch, Fp8Slot kind) const;
  // The first of a layer's slots (its experts': their first), the base of an fp8_weights op's
  // slots: kind k at k after it (experts under current scaling: local expert l's at k·E_l + l).
  int32_t first_slot(int64_t layer, bool experts) const;
  int64_t dense_count() const;  // the layers' slots and their kept inputs', before the experts'
};
// The plan's layout (count() 0 without FP8).
Fp8SlotLayout fp8_slot_layout(const ModelConfig& model, const Plan& plan);

// Transformer Engine's cast of `linear` weight elements to FP8 (op fp8_weights): |w|, its maximum
// and the scaled rounding, three flops an element, the weights read and a byte written; current
// scaling reads them once more for their amax first. Their transposed copy (fp8_weights_transpose)
// reads a byte an element and writes one.
struct Fp8WeightsCast {
  double flops, bytes, transpose_bytes;
};
Fp8WeightsCast fp8_weights_cast(double linear, Dtype act, bool current);
// Block-scaled weights' (fp8.hpp; `weights` their storage): the weights read once and their
// row-wise copy written, each block's amax, scale and rounding. transpose_bytes: MX, the
// column-wise copy written in the same pass (its op, fp8_weights_transpose, as many flops);
// blockwise tiles, the row-wise copy read and written transposed (no flops).
Fp8WeightsCast block_weights_cast(double linear, Dtype act, Dtype weights);

struct LowerContext {
  LowerContext(const ModelConfig& model, const Topology& topology, const Plan& plan);

  const ModelConfig& model;
  const Topology& topology;
  const Plan& plan;
  RankGrid grid;
  LinkFigures links;
  ShardLayout shards;  // what a rank keeps of each parameter group under the plan's ZeRO stage
  ShardLayout expert_shards;  // the same for expert groups, sharded over the edp group

  int64_t s, b, h, t, d, f;  // s: the tokens of a sequence a rank holds (seq_length / cp)
  int64_t cp, s_full;   // context-parallel size, and the whole sequence (seq_length)
  int64_t s_local;      // sequence length a rank holds between tensor-parallel regions (s/t under SP)
  int64_t heads_local;  // a/t
  int64_t kv_local;     // kv/t
  int64_t qkv_width;    // (a + 2kv)·d/t
  int64_t f_local;      // f/t
  int64_t vocab_padded, vocab_local;
  Dtype act;            // activation and weight dtype
  Dtype grad;           // gradient dtype
  Dtype wide;           // statistics kept at least in fp32 (softmax of the loss, log-sum-exp): fp64 under fp64
  bool dropout;         // dropout > 0: masks exist (1 byte per element)
  bool fp8;             // FP8 linear layers (plan.fp8): their inputs, weights and output gradients
  // FP8 on a device that reads column-wise operands only from a transposed copy (its
  // fp8_columnwise): a wgrad's operands transposed (fp8_transposed), and each layer's FP8 weights
  // kept transposed for the dgrad GEMMs (fp8_weights_transposed).
  // Block-scaled (MXFP8, blockwise: plan.fp8.block_scaled(), fp8.hpp): the same buffers hold each
  // activation's and gradient's column-wise copy, quantized from the high-precision tensor, so
  // fp8_transposed is set and nothing is transposed; MX weights likewise (fp8_weights_transposed
  // set), blockwise 128×128 tiles transposed where the device needs it.
  bool fp8_transposed;
  bool fp8_weights_transposed;
  bool block_scaled;
  // The FP8 copy of a linear layer's input the backward keeps: "<stem>_f8" (its column-wise copy
  // "<stem>_f8_T" when block-scaled).
  std::string fp8_kept(const std::string& stem) const { return stem + (block_scaled ? "_f8_T" : "_f8"); }
  Dtype fp8_forward, fp8_backward;  // the storage of forward tensors and of gradients
  Dtype fp8_weights;                // of the layers' FP8 weight copies (blockwise: 128×128 tiles)
  Fp8SlotLayout fp8_slots;          // where each FP8 tensor's scale and amax live
  int64_t num_virtual_stages;
  // Mixture of experts (zeros without experts; lower_moe.cpp). T: tokens a rank routes per
  // microbatch (s_local·b); k: top-k; the ep·etp ranks of an expert block route N = T·k·ep·etp
  // token-copies over E experts, E_l = E/ep of them on a rank, each f_e/etp wide there.
  struct MoeShape {
    int64_t tokens = 0, top_k = 0, experts = 0, experts_local = 0, ep = 1, etp = 1;
    int64_t width_local = 0;   // f_e / etp
    int64_t shared_local = 0;  // shared experts' width / tp (0: none)
    int64_t send_rows = 0;     // permuted rows a rank sends: T·k (dropless), E·capacity
    int64_t expert_rows = 0;   // rows its local experts compute, after the etp gather: the worst
                               // the routing draws give (dropless) or E_l·capacity·ep·etp
    int64_t recv_rows = 0;     // rows the dispatch brings, before the etp gather
    int64_t rows_per_expert = 0;  // the mean an expert computes (the grouped GEMMs' m)
    int64_t capacity = 0;      // per expert per source rank; 0: dropless
  } moe;

  // Parameters of one layer held by one tensor-parallel rank; `sp_replicated` those replicated
  // over tp whose gradients need a tp all_reduce under sequence parallelism (norms, row biases).
  // The attention core's view under cp_comm_type a2a (Ulysses): the whole sequence, 1/cp of a
  // tensor-parallel rank's heads, and no context parallelism left inside the core.
  LowerContext ulysses_view() const;
  int64_t layer_params_local() const;
  int64_t layer_sp_replicated() const;
  int64_t norm_params() const;  // one norm (weight, and bias for LayerNorm)
  // The same for layer `layer`: a MoE layer's group holds attention, norms, the router (replicated
  // over tp) and the shared experts; its routed experts are a group of their own ("X<l>") of
  // expert_params_local() elements (E/ep experts, each f_e/etp wide; biases with use_bias).
  int64_t layer_params_local(int64_t layer) const;
  int64_t layer_sp_replicated(int64_t layer) const;
  int64_t expert_params_local() const;
  // A dense layer's linear weights on a tp rank (qkv, attn_out, the MLP's), fp8.hpp's kFp8Weights.
  int64_t layer_linear_weights() const;
  // The elements of layer `layer`'s weights buffer: all its parameters, or under fp8_param_gather
  // (dense layers) those kept in the plan's dtype, its linear weights living in FP8 only.
  int64_t layer_weights_local(int64_t layer) const;
  // Virtual stage of chunk `chunk` on stage `stage`, and its first global layer.
  int64_t virtual_stage(int64_t stage, int64_t chunk) const { return chunk * plan.pp_size + stage; }
  int64_t first_layer(int64_t virtual_stage) const;
};

// Where one op sits; copied into every op it emits.
struct OpSite {
  Phase phase = Phase::forward;
  int32_t layer = -1;
  int32_t microbatch = -1;
  int32_t chunk = -1;
};

// Emitters shared by the lowering files.
class OpEmitter {
 public:
  OpEmitter(const LowerContext& ctx, RoleBuilder& rb, int64_t first_rank)
      : ctx_(ctx), rb_(rb), first_rank_(first_rank) {}

  int32_t gemm(const OpSite& at, OpName name, Grad grad, int64_t m,
               int64_t n, int64_t k, std::vector<BufferName> inputs,
               std::vector<BufferName> outputs);
  // The same GEMM on FP8 operands of the layer's slot kinds (fp8.hpp) `a` (x or d_y) and `b`
  // (w, or d_y for wgrad), where the plan has fp8; a plain gemm otherwise.
  int32_t linear(const OpSite& at, OpName name, Grad grad, int64_t m, int64_t n, int64_t k,
                 std::vector<BufferName> inputs, std::vector<BufferName> outputs, Fp8Slot a, Fp8Slot b);
  // GEMM op `id` reads FP8 operands on the layer's slots a, b: its slots and bytes (a byte an FP8
  // operand element, the output in the plan's dtype, of one GEMM of its m, n, k).
  // `experts`: a grouped GEMM of the local experts, on their slots (Fp8SlotLayout::expert_slot).
  void mark_fp8(int32_t id, const OpSite& at, Fp8Slot a, Fp8Slot b, bool experts = false);
  // The transposed copy of the live FP8 operand x8 ([rows, elements / rows] → its transpose,
  // fp8_transposed_operand_name(x8), workspace) for the wgrads that read it on a device that
  // reads FP8 operands row-wise only; the caller frees it after its last wgrad.
  std::string fp8_transposed(const OpSite& at, const std::string& x8, int64_t rows);
  // FP8: `x` cast into a new buffer `name` [x's shape] of the slot kind's format; returns `name`.
  // Current scaling takes x's amax first, maximised over tp where `amax_over_tp` (a sequence-
  // parallel input, whose shards are cast before their gather).
  // `transposed`, on a device that reads FP8 operands row-wise only: the cast also writes the
  // codes transposed (fp8_cast_transpose; fp8_transposed_operand_name(name), workspace, as a wgrad
  // reads them; the caller frees it with `name`).
  // `counts`: a MoE expert buffer's counts, which say the rows it really holds (the rest of its
  // worst-case rows are not the step's, and stay out of the amax); its slots are the experts'
  // (Fp8SlotLayout::expert_slot), and under current scaling its amax op reads the counts too (each local
  // expert's rows, into its own slot).
  // Block-scaled (block_cast): no amax and no scale; `name` is x's row-wise copy and, with
  // `transposed`, "<name>_T" its column-wise copy, both [x's shape]; buffer_class is the class of
  // the copy the backward keeps (the column-wise one where there is one; the row-wise one is
  // workspace then).
  std::string fp8_cast(const OpSite& at, const std::string& x, const std::string& name, Fp8Slot kind,
                       BufferClass buffer_class, bool amax_over_tp = false, bool transposed = false,
                       const std::string& counts = "");
  std::string block_cast(const OpSite& at, const std::string& x, const std::string& name, int32_t slot, bool gradient,
                      BufferClass buffer_class, bool columnwise);
  // Compute op whose `bytes` are the sizes of its input and output buffers.
  int32_t compute(const OpSite& at, OpKind kind, OpName name, double flops,
                  std::vector<BufferName> inputs, std::vector<BufferName> outputs,
                  const std::vector<int32_t>& extra_deps = {});
  int32_t attention(const OpSite& at, OpName name, double flops,
                    std::vector<BufferName> inputs, std::vector<BufferName> outputs);
  // The same with n = `kv_rows` key rows (context parallelism: a K/V block, or the sequence).
  int32_t cp_attention(const OpSite& at, OpName name, double flops, int64_t kv_rows,
                       std::vector<BufferName> inputs, std::vector<BufferName> outputs);
  // Collective on `group`; `bytes` is the full buffer per rank. No op when the group has one
  // member (returns -1).
  int32_t collective(const OpSite& at, OpKind kind, GroupKind group, Stream stream,
                     OpName name, double bytes, std::vector<BufferName> inputs,
                     std::vector<BufferName> outputs, const std::vector<int32_t>& extra_deps = {});
  // A send with `staging` copies `buffer` into that comm buffer and sends from it. A pipeline
  // transfer is waited for by the next compute op unless the plan overlaps them; a
  // context-parallel ring transfer (pipeline false) only by the ops that read what it brings.
  // `tp_slice`: a send of this rank's 1/tp of `buffer` (scatter_gather_tensors_in_pipeline).
  int32_t p2p(const OpSite& at, OpKind kind, Peer peer, int64_t tag, double bytes,
              const std::string& buffer, const std::string& staging = "", bool pipeline = true,
              bool tp_slice = false);
  // A buffer to free at the end of the step (a send's staging: the send completes by then).
  void defer_free(const std::string& name) { deferred_frees_.push_back(name); }
  const std::vector<BufferName>& deferred_frees() const { return deferred_frees_; }
  int64_t group_size(GroupKind group) const;

  // Activation-shaped allocations.
  void alloc(const std::string& name, BufferClass c, Dtype dtype, std::vector<int64_t> shape,
             Phase phase) {
    rb_.alloc(name, c, dtype, std::move(shape), phase);
  }
  void free(const std::string& name, Phase phase) { rb_.free(name, phase); }
  bool is_live(const std::string& name) const { return rb_.is_live(name); }
  RoleBuilder& builder() { return rb_; }
  const LowerContext& ctx() const { return ctx_; }
  // An emitter into the same role on the context's Ulysses view (made on first use).
  OpEmitter& ulysses();

 private:
  double buffer_bytes(const std::vector<BufferName>& names) const;
  static Op op_at(const OpSite& at, OpKind kind, Stream stream, OpName name);
  // A compute-stream op's dependencies: `extra`, and the sends and receives it must wait for
  // when the plan does not overlap pipeline transfers (taken once: the next such op waits).
  std::vector<int32_t> waits_for_p2p(std::vector<int32_t> extra);
  const LowerContext& ctx_;
  RoleBuilder& rb_;
  int64_t first_rank_;
  std::vector<int32_t> unwaited_p2p_;  // transfers posted since the last compute-stream op
  std::vector<BufferName> deferred_frees_;
  std::unique_ptr<LowerContext> ulysses_ctx_;
  std::unique_ptr<OpEmitter> ulysses_;
};

// A one-layer probe's FP8 state (layer L0's FP8 weight copy "fp8w.L0", its slots' fp8.scale and
// fp8.amax), persistent; returns the copy's name, "" without FP8.
std::string alloc_probe_fp8_state(RoleBuilder& rb, const LowerContext& ctx);

// What a layer's forward pass keeps for backward.
enum class KeepMode {
  per_plan,        // as the plan's recompute says
  all_for_backward  // recompute pass before a backward: keep everything backward reads
};

// Where the layer reads its weights and writes its weight gradients.
struct LayerParams {
  std::string weights;
  std::string grads;
  std::string fp8_weights = "";  // FP8: the layer's FP8 weight copy the linear layers read
  std::string fp8_weights_t = "";  // and its transposed copy, which the dgrad GEMMs read (fp8_transposed)
  std::string expert_weights = "";  // MoE layer: its local experts' group ("weights.X<l>")
  std::string expert_grads = "";
  std::string expert_fp8_weights = "";    // FP8: the experts' FP8 copy ("fp8w.X<l>")
  std::string expert_fp8_weights_t = "";  // and its transposed copy (fp8_transposed)
};

// Transformer layer `layer` of microbatch `mb`: forward reads `x_in`, returns its output buffer
// name; backward consumes the gradient stream `g` in place (it becomes the gradient of x_in).
// The backward of an MLP's up (and, SwiGLU, gate) projections, a dense layer's or a MoE layer's
// shared experts' (lower_layer.cpp): from `<prefix>d_up` (and d_gate), the input gradient into d_x
// (allocated here, d_x_shape) and the weights' into wg; x is the layers' kept input as they read
// it (gathered under SP; its FP8 copy under FP8), wd the weights the dgrads read, width the
// rank's share of the MLP width. Frees d_up, d_gate and their FP8 copies.
void emit_mlp_input_backward(OpEmitter& e, const OpSite& at, const std::string& prefix, int64_t width,
                             const std::string& x, const std::string& d_x, const std::vector<int64_t>& d_x_shape,
                             const std::string& wd, const std::string& wg);

// A MoE layer's shared experts (lower_moe_shared.cpp): the forward returns their output [T, h]
// (workspace); the backward adds their input gradient into `<prefix>d_ln2`.
std::string emit_shared_experts_forward(OpEmitter& e, const OpSite& at, const std::string& prefix,
                                        const LayerParams& params, bool keep);
void emit_shared_experts_backward(OpEmitter& e, const OpSite& at, const std::string& prefix, const std::string& d,
                                  const LayerParams& params);

std::string emit_layer_forward(OpEmitter& e, const OpSite& at, const std::string& x_in,
                               const LayerParams& params, KeepMode keep);
void emit_layer_backward(OpEmitter& e, const OpSite& at, const std::string& x_in,
                         const std::string& g, const LayerParams& params);
// The MLP half of a MoE layer (lower_moe.cpp), from the attention block's output x_mid to the
// layer's output: norm, router, top-k and aux loss, permutation, dispatch, the local experts'
// grouped GEMMs, combine, un-permutation, shared experts, dropout and residual. `keep`: what
// backward reads survives the forward (false under full recompute).
std::string emit_moe_mlp_forward(OpEmitter& e, const OpSite& at, const std::string& prefix,
                                 const LayerParams& params, bool keep);
// Its backward: consumes the gradient stream `g` (the layer output's) and adds the MLP half's
// input gradient into it, frees what the forward kept.
void emit_moe_mlp_backward(OpEmitter& e, const OpSite& at, const std::string& prefix, const std::string& g,
                           const LayerParams& params);
// Buffer name prefix of a layer's tensors for one microbatch.
std::string layer_prefix(int32_t microbatch, int32_t layer);

// The optimizer's traffic per parameter of the shard, as Megatron-LM's mixed-precision optimizer
// moves it (megatron/optimizer/optimizer.py, Float16OptimizerWithFloat16Params.step at de7dc40,
// MixedPrecisionOptimizer today); 16-bit weights keep an fp32 master copy.
// The gradient pass (op grad_norm): 16-bit gradients cast to the fp32 main gradients, under fp16
// those unscaled in place with the inf/nan check (loss scaling), then read by the norm; without a
// master copy the norm reads the gradients as they are.
double gradient_pass_bytes(Dtype act, Dtype grad);
// AdamW (op adamw): the gradient (the fp32 main gradient with a master copy), the moments (and
// master) read and written, the weights written — with a master copy by a second kernel that reads
// the master again (_copy_main_params_to_model_params).
double adamw_bytes(Dtype act, Dtype grad);
// fp8_param_gather (fp8.hpp): the bytes AdamW spares per FP8 weight of its shard (no 16-bit copy
// written from a second read of the master), and the cost of fp8_param_absmax (`cast` false: the
// master shard read) or fp8_param_cast (read, and a code written) over `shard` elements.
double adamw_spared_bytes(Dtype act);
Fp8WeightsCast fp8_param_cost(double shard, Dtype wide, bool cast);
// The attention core under context parallelism (lower_cp.cpp), in place of the flash op: the
// forward reads prefix+"qkv" and writes prefix+"ctx" and prefix+"lse" (allocated by the caller);
// the backward reads those and prefix+"d_ctx" and writes prefix+"d_qkv".
void emit_cp_attention_forward(OpEmitter& e, const OpSite& at, const std::string& prefix);
void emit_cp_attention_backward(OpEmitter& e, const OpSite& at, const std::string& prefix);
// K and V of `qkv` packed into `local` and gathered over cp into `all` (rank order), `local` freed;
// and back: `dkv_all` reduce-scattered into `dkv`, written into d_qkv's K and V, both freed.
void emit_cp_gather_kv(OpEmitter& e, const OpSite& at, const std::string& qkv, const std::string& local,
                       const std::string& all);
void emit_cp_reduce_dkv(OpEmitter& e, const OpSite& at, const std::string& dkv_all, const std::string& dkv,
                        const std::string& d_qkv);
// cp_comm_type a2a (Ulysses, lower_cp.cpp): `x` [s, b, width] of this rank's tokens and every local
// head re-laid over the cp group into `y` [s_full, b, width/cp], the whole sequence for this rank's
// 1/cp of the heads (split, all_to_all, join); `y` allocated here in `y_class`. And back: `x`
// [s_full, b, width/cp] into `y` [s, b, width], which the caller allocated. width: a qkv width
// (q, k and v heads each split) or a ctx width.
void emit_a2a_to_sequence(OpEmitter& e, const OpSite& at, const std::string& x, const std::string& y, int64_t width,
                          BufferClass y_class);
void emit_a2a_to_heads(OpEmitter& e, const OpSite& at, const std::string& x, const std::string& y, int64_t width);

}  // namespace stepcast
