// FP8 blockwise emulation (plans/fp8.hpp's block storage, exec/cpu_kernels_fp8.cpp's block_cast
// and block-scaled GEMM operands) against hand-computed values: a block's scale (Transformer
// Engine's compute_scale_from_amax with power-of-two scales: fp8_max / amax in fp32, mantissa
// cleared), the codes and scales a cast writes for 1×128 blocks and 128×128 tiles, where they sit
// in a buffer, and the GEMMs against the products of the decoded blocks.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu_kernels.hpp"
#include "fp8_reference.hpp"
#include "fp8.hpp"

using namespace stepcast;

namespace {

// The value a block-scaled buffer holds at (r, c).
double stored(const std::vector<uint8_t>& y, const BlockLayout& l, int64_t r, int64_t c, Fp8Storage f) {
  return fp8_decode(y[size_t(l.code(r, c))], f) * block_dequantize_factor(l.blocks, y.data() + l.scale(r, c));
}

float scale_at(const std::vector<uint8_t>& y, const BlockLayout& l, int64_t r, int64_t c) {
  float v = 0;
  std::memcpy(&v, y.data() + l.scale(r, c), sizeof v);
  return v;
}

}  // namespace

TEST_CASE("fp8 blockwise: a block's scale is fp8_max over amax rounded down to a power of two", "[kernels][fp8]") {
  const Fp8Storage e4m3 = Fp8Storage::e4m3, e5m2 = Fp8Storage::e5m2;
  CHECK(blockwise_scale(448, e4m3) == 1.0f);
  CHECK(blockwise_scale(224, e4m3) == 2.0f);
  CHECK(blockwise_scale(3, e4m3) == 128.0f);    // 149.3 → 128
  CHECK(blockwise_scale(1, e4m3) == 256.0f);    // 448 → 256
  CHECK(blockwise_scale(449, e4m3) == 0.5f);    // 0.998 → 0.5
  CHECK(blockwise_scale(1, e5m2) == 32768.0f);  // 57344 → 32768
  // 1, TE's scale for an amax of 0, infinity or NaN.
  CHECK(blockwise_scale(0, e4m3) == 1.0f);
  CHECK(blockwise_scale(INFINITY, e4m3) == 1.0f);
  CHECK(blockwise_scale(NAN, e4m3) == 1.0f);
  // An amax so small that fp8_max / amax overflows fp32: the largest float, rounded down: 2^127.
  CHECK(blockwise_scale(1e-40, e4m3) == std::ldexp(1.0f, 127));
  // fp32 scales (TE's NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1): the quotient itself.
  CHECK(blockwise_scale(3, e4m3, false) == 448.0f / 3.0f);
  CHECK(blockwise_scale(1, e5m2, false) == 57344.0f);
  CHECK(blockwise_scale(1e-40, e4m3, false) == std::numeric_limits<float>::max());
}

TEST_CASE("fp8 blockwise: buffers hold 128-row bands of codes, each followed by fp32 scales", "[kernels][fp8]") {
  // cols 256. 1×128 blocks: a band is 128·256 codes and 256 scales of 4 bytes (row-wise: 2 a row;
  // column-wise: one a column), 33792 bytes. Tiles: 128·256 codes and 2 scales, 32776 bytes.
  const BlockLayout rows{Fp8Blocks::vector, 256, false}, columns{Fp8Blocks::vector, 256, true};
  const BlockLayout tiles{Fp8Blocks::tile, 256, false}, tiles_t{Fp8Blocks::tile, 256, true};
  CHECK(rows.code(130, 200) == 33792 + 2 * 256 + 200);
  CHECK(columns.code(130, 200) == rows.code(130, 200));
  CHECK(rows.scale(130, 200) == 33792 + 32768 + (2 * 2 + 1) * 4);
  CHECK(columns.scale(130, 200) == 33792 + 32768 + 200 * 4);
  CHECK(tiles.code(130, 200) == 32776 + 2 * 256 + 200);
  CHECK(tiles.scale(130, 200) == 32776 + 32768 + 1 * 4);
  CHECK(tiles_t.scale(130, 200) == tiles.scale(130, 200));  // a tile's scale serves both ways
  CHECK(block_bytes(Fp8Blocks::vector, 256 * 256) == 2 * 33792);
  CHECK(block_bytes(Fp8Blocks::tile, 256 * 256) == 2 * 32776);
  CHECK(block_elements(Fp8Blocks::tile, 2 * 32776) == 256 * 256);
}

