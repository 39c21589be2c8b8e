// The CPU kernels against oracles (kernel_oracles.hpp): every backward against central finite
// differences (fp64), tensor/sequence-parallel shards against the unsplit kernel (dropout masks
// included), cross entropy against −log softmax, AdamW against a hand step. The attention
// kernels' tests are test_cpu_kernels_attention.cpp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "cpu_kernels.hpp"
#include "kernel_oracles.hpp"

using namespace stepcast::cpu;
using namespace stepcast::cpu::test;

TEST_CASE("gemm matches a naive product for every transpose and leading dimension", "[kernels]") {
  const int64_t m = 5, n = 4, k = 3, pad = 2;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const int64_t lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
      Vec a = random_vec(size_t((ta ? k : m) * lda), 1), b = random_vec(size_t((tb ? n : k) * ldb), 2);
      Vec c = random_vec(size_t(m * ldc), 3), expected = c;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t l = 0; l < k; ++l)
            s += (ta ? a[l * lda + i] : a[i * lda + l]) * (tb ? b[j * ldb + l] : b[l * ldb + j]);
          expected[i * ldc + j] = 0.7 * s + 0.3 * c[i * ldc + j];
        }
      gemm(ta, tb, m, n, k, 0.7, a.data(), lda, b.data(), ldb, 0.3, c.data(), ldc);
      CHECK(max_abs_diff(c, expected) < 1e-14);
    }
  }
}

TEST_CASE("linear backward matches finite differences and accumulates", "[kernels]") {
  const int64_t tokens = 3, in = 4, out = 5;
  Vec x = random_vec(tokens * in, 1), w = random_vec(out * in, 2), bias = random_vec(out, 3);
  Vec r = random_vec(tokens * out, 4);
  auto loss = [&](const Vec& xx, const Vec& ww, const Vec& bb) {
    Vec y(tokens * out);
    linear_forward(xx.data(), ww.data(), bb.data(), y.data(), tokens, in, out);
    return weighted_sum(y, r);
  };
  Vec dx0 = random_vec(x.size(), 5), dw0 = random_vec(w.size(), 6), db0 = random_vec(out, 7);
  Vec dx = dx0, dw = dw0, db = db0;
  linear_backward_data(r.data(), w.data(), dx.data(), tokens, in, out, true);
  linear_backward_weight(r.data(), x.data(), dw.data(), db.data(), tokens, in, out);
  CHECK(rel_err(added(dx, dx0), fd_grad([&](const Vec& v) { return loss(v, w, bias); }, x)) < kFdTol);
  CHECK(rel_err(added(dw, dw0), fd_grad([&](const Vec& v) { return loss(x, v, bias); }, w)) < kFdTol);
  CHECK(rel_err(added(db, db0), fd_grad([&](const Vec& v) { return loss(x, w, v); }, bias)) < kFdTol);
  Vec dx_over = dx0;
  linear_backward_data(r.data(), w.data(), dx_over.data(), tokens, in, out, false);
  CHECK(max_abs_diff(dx_over, added(dx, dx0)) < 1e-14);
}

TEST_CASE("vocab-parallel embedding: shards sum to the full lookup — backward scatters", "[kernels]") {
  const int64_t s = 4, b = 2, h = 3, vocab = 6;
  std::vector<int32_t> tokens = {0, 5, 3, 3, 1, 2, 4, 5};
  Vec w = random_vec(vocab * h, 1), r = random_vec(s * b * h, 2);
  Vec full(s * b * h);
  embedding_forward(tokens.data(), w.data(), full.data(), s, b, h, 0, vocab);
  Vec sum(s * b * h, 0.0), dw_full(vocab * h, 0.0);
  embedding_backward(tokens.data(), r.data(), dw_full.data(), s, b, h, 0, vocab);
  for (int64_t rank = 0; rank < 2; ++rank) {
    const int64_t v0 = rank * 3;
    Vec shard_w(w.begin() + v0 * h, w.begin() + (v0 + 3) * h), part(s * b * h);
    embedding_forward(tokens.data(), shard_w.data(), part.data(), s, b, h, v0, 3);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
    Vec dw(3 * h, 0.0);
    embedding_backward(tokens.data(), r.data(), dw.data(), s, b, h, v0, 3);
    CHECK(dw == Vec(dw_full.begin() + v0 * h, dw_full.begin() + (v0 + 3) * h));
  }
  CHECK(sum == full);
  CHECK(full[1 * h + 2] == w[5 * h + 2]);  // token (s=0, b=1) is id 5
  auto loss = [&](const Vec& ww) {
    Vec y(s * b * h);
    embedding_forward(tokens.data(), ww.data(), y.data(), s, b, h, 0, vocab);
    return weighted_sum(y, r);
  };
  CHECK(rel_err(dw_full, fd_grad(loss, w)) < kFdTol);
}

