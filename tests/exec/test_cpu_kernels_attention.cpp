// The CPU attention kernels against oracles: materialized and flash backward against central
// finite differences (fp64), softmax and the causal mask, flash against materialized attention
// (dropout and GQA), and heads split over tensor-parallel ranks against the unsplit kernel.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "cpu_kernels.hpp"
#include "kernel_oracles.hpp"

using namespace stepcast::cpu;
using namespace stepcast::cpu::test;

namespace {

// ---- attention helpers ----

struct AttentionCase {
  AttentionShape sh;
  double scale;
  const Dropout* dropout;
  int64_t head0;
  const int64_t* samples;
};

struct MaterializedForward {
  Vec scores, probs, probs_drop, ctx;
  Mask mask;
};

MaterializedForward materialized_forward(const Vec& qkv, const AttentionCase& c) {
  const AttentionShape& sh = c.sh;
  const size_t square = size_t(sh.b * sh.heads * sh.s * sh.s);
  MaterializedForward f{Vec(square), Vec(square), Vec(square), Vec(size_t(sh.s * sh.b * sh.heads * sh.d)),
                        Mask(square)};
  attention_score_forward(qkv.data(), f.scores.data(), sh, c.scale);
  softmax_forward(f.scores.data(), f.probs.data(), sh.b * sh.heads * sh.s, sh.s);
  const Vec* used = &f.probs;
  if (c.dropout) {
    attention_dropout_forward(f.probs.data(), f.probs_drop.data(), f.mask.data(), sh, *c.dropout, c.head0, c.samples);
    used = &f.probs_drop;
  }
  attention_value_forward(used->data(), qkv.data(), f.ctx.data(), sh);
  return f;
}

Vec materialized_backward(const Vec& qkv, const Vec& d_ctx, const AttentionCase& c) {
  const AttentionShape& sh = c.sh;
  MaterializedForward f = materialized_forward(qkv, c);
  const size_t square = f.probs.size();
  Vec d_used(square), d_probs(square), d_scores(square);
  Vec d_qkv = random_vec(qkv.size(), 99);  // garbage: every element must be overwritten
  attention_value_backward(d_ctx.data(), (c.dropout ? f.probs_drop : f.probs).data(), qkv.data(), d_used.data(),
                           d_qkv.data(), sh);
  if (c.dropout) {
    dropout_backward(d_used.data(), f.mask.data(), d_probs.data(), int64_t(square), c.dropout->p);
  } else {
    d_probs = d_used;
  }
  softmax_backward(d_probs.data(), f.probs.data(), d_scores.data(), sh.b * sh.heads * sh.s, sh.s);
  attention_score_backward(d_scores.data(), qkv.data(), d_qkv.data(), sh, c.scale);
  return d_qkv;
}

struct FlashForward {
  Vec ctx, lse;
};

FlashForward flash_forward(const Vec& qkv, const AttentionCase& c) {
  const AttentionShape& sh = c.sh;
  FlashForward f{Vec(size_t(sh.s * sh.b * sh.heads * sh.d)), Vec(size_t(sh.b * sh.heads * sh.s))};
  flash_attention_forward(qkv.data(), f.ctx.data(), f.lse.data(), sh, c.scale, c.dropout, c.head0, c.samples);
  return f;
}

Vec flash_backward(const Vec& qkv, const Vec& d_ctx, const AttentionCase& c) {
  FlashForward f = flash_forward(qkv, c);
  Vec d_qkv = random_vec(qkv.size(), 98);
  flash_attention_backward(qkv.data(), f.ctx.data(), f.lse.data(), d_ctx.data(), d_qkv.data(), c.sh, c.scale, c.dropout,
                           c.head0, c.samples);
  return d_qkv;
}

std::vector<int64_t> qkv_parts(const AttentionShape& sh) {
  return {sh.heads * sh.d, sh.kv_heads * sh.d, sh.kv_heads * sh.d};
}

}  // namespace

