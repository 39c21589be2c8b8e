// [gpu] The CUDA backend's context-parallel methods (backend.hpp's cp_*) against the CPU kernels
// (cpu_kernels_cp.cpp, the reference, in fp64 on the same inputs rounded to the CUDA storage type),
// on the calls a cp 2 rank makes: Megatron's load-balanced chunks (cp rank c holds chunks c and
// 3 − c of 4), ring steps over K/V blocks with the merge and the dK/dV accumulation, materialized
// scores over the gathered K/V, and Ulysses' shuffles; with and without dropout, GQA. Positions go
// in as host arrays, as the interpreter passes them. Runs only where a GPU is visible.
#include <cuda_runtime_api.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <vector>

#include "bf16.hpp"
#include "cpu_kernels.hpp"
#include "cuda_backend.hpp"
#include "cuda_gpu_support.hpp"

using namespace stepcast;
using namespace stepcast::test;

namespace {

constexpr int64_t kCp = 2;

// The global position of local row r of cp rank c (interpreter.cpp's position()): chunks c and
// 2·cp − 1 − c of the sequence, s_local / 2 rows each.
std::vector<int64_t> chunk_positions(int64_t c, int64_t s_local) {
  const int64_t chunk = s_local / 2;
  std::vector<int64_t> pos;
  for (int64_t r = 0; r < s_local; ++r)
    pos.push_back(r < chunk ? c * chunk + r : (2 * kCp - 1 - c) * chunk + r - chunk);
  return pos;
}

template <class T>
std::unique_ptr<Backend<T, float, float>> one_gpu_backend() {
  return make_cuda_backend<T, float>(RankGrid(1, 1, 1, "tp-dp-pp"), 0, 1, CudaBackendOptions{});
}

// The uploads (cudaMemcpy on the legacy stream) done before the backend's streams read them.
void settle() { REQUIRE(cudaDeviceSynchronize() == cudaSuccess); }

// One cp rank's tensors: on the CPU (fp64) and on the GPU.
struct CpuRank {
  std::vector<int64_t> pos;
  std::vector<double> qkv, d_ctx, kv, ctx, lse, d_qkv, d_kv_sum;
};
template <class T>
struct GpuRank {
  explicit GpuRank(const cpu::AttentionShape& sh)
      : qkv(size_t(sh.s * sh.b * sh.qkv_width())),
        d_ctx(size_t(sh.s * sh.b * sh.heads * sh.d)),
        kv(size_t(sh.s * sh.b * 2 * sh.kv_heads * sh.d)),
        ctx(d_ctx.n),
        d_qkv(qkv.n),
        d_kv_sum(kv.n),
        lse(size_t(sh.b * sh.heads * sh.s)) {}
  Device<T> qkv, d_ctx, kv, ctx, d_qkv, d_kv_sum;
  Device<float> lse;
};

const cpu::Dropout kDropout{0.2, 31, 5, 2, cpu::DropoutSite::attention_probs};
constexpr int64_t kHead0 = 4;  // the heads of tp rank 1 of 2

}  // namespace

