// The CPU kernels' FP8 emulation (cpu_kernels.hpp): casts to the e4m3 / e5m2 grids (per-tensor
// scales, and MXFP8's per-block ones), GEMMs that decode 64×64 blocks of codes into the caller's
// scratch and multiply them with cblas, and the delayed-scaling update.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <string>

#include "cpu_kernels.hpp"
#include "errors.hpp"

namespace stepcast::cpu {

namespace {

const std::array<double, 256>& decode_table(Fp8Storage format) {
  static const std::array<double, 256> e4m3 = fp8_decode_table(Fp8Storage::e4m3);
  static const std::array<double, 256> e5m2 = fp8_decode_table(Fp8Storage::e5m2);
  return format == Fp8Storage::e4m3 ? e4m3 : e5m2;
}

// The value of stored element (r, c) of x (a block-scaled operand's scaled by its block's scale; a
// per-tensor operand's code alone, its scale undone by the GEMM's alpha).
template <class T>
double stored_value(const Fp8Operand<T>& x, const std::array<double, 256>& table, int64_t r, int64_t c) {
  if (x.blocks == Fp8Blocks::none) return table[x.codes[r * x.ld + c]];
  const BlockLayout layout{x.blocks, x.ld, x.columnwise};
  return table[x.codes[layout.code(r, c)]] * block_dequantize_factor(x.blocks, x.codes + layout.scale(r, c));
}

// Rows [r0, r0 + rows) and columns [c0, c0 + cols) of op(X) decoded into out[rows, cols].
template <class T>
void decode_block(const Fp8Operand<T>& x, bool trans, int64_t r0, int64_t rows, int64_t c0, int64_t cols, T* out) {
  const std::array<double, 256>& table = decode_table(x.format);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      out[r * cols + c] = T(trans ? stored_value(x, table, c0 + c, r0 + r) : stored_value(x, table, r0 + r, c0 + c));
    }
  }
}

}  // namespace

template <class T>
void fp8_cast(const T* x, uint8_t* y, int64_t n, T scale, T* amax, Fp8Storage format) {
  T most = *amax;
  for (int64_t i = 0; i < n; ++i) {
    most = std::max(most, T(std::fabs(x[i])));
    y[i] = fp8_encode(fp8_round(double(x[i] * scale), format), format);
  }
  *amax = most;
}

template <class T>
void block_cast(const T* x, uint8_t* y, int64_t rows, int64_t cols, Fp8Blocks blocks, bool columnwise,
                Fp8Storage format, bool power_of_two) {
  const int64_t L = block_length(blocks);
  STEPCAST_CHECK(blocks != Fp8Blocks::none && rows % L == 0 && cols % L == 0,
                 "a block-scaled tensor of " + std::to_string(rows) + " x " + std::to_string(cols) +
                     " (not multiples of " + std::to_string(L) + ")");
  const BlockLayout layout{blocks, cols, columnwise};
  // Block from (r, c): L × L elements (a tile), or L along the row or down the column.
  const bool tile = blocks == Fp8Blocks::tile;
  const int64_t block_rows = tile || columnwise ? L : 1, block_cols = tile || !columnwise ? L : 1;
  for (int64_t r = 0; r < rows; r += block_rows) {
    for (int64_t c = 0; c < cols; c += block_cols) {
      double amax = 0;
      for (int64_t i = r; i < r + block_rows; ++i) {
        for (int64_t j = c; j < c + block_cols; ++j) amax = std::max(amax, double(std::fabs(x[i * cols + j])));
      }
      double factor = 0;
      if (blocks == Fp8Blocks::mx) {
        const uint8_t e = mx_scale_exponent(amax, format);
        y[layout.scale(r, c)] = e;
        factor = mx_quantize_factor(e);
      } else {
        const float scale = blockwise_scale(amax, format, power_of_two), inverse = 1.0f / scale;
        std::memcpy(y + layout.scale(r, c), &inverse, sizeof inverse);
        factor = double(scale);
      }
      // (A power-of-two factor scales exactly; an fp32 scale's product is taken in fp32 first, as
      // TE's kernels multiply, so its rounding is theirs for fp32 and bf16 inputs.)
      const bool exact = blocks == Fp8Blocks::mx || power_of_two;
      for (int64_t i = r; i < r + block_rows; ++i) {
        for (int64_t j = c; j < c + block_cols; ++j) {
          const double v = double(x[i * cols + j]);
          const double scaled = exact ? v * factor : double(float(v) * float(factor));
          y[layout.code(i, j)] = fp8_encode(fp8_round(scaled, format), format);
        }
      }
    }
  }
}

template <class T>
void fp8_absmax(const T* x, int64_t n, T* amax, bool accumulate) {
  T most = accumulate ? *amax : T(0);
  for (int64_t i = 0; i < n; ++i) most = std::max(most, T(std::fabs(x[i])));
  *amax = most;
}

template <class T>
void fp8_set_current_scale(const T* amax, T* scale, Fp8Storage format) {
  *scale = fp8_current_scale(*amax, format);
}

