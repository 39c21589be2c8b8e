// Time of one compute op on one device: a roofline over the device's peak flop/s and memory
// bandwidth, scaled by the profile's achievable fractions, plus the profile's fixed cost per
// kernel. Pure functions: the simulator charges these times, SimGrid only orders them.
//   gemm, attention score/value:  max(F / (peak·gemm_fraction), B / (bw·memory_fraction)) + gemm overhead
//   attention flash:              F / (peak·flash_fraction) + kernel overhead, or with measured
//                                 attention points (AttentionRateTable) F/2 / rate: the models are
//                                 causal, the kernel skips the masked half and the published
//                                 rates count that half alone; a context-parallel block (an
//                                 op that reads K/V) at the cp_flash points' rate where any
//   everything else:              max(F / vector_peak, B / (bw·memory_fraction)) + kernel overhead
// where vector_peak is the device's fp32 peak (elementwise work runs on the vector units). A
// datasheet profile with `gemm_tiling` divides the GEMM term by gemm_wave_efficiency (the tile
// slots of the op's waves that hold output), since its fraction comes from whole-wave shapes; one
// with a GEMM shape model (GemmEfficiency::output_half, k_half) by its shape_efficiency.
//
// A measured profile (profile.hpp's MeasuredTables, of the plan's dtype) replaces these where it
// has points:
//   gemm:                         F / rate(m, n, k), rate from the GEMM table of the op's variant
//                                 (forward, dgrad, wgrad) — GemmRateTable;
//   attention score/value:        Σ over the GEMMs the op is made of (attention_gemms) of
//                                 batch · 2·m·n·k / rate of that GEMM's variant and shape — on a
//                                 GPU (a profile not in order) the rate at batch · m rows: one
//                                 batched launch runs all the GEMMs' tiles together;
//   memory-bound families:        B / bandwidth(B), from the family's table — BandwidthTable;
//   other memory-bound ops:       max(F / vector_peak, B / measured bandwidth) + measured overhead.
// The measured times include every fixed cost, so no overhead is added to them.
//
// Materialized attention (the score, softmax and value ops, forward, recompute and backward;
// context parallelism's cp_score and cp_value, at the keys' length)
// is costed as above, op by op, then multiplied by the profile's measured correction where it has
// materialized attention points (standard attention measured whole, forward and backward):
//   r(seq, head_dim) = measured time / Σ the six ops' times above, at each point's shape
//                      (materialized_attention_ops), non-causal points first;
// log r is piecewise linear in log seq per head dimension and in log head_dim between them,
// clamped to the measured ones. What the ops-by-op sum leaves out (the batched GEMMs' tiling and
// epilogue at short k, the softmax's passes) is what the point measured; dropout and masks of
// the plan stay the plan's own ops.
//
// Communication, where the profile measured it (CollectiveTable): the time of a collective of the
// backend's algorithm, kind and group size at a message size, and of the staging copy a backend
// with staged sends makes before posting a send. The simulator uses them for groups inside one
// node (where the profile measured them), at the reuse distance of the op's operands where the
// profile measured collectives with operands out of cache (operand_reuse.hpp).
#pragma once

#include <array>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "profile.hpp"
#include "program.hpp"
#include "topology.hpp"

namespace stepcast {

struct OperandReuse;
class CollectiveReuseTable;
class GemmReuseTable;

// GEMM rate over a grid of shapes. The axes are the distinct m, n and k of the points; log(flop/s)
// is multilinear in (log2 m, log2 n, log2 k) inside the grid's box, and a query outside it is
// clamped to the box (the rate at the nearest face). Because log(flops) is linear in those
// coordinates, this is the same as interpolating log(time): it is exact for any power law
// time ∝ m^a·n^b·k^c and at every measured point. A grid with holes (a leave-one-out, or points
// not measured) is interpolated axis by axis — along the first axis on every grid line, then
// the second, then the third — where a line's missing entries are bridged by its two nearest
// measured neighbours (extrapolating linearly when the hole is at the line's end); the result is
// the mean log rate of the three cyclic axis orders (on a full grid all three equal the
// multilinear value).
class GemmRateTable {
 public:
  explicit GemmRateTable(const std::vector<GemmPoint>& points);  // points of one variant
  double flops_per_s(double m, double n, double k) const;
  bool empty() const { return values_.empty(); }