TEMPLATE_TEST_CASE("cuda context parallelism: ring flash attention, merge and dK/dV match the CPU", "[gpu]", bf16,
                   float) {
  using T = TestType;
  auto backend = one_gpu_backend<T>();
  for (int64_t d : {16, 40}) {  // 40: lanes past the first 32 of a row, not a flash tile size
    for (bool with_dropout : {false, true}) {
      INFO("head dim " << d << (with_dropout ? ", dropout" : ""));
      const cpu::AttentionShape sh{20, 2, 4, 2, d};  // s_local 20 of 40; GQA
      const int64_t n = sh.s, rows = sh.s * sh.b, kv_width = 2 * sh.kv_heads * d;
      const int64_t lse_n = sh.b * sh.heads * sh.s, ctx_n = rows * sh.heads * d;
      const double scale = 1.0 / std::sqrt(double(d));
      const cpu::Dropout* drop = with_dropout ? &kDropout : nullptr;
      std::vector<int64_t> samples = {9, 2};
      DeviceRaw<int64_t> samples_(samples);
      std::vector<CpuRank> cpu;
      std::vector<std::unique_ptr<GpuRank<T>>> gpu;
      for (int64_t c = 0; c < kCp; ++c) {
        cpu.push_back({chunk_positions(c, sh.s), random_values<T>(size_t(rows * sh.qkv_width())),
                       random_values<T>(size_t(ctx_n)), std::vector<double>(size_t(rows * kv_width)),
                       std::vector<double>(size_t(ctx_n)), std::vector<double>(size_t(lse_n)),
                       std::vector<double>(size_t(rows * sh.qkv_width())),
                       std::vector<double>(size_t(rows * kv_width), 0.0)});
        gpu.push_back(std::make_unique<GpuRank<T>>(sh));
        gpu[c]->qkv.set(cpu[c].qkv);
        gpu[c]->d_ctx.set(cpu[c].d_ctx);
      }
      settle();
      for (int64_t c = 0; c < kCp; ++c) {  // K/V blocks: copies, exact
        cpu::cp_kv_pack(cpu[c].qkv.data(), cpu[c].kv.data(), sh);
        backend->cp_kv_pack(gpu[c]->qkv.p, gpu[c]->kv.p, sh);
        CHECK(gpu[c]->kv.get() == cpu[c].kv);
      }
      // Forward, ring step t: rank c's queries over the block of rank (c − t) mod cp, merged in.
      std::vector<double> ctx_part(static_cast<size_t>(ctx_n)), lse_part(static_cast<size_t>(lse_n));
      Device<T> ctx_part_(static_cast<size_t>(ctx_n));
      Device<float> lse_part_(static_cast<size_t>(lse_n));
      for (int64_t c = 0; c < kCp; ++c) {
        for (int64_t t = 0; t < kCp; ++t) {
          const int64_t src = (c - t + kCp) % kCp;
          const bool first = t == 0;
          cpu::cp_flash_forward(cpu[c].qkv.data(), cpu[src].kv.data(), n, cpu[c].pos.data(), cpu[src].pos.data(),
                                first ? cpu[c].ctx.data() : ctx_part.data(),
                                first ? cpu[c].lse.data() : lse_part.data(), sh, scale, drop, kHead0, samples.data());
          backend->cp_flash_forward(gpu[c]->qkv.p, gpu[src]->kv.p, n, cpu[c].pos.data(), cpu[src].pos.data(),
                                    first ? gpu[c]->ctx.p : ctx_part_.p, first ? gpu[c]->lse.p : lse_part_.p, sh, scale,
                                    drop, kHead0, samples_.p);
          if (first) continue;
          INFO("rank " << c << ", block of rank " << src);
          // Rank 0's chunk-0 queries see no key of rank 1's chunks 1 and 2: ctx 0, lse −inf.
          CHECK_CLOSE(T, ctx_part_.get(), ctx_part);
          CHECK(relative_error(lse_part_.get(), lse_part) < 1e-5 * (std::is_same_v<T, bf16> ? 100 : 1));
          cpu::cp_merge(cpu[c].ctx.data(), cpu[c].lse.data(), ctx_part.data(), lse_part.data(), sh);
          backend->cp_merge(gpu[c]->ctx.p, gpu[c]->lse.p, ctx_part_.p, lse_part_.p, sh);
        }
        INFO("rank " << c << " merged");
        CHECK_CLOSE(T, gpu[c]->ctx.get(), cpu[c].ctx);
        CHECK(relative_error(gpu[c]->lse.get(), cpu[c].lse) < 1e-5 * (std::is_same_v<T, bf16> ? 100 : 1));
      }
      // Backward: dQ over the ring steps (written, then added), each block's dK/dV summed over the
      // ranks (cp_accumulate) and put back into its owner's d_qkv. The GPU reads its own ctx, lse.
      std::vector<double> d_kv(static_cast<size_t>(rows * kv_width));
      Device<T> d_kv_(static_cast<size_t>(rows * kv_width));
      for (int64_t c = 0; c < kCp; ++c) {
        for (int64_t t = 0; t < kCp; ++t) {
          const int64_t src = (c - t + kCp) % kCp;
          INFO("rank " << c << ", block of rank " << src);
          cpu::cp_flash_backward(cpu[c].qkv.data(), cpu[src].kv.data(), n, cpu[c].pos.data(), cpu[src].pos.data(),
                                 cpu[c].ctx.data(), cpu[c].lse.data(), cpu[c].d_ctx.data(), cpu[c].d_qkv.data(), t > 0,
                                 d_kv.data(), sh, scale, drop, kHead0, samples.data());
          backend->cp_flash_backward(gpu[c]->qkv.p, gpu[src]->kv.p, n, cpu[c].pos.data(), cpu[src].pos.data(),
                                     gpu[c]->ctx.p, gpu[c]->lse.p, gpu[c]->d_ctx.p, gpu[c]->d_qkv.p, t > 0, d_kv_.p, sh,
                                     scale, drop, kHead0, samples_.p);
          CHECK_CLOSE(T, d_kv_.get(), d_kv);
          for (size_t e = 0; e < d_kv.size(); ++e) cpu[src].d_kv_sum[e] += d_kv[e];
          backend->cp_accumulate(gpu[src]->d_kv_sum.p, d_kv_.p, int64_t(d_kv.size()));
        }
      }
      for (int64_t c = 0; c < kCp; ++c) {
        INFO("rank " << c << " d_qkv");
        CHECK_CLOSE(T, gpu[c]->d_kv_sum.get(), cpu[c].d_kv_sum);
        cpu::cp_kv_unpack(cpu[c].d_kv_sum.data(), cpu[c].d_qkv.data(), sh);
        backend->cp_kv_unpack(gpu[c]->d_kv_sum.p, gpu[c]->d_qkv.p, sh);
        CHECK_CLOSE(T, gpu[c]->d_qkv.get(), cpu[c].d_qkv);
      }
    }
  }
}