TEST_CASE("learned positions use global positions under a sequence split", "[kernels]") {
  const int64_t s = 4, b = 2, h = 3, max_pos = 6;
  Vec x = random_vec(s * b * h, 1), pos = random_vec(max_pos * h, 2), r = random_vec(s * b * h, 3);
  Vec full = x;
  position_add_forward(full.data(), pos.data(), s, b, h, 0, max_pos);
  Vec dpos_full(max_pos * h, 0.0), dpos_split(max_pos * h, 0.0);
  position_add_backward(r.data(), dpos_full.data(), s, b, h, 0, max_pos);
  for (int64_t rank = 0; rank < 2; ++rank) {
    const int64_t half = s / 2 * b * h;
    Vec part(x.begin() + rank * half, x.begin() + (rank + 1) * half);
    position_add_forward(part.data(), pos.data(), s / 2, b, h, rank * s / 2, max_pos);
    CHECK(part == Vec(full.begin() + rank * half, full.begin() + (rank + 1) * half));
    position_add_backward(r.data() + rank * half, dpos_split.data(), s / 2, b, h, rank * s / 2, max_pos);
  }
  CHECK(max_abs_diff(dpos_split, dpos_full) < 1e-15);
  auto loss = [&](const Vec& p) {
    Vec y = x;
    position_add_forward(y.data(), p.data(), s, b, h, 0, max_pos);
    return weighted_sum(y, r);
  };
  CHECK(rel_err(dpos_full, fd_grad(loss, pos)) < kFdTol);
}

TEST_CASE("layernorm and rmsnorm backward match finite differences and accumulate", "[kernels]") {
  const int64_t rows = 3, h = 5;
  const double eps = 1e-5;
  Vec x = random_vec(rows * h, 1), w = random_vec(h, 2), bias = random_vec(h, 3), r = random_vec(rows * h, 4);
  Vec dx0 = random_vec(rows * h, 5), dw0 = random_vec(h, 6), db0 = random_vec(h, 7);
  SECTION("layernorm") {
    auto loss = [&](const Vec& xx, const Vec& ww, const Vec& bb) {
      Vec y(rows * h);
      layernorm_forward(xx.data(), ww.data(), bb.data(), y.data(), rows, h, eps);
      return weighted_sum(y, r);
    };
    Vec dx = dx0, dw = dw0, db = db0;
    layernorm_backward(x.data(), w.data(), r.data(), dx.data(), dw.data(), db.data(), rows, h, eps);
    CHECK(rel_err(added(dx, dx0), fd_grad([&](const Vec& v) { return loss(v, w, bias); }, x)) < kFdTol);
    CHECK(rel_err(added(dw, dw0), fd_grad([&](const Vec& v) { return loss(x, v, bias); }, w)) < kFdTol);
    CHECK(rel_err(added(db, db0), fd_grad([&](const Vec& v) { return loss(x, w, v); }, bias)) < kFdTol);
  }
  SECTION("rmsnorm") {
    auto loss = [&](const Vec& xx, const Vec& ww) {
      Vec y(rows * h);
      rmsnorm_forward(xx.data(), ww.data(), y.data(), rows, h, eps);
      return weighted_sum(y, r);
    };
    Vec dx = dx0, dw = dw0;
    rmsnorm_backward(x.data(), w.data(), r.data(), dx.data(), dw.data(), rows, h, eps);
    CHECK(rel_err(added(dx, dx0), fd_grad([&](const Vec& v) { return loss(v, w); }, x)) < kFdTol);
    CHECK(rel_err(added(dw, dw0), fd_grad([&](const Vec& v) { return loss(x, v); }, w)) < kFdTol);
    Vec y(rows * h);
    rmsnorm_forward(x.data(), w.data(), y.data(), rows, h, 0.0);
    double ms = (x[0] * x[0] + x[1] * x[1] + x[2] * x[2] + x[3] * x[3] + x[4] * x[4]) / 5;
    CHECK(y[1] == Approx(x[1] / std::sqrt(ms) * w[1]).epsilon(1e-14));
  }
}

