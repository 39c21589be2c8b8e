// The one backend interface of the executor: memory, the compute kernels, communication, timers.
// The interpreter (executor.cpp) decides what runs on which buffers; a backend decides how: the
// CPU backend (cpu_backend.hpp: OpenBLAS kernels, MPI collectives with the recorded algorithms)
// and the CUDA backend (issue 6: cuBLASLt, own kernels, NCCL). Pointers passed to kernels and
// collectives are backend memory (host for the CPU, device for CUDA); upload/download cross it.
// Kernel signatures and semantics are cpu_kernels.hpp's, the reference every backend matches.
//
// Storage types per buffer class, as the program's allocs say: T activations and weights
// (param_dtype), G weight gradients (grad_dtype), W the wide class — loss statistics, softmax,
// attention lse, the gradient norm, master weights and Adam moments (fp32; fp64 with fp64
// weights). The CPU backend is Backend<T> (all three alike); the CUDA backend is
// Backend<bf16, float, float> (Megatron's mixed precision), <bf16, bf16, float> or
// <float, float, float>. Collectives and copies are typed by the program's dtype, not by T.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "bf16.hpp"
#include "errors.hpp"
#include "kernel_args.hpp"
#include "program.hpp"
#include "span.hpp"

namespace stepcast {

// The program's dtype of a storage type.
template <class X>
constexpr Dtype dtype_of() {
  static_assert(std::is_same_v<X, float> || std::is_same_v<X, double> || std::is_same_v<X, bf16>,
                "a storage type of the executor");
  return std::is_same_v<X, float> ? Dtype::fp32 : std::is_same_v<X, double> ? Dtype::fp64 : Dtype::bf16;
}

// An FP8 operand in backend memory: its codes, the scale it was cast with, its format.
template <class S>
// Block-scaled (fp8.hpp): a tensor's storage, its block scales inside it, row-wise or column-wise;
// no scale.
struct Fp8Codes {
  const uint8_t* codes;
  const S* scale;
  Fp8Storage format;
  Fp8Blocks blocks = Fp8Blocks::none;
  bool columnwise = false;
};

// Points of a run outside its steps, for decorators (backend hooks below).
enum class RunPoint {
  checkpoint_write,  // before this rank writes its checkpoint file
  records_gather,    // before the per-op records go to rank 0 (the last exchange of a run)
};

template <class T, class G = T, class W = T>
class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;

  // ---- memory ----
  virtual char* allocate(int64_t bytes) = 0;  // zero-filled
  virtual void release(char* memory) = 0;
  virtual void zero(void* memory, int64_t bytes) = 0;
  virtual void upload(void* backend_dst, const void* host_src, int64_t bytes) = 0;
  virtual void download(void* host_dst, const void* backend_src, int64_t bytes) = 0;

  // ---- small element-wise helpers the interpreter needs ----
  virtual void copy(void* dst, const void* src, int64_t bytes) = 0;           // backend memory
  virtual void add(G* y, const G* x, int64_t n) = 0;                          // y += x (grads)
  virtual void add_rows(T* x, const T* bias, int64_t rows, int64_t h) = 0;    // x[r] += bias
  virtual void sum_rows(const T* x, G* out, int64_t rows, int64_t h) = 0;     // out += Σ_r x[r]
  virtual void fill_columns(T* x, int64_t rows, int64_t cols, int64_t from, T value) = 0;
  virtual double sum(const W* x, int64_t n) = 0;