TEST_CASE("attention backward (materialized and flash) matches finite differences", "[kernels]") {
  const AttentionShape sh{5, 2, 4, 2, 3};  // GQA: two q heads per kv head
  const std::vector<int64_t> samples = {3, 8};
  const Dropout drop{0.25, 77, 1, 4, DropoutSite::attention_probs};
  Vec qkv = random_vec(size_t(sh.s * sh.b * sh.qkv_width()), 1);
  Vec r = random_vec(size_t(sh.s * sh.b * sh.heads * sh.d), 2);
  for (const Dropout* dropout : {static_cast<const Dropout*>(nullptr), &drop}) {
    AttentionCase c{sh, 1 / std::sqrt(3.0), dropout, 2, samples.data()};
    Vec fd = fd_grad([&](const Vec& x) { return weighted_sum(materialized_forward(x, c).ctx, r); }, qkv);
    CHECK(rel_err(materialized_backward(qkv, r, c), fd) < kFdTol);
    Vec fd_flash = fd_grad([&](const Vec& x) { return weighted_sum(flash_forward(x, c).ctx, r); }, qkv);
    CHECK(rel_err(flash_backward(qkv, r, c), fd_flash) < kFdTol);
  }
}

TEST_CASE("softmax rows sum to 1 and the causal mask holds", "[kernels]") {
  const AttentionShape sh{7, 2, 2, 1, 4};
  const std::vector<int64_t> samples = {0, 1};
  const Dropout drop{0.2, 5, 0, 0, DropoutSite::attention_probs};
  Vec qkv = random_vec(size_t(sh.s * sh.b * sh.qkv_width()), 1);
  AttentionCase c{sh, 0.5, &drop, 0, samples.data()};
  MaterializedForward f = materialized_forward(qkv, c);
  for (int64_t row = 0; row < sh.b * sh.heads * sh.s; ++row) {
    const int64_t i = row % sh.s;
    double sum = 0;
    for (int64_t j = 0; j < sh.s; ++j) {
      sum += f.probs[row * sh.s + j];
      if (j > i) {
        CHECK(f.probs[row * sh.s + j] == 0.0);
        CHECK(f.mask[row * sh.s + j] == 0);
      }
    }
    CHECK(sum == Approx(1.0).epsilon(1e-14));
  }
  // Changing the last position's k and v leaves every earlier output bitwise unchanged.
  Vec changed = qkv;
  for (int64_t bi = 0; bi < sh.b; ++bi)
    for (int64_t col = sh.heads * sh.d; col < sh.qkv_width(); ++col)
      changed[((sh.s - 1) * sh.b + bi) * sh.qkv_width() + col] += 0.5;
  const size_t before_last = size_t((sh.s - 1) * sh.b * sh.heads * sh.d);
  Vec a = materialized_forward(changed, c).ctx, b = flash_forward(changed, c).ctx;
  Vec a0 = materialized_forward(qkv, c).ctx, b0 = flash_forward(qkv, c).ctx;
  CHECK(Vec(a.begin(), a.begin() + before_last) == Vec(a0.begin(), a0.begin() + before_last));
  CHECK(Vec(b.begin(), b.begin() + before_last) == Vec(b0.begin(), b0.begin() + before_last));
  CHECK(a != a0);
}