TEST_CASE("rotary: rotate_half convention, global positions, inverse backward", "[kernels]") {
  const AttentionShape sh{6, 2, 2, 1, 4};
  const double theta = 10000;
  Vec qkv = random_vec(size_t(sh.s * sh.b * sh.qkv_width()), 1);
  Vec rotated = qkv;
  rotary_forward(rotated.data(), sh, theta, 0);
  // Hand check: row (s=3, b=1), k head (index 2), pair i = 1: frequency theta^(−2/4).
  const int64_t at = (3 * sh.b + 1) * sh.qkv_width() + 2 * sh.d;
  const double angle = 3 * std::pow(theta, -0.5);
  CHECK(rotated[at + 1] == Approx(qkv[at + 1] * std::cos(angle) - qkv[at + 3] * std::sin(angle)).epsilon(1e-14));
  CHECK(rotated[at + 3] == Approx(qkv[at + 3] * std::cos(angle) + qkv[at + 1] * std::sin(angle)).epsilon(1e-14));
  for (int64_t row = 0; row < sh.s * sh.b; ++row)  // v heads untouched
    for (int64_t c = 3 * sh.d; c < 4 * sh.d; ++c)
      CHECK(rotated[row * sh.qkv_width() + c] == qkv[row * sh.qkv_width() + c]);
  // A sequence shard at offset 3 rotates exactly like those rows of the full tensor.
  const int64_t row_elems = sh.b * sh.qkv_width();
  AttentionShape half = sh;
  half.s = 3;
  Vec tail(qkv.begin() + 3 * row_elems, qkv.end());
  rotary_forward(tail.data(), half, theta, 3);
  CHECK(tail == Vec(rotated.begin() + 3 * row_elems, rotated.end()));
  // Backward is the transpose: finite differences of Σ r·rotate(x).
  Vec r = random_vec(qkv.size(), 2), grad = r;
  rotary_backward(grad.data(), sh, theta, 0);
  auto loss = [&](const Vec& x) {
    Vec y = x;
    rotary_forward(y.data(), sh, theta, 0);
    return weighted_sum(y, r);
  };
  CHECK(rel_err(grad, fd_grad(loss, qkv)) < kFdTol);
  Vec back = rotated;
  rotary_backward(back.data(), sh, theta, 0);
  CHECK(max_abs_diff(back, qkv) < 1e-14);
}