  // ---- compute kernels (cpu_kernels.hpp's semantics) ----
  virtual void linear_forward(const T* x, const T* w, const T* bias, T* y, int64_t tokens,
                              int64_t in, int64_t out) = 0;
  virtual void linear_backward_data(const T* dy, const T* w, T* dx, int64_t tokens, int64_t in,
                                    int64_t out, bool accumulate) = 0;
  virtual void linear_backward_weight(const T* dy, const T* x, G* dw, G* dbias, int64_t tokens,
                                      int64_t in, int64_t out) = 0;
  virtual void dropout_add_forward(const T* x, const T* residual, T* out, uint8_t* mask,
                                   int64_t s, int64_t b, int64_t h, const cpu::Dropout& dropout,
                                   int64_t s0, const int64_t* sample_index) = 0;
  virtual void dropout_backward(const T* dy, const uint8_t* mask, T* dx, int64_t n, double p) = 0;
  virtual void embedding_forward(const int32_t* tokens, const T* w, T* out, int64_t s, int64_t b,
                                 int64_t h, int64_t v0, int64_t v_local) = 0;
  virtual void embedding_backward(const int32_t* tokens, const T* dout, G* dw, int64_t s,
                                  int64_t b, int64_t h, int64_t v0, int64_t v_local) = 0;
  virtual void position_add_forward(T* x, const T* pos, int64_t s, int64_t b, int64_t h,
                                    int64_t s0, int64_t max_positions) = 0;
  virtual void position_add_backward(const T* dx, G* dpos, int64_t s, int64_t b, int64_t h,
                                     int64_t s0, int64_t max_positions) = 0;
  virtual void layernorm_forward(const T* x, const T* w, const T* bias, T* y, int64_t rows,
                                 int64_t h, double eps) = 0;
  virtual void layernorm_backward(const T* x, const T* w, const T* dy, T* dx, G* dw, G* db,
                                  int64_t rows, int64_t h, double eps) = 0;
  virtual void rmsnorm_forward(const T* x, const T* w, T* y, int64_t rows, int64_t h,
                               double eps) = 0;
  virtual void rmsnorm_backward(const T* x, const T* w, const T* dy, T* dx, G* dw, int64_t rows,
                                int64_t h, double eps) = 0;
  virtual void rotary_forward(T* qkv, const cpu::AttentionShape& shape, double theta,
                              int64_t s0) = 0;
  virtual void rotary_backward(T* d_qkv, const cpu::AttentionShape& shape, double theta,
                               int64_t s0) = 0;
  virtual void attention_score_forward(const T* qkv, T* scores, const cpu::AttentionShape& shape,
                                       double scale) = 0;
  virtual void softmax_forward(const T* scores, T* probs, int64_t rows, int64_t cols) = 0;
  virtual void attention_dropout_forward(const T* probs, T* probs_drop, uint8_t* mask,
                                         const cpu::AttentionShape& shape,
                                         const cpu::Dropout& dropout, int64_t head0,
                                         const int64_t* sample_index) = 0;
  virtual void attention_value_forward(const T* probs_used, const T* qkv, T* ctx,
                                       const cpu::AttentionShape& shape) = 0;
  virtual void attention_value_backward(const T* d_ctx, const T* probs_used, const T* qkv,
                                        T* d_probs_used, T* d_qkv,
                                        const cpu::AttentionShape& shape) = 0;
  virtual void softmax_backward(const T* d_probs, const T* probs, T* d_scores, int64_t rows,
                                int64_t cols) = 0;
  virtual void attention_score_backward(const T* d_scores, const T* qkv, T* d_qkv,
                                        const cpu::AttentionShape& shape, double scale) = 0;
  virtual void flash_attention_forward(const T* qkv, T* ctx, W* lse,
                                       const cpu::AttentionShape& shape, double scale,
                                       const cpu::Dropout* dropout, int64_t head0,
                                       const int64_t* sample_index) = 0;
  virtual void flash_attention_backward(const T* qkv, const T* ctx, const W* lse, const T* d_ctx,
                                        T* d_qkv, const cpu::AttentionShape& shape, double scale,
                                        const cpu::Dropout* dropout, int64_t head0,
                                        const int64_t* sample_index) = 0;
  // Context parallelism (cpu_kernels.hpp's cp_*). Positions are host arrays. A backend without
  // them refuses context-parallel programs when it reaches one of their ops.
  virtual void cp_kv_pack(const T* /*qkv*/, T* /*kv*/, const cpu::AttentionShape& /*shape*/) { no_cp(); }
  virtual void cp_kv_unpack(const T* /*d_kv*/, T* /*d_qkv*/, const cpu::AttentionShape& /*shape*/) { no_cp(); }
  virtual void cp_flash_forward(const T* /*qkv*/, const T* /*kv*/, int64_t /*n*/, const int64_t* /*q_pos*/,
                                const int64_t* /*kv_pos*/, T* /*ctx*/, W* /*lse*/, const cpu::AttentionShape& /*shape*/,
                                double /*scale*/, const cpu::Dropout* /*dropout*/, int64_t /*head0*/,
                                const int64_t* /*sample_index*/) {
    no_cp();
  }
  virtual void cp_flash_backward(const T* /*qkv*/, const T* /*kv*/, int64_t /*n*/, const int64_t* /*q_pos*/,
                                 const int64_t* /*kv_pos*/, const T* /*ctx*/, const W* /*lse*/, const T* /*d_ctx*/,
                                 T* /*d_qkv*/, bool /*accumulate*/, T* /*d_kv*/, const cpu::AttentionShape& /*shape*/,
                                 double /*scale*/, const cpu::Dropout* /*dropout*/, int64_t /*head0*/,
                                 const int64_t* /*sample_index*/) {
    no_cp();
  }
  virtual void cp_merge(T* /*ctx*/, W* /*lse*/, const T* /*ctx_part*/, const W* /*lse_part*/,
                        const cpu::AttentionShape& /*shape*/) {
    no_cp();
  }
  virtual void cp_accumulate(T* /*acc*/, const T* /*part*/, int64_t /*n*/) { no_cp(); }  // acc += part
  virtual void cp_score_forward(const T* /*qkv*/, const T* /*kv*/, int64_t /*n*/, const int64_t* /*q_pos*/,
                                const int64_t* /*kv_pos*/, T* /*scores*/, const cpu::AttentionShape& /*shape*/,
                                double /*scale*/) {
    no_cp();
  }
  virtual void cp_attention_dropout_forward(const T* /*probs*/, T* /*probs_drop*/, uint8_t* /*mask*/,
                                            const cpu::AttentionShape& /*shape*/, int64_t /*n*/,
                                            const int64_t* /*q_pos*/, const int64_t* /*kv_pos*/,
                                            const cpu::Dropout& /*dropout*/, int64_t /*head0*/,
                                            const int64_t* /*sample_index*/) {
    no_cp();
  }
  virtual void cp_value_forward(const T* /*probs_used*/, const T* /*kv*/, int64_t /*n*/, T* /*ctx*/,
                                const cpu::AttentionShape& /*shape*/) {
    no_cp();
  }
  virtual void cp_value_backward(const T* /*d_ctx*/, const T* /*probs_used*/, const T* /*kv*/, int64_t /*n*/,
                                 T* /*d_probs_used*/, T* /*d_kv*/, const cpu::AttentionShape& /*shape*/) {
    no_cp();
  }
  virtual void cp_score_backward(const T* /*d_scores*/, const T* /*qkv*/, const T* /*kv*/, int64_t /*n*/,
                                 T* /*d_qkv*/, T* /*d_kv*/, const cpu::AttentionShape& /*shape*/, double /*scale*/) {
    no_cp();
  }
  // cp_comm_type a2a (Ulysses): `sections` (q, k and v widths of a qkv row, or a ctx row's) each
  // split in `parts` ([rows, Σ] → [parts][rows, Σ/parts]) or joined back; rows of `width`
  // elements gathered (y[i] = x[index[i]]) or scattered (y[index[i]] = x[i]).
  virtual void cp_a2a_heads(const T* /*x*/, T* /*y*/, int64_t /*rows*/, const std::vector<int64_t>& /*sections*/,
                            int64_t /*parts*/, bool /*split*/) {
    no_cp();
  }
  virtual void cp_permute_rows(const T* /*x*/, T* /*y*/, const int64_t* /*index*/, int64_t /*n*/, int64_t /*width*/,
                               bool /*gather*/) {
    no_cp();
  }
  // FP8 (cpu_kernels.hpp's fp8_*). Scales point into the program's fp8.scale buffer (backend
  // memory); codes are the FP8 buffers' bytes. A backend without them refuses FP8 programs.
  virtual void fp8_cast(const T* /*x*/, uint8_t* /*y*/, int64_t /*n*/, const W* /*scale*/, W* /*amax*/,
                        Fp8Storage /*format*/) {
    no_fp8();
  }
  virtual void fp8_linear_forward(const Fp8Codes<W>& /*x*/, const Fp8Codes<W>& /*w*/, const T* /*bias*/, T* /*y*/,
                                  int64_t /*tokens*/, int64_t /*in*/, int64_t /*out*/) {
    no_fp8();
  }
  // w's codes row-major [out, in], or with w_transposed its transposed copy [in, out] (fp8_transpose).
  virtual void fp8_linear_backward_data(const Fp8Codes<W>& /*dy*/, const Fp8Codes<W>& /*w*/, T* /*dx*/,
                                        int64_t /*tokens*/, int64_t /*in*/, int64_t /*out*/, bool /*accumulate*/,
                                        bool /*w_transposed*/ = false) {
    no_fp8();
  }
  // Block-scaled FP8 (MXFP8, blockwise): x [rows, cols] into y's storage, blocked row-wise or
  // column-wise, or in tiles (cpu_kernels.hpp's).
  virtual void block_cast(const T* /*x*/, uint8_t* /*y*/, int64_t /*rows*/, int64_t /*cols*/, Fp8Blocks /*blocks*/,
                          bool /*columnwise*/, Fp8Storage /*format*/, bool /*power_of_two*/) {
    no_block_scaling();
  }
  // y [cols, rows] = x [rows, cols]ᵀ, bytes (a layer's FP8 weight codes for the dgrad GEMMs, a
  // wgrad operand's codes).
  virtual void fp8_transpose(const uint8_t* /*x*/, uint8_t* /*y*/, int64_t /*rows*/, int64_t /*cols*/) { no_fp8(); }
  // dw[out, in] += dy[tokens, out]ᵀ · x[tokens, in]. dy_t and x_t (both or neither): the program's
  // transposed copies of their codes, [out, tokens] and [in, tokens], which the GEMM reads instead
  // (dy's row-major codes still give the bias gradient).
  virtual void fp8_linear_backward_weight(const Fp8Codes<W>& /*dy*/, const Fp8Codes<W>& /*x*/, G* /*dw*/,
                                          G* /*dbias*/, int64_t /*tokens*/, int64_t /*in*/, int64_t /*out*/,
                                          const uint8_t* /*dy_t*/ = nullptr, const uint8_t* /*x_t*/ = nullptr) {
    no_fp8();
  }
  virtual void fp8_scale_update(W* /*amax*/, W* /*history*/, W* /*scale*/, int64_t /*slots*/,
                                const Fp8Recipe& /*recipe*/) {
    no_fp8();
  }
  // x[i] = the maximum of x[i] over the group (the FP8 amax reduction).
  virtual void all_reduce_max(GroupKind /*group*/, W* /*x*/, int64_t /*n*/) { no_fp8(); }
  // Current scaling: *amax = max |x| (accumulate: the larger of *amax and max |x|, for a tensor in
  // pieces); *scale from *amax (fp8_current_scale).
  virtual void fp8_absmax(const T* /*x*/, int64_t /*n*/, W* /*amax*/, bool /*accumulate*/) { no_fp8(); }
  virtual void fp8_set_current_scale(const W* /*amax*/, W* /*scale*/, Fp8Storage /*format*/) { no_fp8(); }
  // Mixture of experts (cpu_kernels.hpp's moe_*). Row maps (`rows`, −1 dropped) are host arrays;
  // route_idx and counts are backend memory. A backend without them refuses MoE programs.
  virtual void moe_route_forward(const T* /*logits*/, T* /*probs*/, T* /*route_w*/, int32_t* /*route_idx*/,
                                 int32_t* /*counts*/, int64_t /*tokens*/, int64_t /*experts*/, int64_t /*top_k*/,
                                 int64_t /*capacity*/, bool /*normalize*/, bool /*drop_by_probs*/) {
    no_moe();
  }
  // `chosen` (host, [experts]): the copies routed to each expert over the whole sequence where
  // ranks split it; nullptr: count route_idx's.
  virtual double moe_aux_loss(const T* /*probs*/, const int32_t* /*route_idx*/, int64_t /*tokens*/,
                              int64_t /*experts*/, int64_t /*top_k*/, double /*scale*/, const double* /*chosen*/) {
    no_moe();
    return 0;
  }
  virtual void moe_route_backward(const T* /*probs*/, const int32_t* /*route_idx*/, const T* /*d_route_w*/,
                                  T* /*d_logits*/, int64_t /*tokens*/, int64_t /*experts*/, int64_t /*top_k*/,
                                  double /*aux_scale*/, const double* /*chosen*/, bool /*normalize*/) {
    no_moe();
  }
  virtual void moe_permute(const T* /*x*/, T* /*y*/, const int64_t* /*rows*/, int64_t /*tokens*/, int64_t /*top_k*/,
                           int64_t /*h*/, bool /*backward*/) {
    no_moe();
  }
  virtual void moe_unpermute_forward(const T* /*x*/, const T* /*route_w*/, const int64_t* /*rows*/, T* /*y*/,
                                     int64_t /*tokens*/, int64_t /*top_k*/, int64_t /*h*/) {
    no_moe();
  }
  virtual void moe_unpermute_backward(const T* /*d_y*/, const T* /*x*/, const T* /*route_w*/,
                                      const int64_t* /*rows*/, T* /*d_x*/, T* /*d_route_w*/, int64_t /*tokens*/,
                                      int64_t /*top_k*/, int64_t /*h*/) {
    no_moe();
  }
  virtual void moe_add(T* /*acc*/, const T* /*x*/, int64_t /*n*/) { no_moe(); }  // acc += x
  // The local experts' GEMMs of one MoE op, bias-free: segment i is rows[i] rows of the activations
  // (after segments 0…i−1) through weights w[i] (or into gradient dw[i], which may repeat: an expert
  // fed by several ep ranks) [out, in]. By default linear_*, one segment with rows at a time.
  virtual void expert_linear_forward(const T* x, const std::vector<const T*>& w, const std::vector<int64_t>& rows,
                                     T* y, int64_t in, int64_t out) {
    for (int64_t i = 0, row = 0; i < int64_t(rows.size()); row += rows[size_t(i)], ++i) {
      if (rows[size_t(i)] > 0) {
        linear_forward(x + row * in, w[size_t(i)], nullptr, y + row * out, rows[size_t(i)], in, out);
      }
    }
  }
  virtual void expert_linear_backward_data(const T* dy, const std::vector<const T*>& w,
                                           const std::vector<int64_t>& rows, T* dx, int64_t in, int64_t out,
                                           bool accumulate) {
    for (int64_t i = 0, row = 0; i < int64_t(rows.size()); row += rows[size_t(i)], ++i) {
      if (rows[size_t(i)] > 0) {
        linear_backward_data(dy + row * out, w[size_t(i)], dx + row * in, rows[size_t(i)], in, out, accumulate);
      }
    }
  }
  virtual void expert_linear_backward_weight(const T* dy, const T* x, const std::vector<G*>& dw,
                                             const std::vector<int64_t>& rows, int64_t in, int64_t out) {
    for (int64_t i = 0, row = 0; i < int64_t(rows.size()); row += rows[size_t(i)], ++i) {
      if (rows[size_t(i)] > 0) {
        linear_backward_weight(dy + row * out, x + row * in, dw[size_t(i)], nullptr, rows[size_t(i)], in, out);
      }
    }
  }
  // An all_to_all of variable blocks, in bytes: send[send_offsets[i], + send_bytes[i]) to member i,
  // recv[recv_offsets[j], + recv_bytes[j]) from member j (send blocks may overlap).
  virtual void all_to_allv(GroupKind /*group*/, const char* /*send*/, const std::vector<int64_t>& /*send_bytes*/,
                           const std::vector<int64_t>& /*send_offsets*/, char* /*recv*/,
                           const std::vector<int64_t>& /*recv_bytes*/, const std::vector<int64_t>& /*recv_offsets*/) {
    no_moe();
  }
  virtual void gelu_forward(const T* x, T* y, int64_t n) = 0;
  virtual void gelu_backward(const T* x, const T* dy, T* dx, int64_t n) = 0;
  virtual void swiglu_forward(const T* gate, const T* up, T* act, int64_t n) = 0;
  virtual void swiglu_backward(const T* gate, const T* up, const T* d_act, T* d_gate, T* d_up,
                               int64_t n) = 0;
  virtual void cross_entropy_stats(const T* logits, const int32_t* targets, W* stats,
                                   int64_t tokens, int64_t v0, int64_t v_local) = 0;
  virtual void cross_entropy_forward(const T* logits, const W* stats_all, int64_t tp, W* softmax,
                                     W* loss, int64_t tokens, int64_t v_local) = 0;
  virtual void cross_entropy_backward(const W* softmax, const int32_t* targets, T* dlogits,
                                      int64_t tokens, int64_t v0, int64_t v_local,
                                      double scale) = 0;
  virtual double grad_norm_sq(const G* g, int64_t n) = 0;
  // Σ over ranges of grad_norm_sq, in range order; a device backend sums on the device and
  // reads the total once (one host read per step, not one per tensor).
  virtual double grad_norm_sq(const std::vector<std::pair<const G*, int64_t>>& ranges) {
    double sum = 0;
    for (const auto& [g, n] : ranges) sum += grad_norm_sq(g, n);
    return sum;
  }
  // master null: `param` is the master copy (T == W); else the step updates the W master and
  // writes param = T(master).
  virtual void adamw_step(T* param, W* master, const G* grad, W* exp_avg, W* exp_avg_sq,
                          int64_t n, const cpu::AdamW& config, int64_t step,
                          double clip_coef) = 0;

