// [gpu] The CUDA backend's mixture-of-experts kernels against the CPU backend's (the reference, in
// fp64 on the same inputs rounded to the CUDA storage type): routing (softmax, top-k, capacity
// dropping, counts), the aux loss and the router's backward, the permutation and its inverse,
// forward and backward; the local experts' GEMMs, grouped (one cuBLAS grouped GEMM per op) and per
// expert segment (cuBLASLt), on uneven row counts with an empty expert. Then tiny MoE models trained
// on one GPU through `stepcast run --backend cuda` against the CPU backend's fp32 loss curve. Runs
// only where a GPU is visible.
#include <catch2/catch.hpp>
#include <cublasLt.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <vector>

#include "cpu_kernels.hpp"
#include "cuda_backend.hpp"
#include "cuda_expert_gemm.hpp"
#include "errors.hpp"
#include "cuda_gpu_run.hpp"
#include "cuda_gpu_support.hpp"

using namespace stepcast;
using namespace stepcast::test;

namespace {

// A row map as the interpreter derives it (interpreter_moe.cpp): copies grouped by expert in
// token order; dropped copies −1.
std::vector<int64_t> row_map(const std::vector<int32_t>& route_idx, int64_t experts, int64_t* rows) {
  std::vector<int64_t> per_expert(size_t(experts), 0), start(size_t(experts), 0), map(route_idx.size());
  for (int32_t r : route_idx) {
    if (r >= 0) ++per_expert[size_t(r)];
  }
  for (int64_t e = 1; e < experts; ++e) start[size_t(e)] = start[size_t(e - 1)] + per_expert[size_t(e - 1)];
  *rows = start.back() + per_expert.back();
  for (size_t i = 0; i < route_idx.size(); ++i) map[i] = route_idx[i] >= 0 ? start[size_t(route_idx[i])]++ : -1;
  return map;
}

// The routing of random logits on the CPU (fp64): its probabilities, weights, picks and counts.
struct Routing {
  std::vector<double> probs, route_w;
  std::vector<int32_t> idx, counts;
};
Routing cpu_routing(const std::vector<double>& logits, int64_t tokens, int64_t experts, int64_t k, int64_t capacity,
                    bool normalize = false, bool drop_by_probs = false) {
  Routing r{std::vector<double>(size_t(tokens * experts)), std::vector<double>(size_t(tokens * k)),
            std::vector<int32_t>(size_t(tokens * k)), std::vector<int32_t>(size_t(experts))};
  cpu::moe_route_forward(logits.data(), r.probs.data(), r.route_w.data(), r.idx.data(), r.counts.data(), tokens,
                         experts, k, capacity, normalize, drop_by_probs);
  return r;
}

// The activation and weight-gradient types the backend instantiates.
struct Bf16WithFp32Grads {
  using T = bf16;
  using G = float;
};
struct Bf16WithBf16Grads {
  using T = bf16;
  using G = bf16;
};
struct Fp32WithFp32Grads {
  using T = float;
  using G = float;
};

// cuBLASLt plans on a workspace, and the experts' GEMMs on them: grouped, and per expert segment.
struct ExpertGemmRig {
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  const int64_t workspace_bytes = 32 << 20;
  cuda::DeviceMemory memory{0};
  std::unique_ptr<cuda::Gemms> gemms;
  std::unique_ptr<cuda::ExpertGemms> grouped, single;
  ExpertGemmRig() {
    REQUIRE(cublasLtCreate(&lt) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cudaMalloc(&workspace, size_t(workspace_bytes)) == cudaSuccess);
    gemms = std::make_unique<cuda::Gemms>(lt, workspace, workspace_bytes);
    grouped = std::make_unique<cuda::ExpertGemms>(*gemms, memory, workspace, workspace_bytes, true, 0, "test");
    single = std::make_unique<cuda::ExpertGemms>(*gemms, memory, workspace, workspace_bytes, false, 0, "test");
  }
  ExpertGemmRig(const ExpertGemmRig&) = delete;
  ~ExpertGemmRig() {
    cudaDeviceSynchronize();
    grouped.reset();
    single.reset();
    gemms.reset();
    cudaFree(workspace);
    cublasLtDestroy(lt);
  }
};

}  // namespace

