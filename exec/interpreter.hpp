// The interpreter of one rank's role: it walks the role's ops in list order and runs each on a
// backend, on buffers the arena holds under the names the program gives them, reading every
// operand by its slot (op_signature.hpp) and every GEMM and attention shape from the op. The
// rest of the local problem (hidden size, local vocabulary and heads, the sequence slice) comes
// from the program's resolved inputs, and ZeRO slices from shard_layout.hpp, as the lowering
// used them. It decides neither the schedule nor the dataflow.
//
// The member functions live in interpreter.cpp (buffers, data, dispatch, parameters),
// interpreter_layers.cpp (embedding, norm, GEMM, attention, activations, loss) and
// interpreter_comm.cpp (pipeline transfers, collectives, optimizer); each instantiates the four
// storage-type combinations of backend.hpp.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "arena.hpp"
#include "backend.hpp"
#include "checkpoint.hpp"
#include "data.hpp"
#include "zero_fill.hpp"
#include "executor.hpp"
#include "model.hpp"
#include "op_signature.hpp"
#include "param_layout.hpp"
#include "plan.hpp"
#include "program.hpp"
#include "rank_grid.hpp"
#include "shard_layout.hpp"

// Applies X(T, G, W) to the four storage-type combinations (backend.hpp) each interpreter file
// instantiates.
#define STEPCAST_FOR_EACH_STORAGE(X) \
  X(float, float, float)             \
  X(double, double, double)          \
  X(bf16, float, float)              \
  X(bf16, bf16, float)

namespace stepcast {

// The grid of an FP8 buffer's codes, by its dtype (fp8_e4m3 / fp8_e5m2, and their block-scaled buffers).
Fp8Storage fp8_storage(Dtype dtype);

// The parameter group of a group buffer: "weights.L3" → "L3"; "wfull.L3.mb0.forward" → "L3";
// "gradfull.L3.mb0" → "L3".
std::string group_of_buffer(const std::string& name);

template <class T, class G = T, class W = T>
class Interpreter {
 public:
  Interpreter(const StepProgram& program, const ModelConfig& model, const Plan& plan, const RunOptions& options,
              int64_t rank, Backend<T, G, W>& backend);
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // The arena's layout and its index of buffer names: host bookkeeping that grows with the
  // program (a few hundred bytes per buffer), not the step's memory; made before the measured
  // baseline.
  void index_arena();
  // The arena in backend memory, and the parameters' initial values in it.
  void create_arena();

  // One training step; returns the loss on this rank's share (summed), the caller reduces it.
  // With `records`, every op is timed (the backend synchronised around it).
  double step(int64_t step_index, std::vector<OpRecord>* records, double step_start);

  std::map<std::string, int64_t> algorithms_used() const { return backend_.algorithms_used(); }
  double last_grad_norm() const { return last_grad_norm_; }
  // MoE: token copies this rank's routing dropped at the expert capacity in the last step.
  int64_t moe_dropped_tokens() const { return moe_dropped_; }
  // MoE: token copies this rank's routing sent to each expert in each layer, dropped ones too,
  // over every step run ([layer · num_experts + expert]; the routing's forward, not recomputes).
  const std::vector<double>& moe_routed_by_layer() const { return moe_routed_by_layer_; }
  // ... and of each (step, microbatch, layer) routed: [step, microbatch, layer, copies per expert]
  // in turn, for the first `steps` steps reserve_moe_routing made room for.
  const std::vector<double>& moe_routing_samples() const { return moe_routing_samples_; }
  // Room for the routing of `steps` steps, allocated (and faulted in) now: call before the memory
  // baseline, so that the steps allocate nothing.
  void reserve_moe_routing(int64_t steps);
  // The arena's size as placed: the program's live peak plus what the placement could not pack
  // (the memory model's placement class).
  int64_t arena_extent_bytes() const { return arena_.extent_bytes(); }