 private:
  double log_rate(const std::array<double, 3>& query, const std::array<int, 3>& order) const;
  std::array<std::vector<double>, 3> axes_;  // log2 of the distinct m, n, k, ascending
  std::vector<double> values_;               // log(flop/s) at [i_m][i_n][i_k]; NaN: not measured
};

// Time of one memory-bound kernel family over message size: log(bytes/s) piecewise linear in
// log(bytes) between the measured sizes (equivalently log-log in time); above the largest size at
// its bandwidth; below the smallest (B0, time t0) the kernel keeps its fixed cost: `fixed_s` (the
// profile's kernel_overhead_s, an empty kernel's duration) plus the rest of t0 scaled by bytes,
// fixed_s + (t0 − fixed_s)·B/B0 — never above t0, never below t0·B/B0 (the smallest size's
// bandwidth, what fixed_s 0 gives). Points of equal size are averaged in log.
class BandwidthTable {
 public:
  explicit BandwidthTable(const std::vector<MemoryPoint>& points, double fixed_s = 0);  // one family's
  double bandwidth_bytes_per_s(double bytes) const { return bytes / time_s(bytes); }
  double time_s(double bytes) const;
  bool empty() const { return log_bytes_.empty(); }

 private:
  std::vector<double> log_bytes_, log_bandwidth_;
  double fixed_s_ = 0;
};

// Time of one collective (kind, algorithm, group size) over message size, as measured whole
// (packing, transfers and reduction included): log(time) piecewise linear in log(bytes) between
// the measured sizes; below the smallest the smallest's time (latency-bound), above the largest
// the largest's bandwidth (time ∝ bytes). Points of equal size are averaged in log; a point
// slower than a larger message's takes that message's time (time never falls with bytes).
class CollectiveTable {
 public:
  CollectiveTable() = default;
  explicit CollectiveTable(const std::vector<CollectivePoint>& points);
  double time_s(double bytes) const;
  bool empty() const { return log_bytes_.empty(); }

 private:
  std::vector<double> log_bytes_, log_time_;
};

// Fused attention throughput from measured points (profile.hpp's AttentionPoint): for a pass,
// the points of the nearest head dimension (in log), causal ones first, log(rate) piecewise
// linear in log(seq) and clamped to the measured sequences. A pass without points uses the
// forward_backward points (the two passes at one rate: their sum is what was measured).
class AttentionRateTable {
 public:
  explicit AttentionRateTable(const std::vector<AttentionPoint>& points) : points_(points) {}
  bool empty() const { return points_.empty(); }
  // FlashAttention-convention flop/s (causal halved) of `pass` at (seq, head_dim).
  double flops_per_s(const std::string& pass, int64_t seq, int64_t head_dim) const;