  // ---- communication ----
  // Elements of `dtype` (the buffers' alloc dtype: one of T, G, W).
  virtual void all_reduce(GroupKind group, Algorithm algorithm, Dtype dtype,
                          std::vector<Span<void>> buffers) = 0;
  virtual void reduce_scatter(GroupKind group, Dtype dtype, std::vector<Span<void>> buffers) = 0;
  virtual void all_gather(GroupKind group, Dtype dtype, std::vector<Span<void>> buffers) = 0;
  // Block i of `send` (count / size elements) to member i; block j of `recv` from member j.
  virtual void all_to_all(GroupKind group, Dtype dtype, Span<void> send, Span<void> recv) = 0;
  virtual int group_size(GroupKind group) const = 0;
  virtual int group_index(GroupKind group) const = 0;
  virtual void send(const T* data, int64_t n, int peer, int64_t tag) = 0;  // returns at once
  virtual void recv(T* data, int64_t n, int peer, int64_t tag) = 0;        // blocks (watched)
  // Completes every posted send: at the end of a step, and before an op the program makes wait
  // for a send (a plan without overlap_p2p_comm).
  virtual void finish_sends() = 0;
  // The next collective's staging scratch, from the program's arena (comm class): a host
  // backend packs and receives chunks there instead of memory of its own. Others ignore it.
  virtual void set_collective_scratch(void* /*scratch*/, int64_t /*bytes*/) {}
  virtual std::map<std::string, int64_t> algorithms_used() const = 0;

