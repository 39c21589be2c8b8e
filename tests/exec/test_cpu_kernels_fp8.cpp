// FP8 emulation (plans/fp8.hpp, exec/cpu_kernels_fp8.cpp) against hand-computed values: the grids'
// rounding (ties to even, subnormals, saturation), the 8-bit codes, delayed scaling's update, and
// the blocked FP8 GEMM against the product of the decoded operands.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "cpu_kernels.hpp"
#include "fp8.hpp"

using namespace stepcast;

TEST_CASE("fp8: values round to the e4m3 and e5m2 grids as hand-computed", "[kernels][fp8]") {
  const Fp8Storage e4m3 = Fp8Storage::e4m3, e5m2 = Fp8Storage::e5m2;
  CHECK(fp8_round(1.0, e4m3) == 1.0);
  // 0.1 lies in [2^-4, 2^-3): e4m3 steps 2^-7 (12.8 steps → 13), e5m2 steps 2^-6 (6.4 → 6).
  CHECK(fp8_round(0.1, e4m3) == 13.0 / 128);
  CHECK(fp8_round(0.1, e5m2) == 6.0 / 64);
  CHECK(fp8_round(-0.1, e4m3) == -13.0 / 128);
  // Ties to even: 1.0625 is halfway between 1 and 1.125 (e4m3 step 1/8) → 1; 1.1875 → 1.25.
  CHECK(fp8_round(1.0625, e4m3) == 1.0);
  CHECK(fp8_round(1.1875, e4m3) == 1.25);
  // Saturation to the largest finite value.
  CHECK(fp8_round(448.0, e4m3) == 448.0);
  CHECK(fp8_round(470.0, e4m3) == 448.0);
  CHECK(fp8_round(-1e6, e4m3) == -448.0);
  CHECK(fp8_round(60000.0, e5m2) == 57344.0);
  // Subnormals: e4m3's smallest is 2^-9, e5m2's 2^-16; below half of it, zero.
  CHECK(fp8_round(0.001, e4m3) == std::ldexp(1.0, -9));
  CHECK(fp8_round(0.0009, e4m3) == 0.0);
  CHECK(fp8_round(std::ldexp(3.0, -17), e5m2) == std::ldexp(2.0, -16));  // 1.5 quanta → 2 (even)
  CHECK(std::isnan(fp8_round(std::nan(""), e4m3)));
}

TEST_CASE("fp8: codes are OCP's and every code decodes and encodes back", "[kernels][fp8]") {
  CHECK(fp8_encode(1.0, Fp8Storage::e4m3) == 0x38);
  CHECK(fp8_encode(448.0, Fp8Storage::e4m3) == 0x7e);
  CHECK(fp8_encode(-2.0, Fp8Storage::e4m3) == 0xc0);
  CHECK(fp8_encode(std::ldexp(1.0, -9), Fp8Storage::e4m3) == 0x01);
  CHECK(fp8_encode(1.0, Fp8Storage::e5m2) == 0x3c);
  CHECK(fp8_encode(57344.0, Fp8Storage::e5m2) == 0x7b);
  CHECK(std::isnan(fp8_decode(0x7f, Fp8Storage::e4m3)));
  CHECK(std::isinf(fp8_decode(0x7c, Fp8Storage::e5m2)));
  for (Fp8Storage f : {Fp8Storage::e4m3, Fp8Storage::e5m2}) {
    int finite = 0;
    for (int c = 0; c < 256; ++c) {
      double v = fp8_decode(uint8_t(c), f);
      if (!std::isfinite(v)) continue;
      ++finite;
      INFO("code " << c);
      CHECK(fp8_round(v, f) == v);
      CHECK(fp8_encode(v, f) == uint8_t(c));
    }
    CHECK(finite == (f == Fp8Storage::e4m3 ? 254 : 248));  // e4m3: ±NaN; e5m2: ±inf, 6 NaNs
  }
}

TEST_CASE("fp8: delayed scaling's update follows Transformer Engine's formula", "[kernels][fp8]") {
  // History (newest first) [2, 5, 0], this step's amax 3, margin 1, e4m3 (448).
  std::vector<double> history = {2, 5, 0};
  double scale = fp8_updated_scale(history.data(), 3, 3.0, 1.0, Fp8AmaxAlgo::max, 1, Fp8Storage::e4m3);
  CHECK(history == std::vector<double>{3, 2, 5});
  CHECK(scale == Approx(448.0 / 5 / 2).epsilon(1e-15));
  history = {2, 5, 0};
  scale = fp8_updated_scale(history.data(), 3, 3.0, 1.0, Fp8AmaxAlgo::most_recent, 0, Fp8Storage::e5m2);
  CHECK(scale == Approx(57344.0 / 3).epsilon(1e-15));
  // An amax of 0 (the tensor was all zeros) keeps the scale.
  std::vector<double> one = {7};
  CHECK(fp8_updated_scale(one.data(), 1, 0.0, 2.5, Fp8AmaxAlgo::most_recent, 0, Fp8Storage::e4m3) == 2.5);
}