 private:
  std::vector<AttentionPoint> points_;
};

// One GEMM an attention op is made of: `variant`'s table at (m, n, k), `count` times.
struct AttentionGemm {
  std::string variant;
  int64_t m = 0, n = 0, k = 0;
  int64_t count = 0;
};
// The six ops of one materialized attention core as lowering emits them for `batch` sequences
// of `heads` heads (seq × seq scores, head_dim): forward score, softmax, value, then backward
// value, softmax, score — no dropout, no tensor or context parallelism, activations in `act`
// (plans/lower_layer.cpp's emit_attention_scores and emit_attention_core_*; a test checks that
// they agree).
std::vector<Op> materialized_attention_ops(int64_t batch, int64_t heads, int64_t seq, int64_t head_dim, Dtype act);
// The time a materialized point measured: its forward and backward FlashAttention-convention
// flops (3.5 · 4·batch·seq²·heads·head_dim, halved when causal) at its rate.
double materialized_point_time_s(const AttentionPoint& point);

// The GEMMs of a materialized attention op (op.batch = b·heads, op.m = op.n = s, op.k = d) in the
// linear layer's conventions: score forward S = Q·Kᵀ (forward s×s×d); value forward C = P·V
// (NN: dgrad s×d×s); value backward dP = dC·Vᵀ (forward s×s×d) and dV = Pᵀ·dC (TN: wgrad
// m = d, n = s, k = s); score backward dQ = dS·K (dgrad s×d×s) and dK = dSᵀ·Q (wgrad d×s×s).
// Empty for other attention ops.
std::vector<AttentionGemm> attention_gemms(const Op& op);

// Share of the tile slots of a GEMM's waves that hold output elements: `count` GEMMs of m × n
// outputs cut into tiles of tiling.tile_m × tile_n (or transposed, whichever is better) that run
// ⌈tiles / sm_count⌉ waves: m·n·count / (waves · sm_count · tile_m · tile_n), in (0, 1]. It
// scales a datasheet profile's GEMM fraction, which is measured on shapes that fill whole waves.
double gemm_wave_efficiency(const GemmTiling& tiling, int64_t m, int64_t n, int64_t count);

// The measured table an op is looked up in: "norm_" (or "layernorm_"), "swiglu_", "gelu_",
// "rotary_", "softmax_", "cross_entropy_" + "forward" or "backward" (recompute counts as
// forward), "dropout_add_forward", "attention_dropout_forward", "dropout_backward" (the masked
// scale of every dropout's backward),
// "adamw", "grad_norm" (looked up at the gradient bytes it reads, flops / 2 elements: lowering
// counts only its 4-byte result); "" for ops no table describes (embedding, dropout backward, the
// separate cross_entropy_stats of tensor parallelism, flash attention). exec/profiler.cpp measures these families with bytes
// counted as lowering counts them.
// `norm_type` (the model's: "rmsnorm", "layernorm") picks the norm's family: "norm_…" (RMSNorm)
// or "layernorm_…". Without `cross_entropy_fusion` (the plan's cross_entropy_loss_fusion off: the
// loss as Megatron-LM's separate PyTorch ops, whose bytes lowering counts pass by pass) the
// loss's ops are "cross_entropy_unfused_forward" (the statistics' and the division's passes of
// tensor parallelism too) and "cross_entropy_unfused_backward".
std::string memory_family(const Op& op, const std::string& norm_type = "rmsnorm", bool cross_entropy_fusion = true);
// Every family memory_family returns: what a profile's memory_points may name (profile_json.cpp
// refuses others, which no op would ever look up).
const std::vector<std::string>& memory_families();
// The GEMM table of an op: "forward", "dgrad", "wgrad" (attention score/value: "forward").
std::string gemm_variant(const Op& op);

// Leave-one-out: each point of a table predicted by the table built from all the others.
struct LeaveOneOut {
  std::string what;  // e.g. "forward 40x80x160", "norm_forward 65536 B"
  double measured_s = 0;
  double predicted_s = 0;
  double relative_error() const { return (predicted_s - measured_s) / measured_s; }
};
std::vector<LeaveOneOut> gemm_leave_one_out(const std::vector<GemmPoint>& points);
// `fixed_s`: the profile's kernel_overhead_s (BandwidthTable).
std::vector<LeaveOneOut> memory_leave_one_out(const std::vector<MemoryPoint>& points, double fixed_s);

class ComputeCostModel {
 public:
  // `norm_type`: the model's ("rmsnorm", "layernorm"), for the norm's measured family;
  // `cross_entropy_fusion`: the plan's cross_entropy_loss_fusion, for the loss's (memory_family).
  ComputeCostModel(const DeviceSpec& device, Dtype dtype, const DeviceProfile& profile,
                   const std::string& topology_file, const std::string& norm_type = "rmsnorm",
                   bool cross_entropy_fusion = true);
  double op_time_s(const Op& op) const;
  // With `operands` (the op's reuse distances, operand_reuse.hpp) and the profile's GEMM reuse
  // points, a GEMM's time at its operands' distances (GemmReuseTable); otherwise op_time_s(op).
  double op_time_s(const Op& op, const OperandReuse* operands) const;
  // Whether the profile has GEMM reuse points (what makes operand_reuse worth walking for GEMMs).
  bool has_gemm_reuse() const { return !gemm_reuse_tables_.empty(); }
  // The measured correction of a materialized attention core at (seq, head_dim) (see above); 1
  // without materialized attention points.
  double materialized_correction(int64_t seq, int64_t head_dim) const;
  // FP8 GEMMs (ops with fp8_slots) cost at the device's FP8 peak and the profile's gemm.fp8
  // figures from here on; refused (InputError naming the key) where the topology's device has no
  // FP8 peak or the profile no FP8 GEMM figures.
  void use_fp8(const DeviceSpec& device, const std::string& topology_file);
  double matrix_peak_flops_per_s() const { return matrix_peak_; }
  const DeviceProfile& profile() const { return profile_; }
  // The measured time of a collective of `group_size` ranks inside one node; nullopt where the
  // profile has no table for (kind, algorithm, group_size). With `operands` and the profile's
  // reuse points for that table, at the operands' reuse distances (operand_reuse.hpp).
  std::optional<double> measured_collective_time_s(OpKind kind, Algorithm algorithm,
                                                   int64_t group_size, double bytes,
                                                   const OperandReuse* operands = nullptr) const;
  // Whether the profile has collective reuse points (what makes operand_reuse worth walking).
  bool has_collective_reuse() const { return !collective_reuse_tables_.empty(); }
  // A staged send's copy of `bytes` (read and written once): the "copy" family's table where
  // measured, else 2·bytes at the memory bandwidth plus the kernel overhead.
  double staging_copy_time_s(double bytes) const;
  // Filling `bytes` with zeros (zero_fill.hpp; written once): the "copy" family's table at the
  // bytes moved where measured, else at the memory bandwidth plus the kernel overhead.
  double fill_time_s(double bytes) const;
  // The fills of `allocs` (alloc ops of `role`; zero_fill.hpp's step_fills_before), one after another.
  double fills_time_s(const Role& role, const std::vector<int32_t>& allocs) const;
  // An add of `bytes` into a buffer of as many (two read, one written): the "residual_add"
  // family's table at 3·bytes where measured, else at the memory bandwidth plus the kernel overhead.
  double add_into_time_s(double bytes) const;