TEST_CASE("dropout masks: counter-based, global coordinates, 1 − p kept", "[kernels]") {
  const int64_t s = 6, b = 3, h = 5;
  const Dropout drop{0.3, 1234, 7, 2, DropoutSite::mlp_residual};
  const std::vector<int64_t> samples = {10, 11, 40};
  Vec x = random_vec(s * b * h, 1), residual = random_vec(s * b * h, 2);
  Vec out(s * b * h);
  Mask mask(s * b * h);
  dropout_add_forward(x.data(), residual.data(), out.data(), mask.data(), s, b, h, drop, 0, samples.data());
  int64_t kept = 0;
  for (int64_t si = 0; si < s; ++si)
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t j = 0; j < h; ++j) {
        int64_t at = (si * b + bi) * h + j;
        bool keep = dropout_keep(drop.seed, drop.site, drop.step, drop.layer, samples[bi], si, j, 0, drop.p);
        CHECK(mask[at] == (keep ? 1 : 0));
        CHECK(out[at] == residual[at] + (keep ? x[at] * (1 / 0.7) : 0.0));
        kept += keep;
      }
  CHECK(kept > 0);
  CHECK(kept < s * b * h);

  SECTION("a sequence-parallel split draws the same mask") {
    for (int64_t rank = 0; rank < 2; ++rank) {
      const int64_t half = s / 2 * b * h;
      Vec part_out(half);
      Mask part_mask(half);
      dropout_add_forward(x.data() + rank * half, residual.data() + rank * half, part_out.data(),
                          part_mask.data(), s / 2, b, h, drop, rank * s / 2, samples.data());
      CHECK(part_out == Vec(out.begin() + rank * half, out.begin() + (rank + 1) * half));
      CHECK(part_mask == Mask(mask.begin() + rank * half, mask.begin() + (rank + 1) * half));
    }
  }
  SECTION("a different step, layer, site or sample draws a different mask") {
    auto differs = [&](const Dropout& other, const std::vector<int64_t>& other_samples) {
      Vec o(s * b * h);
      Mask m(s * b * h);
      dropout_add_forward(x.data(), residual.data(), o.data(), m.data(), s, b, h, other, 0, other_samples.data());
      return m != mask;
    };
    CHECK(differs({0.3, 1234, 8, 2, DropoutSite::mlp_residual}, samples));
    CHECK(differs({0.3, 1234, 7, 3, DropoutSite::mlp_residual}, samples));
    CHECK(differs({0.3, 1234, 7, 2, DropoutSite::attention_residual}, samples));
    CHECK(differs({0.3, 1235, 7, 2, DropoutSite::mlp_residual}, samples));
    CHECK(differs(drop, {10, 12, 40}));
  }
  SECTION("the kept fraction is 1 − p") {
    int64_t n = 200000, count = 0;
    for (int64_t i = 0; i < n; ++i) count += dropout_keep(5, DropoutSite::attention_probs, 1, 0, i % 7, i, i % 13, 3, 0.3);
    CHECK(std::abs(double(count) / n - 0.7) < 0.005);
    CHECK(dropout_keep(5, DropoutSite::embedding, 1, -1, 0, 0, 0, 0, 0.0));
  }
  SECTION("backward through the stored mask") {
    Vec dy = random_vec(s * b * h, 3), dx(s * b * h);
    dropout_backward(dy.data(), mask.data(), dx.data(), s * b * h, drop.p);
    auto loss = [&](const Vec& xx) {
      Vec o(s * b * h);
      Mask m(s * b * h);
      dropout_add_forward(xx.data(), residual.data(), o.data(), m.data(), s, b, h, drop, 0, samples.data());
      return weighted_sum(o, dy);
    };
    CHECK(rel_err(dx, fd_grad(loss, x)) < kFdTol);
  }
}

TEST_CASE("gelu's branch-free tanh matches libm's across the range", "[kernels]") {
  // The kernel's tanh is 1 − 2/(e^{2z} + 1) (a time independent of the values); its GELU and
  // gradient agree with the std::tanh forms to rounding, e^{2z}'s overflow included.
  const double c = 0.7978845608028654, a = 0.044715;
  Vec x = {0.0, 1e-300, -1e-8, 1e-3, 0.3, -0.7, 1.2, -2.5, 4.0, -9.0, 30.0, -30.0, 400.0, -400.0, 1e200, -1e200};
  const int64_t n = int64_t(x.size());
  Vec y(n), dy(n, 1.0), dx(n);
  gelu_forward(x.data(), y.data(), n);
  gelu_backward(x.data(), dy.data(), dx.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    double v = x[size_t(i)], z = c * (v + a * v * v * v), t = std::tanh(z);
    double want_y = 0.5 * v * (1.0 + t);
    double want_dx = 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * c * (1.0 + 3.0 * a * v * v);
    INFO("x = " << v);
    CHECK(std::isfinite(y[size_t(i)]));
    CHECK(std::abs(y[size_t(i)] - want_y) <= 4e-16 * std::abs(v));
    if (std::abs(v) < 100) CHECK(std::abs(dx[size_t(i)] - want_dx) <= 1e-15 * (1.0 + v * v));
  }
}