TEST_CASE("flash attention equals materialized attention, with dropout and GQA", "[kernels]") {
  const AttentionShape sh{70, 2, 4, 2, 4};  // s > the flash key block (64): two blocks
  const std::vector<int64_t> samples = {5, 9};
  const Dropout drop{0.1, 31, 3, 1, DropoutSite::attention_probs};
  Vec qkv = random_vec(size_t(sh.s * sh.b * sh.qkv_width()), 1);
  for (double& v : qkv) v *= 3;  // sharper softmax rows
  Vec d_ctx = random_vec(size_t(sh.s * sh.b * sh.heads * sh.d), 2);
  for (const Dropout* dropout : {static_cast<const Dropout*>(nullptr), &drop}) {
    AttentionCase c{sh, 0.5, dropout, 4, samples.data()};
    MaterializedForward m = materialized_forward(qkv, c);
    FlashForward f = flash_forward(qkv, c);
    CHECK(rel_err(f.ctx, m.ctx) < 1e-10);
    Vec lse(f.lse.size());
    for (size_t row = 0; row < lse.size(); ++row) {
      double max = -INFINITY, sum = 0;
      for (int64_t j = 0; j < sh.s; ++j) max = std::max(max, m.scores[row * sh.s + j]);
      for (int64_t j = 0; j < sh.s; ++j) sum += std::exp(m.scores[row * sh.s + j] - max);
      lse[row] = max + std::log(sum);
    }
    CHECK(rel_err(f.lse, lse) < 1e-12);
    CHECK(rel_err(flash_backward(qkv, d_ctx, c), materialized_backward(qkv, d_ctx, c)) < 1e-10);
  }
  SECTION("fp32 flash agrees with fp32 materialized") {
    std::vector<float> q32(qkv.begin(), qkv.end()), ctx32(d_ctx.size()), lse32(sh.b * sh.heads * sh.s);
    std::vector<float> scores(sh.b * sh.heads * sh.s * sh.s), probs(scores.size()), pd(scores.size()),
        m32(d_ctx.size());
    Mask mask(scores.size());
    flash_attention_forward(q32.data(), ctx32.data(), lse32.data(), sh, 0.5, &drop, 4, samples.data());
    attention_score_forward(q32.data(), scores.data(), sh, 0.5);
    softmax_forward(scores.data(), probs.data(), sh.b * sh.heads * sh.s, sh.s);
    attention_dropout_forward(probs.data(), pd.data(), mask.data(), sh, drop, 4, samples.data());
    attention_value_forward(pd.data(), q32.data(), m32.data(), sh);
    CHECK(rel_err(Vec(ctx32.begin(), ctx32.end()), Vec(m32.begin(), m32.end())) < 1e-5);
  }
}

TEST_CASE("attention split over heads (tensor parallel) equals the unsplit kernel", "[kernels]") {
  const AttentionShape full{9, 2, 4, 2, 4};
  const int64_t tp = 2;
  const AttentionShape local{full.s, full.b, full.heads / tp, full.kv_heads / tp, full.d};
  const std::vector<int64_t> samples = {21, 22};
  const Dropout drop{0.3, 8, 2, 5, DropoutSite::attention_probs};
  Vec qkv = random_vec(size_t(full.s * full.b * full.qkv_width()), 1);
  Vec d_ctx = random_vec(size_t(full.s * full.b * full.heads * full.d), 2);
  const int64_t rows = full.s * full.b;
  AttentionCase fc{full, 0.5, &drop, 0, samples.data()};
  MaterializedForward m = materialized_forward(qkv, fc);
  Vec m_grad = materialized_backward(qkv, d_ctx, fc);
  FlashForward f = flash_forward(qkv, fc);
  Vec f_grad = flash_backward(qkv, d_ctx, fc);
  for (int64_t r = 0; r < tp; ++r) {
    Vec qkv_r = column_shard(qkv, rows, qkv_parts(full), tp, r);
    Vec d_ctx_r = column_shard(d_ctx, rows, {full.heads * full.d}, tp, r);
    AttentionCase lc{local, 0.5, &drop, r * local.heads, samples.data()};
    MaterializedForward mr = materialized_forward(qkv_r, lc);
    const size_t square = size_t(local.heads * full.s * full.s);
    for (int64_t bi = 0; bi < full.b; ++bi) {  // masks: [b, heads, s, s], heads split per b
      auto at = m.mask.begin() + (bi * full.heads + r * local.heads) * full.s * full.s;
      CHECK(Mask(mr.mask.begin() + bi * square, mr.mask.begin() + (bi + 1) * square) == Mask(at, at + square));
    }
    CHECK(max_abs_diff(mr.ctx, column_shard(m.ctx, rows, {full.heads * full.d}, tp, r)) < 1e-12);
    CHECK(max_abs_diff(materialized_backward(qkv_r, d_ctx_r, lc), column_shard(m_grad, rows, qkv_parts(full), tp, r)) <
          1e-12);
    FlashForward fr = flash_forward(qkv_r, lc);
    CHECK(fr.ctx == column_shard(f.ctx, rows, {full.heads * full.d}, tp, r));
    CHECK(flash_backward(qkv_r, d_ctx_r, lc) == column_shard(f_grad, rows, qkv_parts(full), tp, r));
  }
}
