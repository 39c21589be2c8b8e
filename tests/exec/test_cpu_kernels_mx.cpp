// MXFP8 emulation (plans/fp8.hpp's MX storage, exec/cpu_kernels_fp8.cpp's mx_cast and MX GEMM
// operands) against hand-computed values: the E8M0 scale of a block (Transformer Engine's
// float_to_e8m0 of amax/fp8_max, rounded up), the codes and scales a cast writes, where they sit
// in a buffer, and the GEMM against the product of the decoded blocks.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "cpu_kernels.hpp"
#include "fp8_reference.hpp"
#include "fp8.hpp"

using namespace stepcast;

TEST_CASE("mxfp8: a block's scale exponent is amax over fp8_max rounded up to a power of two", "[kernels][fp8]") {
  const Fp8Storage e4m3 = Fp8Storage::e4m3, e5m2 = Fp8Storage::e5m2;
  // 448 · fp32(1/448) is 1 exactly: 2^0, biased 127; 224 → 2^-1 (126); 896 → 2^1 (128).
  CHECK(mx_scale_exponent(448, e4m3) == 127);
  CHECK(mx_scale_exponent(224, e4m3) == 126);
  CHECK(mx_scale_exponent(896, e4m3) == 128);
  // 1/448 = 2^-8.81 lies in [2^-9, 2^-8): rounded up to 2^-8 (119); 449/448 just above 1 → 2^1 (128).
  CHECK(mx_scale_exponent(1, e4m3) == 119);
  CHECK(mx_scale_exponent(3, e4m3) == 120);
  CHECK(mx_scale_exponent(449, e4m3) == 128);
  // e5m2's largest, 57344, is 2^0; 1 → 57344^-1 = 2^-15.81 → 2^-15 (112).
  CHECK(mx_scale_exponent(57344, e5m2) == 127);
  CHECK(mx_scale_exponent(1, e5m2) == 112);
  // 0 → 0; infinity → 0xFE; NaN → 0xFF.
  CHECK(mx_scale_exponent(0, e4m3) == 0);
  CHECK(mx_scale_exponent(INFINITY, e4m3) == 0xFE);
  CHECK(mx_scale_exponent(NAN, e4m3) == 0xFF);
  // The factors: quantize by 2^(127 − e) (1 for e = 0, as TE's exp2f_rcp), read back by 2^(e − 127).
  CHECK(mx_quantize_factor(120) == 128);
  CHECK(mx_quantize_factor(0) == 1);
  CHECK(mx_dequantize_factor(120) == 1.0 / 128);
}

TEST_CASE("mxfp8: an MX buffer holds 32-row blocks of codes, each followed by its scales", "[kernels][fp8]") {
  // cols 64: block b at b·33·64 = b·2112; row r's codes at (r mod 32)·64 in it; its scales after
  // the block's 2048 codes: row-wise 2 a row, column-wise one a column.
  const BlockLayout rows{Fp8Blocks::mx, 64, false}, columns{Fp8Blocks::mx, 64, true};
  CHECK(rows.code(33, 5) == 2112 + 64 + 5);
  CHECK(columns.code(33, 5) == rows.code(33, 5));
  CHECK(rows.scale(33, 40) == 2112 + 2048 + 2 + 1);
  CHECK(columns.scale(33, 40) == 2112 + 2048 + 40);
  CHECK(mx_bytes(64 * 64) == 2 * 2112);
}

TEST_CASE("mxfp8: a cast writes each block's scale and its values scaled and rounded", "[kernels][fp8]") {
  // A 32 × 64 tensor: 1.1 everywhere but row 0, column 0 (3) and row 5, column 40 (−448).
  const int64_t rows = 32, cols = 64;
  std::vector<double> x(size_t(rows * cols), 1.1);
  x[0] = 3;
  x[5 * cols + 40] = -448;
  std::vector<uint8_t> y(size_t(mx_bytes(rows * cols)));
  auto value = [&](const BlockLayout& l, int64_t r, int64_t c) {
    return fp8_decode(y[size_t(l.code(r, c))], Fp8Storage::e4m3) * mx_dequantize_factor(y[size_t(l.scale(r, c))]);
  };
  SECTION("row-wise") {
    cpu::block_cast(x.data(), y.data(), rows, cols, Fp8Blocks::mx, false, Fp8Storage::e4m3);
    const BlockLayout l{Fp8Blocks::mx, cols, false};
    // Row 0, columns 0–31: amax 3 → exponent 120 (×128): 3 → 384 exactly; 1.1 → 140.8, on e4m3's
    // grid of 16 between 128 and 256 → 144, read back as 1.125.
    CHECK(y[size_t(l.scale(0, 0))] == 120);
    CHECK(value(l, 0, 0) == 3);
    CHECK(value(l, 0, 1) == 1.125);
    // Row 0, columns 32–63: amax 1.1 → 2^-8.6, exponent 119 (×256): 281.6 → 288 (grid 32), 1.125.
    CHECK(y[size_t(l.scale(0, 32))] == 119);
    CHECK(value(l, 0, 40) == 1.125);
    // Row 5, columns 32–63: amax 448 → exponent 127 (×1): 1.1 → 1.125 (grid 1/8), −448 stays.
    CHECK(y[size_t(l.scale(5, 40))] == 127);
    CHECK(value(l, 5, 40) == -448);
    CHECK(value(l, 5, 33) == 1.125);
  }
  SECTION("column-wise") {
    cpu::block_cast(x.data(), y.data(), rows, cols, Fp8Blocks::mx, true, Fp8Storage::e4m3);
    const BlockLayout l{Fp8Blocks::mx, cols, true};
    // Column 0: amax 3 (×128); column 40: amax 448 (×1); column 1: amax 1.1 (×256).
    CHECK(y[size_t(l.scale(0, 0))] == 120);
    CHECK(y[size_t(l.scale(17, 40))] == 127);
    CHECK(y[size_t(l.scale(9, 1))] == 119);
    CHECK(value(l, 0, 0) == 3);
    CHECK(value(l, 5, 40) == -448);
    CHECK(value(l, 6, 40) == 1.125);
    CHECK(value(l, 31, 1) == 1.125);
  }
}