TEST_CASE("gelu and swiglu backward match finite differences", "[kernels]") {
  const int64_t n = 7;
  Vec x = random_vec(n, 1), up = random_vec(n, 2), r = random_vec(n, 3);
  Vec y(n), dx(n);
  gelu_forward(x.data(), y.data(), n);
  gelu_backward(x.data(), r.data(), dx.data(), n);
  auto gelu_loss = [&](const Vec& v) {
    Vec o(n);
    gelu_forward(v.data(), o.data(), n);
    return weighted_sum(o, r);
  };
  CHECK(rel_err(dx, fd_grad(gelu_loss, x)) < kFdTol);
  Vec known = {1.0, -0.5}, known_y(2);
  gelu_forward(known.data(), known_y.data(), 2);
  CHECK(known_y[0] == Approx(0.8411919906082768).epsilon(1e-14));  // GPT-2 gelu_new(1)
  CHECK(known_y[1] == Approx(-0.15428599017485606).epsilon(1e-14));

  Vec d_gate(n), d_up(n);
  swiglu_backward(x.data(), up.data(), r.data(), d_gate.data(), d_up.data(), n);
  auto swiglu_loss = [&](const Vec& g, const Vec& u) {
    Vec o(n);
    swiglu_forward(g.data(), u.data(), o.data(), n);
    return weighted_sum(o, r);
  };
  CHECK(rel_err(d_gate, fd_grad([&](const Vec& g) { return swiglu_loss(g, up); }, x)) < kFdTol);
  CHECK(rel_err(d_up, fd_grad([&](const Vec& u) { return swiglu_loss(x, u); }, up)) < kFdTol);
  Vec one = {1.0}, two = {2.0}, act(1);
  swiglu_forward(one.data(), two.data(), act.data(), 1);
  CHECK(act[0] == Approx(1.4621171572600098).epsilon(1e-14));  // silu(1)·2
}

TEST_CASE("vocab-parallel cross entropy: −log softmax, shard invariance, gradient", "[kernels]") {
  const int64_t tokens = 6, vocab = 8, tp = 2, v_local = vocab / tp;
  const std::vector<int32_t> targets = {0, 7, 3, 4, 4, 1};
  Vec logits = random_vec(tokens * vocab, 1);
  for (double& v : logits) v *= 4;
  auto single_rank = [&](const Vec& lg, Vec* softmax) {
    Vec stats(3 * tokens), loss(tokens), sm(tokens * vocab);
    cross_entropy_stats(lg.data(), targets.data(), stats.data(), tokens, 0, vocab);
    cross_entropy_forward(lg.data(), stats.data(), 1, sm.data(), loss.data(), tokens, vocab);
    if (softmax) *softmax = sm;
    return loss;
  };
  Vec softmax;
  Vec loss = single_rank(logits, &softmax);
  for (int64_t t = 0; t < tokens; ++t) {
    double z = 0, row_sum = 0;
    for (int64_t j = 0; j < vocab; ++j) {
      z += std::exp(logits[t * vocab + j]);
      row_sum += softmax[t * vocab + j];
    }
    CHECK(loss[t] == Approx(-std::log(std::exp(logits[t * vocab + targets[t]]) / z)).epsilon(1e-13));
    CHECK(row_sum == Approx(1.0).epsilon(1e-14));
  }
  const double scale = 1.0 / tokens;
  Vec dlogits(tokens * vocab);
  cross_entropy_backward(softmax.data(), targets.data(), dlogits.data(), tokens, 0, vocab, scale);
  auto mean_loss = [&](const Vec& lg) {
    Vec l = single_rank(lg, nullptr);
    double s = 0;
    for (double v : l) s += v;
    return s * scale;
  };
  CHECK(rel_err(dlogits, fd_grad(mean_loss, logits)) < kFdTol);

  // Two vocab shards: stats gathered in rank order, then each rank combines.
  std::vector<Vec> shard_logits(tp);
  Vec stats_all(tp * 3 * tokens);
  for (int64_t r = 0; r < tp; ++r) {
    shard_logits[r] = column_shard(logits, tokens, {vocab}, tp, r);
    cross_entropy_stats(shard_logits[r].data(), targets.data(), stats_all.data() + r * 3 * tokens,
                        tokens, r * v_local, v_local);
  }
  for (int64_t r = 0; r < tp; ++r) {
    Vec sm(tokens * v_local), l(tokens), dl(tokens * v_local);
    cross_entropy_forward(shard_logits[r].data(), stats_all.data(), tp, sm.data(), l.data(), tokens, v_local);
    CHECK(max_abs_diff(l, loss) < 1e-12);
    CHECK(max_abs_diff(sm, column_shard(softmax, tokens, {vocab}, tp, r)) < 1e-12);
    cross_entropy_backward(sm.data(), targets.data(), dl.data(), tokens, r * v_local, v_local, scale);
    CHECK(max_abs_diff(dl, column_shard(dlogits, tokens, {vocab}, tp, r)) < 1e-12);
  }
}

