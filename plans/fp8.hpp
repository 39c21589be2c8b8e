// FP8 training as Transformer Engine does it (Megatron-LM's --fp8-format, --fp8-recipe delayed):
// the inputs of every linear layer of a transformer layer cast to an 8-bit float with a per-tensor
// scale, the GEMMs run on FP8 operands and accumulate in fp32, their outputs leave in the plan's
// dtype. Delayed scaling: each FP8 tensor kind of each layer (a "slot") keeps an amax history;
// its scale for a step is fp8_max / amax / 2^margin from that history, the amax of the step's
// tensors (maximised over every rank) is pushed into the history at the step's end. Current
// scaling (Megatron's --fp8-recipe tensorwise, Transformer Engine's Float8CurrentScaling): each
// tensor's scale is fp8_max / amax of that tensor itself, taken just before its cast (the amax
// maximised over the tensor-parallel group for a sequence-parallel input, whose shards are cast
// before their FP8 all-gather); no history.
//
// Formats (OCP FP8, as NVIDIA's __nv_fp8_e4m3 / __nv_fp8_e5m2 with saturation to finite):
//   e4m3: 1 sign, 4 exponent (bias 7), 3 mantissa bits; largest 448, no infinities, smallest
//         subnormal 2^-9;
//   e5m2: 1 sign, 5 exponent (bias 15), 2 mantissa bits; largest 57344, smallest subnormal 2^-16.
// Rounding is to nearest, ties to even; values beyond the largest saturate to it.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>

#include "topology.hpp"