TEMPLATE_TEST_CASE("cuda kernels: MoE routing, top-k and capacity match the CPU", "[gpu]", bf16, float) {
  using T = TestType;
  for (int64_t experts : {8, 40}) {  // within one warp's lanes and beyond
    for (int64_t capacity : {0, 30}) {
      const int64_t tokens = 200, k = 2;
      INFO("experts " << experts << ", capacity " << capacity);
      auto logits = random_values<T>(size_t(tokens * experts), -3, 3);
      Routing want = cpu_routing(logits, tokens, experts, k, capacity);
      Device<T> logits_(logits.size()), probs_(want.probs.size()), route_w_(want.route_w.size());
      logits_.set(logits);
      DeviceRaw<int32_t> idx_(std::vector<int32_t>(want.idx.size(), 0)),
          counts_(std::vector<int32_t>(size_t(experts), 7));
      cuda::moe_route_forward(kLaunch, logits_.p, probs_.p, route_w_.p, idx_.p, counts_.p, tokens, experts, k,
                              capacity, false, false);
      std::vector<double> probs = probs_.get(), route_w = route_w_.get();
      // norm_topk_prob: the same picks, each token's weights over their sum.
      cuda::moe_route_forward(kLaunch, logits_.p, probs_.p, route_w_.p, idx_.p, counts_.p, tokens, experts, k,
                              capacity, true, false);
      std::vector<double> normalized = route_w;
      for (int64_t t = 0; t < tokens; ++t) {
        double sum = 0;
        for (int64_t j = 0; j < k; ++j) sum += route_w[size_t(t * k + j)];
        for (int64_t j = 0; j < k; ++j) normalized[size_t(t * k + j)] /= sum;
      }
      CHECK_CLOSE(T, route_w_.get(), normalized);
      std::vector<int32_t> idx = idx_.get(), counts = counts_.get();
      CHECK_CLOSE(T, probs, want.probs);
      // The picks are made on the stored probabilities: in fp32 they are the CPU's; in bf16, where
      // rounding ties experts, they must be a top-k of the GPU's own probabilities, ties to the
      // lower expert, with the weights those probabilities.
      if (std::is_same_v<T, float>) CHECK(idx == want.idx);
      std::vector<int32_t> kept(size_t(experts), 0);
      for (int64_t t = 0; t < tokens; ++t) {
        std::set<int32_t> chosen;
        for (int64_t j = 0; j < k; ++j) {
          int32_t r = idx[size_t(t * k + j)], e = r >= 0 ? r : -1 - r;
          REQUIRE(e < experts);
          chosen.insert(e);
          CHECK(route_w[size_t(t * k + j)] == probs[size_t(t * experts + e)]);
          if (j > 0) {
            int32_t before = idx[size_t(t * k + j - 1)], b = before >= 0 ? before : -1 - before;
            double pb = probs[size_t(t * experts + b)], pe = probs[size_t(t * experts + e)];
            CHECK((pb > pe || (pb == pe && b < e)));
          }
          if (r >= 0) ++kept[size_t(e)];
        }
        CHECK(chosen.size() == size_t(k));
        for (int64_t e = 0; e < experts; ++e) {
          if (chosen.count(int32_t(e))) continue;
          for (int32_t c : chosen) CHECK(probs[size_t(t * experts + e)] <= probs[size_t(t * experts + c)]);
        }
      }
      CHECK(counts == kept);  // kept copies per expert; with a capacity, none beyond it
      for (int32_t c : counts) CHECK((capacity == 0 || c <= capacity));
      // In token order: an expert's dropped copies come after its kept ones.
      if (capacity > 0) {
        std::vector<bool> dropped_seen(size_t(experts), false);
        for (int32_t r : idx) {
          int32_t e = r >= 0 ? r : -1 - r;
          if (r < 0)
            dropped_seen[size_t(e)] = true;
          else
            CHECK_FALSE(dropped_seen[size_t(e)]);
        }
        if (std::is_same_v<T, float>) CHECK(counts == want.counts);
      }
    }
  }
}