TEST_CASE("fp8: the blocked FP8 GEMM is the product of the decoded operands, every transpose", "[kernels][fp8]") {
  // Shapes across the 64-wide blocks, the operands cast with scales 4 and 0.5.
  const int64_t m = 70, n = 130, k = 65;
  std::vector<double> scratch(size_t(cpu::kFp8Scratch));
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      std::vector<uint8_t> a(size_t(m * k)), b(size_t(k * n));
      std::vector<double> av(a.size()), bv(b.size());
      double amax_a = 0, amax_b = 0;
      std::vector<double> ra(a.size()), rb(b.size());
      for (size_t i = 0; i < a.size(); ++i) ra[i] = std::sin(0.37 * double(i)) * 3;
      for (size_t i = 0; i < b.size(); ++i) rb[i] = std::cos(0.11 * double(i)) * 50;
      cpu::fp8_cast(ra.data(), a.data(), int64_t(a.size()), 4.0, &amax_a, Fp8Storage::e4m3);
      cpu::fp8_cast(rb.data(), b.data(), int64_t(b.size()), 0.5, &amax_b, Fp8Storage::e5m2);
      CHECK(amax_a == Approx(3).epsilon(1e-3));
      CHECK(amax_b == Approx(50).epsilon(1e-3));
      for (size_t i = 0; i < a.size(); ++i) av[i] = fp8_decode(a[i], Fp8Storage::e4m3) / 4.0;
      for (size_t i = 0; i < b.size(); ++i) bv[i] = fp8_decode(b[i], Fp8Storage::e5m2) / 0.5;
      const int64_t lda = ta ? m : k, ldb = tb ? k : n;
      std::vector<double> c(size_t(m * n), 1.0), expected(c.size());
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t l = 0; l < k; ++l)
            s += (ta ? av[l * lda + i] : av[i * lda + l]) * (tb ? bv[j * ldb + l] : bv[l * ldb + j]);
          expected[size_t(i * n + j)] = s + 0.5;
        }
      cpu::fp8_gemm<double>(ta, tb, m, n, k, {a.data(), lda, 4.0, Fp8Storage::e4m3},
                            {b.data(), ldb, 0.5, Fp8Storage::e5m2}, 0.5, c.data(), n, scratch.data());
      double worst = 0;
      for (size_t i = 0; i < c.size(); ++i) worst = std::max(worst, std::abs(c[i] - expected[i]));
      INFO("trans_a " << ta << " trans_b " << tb);
      CHECK(worst < 1e-10);
    }
  }
}

TEST_CASE("fp8: the wgrad from transposed copies of its operands' codes is the same bit for bit", "[kernels][fp8]") {
  // A device with fp8_columnwise transposed: the program's fp8_transpose writes x's and d_y's codes
  // transposed and the wgrad GEMM reads those; the same blocks decode to the same values, so dw
  // and the bias gradient (from d_y's own rows) equal the row-major product's exactly.
  const int64_t tokens = 70, in = 90, out = 130;  // across the 64-wide blocks
  std::vector<uint8_t> x8(size_t(tokens * in)), d8(size_t(tokens * out));
  for (size_t i = 0; i < x8.size(); ++i) x8[i] = uint8_t((i * 37 + 11) % 120);
  for (size_t i = 0; i < d8.size(); ++i) d8[i] = uint8_t(128 + (i * 53 + 5) % 110);
  std::vector<uint8_t> x8t(x8.size()), d8t(d8.size());
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t c = 0; c < in; ++c) x8t[size_t(c * tokens + t)] = x8[size_t(t * in + c)];
    for (int64_t c = 0; c < out; ++c) d8t[size_t(c * tokens + t)] = d8[size_t(t * out + c)];
  }
  const cpu::Fp8Operand<double> x{x8.data(), in, 16.0, Fp8Storage::e4m3}, d{d8.data(), out, 512.0, Fp8Storage::e5m2};
  std::vector<double> scratch(size_t(cpu::kFp8Scratch));
  std::vector<double> dw(size_t(out * in), 0.25), db(size_t(out), -0.5);
  std::vector<double> dw_t = dw, db_t = db;
  cpu::fp8_linear_backward_weight(d, x, dw.data(), db.data(), tokens, in, out, scratch.data());
  cpu::fp8_linear_backward_weight(d, x, dw_t.data(), db_t.data(), tokens, in, out, scratch.data(), d8t.data(),
                                  x8t.data());
  CHECK(dw_t == dw);
  CHECK(db_t == db);
  double moved = 0;
  for (size_t i = 0; i < dw.size(); ++i) moved += std::abs(dw[i] - 0.25);
  CHECK(moved > 0);
}