 private:
  // op_time_s before the materialized attention correction.
  double base_op_time_s(const Op& op) const;
  double measured_matrix_time_s(const Op& op) const;
  // gemm_wave_efficiency of a matrix op under the profile's gemm_tiling (attention: its GEMMs).
  double datasheet_wave_efficiency(const Op& op) const;
  // The profile's GEMM shape model for a matrix op (attention: its GEMMs), in (0, 1].
  double shape_efficiency(const Op& op) const;
  double gemm_time_s(const std::string& variant, int64_t m, int64_t n, int64_t k) const;
  std::string norm_type_;
  bool cross_entropy_fusion_ = true;
  double matrix_peak_, vector_peak_, bandwidth_;
  GemmEfficiency gemm_;
  DeviceProfile profile_;
  Dtype dtype_;
  std::map<std::string, GemmRateTable> gemm_tables_;     // by variant; empty: no measured GEMMs
  std::map<std::string, BandwidthTable> memory_tables_;  // by family
  AttentionRateTable attention_table_{{}};     // the flash points
  AttentionRateTable cp_attention_table_{{}};  // the cp_flash points (the ops that read a K/V block)
  std::vector<AttentionPoint> materialized_;   // the materialized points used (non-causal first)
  mutable std::map<std::pair<int64_t, int64_t>, double> correction_cache_;
  // by (kind, algorithm, group size) of the profile's collective points
  std::map<std::tuple<std::string, std::string, int64_t>, CollectiveTable> collective_tables_;
  // and of those with reuse points as well
  std::map<std::tuple<std::string, std::string, int64_t>, std::shared_ptr<const CollectiveReuseTable>>
      collective_reuse_tables_;
  // Interpolated rates by (variant, m, n, k): ops of one shape repeat thousands of times.
  mutable std::map<std::tuple<std::string, int64_t, int64_t, int64_t>, double> rate_cache_;
  // by variant, of the profile's GEMM reuse points (with its GEMM table)
  std::map<std::string, std::shared_ptr<const GemmReuseTable>> gemm_reuse_tables_;
  std::shared_ptr<const ComputeCostModel> fp8_;  // use_fp8's model of the FP8 GEMMs
};

// A grouped expert GEMM (expert_gate, _up or _down) on an ep rank whose local experts compute
// rows[l] token copies each: one GEMM per expert through op_time_s with its own rows (m, or k
// for the weight gradient), as the simulator costs routing draws and the quick estimate their
// expectation. `memo` keeps each (op id, rows)'s time.
double grouped_gemm_time_s(const ComputeCostModel& cost, const Op& op, const std::vector<int64_t>& rows,
                           std::map<std::pair<int32_t, int64_t>, double>& memo);

}  // namespace stepcast