TEMPLATE_TEST_CASE("cuda kernels: MoE capacity by probability keeps each expert's most probable copies",
                   "[gpu]", bf16, float) {
  using T = TestType;
  const int64_t tokens = 300, experts = 8, k = 2, capacity = 40;
  auto logits = random_values<T>(size_t(tokens * experts), -3, 3);
  Device<T> logits_(logits.size()), probs_(size_t(tokens * experts)), route_w_(size_t(tokens * k));
  logits_.set(logits);
  DeviceRaw<int32_t> idx_(std::vector<int32_t>(size_t(tokens * k), 0)),
      counts_(std::vector<int32_t>(size_t(experts), 7));
  for (bool normalize : {false, true}) {
    INFO("normalize " << normalize);
    cuda::moe_route_forward(kLaunch, logits_.p, probs_.p, route_w_.p, idx_.p, counts_.p, tokens, experts, k, capacity,
                            normalize, true);
    std::vector<double> route_w = route_w_.get();
    std::vector<int32_t> idx = idx_.get(), counts = counts_.get();
    // Every kept copy of an expert weighs at least each of its dropped ones (ties: the lower entry
    // kept), and it keeps min(its copies, capacity).
    std::vector<int32_t> routed(size_t(experts), 0), kept(size_t(experts), 0);
    for (size_t i = 0; i < idx.size(); ++i) {
      const int32_t e = idx[i] >= 0 ? idx[i] : -1 - idx[i];
      ++routed[size_t(e)];
      kept[size_t(e)] += idx[i] >= 0;
      if (idx[i] >= 0) continue;
      for (size_t j = 0; j < idx.size(); ++j) {
        if (idx[j] != e) continue;
        CHECK((route_w[j] > route_w[i] || (route_w[j] == route_w[i] && j < i)));
      }
    }
    for (int64_t e = 0; e < experts; ++e) CHECK(kept[size_t(e)] == std::min<int32_t>(routed[size_t(e)], capacity));
    CHECK(counts == kept);
    // In fp32 the CPU's choice.
    if (std::is_same_v<T, float>) {
      Routing want = cpu_routing(logits, tokens, experts, k, capacity, normalize, true);
      CHECK(idx == want.idx);
    }
  }
}