  // The state a checkpoint holds: every persistent weights and optimizer buffer, in op order,
  // as host mirrors (download_state fills them; upload_state writes them back).
  StateBuffers state_buffers();
  StateBuffers download_state();
  void upload_state();

 private:
  template <class F>
  void for_each_state_buffer(F&& f) {
    size_t i = 0;
    for (const Op& op : role_.ops) {
      if (is_checkpointed_state(op)) f(op, i++);
    }
  }

  // ---- buffers (interpreter.cpp) ----
  // As X: T unless the buffer's class says G or W (the program's alloc dtype, checked).
  template <class X = T>
  X* buf(const std::string& name, const Op& op) {
    check_element_size(name, op, int(sizeof(X)));
    return reinterpret_cast<X*>(arena_.buffer(name, op.id));
  }
  void check_element_size(const std::string& name, const Op& op, int bytes) const;
  uint8_t* mask(const std::string& name, const Op& op) {
    return reinterpret_cast<uint8_t*>(arena_.buffer(name, op.id));
  }
  Dtype dtype(const std::string& name, const Op& op) const {
    return role_.ops[size_t(arena_.alloc_of(name, op.id))].dtype;
  }
  int64_t element_bytes(const std::string& name, const Op& op) const { return dtype_bytes(dtype(name, op)); }
  // Elements of the buffer, in its own dtype (a block-scaled buffer's codes, its scales not counted).
  int64_t count(const std::string& name, const Op& op) const {
    const int64_t bytes = arena_.bytes_of(arena_.alloc_of(name, op.id));
    const Fp8Blocks blocks = fp8_blocks(dtype(name, op));
    return blocks != Fp8Blocks::none ? block_elements(blocks, bytes) : bytes / element_bytes(name, op);
  }
  // The op's operands by slot.
  const Operands& operands(const Op& op) const { return operands_[size_t(op.id)]; }
  const std::string& in(const Op& op, const char* slot) const { return operands(op).in(slot); }
  const std::string& out(const Op& op, const char* slot) const { return operands(op).out(slot); }
  // A tensor of a parameter group's (full, unsharded) buffer: weights, wfull, grads or gradfull.
  bool has_tensor(const std::string& buffer, const std::string& tensor) const {
    return buffer_layout(buffer).has(tensor);
  }
  template <class X = T>
  X* slice(const std::string& buffer, const Op& op, const std::string& tensor) {
    return buf<X>(buffer, op) + buffer_layout(buffer).at(tensor).offset;
  }
  // A group buffer's layout: the group's, or under fp8_param_gather a layer's weights buffer's
  // (kept_layouts_: its tensors but the FP8 weights).
  const GroupLayout& buffer_layout(const std::string& buffer) const {
    const std::string group = group_of_buffer(buffer);
    auto kept = kept_layouts_.find(group);
    if (kept != kept_layouts_.end() && buffer.rfind("weights.", 0) == 0) return kept->second;
    return layouts_.at(group);
  }
  // The zero fills that no op touches (zero_fill.hpp's `untouched`): a persistent buffer's at the
  // step's start, another's at its alloc, as the buffers were always filled.
  void fill_untouched_persistent();

  // ---- ZeRO shards (shard_layout.hpp) ----
  int64_t dp_rank() const { return coord_.dp; }  // which samples the rank reads
  // Its place among the ranks a group's gradient is reduced and sharded over: dp × cp, or for a
  // MoE layer's experts ("X<l>") edp.
  static bool is_expert_group(const std::string& group) { return !group.empty() && group[0] == 'X'; }
  const ShardLayout& shards(const std::string& group) const {
    return is_expert_group(group) ? expert_shards_ : shards_;
  }
  int64_t shard_rank(const std::string& group) const {
    return is_expert_group(group) ? edp_index_ : grid_.dp_cp_index(rank_);
  }
  // The elements of a group this rank updates, and where element `e` of the group sits in the
  // rank's `state` buffer (at e − first of what the buffer holds).
  ShardRange owned(int64_t elements, const std::string& group) const {
    return shards(group).owned(elements, shard_rank(group));
  }
  int64_t held_first(ShardedState state, int64_t elements, const std::string& group) const {
    return shards(group).held(state, elements, shard_rank(group)).first;
  }

