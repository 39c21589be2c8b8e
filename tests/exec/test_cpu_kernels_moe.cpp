// The CPU MoE routing kernels against oracles: the routing weights with and without the model's
// norm_topk_prob (each token's k weights over their sum), and the routing backward against
// central finite differences (fp64) of the weights and the aux loss, both ways. (Permutation,
// grouped GEMMs and the dispatch are checked end to end: tests/exec/test_run_moe.cpp.)
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "cpu_kernels.hpp"
#include "kernel_oracles.hpp"

using namespace stepcast::cpu;
using namespace stepcast::cpu::test;

namespace {

struct Routed {
  Vec probs, weights;
  std::vector<int32_t> idx, counts;
};

Routed route(const Vec& logits, int64_t tokens, int64_t experts, int64_t k, int64_t capacity, bool normalize) {
  Routed r{Vec(size_t(tokens * experts)), Vec(size_t(tokens * k)), std::vector<int32_t>(size_t(tokens * k)),
           std::vector<int32_t>(size_t(experts))};
  moe_route_forward(logits.data(), r.probs.data(), r.weights.data(), r.idx.data(), r.counts.data(), tokens, experts,
                    k, capacity, normalize);
  return r;
}

}  // namespace

TEST_CASE("MoE routing weights: the chosen probabilities or with norm_topk_prob their share of the k", "[kernels]") {
  // Two tokens, four experts, top-2; a capacity of 1 drops token 1's copy to expert 0.
  const Vec logits = {2.0, 1.0, 0.0, -1.0, 3.0, -2.0, 2.5, 0.5};
  for (bool normalize : {false, true}) {
    Routed r = route(logits, 2, 4, 2, 1, normalize);
    CHECK(r.idx == std::vector<int32_t>{0, 1, -1, 2});  // token 1: expert 0 dropped (−1 − 0), then 2
    for (int64_t t = 0; t < 2; ++t) {
      const int64_t a = r.idx[size_t(2 * t)] >= 0 ? r.idx[size_t(2 * t)] : -1 - r.idx[size_t(2 * t)];
      const int64_t b = r.idx[size_t(2 * t + 1)];
      const double pa = r.probs[size_t(4 * t + a)], pb = r.probs[size_t(4 * t + b)];
      // Normalized: the softmax over the two chosen logits, Megatron-LM's default router.
      const double wa = normalize ? pa / (pa + pb) : pa, wb = normalize ? pb / (pa + pb) : pb;
      CHECK(std::abs(r.weights[size_t(2 * t)] - wa) < 1e-15);
      CHECK(std::abs(r.weights[size_t(2 * t + 1)] - wb) < 1e-15);
    }
    CHECK(std::abs(r.weights[0] - (normalize ? 1 / (1 + std::exp(-1.0)) : r.probs[0])) < 1e-15);
  }
}

TEST_CASE("MoE capacity: by position the first copies in token order, by probability the most probable",
          "[kernels]") {
  // Top-1 of four experts: tokens 0 and 3 route to expert 0 with probability e/(e+3) = 0.475,
  // token 1 with e³/(e³+3) = 0.870, token 2 to expert 1.
  const Vec logits = {1, 0, 0, 0, 3, 0, 0, 0, 0, 2, 0, 0, 1, 0, 0, 0};
  auto idx = [&](int64_t capacity, bool by_probs) {
    Routed r{Vec(16), Vec(4), std::vector<int32_t>(4), std::vector<int32_t>(4)};
    moe_route_forward(logits.data(), r.probs.data(), r.weights.data(), r.idx.data(), r.counts.data(), 4, 4, 1,
                      capacity, false, by_probs);
    const int32_t first = capacity > 0 ? std::min<int32_t>(3, int32_t(capacity)) : 3;
    CHECK(r.counts == std::vector<int32_t>{first, 1, 0, 0});  // alike
    return r.idx;
  };
  CHECK(idx(1, false) == std::vector<int32_t>{0, -1, 1, -1});  // expert 0 keeps token 0
  CHECK(idx(1, true) == std::vector<int32_t>{-1, 0, 1, -1});   // ... token 1, the most probable
  CHECK(idx(2, false) == std::vector<int32_t>{0, 0, 1, -1});
  CHECK(idx(2, true) == std::vector<int32_t>{0, 0, 1, -1});    // tokens 0 and 3 tie: the lower kept
  CHECK(idx(3, true) == std::vector<int32_t>{0, 0, 1, 0});
  CHECK(idx(0, true) == std::vector<int32_t>{0, 0, 1, 0});  // dropless: nothing to rank
  CHECK(idx(0, false) == std::vector<int32_t>{0, 0, 1, 0});
}

TEST_CASE("MoE routing backward matches finite differences of the weights and the aux loss", "[kernels]") {
  const int64_t tokens = 5, experts = 6, k = 3;
  const Vec logits = random_vec(tokens * experts, 11), c = random_vec(tokens * k, 12);
  const double aux_scale = 0.37;
  for (bool normalize : {false, true}) {
    INFO("normalize " << normalize);
    const Routed at = route(logits, tokens, experts, k, 2, normalize);  // capacity 2: some copies dropped
    // L = Σ c · w + aux_scale · Σ_e (Σ_t p[t, e]) · copies_e, with the picks held (the logits are
    // apart by more than the step).
    auto loss = [&](const Vec& l) {
      Routed r = route(l, tokens, experts, k, 2, normalize);
      REQUIRE(r.idx == at.idx);
      return weighted_sum(r.weights, c) + moe_aux_loss(r.probs.data(), r.idx.data(), tokens, experts, k, aux_scale);
    };
    Vec d_logits(size_t(tokens * experts));
    moe_route_backward(at.probs.data(), at.idx.data(), c.data(), d_logits.data(), tokens, experts, k, aux_scale,
                       nullptr, normalize);
    CHECK(rel_err(d_logits, fd_grad(loss, logits)) < kFdTol);
  }
}