TEMPLATE_TEST_CASE("cuda context parallelism: materialized attention over the gathered K/V matches the CPU", "[gpu]",
                   bf16, float) {
  using T = TestType;
  auto backend = one_gpu_backend<T>();
  const cpu::AttentionShape sh{24, 2, 4, 2, 16};  // s_local 24 of 48; GQA
  const int64_t n = kCp * sh.s, rows = sh.s * sh.b, kv_width = 2 * sh.kv_heads * sh.d;
  const int64_t sq = sh.b * sh.heads * sh.s * n, ctx_n = rows * sh.heads * sh.d;
  const double scale = 0.25;
  std::vector<int64_t> samples = {40, 17};
  DeviceRaw<int64_t> samples_(samples);
  // The gathered block: every cp rank's K/V rows in cp rank order, and their positions.
  std::vector<int64_t> kv_pos;
  for (int64_t c = 0; c < kCp; ++c) {
    for (int64_t p : chunk_positions(c, sh.s)) kv_pos.push_back(p);
  }
  auto kv = random_values<T>(size_t(n * sh.b * kv_width));
  Device<T> kv_(kv.size());
  kv_.set(kv);
  for (int64_t c = 0; c < kCp; ++c) {
    for (bool with_dropout : {false, true}) {
      INFO("rank " << c << (with_dropout ? ", dropout" : ""));
      const std::vector<int64_t> q_pos = chunk_positions(c, sh.s);
      auto qkv = random_values<T>(size_t(rows * sh.qkv_width()));
      auto d_ctx = random_values<T>(size_t(ctx_n));
      auto d_qkv0 = random_values<T>(qkv.size());  // K and V parts must stay as they are
      Device<T> qkv_(qkv.size()), d_ctx_(d_ctx.size()), d_qkv_(qkv.size()), scores_(sq), probs_(sq), drop_(sq);
      Device<T> ctx_(static_cast<size_t>(ctx_n)), d_used_(sq), d_probs_(sq), d_scores_(sq), d_kv_(kv.size());
      DeviceRaw<uint8_t> mask_(std::vector<uint8_t>(size_t(sq), 7));
      qkv_.set(qkv);
      d_ctx_.set(d_ctx);
      d_qkv_.set(d_qkv0);
      settle();
      std::vector<double> scores(sq), probs(sq), drop(sq), ctx(ctx_n), d_used(sq), d_probs(sq), d_scores(sq);
      std::vector<double> d_kv(kv.size()), d_qkv = d_qkv0;
      std::vector<uint8_t> mask(sq);
      cpu::cp_score_forward(qkv.data(), kv.data(), n, q_pos.data(), kv_pos.data(), scores.data(), sh, scale);
      cpu::softmax_forward(scores.data(), probs.data(), sh.b * sh.heads * sh.s, n);
      backend->cp_score_forward(qkv_.p, kv_.p, n, q_pos.data(), kv_pos.data(), scores_.p, sh, scale);
      backend->softmax_forward(scores_.p, probs_.p, sh.b * sh.heads * sh.s, n);
      CHECK_CLOSE(T, scores_.get(), scores);  // −inf where the key is after the query
      const double* used = probs.data();
      const T* used_ = probs_.p;
      if (with_dropout) {
        cpu::cp_attention_dropout_forward(probs.data(), drop.data(), mask.data(), sh, n, q_pos.data(), kv_pos.data(),
                                          kDropout, kHead0, samples.data());
        backend->cp_attention_dropout_forward(probs_.p, drop_.p, mask_.p, sh, n, q_pos.data(), kv_pos.data(), kDropout,
                                              kHead0, samples_.p);
        CHECK(mask_.get() == mask);
        CHECK_CLOSE(T, drop_.get(), drop);
        used = drop.data();
        used_ = drop_.p;
      }
      cpu::cp_value_forward(used, kv.data(), n, ctx.data(), sh);
      backend->cp_value_forward(used_, kv_.p, n, ctx_.p, sh);
      CHECK_CLOSE(T, ctx_.get(), ctx);
      cpu::cp_value_backward(d_ctx.data(), used, kv.data(), n, d_used.data(), d_kv.data(), sh);
      backend->cp_value_backward(d_ctx_.p, used_, kv_.p, n, d_used_.p, d_kv_.p, sh);
      CHECK_CLOSE(T, d_used_.get(), d_used);
      CHECK_CLOSE(T, d_kv_.get(), d_kv);  // dV, and dK zeroed
      const double* d_probs_in = d_used.data();
      const T* d_probs_in_ = d_used_.p;
      if (with_dropout) {
        cpu::dropout_backward(d_used.data(), mask.data(), d_probs.data(), sq, kDropout.p);
        backend->dropout_backward(d_used_.p, mask_.p, d_probs_.p, sq, kDropout.p);
        d_probs_in = d_probs.data();
        d_probs_in_ = d_probs_.p;
      }
      cpu::softmax_backward(d_probs_in, probs.data(), d_scores.data(), sh.b * sh.heads * sh.s, n);
      backend->softmax_backward(d_probs_in_, probs_.p, d_scores_.p, sh.b * sh.heads * sh.s, n);
      cpu::cp_score_backward(d_scores.data(), qkv.data(), kv.data(), n, d_qkv.data(), d_kv.data(), sh, scale);
      backend->cp_score_backward(d_scores_.p, qkv_.p, kv_.p, n, d_qkv_.p, d_kv_.p, sh, scale);
      CHECK_CLOSE(T, d_qkv_.get(), d_qkv);  // dQ written, K and V parts untouched
      CHECK_CLOSE(T, d_kv_.get(), d_kv);    // dK added to the value backward's
    }
  }
}