TEMPLATE_TEST_CASE("cuda kernels: MoE aux loss and router backward match the CPU", "[gpu]", bf16, float) {
  using T = TestType;
  const int64_t tokens = 150, experts = 40, k = 4;
  auto logits = random_values<T>(size_t(tokens * experts), -2, 2);
  Routing r = cpu_routing(logits, tokens, experts, k, 12);  // some copies dropped
  for (auto& p : r.probs) p = double(T(p));
  auto d_route_w = random_values<T>(size_t(tokens * k));
  const double scale = 0.01 * double(experts) / (double(k) * tokens * tokens), aux_scale = 3e-3;
  double want_aux = cpu::moe_aux_loss(r.probs.data(), r.idx.data(), tokens, experts, k, scale);
  std::vector<double> want_d_logits(size_t(tokens * experts));
  cpu::moe_route_backward(r.probs.data(), r.idx.data(), d_route_w.data(), want_d_logits.data(), tokens, experts, k,
                          aux_scale);
  Device<T> probs_(r.probs.size()), d_route_w_(d_route_w.size()), d_logits_(want_d_logits.size());
  probs_.set(r.probs);
  d_route_w_.set(d_route_w);
  DeviceRaw<int32_t> idx_(r.idx);
  Device<double> scratch_(size_t(2 * experts)), result_(1);
  cuda::moe_aux_loss(kLaunch, probs_.p, idx_.p, tokens, experts, k, scale, nullptr, scratch_.p, result_.p);
  CHECK(std::abs(result_.get()[0] - want_aux) < 1e-6 * std::abs(want_aux));  // fp64 sums of the same values
  cuda::moe_route_backward(kLaunch, probs_.p, idx_.p, d_route_w_.p, d_logits_.p, tokens, experts, k, aux_scale,
                           nullptr, scratch_.p, false);
  CHECK_CLOSE(T, d_logits_.get(), want_d_logits);
  // norm_topk_prob's backward: through the weights' division by their sum.
  cpu::moe_route_backward(r.probs.data(), r.idx.data(), d_route_w.data(), want_d_logits.data(), tokens, experts, k,
                          aux_scale, nullptr, true);
  cuda::moe_route_backward(kLaunch, probs_.p, idx_.p, d_route_w_.p, d_logits_.p, tokens, experts, k, aux_scale,
                           nullptr, scratch_.p, true);
  CHECK_CLOSE(T, d_logits_.get(), want_d_logits);
  // The whole sequence's counts given (as where tp or cp splits it): the host's, not route_idx's.
  std::vector<double> chosen(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) chosen[size_t(e)] = double(3 * e + 1);
  want_aux = cpu::moe_aux_loss(r.probs.data(), r.idx.data(), tokens, experts, k, scale, chosen.data());
  cpu::moe_route_backward(r.probs.data(), r.idx.data(), d_route_w.data(), want_d_logits.data(), tokens, experts, k,
                          aux_scale, chosen.data());
  cuda::moe_aux_loss(kLaunch, probs_.p, idx_.p, tokens, experts, k, scale, chosen.data(), scratch_.p, result_.p);
  CHECK(std::abs(result_.get()[0] - want_aux) < 1e-6 * std::abs(want_aux));
  cuda::moe_route_backward(kLaunch, probs_.p, idx_.p, d_route_w_.p, d_logits_.p, tokens, experts, k, aux_scale,
                           chosen.data(), scratch_.p, false);
  CHECK_CLOSE(T, d_logits_.get(), want_d_logits);
}

TEMPLATE_TEST_CASE("cuda kernels: MoE permutation and its inverse match the CPU", "[gpu]", bf16, float) {
  using T = TestType;
  const int64_t tokens = 120, experts = 6, k = 2, h = 200;
  Routing r = cpu_routing(random_values<T>(size_t(tokens * experts), -3, 3), tokens, experts, k, 35);
  int64_t rows = 0;
  std::vector<int64_t> map = row_map(r.idx, experts, &rows);
  for (auto& w : r.route_w) w = double(T(w));
  DeviceRaw<int64_t> map_(map);
  auto x = random_values<T>(size_t(tokens * h)), xe = random_values<T>(size_t(rows * h));
  auto d_y = random_values<T>(size_t(tokens * h)), d_ye = random_values<T>(size_t(rows * h));
  Device<T> x_(x.size()), xe_(xe.size()), d_y_(d_y.size()), d_ye_(d_ye.size()), w_(r.route_w.size());
  x_.set(x);
  xe_.set(xe);
  d_y_.set(d_y);
  d_ye_.set(d_ye);
  w_.set(r.route_w);
  {  // permute forward and backward: rows moved exactly
    std::vector<double> y(size_t(rows * h)), d_x(size_t(tokens * h));
    Device<T> y_(y.size()), d_x_(d_x.size());
    cpu::moe_permute_forward(x.data(), y.data(), map.data(), tokens, k, h);
    cpu::moe_permute_backward(d_ye.data(), d_x.data(), map.data(), tokens, k, h);
    cuda::moe_permute(kLaunch, x_.p, y_.p, map_.p, tokens, k, h, false);
    cuda::moe_permute(kLaunch, d_ye_.p, d_x_.p, map_.p, tokens, k, h, true);
    CHECK(y_.get() == y);
    CHECK_CLOSE(T, d_x_.get(), d_x);
  }
  {  // unpermute (the weighted combine) forward and backward
    std::vector<double> y(size_t(tokens * h)), d_x(size_t(rows * h)), d_w(r.route_w.size(), 5.0);
    Device<T> y_(y.size()), d_x_(d_x.size()), d_w_(d_w.size());
    d_w_.set(d_w);
    cpu::moe_unpermute_forward(xe.data(), r.route_w.data(), map.data(), y.data(), tokens, k, h);
    cpu::moe_unpermute_backward(d_y.data(), xe.data(), r.route_w.data(), map.data(), d_x.data(), d_w.data(), tokens, k,
                                h);
    cuda::moe_unpermute_forward(kLaunch, xe_.p, w_.p, map_.p, y_.p, tokens, k, h);
    cuda::moe_unpermute_backward(kLaunch, d_y_.p, xe_.p, w_.p, map_.p, d_x_.p, d_w_.p, tokens, k, h);
    CHECK_CLOSE(T, y_.get(), y);
    CHECK_CLOSE(T, d_x_.get(), d_x);
    CHECK_CLOSE(T, d_w_.get(), d_w);  // dropped copies: 0
  }
}