TEST_CASE("fp8 blockwise: a cast writes each block's scale and its values scaled and rounded", "[kernels][fp8]") {
  // A 128 × 256 tensor: 1.1 everywhere but row 0, column 0 (3) and row 5, column 200 (−448).
  const int64_t rows = 128, cols = 256;
  const Fp8Storage e4m3 = Fp8Storage::e4m3;
  std::vector<double> x(size_t(rows * cols), 1.1);
  x[0] = 3;
  x[5 * cols + 200] = -448;
  std::vector<uint8_t> y(size_t(block_bytes(Fp8Blocks::vector, rows * cols)));
  SECTION("1x128 blocks along rows") {
    cpu::block_cast(x.data(), y.data(), rows, cols, Fp8Blocks::vector, false, e4m3);
    const BlockLayout l{Fp8Blocks::vector, cols, false};
    // Row 0, columns 0–127: amax 3 → scale 128 (its reciprocal stored): 3 → 384 exactly; 1.1 →
    // 140.8, on e4m3's grid of 16 between 128 and 256 → 144, read back as 1.125.
    CHECK(scale_at(y, l, 0, 0) == 1.0f / 128);
    CHECK(stored(y, l, 0, 0, e4m3) == 3);
    CHECK(stored(y, l, 0, 1, e4m3) == 1.125);
    // Row 0, columns 128–255: amax 1.1 → 407.3 → 256: 281.6 → 288 (grid 32), 1.125.
    CHECK(scale_at(y, l, 0, 128) == 1.0f / 256);
    CHECK(stored(y, l, 0, 200, e4m3) == 1.125);
    // Row 5, columns 128–255: amax 448 → 1: 1.1 → 1.125 (grid 1/8), −448 stays.
    CHECK(scale_at(y, l, 5, 255) == 1.0f);
    CHECK(stored(y, l, 5, 200, e4m3) == -448);
    CHECK(stored(y, l, 5, 130, e4m3) == 1.125);
    CHECK(scale_at(y, l, 6, 200) == 1.0f / 256);
  }
  SECTION("1x128 blocks along rows, fp32 scales") {
    cpu::block_cast(x.data(), y.data(), rows, cols, Fp8Blocks::vector, false, e4m3, false);
    const BlockLayout l{Fp8Blocks::vector, cols, false};
    // Row 0, columns 0–127: scale 448/3 = 149.33: 3 → 448; 1.1 → 164.27, on the grid of 16 → 160,
    // read back times fp32(3/448): not 1.1's power-of-two rounding (1.125).
    const float inverse = 1.0f / (448.0f / 3.0f);
    CHECK(scale_at(y, l, 0, 0) == inverse);
    CHECK(stored(y, l, 0, 0, e4m3) == 448 * double(inverse));
    CHECK(stored(y, l, 0, 1, e4m3) == 160 * double(inverse));
    CHECK(stored(y, l, 0, 1, e4m3) == Approx(1.0714).epsilon(1e-4));
  }
  SECTION("128x1 blocks down columns") {
    cpu::block_cast(x.data(), y.data(), rows, cols, Fp8Blocks::vector, true, e4m3);
    const BlockLayout l{Fp8Blocks::vector, cols, true};
    // Column 0: amax 3 (×128); column 200: amax 448 (×1); column 1: amax 1.1 (×256).
    CHECK(scale_at(y, l, 0, 0) == 1.0f / 128);
    CHECK(scale_at(y, l, 77, 200) == 1.0f);
    CHECK(scale_at(y, l, 9, 1) == 1.0f / 256);
    CHECK(stored(y, l, 0, 0, e4m3) == 3);
    CHECK(stored(y, l, 5, 200, e4m3) == -448);
    CHECK(stored(y, l, 6, 200, e4m3) == 1.125);
  }
  SECTION("128x128 tiles") {
    std::vector<uint8_t> t(size_t(block_bytes(Fp8Blocks::tile, rows * cols)));
    cpu::block_cast(x.data(), t.data(), rows, cols, Fp8Blocks::tile, false, e4m3);
    const BlockLayout l{Fp8Blocks::tile, cols, false};
    // Tile 0: amax 3 (×128); tile 1: amax 448 (×1), every one of its rows.
    CHECK(scale_at(t, l, 0, 0) == 1.0f / 128);
    CHECK(scale_at(t, l, 127, 127) == 1.0f / 128);
    CHECK(scale_at(t, l, 0, 128) == 1.0f);
    CHECK(stored(t, l, 1, 1, e4m3) == 1.125);
    CHECK(stored(t, l, 0, 130, e4m3) == 1.125);
    CHECK(stored(t, l, 5, 200, e4m3) == -448);
    std::vector<uint8_t> t_columnwise(t.size());  // the same tiles, the same bytes
    cpu::block_cast(x.data(), t_columnwise.data(), rows, cols, Fp8Blocks::tile, true, e4m3);
    CHECK(t_columnwise == t);
  }
}