  // ---- parameters and data (interpreter.cpp) ----
  void initialize_parameters();
  void upload_ones(const Op& alloc);
  template <class X>
  void upload_initial_values(char* dst, const std::string& group, const GroupLayout& layout, int64_t first,
                             int64_t last);
  static int64_t optimizer_states(const Op& alloc);
  void load_data(const Op& alloc, DataBuffer what);
  const int64_t* samples(const Op& op);
  int64_t s0() const { return plan_.sequence_parallel ? coord_.tp * s_local_ : 0; }
  // Context parallelism: the global position of local row r of cp rank `cp_rank` (chunks cp_rank
  // and 2·cp−1−cp_rank of the sequence); runs of consecutive positions among `rows` local rows
  // from `first`, each {row offset, rows, first position}, for the kernels that take a start s0.
  int64_t position(int64_t cp_rank, int64_t r) const;
  struct PositionRun {
    int64_t offset, rows, s0;
  };
  std::vector<PositionRun> position_runs(int64_t first, int64_t rows) const;
  // Positions of the K/V rows a context-parallel flash op reads (its cp_step's block, or all).
  const std::vector<int64_t>& kv_positions(const Op& op);
  // Context parallelism's ops (interpreter_cp.cpp): flash over a K/V block, and the packing,
  // merging and gradient ops around it.
  void cp_attention(const Op& op);
  void cp_activation(const Op& op);
  // FP8 (interpreter_fp8.cpp): casts, GEMMs on FP8 operands, the end-of-step amax and scales.
  uint8_t* codes(const std::string& name, const Op& op) {
    check_element_size(name, op, 1);
    return reinterpret_cast<uint8_t*>(arena_.buffer(name, op.id));
  }
  Fp8Codes<W> fp8_codes(const std::string& name, const Op& op, int32_t slot);
  void fp8_activation(const Op& op);
  void fp8_gemm(const Op& op, const char* weight_tensor, const char* bias_tensor);
  // Block-scaled FP8, MXFP8 and blockwise (interpreter_blocks.cpp; fp8.hpp): the casts into
  // block-scaled buffers and the GEMMs on them. block_codes: `name`'s storage from byte `offset`.
  Fp8Codes<W> block_codes(const std::string& name, const Op& op, bool columnwise, int64_t offset = 0);
  void block_activation(const Op& op);
  void block_gemm(const Op& op, const char* weight_tensor, const char* bias_tensor);
  void fp8_step_end(const Op& op);
  // fp8_param_gather (interpreter_fp8.cpp): the FP8 weights' amax and cast from this rank's master
  // shard (fp8_param_absmax, fp8_param_cast); before the first step the casts, their amax
  // reduction and the gathers after the optimizer run once (as Megatron-LM quantizes the initial
  // weights); a gather of weights buffers whose shards are uneven (kept layouts) as a sum of the
  // shards, every rank's other elements zeroed (interpreter_comm.cpp).
  void fp8_param(const Op& op);
  void prime_fp8_params();
  void gather_by_sum(const Op& op);
  cpu::Dropout dropout(const Op& op, cpu::DropoutSite site) const {
    return cpu::Dropout{plan_.dropout, options_.seed, step_, op.layer, site};
  }
  void execute(const Op& op);

