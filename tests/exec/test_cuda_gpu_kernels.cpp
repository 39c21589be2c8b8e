// [gpu] Every CUDA kernel and GEMM against the CPU backend's kernels (the reference, run in fp64 on
// the same inputs rounded to the CUDA storage type) on fresh random inputs: relative error (largest
// difference over the largest reference value) under 1e-2 in bf16 and under 1e-5 in fp32, and
// dropout masks identical bit for bit. Runs only where a GPU is visible (cuda_gpu_main.cpp).
#include <catch2/catch.hpp>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include "bf16.hpp"
#include "cpu_kernels.hpp"
#include "cuda_backend.hpp"
#include "cuda_kernels.hpp"
#include "cuda_gpu_support.hpp"

using namespace stepcast;
using namespace stepcast::test;

TEMPLATE_TEST_CASE("cuda kernels: norms, forward and backward, match the CPU", "[gpu]", bf16, float) {
  using T = TestType;
  const int64_t rows = 96, h = 200;
  for (bool layer : {true, false}) {
    auto x = random_values<T>(rows * h), w = random_values<T>(h, 0.5, 1.5), b = random_values<T>(h);
    auto dy = random_values<T>(rows * h), dx0 = random_values<T>(rows * h);
    auto dw0 = random_values<float>(h), db0 = random_values<float>(h);
    Device<T> dx_(rows * h), x_(rows * h), w_(h), b_(h), y_(rows * h), dy_(rows * h);
    Device<float> dw_(h), db_(h);
    x_.set(x); w_.set(w); b_.set(b); dy_.set(dy); dx_.set(dx0); dw_.set(dw0); db_.set(db0);
    std::vector<double> y(rows * h), dx = dx0, dw = dw0, db = db0;
    if (layer) {
      cpu::layernorm_forward(x.data(), w.data(), b.data(), y.data(), rows, h, 1e-5);
      cpu::layernorm_backward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), rows, h, 1e-5);
      cuda::layernorm_forward(kLaunch, x_.p, w_.p, b_.p, y_.p, rows, h, 1e-5);
      cuda::layernorm_backward(kLaunch, x_.p, w_.p, dy_.p, dx_.p, dw_.p, db_.p, rows, h, 1e-5);
      CHECK_CLOSE(T, db_.get(), db);
    } else {
      cpu::rmsnorm_forward(x.data(), w.data(), y.data(), rows, h, 1e-5);
      cpu::rmsnorm_backward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), rows, h, 1e-5);
      cuda::rmsnorm_forward(kLaunch, x_.p, w_.p, y_.p, rows, h, 1e-5);
      cuda::rmsnorm_backward(kLaunch, x_.p, w_.p, dy_.p, dx_.p, dw_.p, rows, h, 1e-5);
    }
    INFO((layer ? "layernorm" : "rmsnorm"));
    CHECK_CLOSE(T, y_.get(), y);
    CHECK_CLOSE(T, dx_.get(), dx);
    CHECK_CLOSE(T, dw_.get(), dw);
  }
}