  // ---- synchronisation and timers ----
  virtual void synchronize() = 0;
  virtual double now_s() = 0;  // after synchronize(): wall clock comparable across ranks
  virtual void set_current(const std::string& what) = 0;  // for the watchdog's message

  // ---- streams (a GPU backend; a host backend runs everything in order) ----
  // From begin_async(id) to end_async(id) all the backend is asked to do — op `id`, a collective
  // of the program's communication stream — runs on the backend's communication stream, after
  // everything issued before it; the interpreter calls wait_async(id) before the first later op
  // that depends on op `id` (its deps: readers, writers, and the free before memory is reused).
  virtual void begin_async(int32_t /*op_id*/) {}
  virtual void end_async(int32_t /*op_id*/) {}
  virtual void wait_async(int32_t /*op_id*/) {}

  // ---- progress, for decorators (forwarding_backend.hpp: tracing, the tests' faults) ----
  // A step begins (step_index counts from 0 over the training, a resume included); an op of the
  // program is about to run (every op, allocs and frees too); the run reaches `point`.
  virtual void begin_step(int64_t /*step_index*/) {}
  virtual void begin_op(const Op& /*op*/) {}
  virtual void reached(RunPoint /*point*/) {}

  // ---- measured memory ----
  // The device's own figures for measurement.json (CUDA: cudaMemGetInfo and the allocator's
  // high-water mark); empty for host backends, whose peak the executor reads from the process.
  virtual Json device_memory() const { return Json::object(); }
  // Bytes above the level before the arena at the device's high-water mark; < 0: not known here.
  virtual double device_peak_bytes() const { return -1; }

 protected:
  void no_fp8() const {
    throw InputError(std::string("the ") + name() + " backend does not run FP8 linear layers yet (plan key fp8); valid: "
                     "--backend cpu (FP8 emulated), or no fp8");
  }
  void no_block_scaling() const {
    throw InputError(std::string("the ") + name() +
                     " backend does not run block-scaled FP8 yet (plan key fp8_recipe \"mxfp8\" or \"blockwise\"); "
                     "valid: --backend cpu (emulated), or fp8_recipe \"delayed\" or \"tensorwise\"");
  }
  void no_moe() const {
    throw InputError(std::string("the ") + name() +
                     " backend does not run mixtures of experts yet (a model with num_local_experts); valid: "
                     "--backend cpu, or a dense model");
  }
  void no_cp() const {
    throw InputError(std::string("the ") + name() +
                     " backend does not run context parallelism yet (context_parallel_size > 1); valid: "
                     "--backend cpu, or context_parallel_size 1");
  }
};

}  // namespace stepcast