TEST_CASE("fp8 blockwise: the GEMMs on blockwise operands are the products of their decoded blocks",
          "[kernels][fp8]") {
  // A linear layer's three GEMMs (256 tokens, 128 in, 256 out) on operands cast as the program
  // casts them (x and d_y in 1×128 blocks both ways, w in tiles), against sums over each operand's
  // own decoded values.
  const int64_t tokens = 256, in = 128, out = 256;
  const Fp8Storage e4m3 = Fp8Storage::e4m3, e5m2 = Fp8Storage::e5m2;
  std::vector<double> x(size_t(tokens * in)), w(size_t(out * in)), dy(size_t(tokens * out));
  for (int64_t t = 0; t < tokens; ++t)  // magnitudes varying row to row: a column's block spans them
    for (int64_t i = 0; i < in; ++i)
      x[size_t(t * in + i)] = std::sin(0.37 * double(t * in + i)) * std::ldexp(1.0, int((t * 3) % 11) - 5);
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::cos(0.11 * double(i)) * 0.02;
  for (size_t i = 0; i < dy.size(); ++i) dy[i] = std::sin(0.05 * double(i) + 1) * 1e-3 * (1 + double(i % 13));
  auto cast = [](const std::vector<double>& v, int64_t rows, int64_t cols, Fp8Blocks b, bool columnwise,
                 Fp8Storage f) {
    std::vector<uint8_t> codes(size_t(block_bytes(b, rows * cols)));
    cpu::block_cast(v.data(), codes.data(), rows, cols, b, columnwise, f);
    std::vector<double> decoded(v.size());
    const BlockLayout l{b, cols, columnwise};
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) decoded[size_t(r * cols + c)] = stored(codes, l, r, c, f);
    return std::make_pair(codes, decoded);
  };
  const Fp8Blocks vec = Fp8Blocks::vector, tile = Fp8Blocks::tile;
  auto [x_r, xv_r] = cast(x, tokens, in, vec, false, e4m3);
  auto [x_c, xv_c] = cast(x, tokens, in, vec, true, e4m3);
  auto [w_t, wv_t] = cast(w, out, in, tile, false, e4m3);
  auto [d_r, dv_r] = cast(dy, tokens, out, vec, false, e5m2);
  auto [d_c, dv_c] = cast(dy, tokens, out, vec, true, e5m2);
  CHECK(xv_r != xv_c);  // blocks along rows and down columns round differently
  std::vector<double> scratch(size_t(cpu::kFp8Scratch));
  const cpu::Fp8Operand<double> xr{x_r.data(), in, 1.0, e4m3, vec, false}, xc{x_c.data(), in, 1.0, e4m3, vec, true};
  const cpu::Fp8Operand<double> wt{w_t.data(), in, 1.0, e4m3, tile, false}, wt_c{w_t.data(), in, 1.0, e4m3, tile, true};
  const cpu::Fp8Operand<double> dr{d_r.data(), out, 1.0, e5m2, vec, false}, dc{d_c.data(), out, 1.0, e5m2, vec, true};
  // Forward y = x·wᵀ; dgrad d_x = d_y·w (the tiles read column-wise: the same values).
  std::vector<double> y(size_t(tokens * out));
  cpu::fp8_linear_forward(xr, wt, static_cast<const double*>(nullptr), y.data(), tokens, in, out, scratch.data());
  CHECK(test::worst_relative(y, test::reference_forward(xv_r, wv_t, tokens, in, out)) < 1e-13);
  const double off = test::worst_relative(y, test::reference_forward(x, w, tokens, in, out));  // FP8's few percent
  CHECK(off > 1e-4);
  CHECK(off < 0.1);
  std::vector<double> dx(size_t(tokens * in));
  cpu::fp8_linear_backward_data(dr, wt_c, dx.data(), tokens, in, out, false, scratch.data());
  CHECK(test::worst_relative(dx, test::reference_dgrad(dv_r, wv_t, tokens, in, out)) < 1e-13);
  // wgrad dw = d_yᵀ·x (column-wise both), and the bias gradient from the column-wise d_y.
  std::vector<double> dw(size_t(out * in), 0.0), db(size_t(out), 0.0), db_ref;
  cpu::fp8_linear_backward_weight(dc, xc, dw.data(), db.data(), tokens, in, out, scratch.data());
  CHECK(test::worst_relative(dw, test::reference_wgrad(dv_c, xv_c, tokens, in, out, db_ref)) < 1e-13);
  CHECK(test::worst_relative(db, db_ref) < 1e-13);
}