TEMPLATE_TEST_CASE("cuda kernels: activations, rotary and dropout match the CPU", "[gpu]", bf16, float) {
  using T = TestType;
  const int64_t n = 5000;
  auto a = random_values<T>(n, -3, 3), g = random_values<T>(n, -3, 3), d = random_values<T>(n);
  Device<T> a_(n), g_(n), d_(n), y_(n), y2_(n);
  a_.set(a); g_.set(g); d_.set(d);
  std::vector<double> y(n), y2(n);
  cpu::gelu_forward(a.data(), y.data(), n);
  cuda::gelu_forward(kLaunch, a_.p, y_.p, n);
  CHECK_CLOSE(T, y_.get(), y);
  cpu::gelu_backward(a.data(), d.data(), y.data(), n);
  cuda::gelu_backward(kLaunch, a_.p, d_.p, y_.p, n);
  CHECK_CLOSE(T, y_.get(), y);
  cpu::swiglu_forward(g.data(), a.data(), y.data(), n);
  cuda::swiglu_forward(kLaunch, g_.p, a_.p, y_.p, n);
  CHECK_CLOSE(T, y_.get(), y);
  cpu::swiglu_backward(g.data(), a.data(), d.data(), y.data(), y2.data(), n);
  cuda::swiglu_backward(kLaunch, g_.p, a_.p, d_.p, y_.p, y2_.p, n);
  CHECK_CLOSE(T, y_.get(), y);
  CHECK_CLOSE(T, y2_.get(), y2);

  const cpu::AttentionShape sh{48, 3, 4, 2, 32};
  auto qkv = random_values<T>(sh.s * sh.b * sh.qkv_width());
  Device<T> qkv_(qkv.size());
  for (double sign : {1.0, -1.0}) {
    qkv_.set(qkv);
    std::vector<double> ref = qkv;
    if (sign > 0) cpu::rotary_forward(ref.data(), sh, 10000.0, 5);
    else cpu::rotary_backward(ref.data(), sh, 10000.0, 5);
    cuda::rotary(kLaunch, qkv_.p, sh, 10000.0, 5, sign);
    CHECK_CLOSE(T, qkv_.get(), ref);
  }

  // Dropout + residual: the same global-coordinate masks, then the backward from the mask.
  const int64_t s = 40, b = 3, h = 64;
  auto x = random_values<T>(s * b * h), res = random_values<T>(s * b * h);
  std::vector<int64_t> samples = {7, 100, 3};
  DeviceRaw<int64_t> samples_(samples);
  Device<T> x_(x.size()), res_(res.size()), out_(x.size()), back_(x.size());
  x_.set(x); res_.set(res);
  DeviceRaw<uint8_t> mask_(std::vector<uint8_t>(x.size(), 9));
  std::vector<double> out(x.size()), back(x.size());
  std::vector<uint8_t> mask(x.size());
  const cpu::Dropout drop{0.25, 99, 4, 2, cpu::DropoutSite::mlp_residual};
  cpu::dropout_add_forward(x.data(), res.data(), out.data(), mask.data(), s, b, h, drop, 8, samples.data());
  cuda::dropout_add_forward(kLaunch, x_.p, res_.p, out_.p, mask_.p, s, b, h, drop, 8, samples_.p);
  CHECK(mask_.get() == mask);
  CHECK_CLOSE(T, out_.get(), out);
  cpu::dropout_backward(x.data(), mask.data(), back.data(), int64_t(x.size()), 0.25);
  cuda::dropout_backward(kLaunch, x_.p, mask_.p, back_.p, int64_t(x.size()), 0.25);
  CHECK_CLOSE(T, back_.get(), back);
}

TEMPLATE_TEST_CASE("cuda kernels: embeddings and positions match the CPU", "[gpu]", bf16, float) {
  using T = TestType;
  const int64_t s = 32, b = 2, h = 48, v_local = 50, v0 = 50, max_pos = 64;
  std::vector<int32_t> tokens(s * b);
  std::mt19937 rng(5);
  for (auto& t : tokens) t = int32_t(rng() % 100);  // half in this shard
  DeviceRaw<int32_t> tokens_(tokens);
  auto w = random_values<T>(v_local * h), dout = random_values<T>(s * b * h);
  auto pos = random_values<T>(max_pos * h);
  auto dw0 = random_values<float>(v_local * h), dpos0 = random_values<float>(max_pos * h);
  Device<T> w_(w.size()), out_(s * b * h), dout_(dout.size()), pos_(pos.size());
  Device<float> dw_(dw0.size()), dpos_(dpos0.size());
  w_.set(w); dout_.set(dout); pos_.set(pos); dw_.set(dw0); dpos_.set(dpos0);
  std::vector<double> out(s * b * h), dw = dw0, dpos = dpos0;
  cpu::embedding_forward(tokens.data(), w.data(), out.data(), s, b, h, v0, v_local);
  cuda::embedding_forward(kLaunch, tokens_.p, w_.p, out_.p, s, b, h, v0, v_local);
  CHECK_CLOSE(T, out_.get(), out);
  cpu::position_add_forward(out.data(), pos.data(), s, b, h, 16, max_pos);
  cuda::position_add_forward(kLaunch, out_.p, pos_.p, s, b, h, 16, max_pos);
  CHECK_CLOSE(T, out_.get(), out);
  cpu::embedding_backward(tokens.data(), dout.data(), dw.data(), s, b, h, v0, v_local);
  cuda::embedding_backward(kLaunch, tokens_.p, dout_.p, dw_.p, s, b, h, v0, v_local);
  CHECK_CLOSE(T, dw_.get(), dw);
  cpu::position_add_backward(dout.data(), dpos.data(), s, b, h, 16, max_pos);
  cuda::position_add_backward(kLaunch, dout_.p, dpos_.p, s, b, h, 16, max_pos);
  CHECK_CLOSE(T, dpos_.get(), dpos);
}