// The experts' side of two ep ranks' dispatch, 4 local experts: segments by source rank, then local
// expert, with rows {5, 0, 17, 0 | 9, 0, 33, 2}: expert 1 receives none, expert 3 rows from one
// source only, experts 0 and 2 from both (their wgrad: two launches, the second accumulating).
// Widths 48/40 keep every row 16-byte aligned (grouped where cuBLAS has the types); 21/13 do not
// (per expert everywhere). Both paths against the CPU in fp64 and against each other.
TEMPLATE_TEST_CASE("cuda kernels: MoE expert GEMMs, grouped and per expert, match the CPU", "[gpu]",
                   Bf16WithFp32Grads, Bf16WithBf16Grads, Fp32WithFp32Grads) {
  using T = typename TestType::T;
  using G = typename TestType::G;
  const int64_t local = 4;
  const std::vector<int64_t> rows = {5, 0, 17, 0, 9, 0, 33, 2};
  const int64_t total = 66, segments_with_rows = 5;
  ExpertGemmRig rig;
  CHECK_FALSE(cuda::grouped_gemm_supported(CUDA_R_16BF, CUDA_R_32F));  // the wgrad bf16 → fp32: per expert
  for (auto [in, out] : {std::pair<int64_t, int64_t>{48, 40}, {21, 13}}) {
    INFO("in " << in << ", out " << out);
    auto w = random_values<T>(size_t(local * out * in)), x = random_values<T>(size_t(total * in));
    auto dy = random_values<T>(size_t(total * out)), dx0 = random_values<T>(size_t(total * in));
    auto dw0 = random_values<G>(size_t(local * out * in));
    // The CPU in fp64: y = x·W_eᵀ, dx = dx0 + dy·W_e, dw_e = dw0_e + Σ over e's rows dyᵀ·x.
    std::vector<double> y(size_t(total * out), 0.0), dx = dx0, dw = dw0;
    int64_t row = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      const int64_t e = int64_t(i) % local;
      const double* we = w.data() + e * out * in;
      for (int64_t r = row; r < row + rows[i]; ++r) {
        for (int64_t o = 0; o < out; ++o) {
          for (int64_t c = 0; c < in; ++c) {
            y[size_t(r * out + o)] += x[size_t(r * in + c)] * we[o * in + c];
            dx[size_t(r * in + c)] += dy[size_t(r * out + o)] * we[o * in + c];
            dw[size_t(e * out * in + o * in + c)] += dy[size_t(r * out + o)] * x[size_t(r * in + c)];
          }
        }
      }
      row += rows[i];
    }
    Device<T> w_(w.size()), x_(x.size()), dy_(dy.size());
    w_.set(w);
    x_.set(x);
    dy_.set(dy);
    std::vector<const T*> w_of(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) w_of[i] = w_.p + (int64_t(i) % local) * out * in;
    const bool aligned = in == 48, wgrad_grouped = aligned && cuda::grouped_gemm_supported(
                                                                  cuda::cuda_type<T>(), cuda::cuda_type<G>());
    std::vector<std::vector<double>> results;  // grouped then per expert: y, dx, dw
    for (cuda::ExpertGemms* gemms : {rig.grouped.get(), rig.single.get()}) {
      const bool grouped = gemms == rig.grouped.get();
      INFO((grouped ? "grouped" : "per expert"));
      Device<T> y_(y.size()), dx_(dx0.size());
      Device<G> dw_(dw0.size());
      dx_.set(dx0);
      dw_.set(dw0);
      std::vector<G*> dw_of(rows.size());
      for (size_t i = 0; i < rows.size(); ++i) dw_of[i] = dw_.p + (int64_t(i) % local) * out * in;
      const int64_t grouped_before = gemms->grouped_launches(), single_before = gemms->single_launches();
      gemms->forward<T>(x_.p, w_of, rows, y_.p, in, out, kLaunch.stream, "test");
      gemms->backward_data<T>(dy_.p, w_of, rows, dx_.p, in, out, /*accumulate=*/true, kLaunch.stream, "test");
      const int64_t grouped_dgrad = gemms->grouped_launches(), single_dgrad = gemms->single_launches();
      gemms->backward_weight<T, G>(dy_.p, x_.p, dw_of, rows, in, out, kLaunch.stream, "test");
      results.push_back(y_.get());
      results.push_back(dx_.get());
      results.push_back(dw_.get());
      CHECK_CLOSE(T, results[results.size() - 3], y);
      CHECK_CLOSE(T, results[results.size() - 2], dx);
      CHECK_CLOSE(T, results.back(), dw);
      // The empty expert's gradient is left as it was, bit for bit.
      const auto empty_from = results.back().begin() + out * in, empty_to = empty_from + out * in;
      CHECK(std::vector<double>(empty_from, empty_to) ==
            std::vector<double>(dw0.begin() + out * in, dw0.begin() + 2 * out * in));
      // Which path ran: one grouped launch per op (the wgrad: one per segment of the expert with
      // the most), or a cuBLASLt GEMM per segment with rows.
      const bool forward_grouped = grouped && aligned;
      CHECK(grouped_dgrad - grouped_before == (forward_grouped ? 2 : 0));
      CHECK(single_dgrad - single_before == (forward_grouped ? 0 : 2 * segments_with_rows));
      CHECK(gemms->grouped_launches() - grouped_dgrad == (grouped && wgrad_grouped ? 2 : 0));
      CHECK(gemms->single_launches() - single_dgrad == (grouped && wgrad_grouped ? 0 : segments_with_rows));
    }
    for (int i = 0; i < 3; ++i) {
      INFO("grouped against per expert, output " << i);
      CHECK_CLOSE(T, results[size_t(i)], results[size_t(i + 3)]);
    }
  }
}