  // ---- mixture of experts (interpreter_moe.cpp) ----
  // Routing, permutation, un-permutation and the shared experts' sum; the local experts' grouped
  // GEMMs; the aux loss; the dispatch and combine all_to_alls with their counts.
  void moe_activation(const Op& op);
  void moe_gemm(const Op& op);
  void moe_aux(const Op& op);
  // The aux loss's counts summed over the sequence (`routed`; empty without), and its scale.
  std::vector<double> moe_routed(const Op& op);
  double moe_aux_scale(const Op& op, const std::vector<double>& routed) const;
  void moe_all_to_all(const Op& op);
  // The etp gather of the alltoall dispatcher: every etp rank's counts, then the rows.
  void moe_etp_gather(const Op& op);
  void moe_share_counts(const Op& op, int64_t row, int64_t mine, int64_t first);
  // FP8 expert GEMMs (one block's segments), an expert buffer's FP8 cast and its amax under current
  // scaling (its real rows, interpreter_fp8.cpp).
  void moe_fp8_gemm(const Op& op, const std::string& weights, const char* tensor, const char* bias,
                    const std::vector<int64_t>& experts, const std::vector<int64_t>& rows, int64_t in_at,
                    int64_t out_at, int64_t in_features, int64_t out_features);
  void moe_fp8_cast(const Op& op);
  void moe_fp8_absmax(const Op& op);
  // A run of one local expert's rows in an expert buffer: its elements from element `at`.
  struct ExpertRows {
    int64_t local, at, elements;
  };
  std::vector<ExpertRows> moe_expert_rows(const Op& op, const std::string& x);
  // The allgather dispatcher's routing gather (moe_route_gather): whole blocks of any dtype.
  void moe_gather_route(const Op& op);
  // `bytes` at send to every member of the group, member i's into recv + i·bytes (all_to_allv).
  void gather_blocks(GroupKind group, const char* send, char* recv, int64_t bytes);
  // An overflow of the dispatch buffers: `rows` copies for this rank's experts, `capacity` held.
  [[noreturn]] void moe_overflow(const Op& op, int64_t rows, int64_t capacity) const;
  // The op's counts [etp, ep, E] into moe_counts_; with route_idx, the permuted row of every token
  // copy into moe_rows_ (−1: dropped).
  void moe_read_counts(const Op& op);
  void moe_map_rows(const Op& op);
  void moe_zero_padding(const Op& op, const std::string& rows);
  // The allgather dispatcher's: route_idx is the expert block's [etp·ep·T, k]; every gathered
  // rank's counts are taken from it, and only this rank's experts' copies get rows (by source rank,
  // then local expert, in token order), the others −1. Returns the rows.
  int64_t moe_map_gathered_rows(const Op& op);
  bool moe_allgather() const { return plan_.moe.dispatcher == MoeDispatcher::allgather; }
  // The blocks of the experts' buffers: the alltoall dispatcher's etp blocks of ep sources each,
  // the allgather's one block of every source (the counts' rows).
  int64_t moe_blocks() const { return moe_allgather() ? 1 : grid_.etp_size(); }
  int64_t moe_tokens(const Op& op) const;
  // Rows of this rank's local expert `local` from counts row `source` (etp rank · ep + ep rank) in
  // the experts' buffers.
  int64_t moe_received(int64_t source, int64_t local) const {
    return moe_counts_[size_t(source * p_.moe.num_experts + ep_index_ * moe_local_ + local)];
  }
  // The counts row of ep rank `ep` in this rank's etp block (moe_row_ for this rank's own).
  int64_t moe_row_of(int64_t ep) const { return etp_index_ * grid_.ep_size() + ep; }

  // ---- layers (interpreter_layers.cpp) ----
  void embedding(const Op& op);
  void norm(const Op& op);
  void gemm(const Op& op);
  void mask_padded_vocab(T* logits, int64_t tokens);
  cpu::AttentionShape attention_shape(const Op& op) const;
  void attention(const Op& op);
  void activation(const Op& op);
  void add_bias_grad(const Op& op, const T* d, const std::string& grads);
  void loss(const Op& op);