TEMPLATE_TEST_CASE("cuda kernels: materialized attention matches the CPU", "[gpu]", bf16, float) {
  using T = TestType;
  const cpu::AttentionShape sh{40, 2, 4, 2, 16};
  const double scale = 0.25;
  const int64_t sq = sh.b * sh.heads * sh.s * sh.s, rows = sh.b * sh.heads * sh.s;
  auto qkv = random_values<T>(sh.s * sh.b * sh.qkv_width());
  auto d_ctx = random_values<T>(sh.s * sh.b * sh.heads * sh.d);
  std::vector<int64_t> samples = {11, 12};
  DeviceRaw<int64_t> samples_(samples);
  Device<T> qkv_(qkv.size()), scores_(sq), probs_(sq), drop_(sq), ctx_(d_ctx.size()), dctx_(d_ctx.size());
  Device<T> dprobs_(sq), dprobs2_(sq), dscores_(sq), dqkv_(qkv.size());
  DeviceRaw<uint8_t> mask_(std::vector<uint8_t>(size_t(sq), 7));
  qkv_.set(qkv); dctx_.set(d_ctx);
  std::vector<double> scores(sq), probs(sq), drop(sq), ctx(d_ctx.size()), dprobs(sq), dprobs2(sq),
      dscores(sq), dqkv(qkv.size(), 0.0);
  std::vector<uint8_t> mask(sq);
  const cpu::Dropout dropout{0.2, 5, 3, 1, cpu::DropoutSite::attention_probs};
  cpu::attention_score_forward(qkv.data(), scores.data(), sh, scale);
  cpu::softmax_forward(scores.data(), probs.data(), rows, sh.s);
  cpu::attention_dropout_forward(probs.data(), drop.data(), mask.data(), sh, dropout, 4, samples.data());
  cpu::attention_value_forward(drop.data(), qkv.data(), ctx.data(), sh);
  cpu::attention_value_backward(d_ctx.data(), drop.data(), qkv.data(), dprobs.data(), dqkv.data(), sh);
  cpu::dropout_backward(dprobs.data(), mask.data(), dprobs2.data(), sq, 0.2);
  cpu::softmax_backward(dprobs2.data(), probs.data(), dscores.data(), rows, sh.s);
  cpu::attention_score_backward(dscores.data(), qkv.data(), dqkv.data(), sh, scale);
  cuda::attention_score_forward(kLaunch, qkv_.p, scores_.p, sh, scale);
  cuda::softmax_forward(kLaunch, scores_.p, probs_.p, rows, sh.s);
  cuda::attention_dropout_forward(kLaunch, probs_.p, drop_.p, mask_.p, sh, dropout, 4, samples_.p);
  cuda::attention_value_forward(kLaunch, drop_.p, qkv_.p, ctx_.p, sh);
  cuda::attention_value_backward(kLaunch, dctx_.p, drop_.p, qkv_.p, dprobs_.p, dqkv_.p, sh);
  cuda::dropout_backward(kLaunch, dprobs_.p, mask_.p, dprobs2_.p, sq, 0.2);
  cuda::softmax_backward(kLaunch, dprobs2_.p, probs_.p, dscores_.p, rows, sh.s);
  cuda::attention_score_backward(kLaunch, dscores_.p, qkv_.p, dqkv_.p, sh, scale);
  CHECK_CLOSE(T, scores_.get(), scores);
  CHECK_CLOSE(T, probs_.get(), probs);
  CHECK(mask_.get() == mask);
  CHECK_CLOSE(T, ctx_.get(), ctx);
  CHECK_CLOSE(T, dprobs_.get(), dprobs);
  CHECK_CLOSE(T, dscores_.get(), dscores);
  CHECK_CLOSE(T, dqkv_.get(), dqkv);
}