namespace stepcast {

// The plan's fp8 key: none (16/32-bit GEMMs); e4m3, every FP8 tensor in e4m3; hybrid, e4m3
// forward and e5m2 for the gradients (Transformer Engine's Format.HYBRID).
enum class Fp8Format { none, e4m3, hybrid };
// How the scale's amax comes from the history (Megatron's --fp8-amax-compute-algo).
enum class Fp8AmaxAlgo { most_recent, max };
// Where a scale comes from (Megatron's --fp8-recipe: delayed, tensorwise, mxfp8, blockwise): a
// tensor's scale from an amax history, from the tensor's own amax, one E8M0 scale per block of 32
// elements (MXFP8), or one fp32 scale per 128 elements or 128×128 tile (blockwise; both below).
enum class Fp8Scaling { delayed, current, mxfp8, blockwise };
const char* to_string(Fp8Format format);
const char* to_string(Fp8AmaxAlgo algo);
const char* to_string(Fp8Scaling scaling);  // "delayed", "tensorwise", "mxfp8", "blockwise"
// The scaling of a recipe name (to_string's), nullopt for any other.
std::optional<Fp8Scaling> parse_fp8_scaling(const std::string& recipe);

struct Fp8Recipe {
  Fp8Format format = Fp8Format::none;
  Fp8Scaling scaling = Fp8Scaling::delayed;
  // Delayed scaling's (unused under current scaling):
  int64_t amax_history_len = 1;  // Megatron's default --fp8-amax-history-len
  Fp8AmaxAlgo amax_compute_algo = Fp8AmaxAlgo::most_recent;
  int64_t margin = 0;  // scale = fp8_max / amax / 2^margin
  // Blockwise scaling's: scales rounded down to powers of two (TE's default), or any fp32 (TE's
  // NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1, Hopper only).
  bool power_of_two_scales = true;
  // Megatron-LM's --fp8-param-gather (delayed and tensorwise, ZeRO-1/2/3): a layer's linear
  // weights kept in FP8 only (no 16-bit copy), cast from the fp32 master shards after the optimizer
  // step and gathered as FP8 codes (fp8_utils.py's quantize_param_shard, Transformer Engine's
  // cast_master_weights_to_fp8); under ZeRO-3 the codes stay sharded and are gathered at each use.
  bool param_gather = false;
  bool enabled() const { return format != Fp8Format::none; }
  bool delayed() const { return enabled() && scaling == Fp8Scaling::delayed; }
  bool current() const { return enabled() && scaling == Fp8Scaling::current; }
  bool mx() const { return enabled() && scaling == Fp8Scaling::mxfp8; }
  bool blockwise() const { return enabled() && scaling == Fp8Scaling::blockwise; }
  // A scale per block of elements, carried inside each FP8 buffer (MXFP8 or blockwise).
  bool block_scaled() const { return mx() || blockwise(); }
};

// The FP8 tensors of one transformer layer: the input (x) and weight (w) of each linear layer
// in the forward, the output gradient (d) of each in the backward. mlp_up and mlp_gate share
// their input. Slot of layer l, kind k: l·kFp8SlotsPerLayer + k.
enum Fp8Slot : int32_t {
  qkv_x, qkv_w, attn_out_x, attn_out_w, mlp_x, mlp_up_w, mlp_gate_w, mlp_down_x, mlp_down_w,
  qkv_d, attn_out_d, mlp_up_d, mlp_gate_d, mlp_down_d
};
constexpr int32_t kFp8SlotsPerLayer = int32_t(mlp_down_d) + 1;
inline bool is_gradient_slot(int32_t slot) { return slot % kFp8SlotsPerLayer >= qkv_d; }

// A layer group's linear weights, each with its weight slot kind: what fp8_weights casts, and what
// fp8_param_gather keeps in FP8 only (param_layout.hpp names them).
struct Fp8Weight {
  const char* tensor;
  Fp8Slot slot;
};
inline constexpr Fp8Weight kFp8Weights[] = {{"qkv.weight", Fp8Slot::qkv_w},
                                            {"attn_out.weight", Fp8Slot::attn_out_w},
                                            {"mlp_up.weight", Fp8Slot::mlp_up_w},
                                            {"mlp_gate.weight", Fp8Slot::mlp_gate_w},
                                            {"mlp_down.weight", Fp8Slot::mlp_down_w}};
inline bool is_fp8_weight(const std::string& tensor) {
  for (const Fp8Weight& w : kFp8Weights) {
    if (tensor == w.tensor) return true;
  }
  return false;
}

// A layer's transposed FP8 weight copy, written by fp8_transpose: its buffer name ("fp8wt.L<l>" for
// group "L<l>"), and whether a buffer is one (the dgrad GEMMs that read it take its codes as [in, out]).
inline constexpr const char* kFp8TransposedCopyPrefix = "fp8wt.";
inline std::string fp8_transposed_copy_name(const std::string& group) { return kFp8TransposedCopyPrefix + group; }
inline bool is_fp8_transposed_copy(const std::string& buffer) { return buffer.rfind(kFp8TransposedCopyPrefix, 0) == 0; }
// The transient transposed copy of a wgrad GEMM's FP8 operand (its input or output gradient, [k, m]
// written [m, k]; by fp8_transpose or the gradient's fp8_cast_transpose) on such a device, as the
// wgrad's x_t and d_y_t read them: "<operand>_T".
inline std::string fp8_transposed_operand_name(const std::string& operand) { return operand + "_T"; }

// One of the two storage formats.
enum class Fp8Storage { e4m3, e5m2 };
inline Fp8Storage storage_of(Fp8Format format, bool gradient) {
  return format == Fp8Format::hybrid && gradient ? Fp8Storage::e5m2 : Fp8Storage::e4m3;
}
inline double fp8_max(Fp8Storage f) { return f == Fp8Storage::e4m3 ? 448.0 : 57344.0; }

// The nearest value of the format's grid to x (ties to even), saturated to ±fp8_max; NaN stays NaN.
inline double fp8_round(double x, Fp8Storage f) {
  if (std::isnan(x)) return x;
  const int mantissa_bits = f == Fp8Storage::e4m3 ? 3 : 2;
  const int min_exponent = f == Fp8Storage::e4m3 ? -6 : -14;  // of the smallest normal
  double a = std::fabs(x);
  if (a >= fp8_max(f)) return std::copysign(fp8_max(f), x);
  if (a == 0) return x;
  int e = std::ilogb(a);
  if (e < min_exponent) e = min_exponent;
  double quantum = std::ldexp(1.0, e - mantissa_bits);
  double r = std::nearbyint(a / quantum) * quantum;  // the default rounding mode: ties to even
  return std::copysign(std::fmin(r, fp8_max(f)), x);
}

// The 8-bit code of a value on the grid (fp8_round's result), and back.
inline uint8_t fp8_encode(double v, Fp8Storage f) {
  const int mantissa_bits = f == Fp8Storage::e4m3 ? 3 : 2;
  const int bias = f == Fp8Storage::e4m3 ? 7 : 15;
  uint8_t sign = std::signbit(v) ? 0x80 : 0;
  if (std::isnan(v)) return f == Fp8Storage::e4m3 ? 0x7f : 0x7e;
  double a = std::fabs(v);
  if (a == 0) return sign;
  int e = std::ilogb(a);
  if (e < 1 - bias) {  // subnormal: exponent field 0
    return uint8_t(sign | int(std::ldexp(a, bias - 1 + mantissa_bits)));
  }
  int m = int(std::ldexp(a, -e) * (1 << mantissa_bits)) - (1 << mantissa_bits);
  return uint8_t(sign | ((e + bias) << mantissa_bits) | m);
}

inline double fp8_decode(uint8_t code, Fp8Storage f) {
  const int mantissa_bits = f == Fp8Storage::e4m3 ? 3 : 2;
  const int bias = f == Fp8Storage::e4m3 ? 7 : 15;
  const int exponent = (code & 0x7f) >> mantissa_bits;
  const int m = code & ((1 << mantissa_bits) - 1);
  double sign = code & 0x80 ? -1.0 : 1.0;
  if (f == Fp8Storage::e4m3 && (code & 0x7f) == 0x7f) return std::nan("");
  if (f == Fp8Storage::e5m2 && exponent == 31) return m ? std::nan("") : sign * INFINITY;
  if (exponent == 0) return sign * std::ldexp(double(m), 1 - bias - mantissa_bits);
  return sign * std::ldexp(1.0 + double(m) / (1 << mantissa_bits), exponent - bias);
}

// Every code's value, for kernels that decode by table.
inline std::array<double, 256> fp8_decode_table(Fp8Storage f) {
  std::array<double, 256> t{};
  for (int c = 0; c < 256; ++c) t[size_t(c)] = fp8_decode(uint8_t(c), f);
  return t;
}

// Delayed scaling's update of one slot at the end of a step (Transformer Engine's
// _default_sf_compute after the history roll): the step's amax enters the history (newest
// first, the oldest dropped); the amax used is the newest (most_recent) or the history's largest
// (max); the scale becomes fp8_max / amax / 2^margin, or stays as it was when that amax is 0 or
// not finite. history has amax_history_len entries.
template <class X>
X fp8_updated_scale(X* history, int64_t len, X step_amax, X scale, Fp8AmaxAlgo algo, int64_t margin, Fp8Storage f) {
  for (int64_t i = len - 1; i > 0; --i) history[i] = history[i - 1];
  history[0] = step_amax;
  X amax = history[0];
  if (algo == Fp8AmaxAlgo::max) {
    for (int64_t i = 1; i < len; ++i) amax = std::fmax(amax, history[i]);
  }
  if (!(amax > 0) || !std::isfinite(amax)) return scale;
  X updated = X(fp8_max(f)) / amax / X(std::ldexp(1.0, int(margin)));
  return std::isfinite(updated) ? updated : scale;
}

// Current scaling's scale of a tensor whose largest magnitude is `amax` (Transformer Engine's
// compute_scale_from_amax with its defaults: no epsilon, no power-of-two rounding): fp8_max /
// amax, 1 where amax is 0 or not finite.
template <class X>
X fp8_current_scale(X amax, Fp8Storage f) {
  if (!(amax > 0) || !std::isfinite(amax)) return X(1);
  X scale = X(fp8_max(f)) / amax;
  return std::isfinite(scale) ? scale : X(1);
}

// ---- Block-scaled FP8: MXFP8 and blockwise ----
// MXFP8 (fp8_recipe "mxfp8"; Transformer Engine's MXFP8BlockScaling, the OCP MX format): every 32
// consecutive elements along a row (row-wise) or down a column (column-wise) share one E8M0 scale,
// a biased power-of-two exponent e, 2^(e − 127), one byte.
// Blockwise (fp8_recipe "blockwise"; TE's Float8BlockScaling with its defaults, DeepSeek-V3's
// scheme): activations and gradients in blocks of 128 along a row or down a column ("vector"),
// weights in 128×128 tiles ("tile"), each block's scale an fp32 power of two (below).
// A GEMM reads each operand blocked along its reduction dimension, so a linear layer's vector
// blocked tensors are quantized twice from their high-precision values: x row-wise for the
// forward, d_y row-wise for dgrad, x and d_y column-wise for wgrad (the column-wise copy is not
// made from the row-wise codes, unlike a per-tensor scale's transpose). MX weights likewise (w
// row-wise forward, column-wise dgrad); a tile covers the same elements both ways, so a tiled
// weight's column-wise copy is its row-wise one transposed.
//
// Storage of a block-scaled tensor [rows, cols] (both multiples of the block length L: 32 for MX,
// 128 otherwise), in bands of L rows: band b at b·band_bytes, its L·cols codes row-major, then its
// scales: MX row-wise, row r's cols/32 scale bytes (r = 0..31); MX column-wise, one byte per
// column; vector, the same with 4-byte fp32 scales; tile, cols/128 fp32 scales, one per tile. A
// buffer's shards along its rows are whole bands, so a sequence-parallel all_gather of them is
// the gathered tensor's storage. Blockwise scales hold what the codes are multiplied by when read
// (TE's scale_inv).
enum class Fp8Blocks : uint8_t { none, mx, vector, tile };
constexpr int64_t kMxBlock = 32;
constexpr int64_t kFp8BlockwiseBlock = 128;
constexpr int64_t block_length(Fp8Blocks b) { return b == Fp8Blocks::mx ? kMxBlock : kFp8BlockwiseBlock; }
constexpr int64_t scale_bytes(Fp8Blocks b) { return b == Fp8Blocks::mx ? 1 : 4; }

struct BlockLayout {
  Fp8Blocks blocks;
  int64_t cols;
  bool columnwise;
  int64_t band() const { return block_length(blocks); }
  int64_t band_scales() const {  // scales a band holds
    return blocks == Fp8Blocks::tile ? cols / kFp8BlockwiseBlock : cols;
  }
  int64_t band_bytes() const { return band() * cols + band_scales() * scale_bytes(blocks); }
  int64_t block(int64_t r) const { return (r / band()) * band_bytes(); }
  int64_t code(int64_t r, int64_t c) const { return block(r) + (r % band()) * cols + c; }
  int64_t scale(int64_t r, int64_t c) const {  // the byte offset of (r, c)'s scale
    const int64_t index = blocks == Fp8Blocks::tile ? c / kFp8BlockwiseBlock
                          : columnwise              ? c
                                                    : (r % band()) * (cols / band()) + c / band();
    return block(r) + band() * cols + index * scale_bytes(blocks);
  }
};

// The blocks of a buffer of `dtype` (none: per-tensor FP8 codes, or not FP8).
inline Fp8Blocks fp8_blocks(Dtype dtype) {
  if (is_mx_storage(dtype)) return Fp8Blocks::mx;
  if (dtype == Dtype::fp8_tile_e4m3) return Fp8Blocks::tile;
  return is_block_scaled(dtype) ? Fp8Blocks::vector : Fp8Blocks::none;
}

// Elements per scale byte: an E8M0 byte per 32, an fp32 per 128, an fp32 per 128×128 tile.
constexpr int64_t elements_per_scale_byte(Fp8Blocks b) {
  return b == Fp8Blocks::tile ? kFp8BlockwiseBlock * kFp8BlockwiseBlock / 4 : block_length(b) / scale_bytes(b);
}
// The storage bytes of a block-scaled tensor of `elements` (whole bands), and the elements of
// `bytes` of such storage.
constexpr int64_t block_bytes(Fp8Blocks b, int64_t elements) {
  return elements + elements / elements_per_scale_byte(b);
}
constexpr int64_t block_elements(Fp8Blocks b, int64_t bytes) {
  return bytes / (elements_per_scale_byte(b) + 1) * elements_per_scale_byte(b);
}
constexpr int64_t mx_bytes(int64_t elements) { return block_bytes(Fp8Blocks::mx, elements); }

// An MX block's scale exponent from its largest magnitude (TE's float_to_e8m0(amax · max_norm_rcp),
// transformer_engine/common/util/ptx.cuh, and Blackwell's cvt.rp.satfinite.ue8m0x2.f32): the fp32
// product amax·(1/fp8_max), its exponent rounded up to the next power of two; 0 for 0, 0xFE for
// infinity, 0xFF for NaN.
inline uint8_t mx_scale_exponent(double amax, Fp8Storage f) {
  const float v = float(amax) * (1.0f / float(fp8_max(f)));
  if (std::isnan(v)) return 0xFF;
  if (std::isinf(v)) return 0xFE;
  if (v == 0.0f) return 0;
  uint32_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  uint32_t exponent = (bits >> 23) & 0xFF;
  const uint32_t mantissa = bits & 0x7FFFFF;
  if (mantissa > 0 && exponent != 0xFE && !(exponent == 0 && mantissa <= 0x400000)) ++exponent;
  return uint8_t(exponent);
}

// What an MX block's values are multiplied by before rounding (TE's exp2f_rcp: 2^(127 − e), 1 for
// e = 0) and what its codes' values are multiplied by when read (2^(e − 127), as the tensor cores do).
inline double mx_quantize_factor(uint8_t e) { return e == 0 ? 1.0 : std::ldexp(1.0, 127 - int(e)); }
inline double mx_dequantize_factor(uint8_t e) { return std::ldexp(1.0, int(e) - 127); }

// A blockwise block's scale from its largest magnitude (TE's compute_scale_from_amax with the
// recipe's defaults, no epsilon: transformer_engine/common/recipe/recipe_common.cuh): fp8_max /
// amax divided in fp32, then, with power_of_two (the default), its mantissa cleared (rounded down
// to a power of two); 1 where amax is 0, infinite or NaN; where the quotient overflows fp32, the
// largest fp32 (TE's value_for_inf; 2^127 once rounded down). Values are multiplied by it before
// rounding, codes by its fp32 reciprocal (TE's scale_inv; exact for a power of two) when read.
inline float blockwise_scale(double amax, Fp8Storage f, bool power_of_two = true) {
  const float a = float(amax);
  if (std::isinf(a) || std::isnan(a) || a == 0.0f) return 1.0f;
  float scale = float(fp8_max(f)) / a;
  if (std::isinf(scale)) scale = std::numeric_limits<float>::max();
  if (!power_of_two) return scale;
  uint32_t bits = 0;
  std::memcpy(&bits, &scale, sizeof bits);
  bits &= 0xFF800000u;
  std::memcpy(&scale, &bits, sizeof bits);
  return scale;
}

// The factor a block-scaled element's code is multiplied by when read: its block's scale from
// `scale` (the bytes at BlockLayout::scale).
inline double block_dequantize_factor(Fp8Blocks b, const uint8_t* scale) {
  if (b == Fp8Blocks::mx) return mx_dequantize_factor(*scale);
  float inverse = 0;
  std::memcpy(&inverse, scale, sizeof inverse);
  return double(inverse);
}

}  // namespace stepcast