  // ---- communication and optimizer (interpreter_comm.cpp) ----
  void p2p(const Op& op);
  void ps_transfer(const Op& op);  // a worker's transfer with a parameter server
  std::vector<Span<void>> spans(std::span<const BufferName> names, const Op& op);
  Dtype dtype_of_all(std::span<const BufferName> names, const Op& op) const;
  void collective(const Op& op);
  bool counted_in_norm(const std::string& group, const TensorSlice& tensor) const;
  void moe_norm_shares();
  void optimizer(const Op& op);

  const StepProgram& p_;
  const ModelConfig& model_;
  const Plan& plan_;
  const RunOptions& options_;
  int64_t rank_;
  RankGrid grid_;
  RankCoord coord_;
  const Role& role_;
  ShardLayout shards_;
  ShardLayout expert_shards_;  // expert groups, over edp
  int64_t ep_index_ = 0, edp_index_ = 0, moe_local_ = 0;  // moe_local_: E / ep
  // The etp rank (its block of the counts [etp, ep, E]) and this rank's row there.
  int64_t etp_index_ = 0, moe_row_ = 0;
  // ZeRO-0 with experts: which of this rank's tensors its gradient-norm share counts, and its
  // scale (moe_norm_shares).
  bool moe_norm_ = false, norm_counts_dense_ = true, norm_counts_replicated_ = true, norm_counts_experts_ = true;
  double norm_weight_ = 1.0;
  Backend<T, G, W>& backend_;
  Arena arena_;
  char* arena_memory_ = nullptr;
  bool arena_indexed_ = false;
  std::vector<Operands> operands_;  // per op id
  // The local problem: tp size, sequence, micro batch, hidden, sequence slice, vocabulary shard.
  // Under context parallelism s_ is the rank's tokens of a sequence, s_full_ the sequence.
  int64_t t_, s_, b_, h_, s_local_, vocab_local_;
  int64_t s_full_, cp_;
  int64_t kv_heads_local_;
  std::vector<int64_t> q_positions_, kv_positions_;  // context parallelism: this rank's, a block's
  // cp_comm_type a2a: the attention core holds the whole sequence for 1/cp of the heads; the
  // positions of the cp ranks' rows in cp rank order (the all_to_all's blocks).
  bool ulysses_ = false;
  std::vector<int64_t> a2a_positions_;
  double scale_;  // 1/√head_dim
  std::unique_ptr<TokenSource> source_;
  std::vector<int32_t> batch_tokens_, batch_targets_, staged_;  // one microbatch, host staging
  std::vector<int64_t> batch_samples_;
  int64_t staged_step_ = -1;  // the microbatch the staging holds
  int32_t staged_microbatch_ = -1;
  std::vector<std::vector<char>> host_state_;  // checkpoint mirrors of the state buffers
  std::vector<std::string> groups_;
  std::map<std::string, GroupLayout> layouts_;
  std::map<std::string, GroupLayout> kept_layouts_;  // fp8_param_gather: weights.L<l>'s (no FP8 weights)
  ZeroFills fills_;                  // zero_fill.hpp: each filled just before its first toucher
  std::vector<char> fill_at_alloc_;  // by op id: an untouched per-step buffer, filled at its alloc
  // per op: kAsyncCollective, a collective of the comm stream not yet waited for; kPostedSend, a
  // pipeline send posted and not yet completed (posted_sends_ lists them)
  std::vector<char> pending_async_;
  std::vector<int32_t> posted_sends_;
  static constexpr char kAsyncCollective = 1, kPostedSend = 2;
  std::vector<int32_t> moe_counts_, moe_idx_;  // host copies of an op's counts and route_idx
  std::vector<int64_t> moe_rows_, moe_cursor_, moe_bytes_[4];
  int64_t moe_dropped_ = 0;
  std::vector<double> moe_routed_by_layer_;
  std::vector<double> moe_routing_samples_;
  int64_t step_ = 0;
  double loss_sum_ = 0;
  double last_grad_norm_ = 0;
  bool trace_ops_ = false;  // STEPCAST_TRACE_OPS: print every op before it runs (debugging hangs)
};

}  // namespace stepcast