template <class T>
void fp8_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const Fp8Operand<T>& a,
              const Fp8Operand<T>& b, T beta, T* c, int64_t ldc, T* scratch) {
  const T alpha = T(1) / (a.scale * b.scale);
  T* a_block = scratch;
  T* b_block = scratch + kFp8Block * kFp8Block;
  for (int64_t i0 = 0; i0 < m; i0 += kFp8Block) {
    const int64_t mb = std::min(kFp8Block, m - i0);
    for (int64_t j0 = 0; j0 < n; j0 += kFp8Block) {
      const int64_t nb = std::min(kFp8Block, n - j0);
      T* cb = c + i0 * ldc + j0;
      if (k == 0) {
        gemm<T>(false, false, mb, nb, 0, alpha, a_block, kFp8Block, b_block, kFp8Block, beta, cb, ldc);
        continue;
      }
      for (int64_t p0 = 0; p0 < k; p0 += kFp8Block) {
        const int64_t kb = std::min(kFp8Block, k - p0);
        decode_block(a, trans_a, i0, mb, p0, kb, a_block);
        decode_block(b, trans_b, p0, kb, j0, nb, b_block);
        gemm<T>(false, false, mb, nb, kb, alpha, a_block, kb, b_block, nb, p0 == 0 ? beta : T(1), cb, ldc);
      }
    }
  }
}

template <class T>
void fp8_linear_forward(const Fp8Operand<T>& x, const Fp8Operand<T>& w, const T* bias, T* y, int64_t tokens,
                        int64_t in, int64_t out, T* scratch) {
  fp8_gemm<T>(false, true, tokens, out, in, x, w, T(0), y, out, scratch);
  if (!bias) return;
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t o = 0; o < out; ++o) y[t * out + o] += bias[o];
}

template <class T>
void fp8_linear_backward_data(const Fp8Operand<T>& dy, const Fp8Operand<T>& w, T* dx, int64_t tokens, int64_t in,
                              int64_t out, bool accumulate, T* scratch, bool w_transposed) {
  fp8_gemm<T>(false, w_transposed, tokens, in, out, dy, w, accumulate ? T(1) : T(0), dx, in, scratch);
}

template <class T>
void fp8_linear_backward_weight(const Fp8Operand<T>& dy, const Fp8Operand<T>& x, T* dw, T* dbias, int64_t tokens,
                                int64_t in, int64_t out, T* scratch, const uint8_t* dy_t, const uint8_t* x_t) {
  if (dy_t && x_t) {  // the transposed copies [out, tokens] and [in, tokens]: the same blocks decoded
    fp8_gemm<T>(false, true, out, in, tokens, {dy_t, tokens, dy.scale, dy.format}, {x_t, tokens, x.scale, x.format},
                T(1), dw, in, scratch);
  } else {
    fp8_gemm<T>(true, false, out, in, tokens, dy, x, T(1), dw, in, scratch);
  }
  if (!dbias) return;
  const std::array<double, 256>& table = decode_table(dy.format);
  for (int64_t o = 0; o < out; ++o) {
    double sum = 0;
    for (int64_t t = 0; t < tokens; ++t) sum += stored_value(dy, table, t, o);
    dbias[o] += T(sum / double(dy.scale));
  }
}

template <class T>
void fp8_scale_update(T* amax, T* history, T* scale, int64_t slots, const Fp8Recipe& recipe) {
  const int64_t len = recipe.amax_history_len;
  for (int64_t i = 0; i < slots; ++i) {
    Fp8Storage format = storage_of(recipe.format, is_gradient_slot(int32_t(i)));
    scale[i] = fp8_updated_scale(history + i * len, len, amax[i], scale[i], recipe.amax_compute_algo, recipe.margin,
                                 format);
    amax[i] = T(0);
  }
}

#define STEPCAST_CPU_KERNELS_FP8(T)                                                                                   \
  template void fp8_cast<T>(const T*, uint8_t*, int64_t, T, T*, Fp8Storage);                                          \
  template void block_cast<T>(const T*, uint8_t*, int64_t, int64_t, Fp8Blocks, bool, Fp8Storage, bool);             \
  template void fp8_absmax<T>(const T*, int64_t, T*, bool);                                                           \
  template void fp8_set_current_scale<T>(const T*, T*, Fp8Storage);                                                  \
  template void fp8_gemm<T>(bool, bool, int64_t, int64_t, int64_t, const Fp8Operand<T>&, const Fp8Operand<T>&, T, T*, \
                            int64_t, T*);                                                                             \
  template void fp8_linear_forward<T>(const Fp8Operand<T>&, const Fp8Operand<T>&, const T*, T*, int64_t, int64_t,     \
                                      int64_t, T*);                                                                   \
  template void fp8_linear_backward_data<T>(const Fp8Operand<T>&, const Fp8Operand<T>&, T*, int64_t, int64_t, int64_t, \
                                            bool, T*, bool);                                                          \
  template void fp8_linear_backward_weight<T>(const Fp8Operand<T>&, const Fp8Operand<T>&, T*, T*, int64_t, int64_t,   \
                                              int64_t, T*, const uint8_t*, const uint8_t*);                           \
  template void fp8_scale_update<T>(T*, T*, T*, int64_t, const Fp8Recipe&);
STEPCAST_CPU_KERNELS_FP8(float)
STEPCAST_CPU_KERNELS_FP8(double)
#undef STEPCAST_CPU_KERNELS_FP8

}  // namespace stepcast::cpu