TEST_CASE("AdamW: one step by hand, clipping, gradient norm", "[kernels]") {
  CHECK(grad_norm_sq(Vec{3.0, 4.0}.data(), 2) == 25.0);
  CHECK(clip_coefficient(0.5, 1.0) == 1.0);
  CHECK(clip_coefficient(10.0, 1.0) == Approx(1.0 / (10.0 + 1e-6)).epsilon(1e-15));
  const AdamW cfg{1e-2, 0.9, 0.95, 1e-8, 0.1};
  Vec p = {0.5, -1.0}, g = {0.2, -0.4}, m = {0.0, 0.0}, v = {0.0, 0.0};
  // Step 1 with clip coefficient 0.5: g' = g/2, m̂ = g', v̂ = g'², update = g'/(|g'| + eps).
  adamw_step(p.data(), g.data(), m.data(), v.data(), 2, cfg, 1, 0.5);
  CHECK(m[0] == Approx(0.1 * 0.1).epsilon(1e-15));
  CHECK(v[1] == Approx(0.05 * 0.04).epsilon(1e-15));
  CHECK(p[0] == Approx(0.5 - 1e-2 * (0.1 / (0.1 + 1e-8) + 0.1 * 0.5)).epsilon(1e-15));
  CHECK(p[1] == Approx(-1.0 - 1e-2 * (-0.2 / (0.2 + 1e-8) - 0.1 * 1.0)).epsilon(1e-15));
  // Step 2, no clipping, from the moments above.
  const double p0 = p[0], m0 = m[0], v0 = v[0];
  adamw_step(p.data(), g.data(), m.data(), v.data(), 2, cfg, 2, 1.0);
  const double m2 = 0.9 * m0 + 0.1 * 0.2, v2 = 0.95 * v0 + 0.05 * 0.04;
  const double update = (m2 / (1 - 0.81)) / (std::sqrt(v2 / (1 - 0.9025)) + 1e-8);
  CHECK(p[0] == Approx(p0 - 1e-2 * (update + 0.1 * p0)).epsilon(1e-14));
  std::vector<float> pf = {0.5f}, gf = {0.2f}, mf = {0.0f}, vf = {0.0f};
  adamw_step(pf.data(), gf.data(), mf.data(), vf.data(), 1, cfg, 1, 1.0);
  CHECK(pf[0] == Approx(0.5 - 1e-2 * (1.0 + 0.05)).epsilon(1e-6));
}