TEMPLATE_TEST_CASE("cuda kernels: flash attention matches the CPU for every head dim", "[gpu]", bf16, float) {
  using T = TestType;
  for (int64_t d : {16, 32, 64, 128}) {
    for (bool with_dropout : {false, true}) {
      const cpu::AttentionShape sh{70, 2, 4, 2, d};  // s not a multiple of any tile; GQA
      const double scale = 1.0 / std::sqrt(double(d));
      auto qkv = random_values<T>(sh.s * sh.b * sh.qkv_width());
      auto d_ctx = random_values<T>(sh.s * sh.b * sh.heads * d);
      std::vector<int64_t> samples = {21, 4};
      DeviceRaw<int64_t> samples_(samples);
      Device<T> qkv_(qkv.size()), ctx_(d_ctx.size()), dctx_(d_ctx.size()), dqkv_(qkv.size());
      Device<float> lse_(sh.b * sh.heads * sh.s), delta_(sh.b * sh.heads * sh.s);
      qkv_.set(qkv); dctx_.set(d_ctx);
      std::vector<double> ctx(d_ctx.size()), lse(sh.b * sh.heads * sh.s), dqkv(qkv.size());
      const cpu::Dropout dropout{0.15, 77, 2, 3, cpu::DropoutSite::attention_probs};
      const cpu::Dropout* drop = with_dropout ? &dropout : nullptr;
      cpu::flash_attention_forward(qkv.data(), ctx.data(), lse.data(), sh, scale, drop, 8, samples.data());
      cuda::flash_attention_forward(kLaunch, qkv_.p, ctx_.p, lse_.p, sh, scale, drop, 8, samples_.p);
      INFO("head dim " << d << (with_dropout ? ", dropout 0.15" : ""));
      CHECK_CLOSE(T, ctx_.get(), ctx);
      CHECK(relative_error(lse_.get(), lse) < 1e-5 * (std::is_same_v<T, bf16> ? 100 : 1));
      // The CUDA backward reads the CUDA forward's ctx and lse (its own pass), the CPU its own.
      cpu::flash_attention_backward(qkv.data(), ctx.data(), lse.data(), d_ctx.data(), dqkv.data(), sh,
                                    scale, drop, 8, samples.data());
      cuda::flash_attention_backward(kLaunch, qkv_.p, ctx_.p, lse_.p, dctx_.p, dqkv_.p, delta_.p, sh,
                                     scale, drop, 8, samples_.p);
      CHECK_CLOSE(T, dqkv_.get(), dqkv);
    }
  }
}

TEMPLATE_TEST_CASE("cuda kernels: vocab-parallel cross entropy matches the CPU", "[gpu]", bf16, float) {
  using T = TestType;
  const int64_t tokens = 50, v_local = 300, v0 = 300;
  std::vector<int32_t> targets(tokens);
  std::mt19937 rng(9);
  for (auto& t : targets) t = int32_t(rng() % 600);
  DeviceRaw<int32_t> targets_(targets);
  auto logits = random_values<T>(tokens * v_local, -4, 4);
  // stats of a second tp rank, as gathered: [tp = 2, 3, tokens] with this rank second.
  auto other = random_values<float>(3 * tokens, 0.5, 2);
  Device<T> logits_(logits.size()), dlogits_(logits.size());
  Device<float> stats_all_(6 * tokens), softmax_(logits.size()), loss_(tokens);
  logits_.set(logits);
  std::vector<double> stats(3 * tokens), stats_all(6 * tokens), softmax(logits.size()), loss(tokens),
      dlogits(logits.size());
  cpu::cross_entropy_stats(logits.data(), targets.data(), stats.data(), tokens, v0, v_local);
  Device<float> stats_(3 * tokens);
  cuda::cross_entropy_stats(kLaunch, logits_.p, targets_.p, stats_.p, tokens, v0, v_local);
  CHECK(relative_error(stats_.get(), stats) < 1e-5 * (std::is_same_v<T, bf16> ? 100 : 1));
  for (int64_t i = 0; i < 3 * tokens; ++i) {
    stats_all[size_t(i)] = i >= 2 * tokens ? 0.0 : other[size_t(i)];  // target held here
    stats_all[size_t(3 * tokens + i)] = stats[size_t(i)];
  }
  stats_all_.set(stats_all);
  cpu::cross_entropy_forward(logits.data(), stats_all.data(), 2, softmax.data(), loss.data(), tokens, v_local);
  cuda::cross_entropy_forward(kLaunch, logits_.p, stats_all_.p, 2, softmax_.p, loss_.p, tokens, v_local);
  CHECK(relative_error(loss_.get(), loss) < 1e-5);
  CHECK(relative_error(softmax_.get(), softmax) < 1e-5);
  cpu::cross_entropy_backward(softmax.data(), targets.data(), dlogits.data(), tokens, v0, v_local, 1e-2);
  cuda::cross_entropy_backward(kLaunch, softmax_.p, targets_.p, dlogits_.p, tokens, v0, v_local, 1e-2);
  CHECK_CLOSE(T, dlogits_.get(), dlogits);
}