TEMPLATE_TEST_CASE("cuda context parallelism: Ulysses head split and join and row permutation match the CPU", "[gpu]",
                   bf16, float) {
  using T = TestType;
  auto backend = one_gpu_backend<T>();
  const int64_t s = 20, b = 3, d = 8, heads = 4, kv_heads = 2, rows = s * b;
  // A qkv row (q, k, v heads each split) and a ctx row.
  for (const std::vector<int64_t>& sections :
       {std::vector<int64_t>{heads * d, kv_heads * d, kv_heads * d}, std::vector<int64_t>{heads * d}}) {
    int64_t width = 0;
    for (int64_t w : sections) width += w;
    INFO("row width " << width);
    auto x = random_values<T>(size_t(rows * width));
    std::vector<double> blocks(x.size()), back(x.size());
    Device<T> x_(x.size()), blocks_(x.size()), back_(x.size());
    x_.set(x);
    settle();
    cpu::a2a_heads(x.data(), blocks.data(), rows, sections, kCp, true);
    backend->cp_a2a_heads(x_.p, blocks_.p, rows, sections, kCp, true);
    CHECK(blocks_.get() == blocks);
    cpu::a2a_heads(blocks.data(), back.data(), rows, sections, kCp, false);
    backend->cp_a2a_heads(blocks_.p, back_.p, rows, sections, kCp, false);
    CHECK(back_.get() == back);
    CHECK(back == x);
  }
  // The cp blocks' token rows to their sequence positions and back (interpreter_cp.cpp).
  std::vector<int64_t> index;
  for (int64_t c = 0; c < kCp; ++c) {
    for (int64_t p : chunk_positions(c, s)) index.push_back(p);
  }
  const int64_t n = kCp * s, width = b * 12;
  auto x = random_values<T>(size_t(n * width));
  Device<T> x_(x.size()), y_(x.size()), z_(x.size());
  x_.set(x);
  settle();
  std::vector<double> y(x.size()), z(x.size());
  for (bool gather : {true, false}) {
    cpu::permute_rows(x.data(), y.data(), index.data(), n, width, gather);
    backend->cp_permute_rows(x_.p, y_.p, index.data(), n, width, gather);
    CHECK(y_.get() == y);
    cpu::permute_rows(y.data(), z.data(), index.data(), n, width, !gather);
    backend->cp_permute_rows(y_.p, z_.p, index.data(), n, width, !gather);
    CHECK(z_.get() == x);
  }
}