TEST_CASE("mxfp8: the GEMMs on MX operands are the products of their decoded blocks", "[kernels][fp8]") {
  // A linear layer's three GEMMs (96 tokens, 64 in, 160 out: across the 64-wide decode blocks) on
  // operands cast as the program casts them, against sums over each operand's own decoded values.
  const int64_t tokens = 96, in = 64, out = 160;
  std::vector<double> x(size_t(tokens * in)), w(size_t(out * in)), dy(size_t(tokens * out));
  // x's magnitudes vary from row to row (2^-5 … 2^5): a column's block spans them, a row's does not.
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t i = 0; i < in; ++i)
      x[size_t(t * in + i)] = std::sin(0.37 * double(t * in + i)) * std::ldexp(1.0, int((t * 3) % 11) - 5);
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::cos(0.11 * double(i)) * 0.02;
  for (size_t i = 0; i < dy.size(); ++i) dy[i] = std::sin(0.05 * double(i) + 1) * 1e-3 * (1 + double(i % 13));
  auto cast = [](const std::vector<double>& v, int64_t rows, int64_t cols, bool columnwise, Fp8Storage f) {
    std::vector<uint8_t> codes(size_t(mx_bytes(rows * cols)));
    cpu::block_cast(v.data(), codes.data(), rows, cols, Fp8Blocks::mx, columnwise, f);
    std::vector<double> decoded(v.size());
    const BlockLayout l{Fp8Blocks::mx, cols, columnwise};
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        decoded[size_t(r * cols + c)] =
            fp8_decode(codes[size_t(l.code(r, c))], f) * mx_dequantize_factor(codes[size_t(l.scale(r, c))]);
    return std::make_pair(codes, decoded);
  };
  const Fp8Storage e4m3 = Fp8Storage::e4m3, e5m2 = Fp8Storage::e5m2;
  auto [x_r, xv_r] = cast(x, tokens, in, false, e4m3);
  auto [x_c, xv_c] = cast(x, tokens, in, true, e4m3);
  auto [w_r, wv_r] = cast(w, out, in, false, e4m3);
  auto [w_c, wv_c] = cast(w, out, in, true, e4m3);
  auto [d_r, dv_r] = cast(dy, tokens, out, false, e5m2);
  auto [d_c, dv_c] = cast(dy, tokens, out, true, e5m2);
  CHECK(xv_r != xv_c);  // the two copies round differently: blocks along rows, blocks down columns
  std::vector<double> scratch(size_t(cpu::kFp8Scratch));
  const Fp8Blocks mx = Fp8Blocks::mx;
  const cpu::Fp8Operand<double> xr{x_r.data(), in, 1.0, e4m3, mx, false}, xc{x_c.data(), in, 1.0, e4m3, mx, true};
  const cpu::Fp8Operand<double> wr{w_r.data(), in, 1.0, e4m3, mx, false}, wc{w_c.data(), in, 1.0, e4m3, mx, true};
  const cpu::Fp8Operand<double> dr{d_r.data(), out, 1.0, e5m2, mx, false}, dc{d_c.data(), out, 1.0, e5m2, mx, true};
  // Forward y = x·wᵀ (row-wise x and w).
  std::vector<double> y(size_t(tokens * out));
  cpu::fp8_linear_forward(xr, wr, static_cast<const double*>(nullptr), y.data(), tokens, in, out, scratch.data());
  CHECK(test::worst_relative(y, test::reference_forward(xv_r, wv_r, tokens, in, out)) < 1e-13);
  // dgrad d_x = d_y·w (row-wise d_y, column-wise w).
  std::vector<double> dx(size_t(tokens * in));
  cpu::fp8_linear_backward_data(dr, wc, dx.data(), tokens, in, out, false, scratch.data());
  CHECK(test::worst_relative(dx, test::reference_dgrad(dv_r, wv_c, tokens, in, out)) < 1e-13);
  // wgrad dw += d_yᵀ·x (column-wise both), and the bias gradient from the column-wise d_y.
  std::vector<double> dw(size_t(out * in), 0.0), db(size_t(out), 0.0), db_ref;
  cpu::fp8_linear_backward_weight(dc, xc, dw.data(), db.data(), tokens, in, out, scratch.data());
  CHECK(test::worst_relative(dw, test::reference_wgrad(dv_c, xv_c, tokens, in, out, db_ref)) < 1e-13);
  CHECK(test::worst_relative(db, db_ref) < 1e-13);
  // And the values are near the unquantized product (FP8's few percent, not garbage).
  const double off = test::worst_relative(y, test::reference_forward(x, w, tokens, in, out));
  CHECK(off > 1e-4);
  CHECK(off < 0.1);
}