TEST_CASE("cuda run: STEPCAST_CUDA_MOE_GROUPED picks the experts' GEMMs", "[gpu]") {
  CHECK(moe_grouped_gemms_from_environment(nullptr));
  CHECK(moe_grouped_gemms_from_environment("1"));
  CHECK_FALSE(moe_grouped_gemms_from_environment("0"));
  CHECK_THROWS_AS(moe_grouped_gemms_from_environment("yes"), InputError);
}

// bf16 routing may pick another expert where two tie after rounding, so the bf16 curve is held to
// the dense bf16 tolerance (test_cuda_gpu_train.cpp), fp32 to 1e-3 as the dense fp32 plan.
TEST_CASE("cuda run: one-GPU plans of the tiny MoE models give the CPU loss curve", "[gpu]") {
  struct Case {
    const char* model;
    double capacity;  // 0: dropless
    const char* recompute;
    const char* dtype;
  };
  for (const Case& c : {Case{"tiny-moe", 0, "none", "bf16"}, Case{"tiny-moe", 1.0, "selective", "bf16"},
                        Case{"tiny-moe-shared", 0, "full", "bf16"}, Case{"tiny-moe", 0, "none", "fp32"}}) {
    INFO(c.model << " capacity " << c.capacity << " recompute " << c.recompute << " " << c.dtype);
    Json plan = {{"tp_size", 1},
                 {"pp_size", 1},
                 {"dp_size", 1},
                 {"zero_stage", 1},
                 {"recompute", c.recompute},
                 {"attention_impl", "flash"},
                 {"micro_batch_size", 2},
                 {"global_batch_size", 8},
                 {"dtype", "fp32"},
                 {"grad_dtype", "fp32"},
                 {"dropout", 0.0},
                 {"expert_model_parallel_size", 1}};
    if (c.capacity > 0) plan["moe_expert_capacity_factor"] = c.capacity;
    RunResult cpu = run_one_rank(c.model, plan, "cpu", 20);
    plan["dtype"] = c.dtype;
    RunResult gpu = run_one_rank(c.model, plan, "cuda", 20);
    INFO(cpu.output << gpu.output);
    REQUIRE(cpu.exit_code == 0);
    REQUIRE(gpu.exit_code == 0);
    auto want = cpu.measurement.at("losses").get<std::vector<double>>();
    auto got = gpu.measurement.at("losses").get<std::vector<double>>();
    CHECK(max_relative_difference(got, want) < (std::string(c.dtype) == "fp32" ? 1e-3 : 3e-2));
    CHECK(got.back() < 0.8 * got.front());
    // Dropped copies per step: none dropless; with a capacity, some on both backends.
    auto dropped_gpu = gpu.measurement.at("moe_dropped_tokens").get<std::vector<int64_t>>();
    auto dropped_cpu = cpu.measurement.at("moe_dropped_tokens").get<std::vector<int64_t>>();
    REQUIRE(dropped_gpu.size() == dropped_cpu.size());
    int64_t total_gpu = 0, total_cpu = 0;
    for (size_t i = 0; i < dropped_gpu.size(); ++i) total_gpu += dropped_gpu[i], total_cpu += dropped_cpu[i];
    CHECK((c.capacity == 0 ? total_gpu == 0 : total_gpu > 0));
    CHECK((c.capacity == 0 ? total_cpu == 0 : total_cpu > 0));
  }
}

// FP8 experts: each expert's rows through cuBLASLt's FP8 GEMMs (the wgrad's rows padded to 16 with
// zero codes), under both recipes, against the CPU's emulated FP8 curve at the dense FP8
// tolerance (test_cuda_gpu_fp8.cpp).
TEST_CASE("cuda run: FP8 experts on one GPU give the CPU's emulated FP8 curve", "[gpu]") {
  for (const char* model : {"tiny-moe", "tiny-moe-shared"}) {
    for (const char* scaling : {"delayed", "tensorwise"}) {
      INFO(model << " fp8 hybrid, " << scaling);
      Json plan = {{"tp_size", 1},          {"pp_size", 1},           {"dp_size", 1},
                   {"zero_stage", 1},       {"recompute", "none"},    {"attention_impl", "flash"},
                   {"micro_batch_size", 2}, {"global_batch_size", 8}, {"dtype", "fp32"},
                   {"grad_dtype", "fp32"},  {"dropout", 0.0},         {"expert_model_parallel_size", 1},
                   {"fp8", "hybrid"},       {"fp8_recipe", scaling}};
      check_fp8_curve_against_cpu(model, plan);
    }
  }
}