TEST_CASE("cuda kernels: AdamW on fp32 master weights and the gradient norm match the CPU", "[gpu]") {
  const int64_t n = 10000;
  auto master = random_values<float>(n), grad = random_values<float>(n);
  auto m = random_values<float>(n, -0.1, 0.1), v = random_values<float>(n, 0, 0.01);
  Device<bf16> param_(n);
  Device<float> master_(n), grad_(n), m_(n), v_(n);
  master_.set(master); grad_.set(grad); m_.set(m); v_.set(v);
  const cpu::AdamW config{1e-3, 0.9, 0.95, 1e-8, 0.1};
  std::vector<double> p = master, mm = m, vv = v;
  cpu::adamw_step(p.data(), grad.data(), mm.data(), vv.data(), n, config, 3, 0.7);
  cuda::adamw_step(kLaunch, param_.p, master_.p, grad_.p, m_.p, v_.p, n, config, 3, 0.7);
  CHECK(relative_error(master_.get(), p) < 1e-5);
  CHECK(relative_error(m_.get(), mm) < 1e-5);
  CHECK(relative_error(v_.get(), vv) < 1e-5);
  CHECK(relative_error(param_.get(), p) < 1e-2);  // the bf16 weights are the master, rounded
  Device<double> result_(1);
  cuda::sum_squares(kLaunch, grad_.p, n, result_.p);
  double want = cpu::grad_norm_sq(grad.data(), n);
  CHECK(std::abs(result_.get()[0] - want) / want < 1e-5);
  // The gradient norm over several tensors: one total on the device, read once.
  cuda::sum_squares(kLaunch, grad_.p, n / 3, result_.p);
  cuda::sum_squares(kLaunch, grad_.p + n / 3, n - n / 3, result_.p, true);
  CHECK(std::abs(result_.get()[0] - want) / want < 1e-5);
}

TEMPLATE_TEST_CASE("cuda GEMMs: cuBLASLt linear layers match the CPU", "[gpu]", bf16, float) {
  using T = TestType;
  auto backend = make_cuda_backend<T, float>(RankGrid(1, 1, 1, "tp-dp-pp"), 0, 1, CudaBackendOptions{});
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes = {
      {64, 96, 160}, {257, 130, 71}, {512, 768, 2304}};
  for (auto [tokens, in, out] : shapes) {
    auto x = random_values<T>(tokens * in), w = random_values<T>(out * in), bias = random_values<T>(out);
    auto dy = random_values<T>(tokens * out), dx0 = random_values<T>(tokens * in);
    auto dw0 = random_values<float>(out * in), db0 = random_values<float>(out);
    Device<T> x_(x.size()), w_(w.size()), bias_(out), y_(tokens * out), dy_(dy.size()), dx_(dx0.size());
    Device<float> dw_(dw0.size()), db_(out);
    x_.set(x); w_.set(w); bias_.set(bias); dy_.set(dy); dx_.set(dx0); dw_.set(dw0); db_.set(db0);
    std::vector<double> y(tokens * out), dx = dx0, dw = dw0, db = db0;
    cpu::linear_forward(x.data(), w.data(), bias.data(), y.data(), tokens, in, out);
    cpu::linear_backward_data(dy.data(), w.data(), dx.data(), tokens, in, out, true);
    cpu::linear_backward_weight(dy.data(), x.data(), dw.data(), db.data(), tokens, in, out);
    backend->linear_forward(x_.p, w_.p, bias_.p, y_.p, tokens, in, out);
    backend->linear_backward_data(dy_.p, w_.p, dx_.p, tokens, in, out, true);
    backend->linear_backward_weight(dy_.p, x_.p, dw_.p, db_.p, tokens, in, out);
    backend->synchronize();
    INFO("tokens " << tokens << " in " << in << " out " << out);
    CHECK_CLOSE(T, y_.get(), y);
    CHECK_CLOSE(T, dx_.get(), dx);
    CHECK(relative_error(dw_.get(), dw) < tolerance<T>());
    CHECK(relative_error(db_.get(), db) < tolerance<T>());
  }
}

TEST_CASE("cuda NCCL: one-rank collectives keep the data, chunked ones too", "[gpu]") {
  auto backend = make_cuda_backend<bf16, float>(RankGrid(1, 1, 1, "tp-dp-pp"), 0, 1, CudaBackendOptions{});
  auto values = random_values<float>(1001);
  Device<float> a_(values.size());
  a_.set(values);
  backend->all_reduce(GroupKind::dp, Algorithm::ring, Dtype::fp32, {{a_.p, int64_t(values.size())}});
  backend->reduce_scatter(GroupKind::tp, Dtype::fp32, {{a_.p, int64_t(values.size())}});
  backend->all_gather(GroupKind::world, Dtype::fp32, {{a_.p, int64_t(values.size())}});
  backend->synchronize();
  CHECK(a_.get() == values);
  CHECK(backend->algorithms_used().size() == 3);
}
