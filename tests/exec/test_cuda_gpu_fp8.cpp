// [gpu] The CUDA backend's FP8 against the CPU backend's emulation (cpu_kernels_fp8.cpp): casts
// give the same codes, bit for bit, and amax, current scaling the same scale; the FP8 GEMMs of a linear layer (forward,
// backward data with accumulation, backward weight with the bias gradient) on the same codes and
// scales agree within fp32 accumulation (1e-5 with fp32 outputs, 1e-2 in bf16), through cuBLASLt's
// TN layout and the transposed copies; delayed scaling's update is the CPU's. Then the tiny model
// with FP8 on one GPU against the CPU's emulated FP8 curve. Runs only where a GPU is visible.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <sstream>
#include <vector>

#include "cpu_kernels.hpp"
#include "cuda_backend.hpp"
#include "cuda_gpu_run.hpp"
#include "cuda_gpu_support.hpp"

using namespace stepcast;
using namespace stepcast::test;

namespace {

// CPU codes of x with `scale`, cast in fp32 as the GPU casts (x·scale in float, then rounded).
std::vector<uint8_t> cpu_codes(const std::vector<double>& x, double scale, Fp8Storage format) {
  std::vector<float> xf(x.begin(), x.end());
  std::vector<uint8_t> codes(x.size());
  float amax = 0;
  cpu::fp8_cast(xf.data(), codes.data(), int64_t(x.size()), float(scale), &amax, format);
  return codes;
}

}  // namespace

TEMPLATE_TEST_CASE("cuda FP8: casts, amax and current scaling match the CPU", "[gpu]", bf16, float) {
  using T = TestType;
  auto backend = make_cuda_backend<T, float>(RankGrid(1, 1, 1, "tp-dp-pp"), 0, 1, CudaBackendOptions{});
  for (Fp8Storage format : {Fp8Storage::e4m3, Fp8Storage::e5m2}) {
    const int64_t n = 20000;
    auto x = random_values<T>(size_t(n), -3, 3);
    x[17] = 0;
    x[99] = double(T(1e-6));                                    // a subnormal code
    const double scale = double(float(fp8_max(format) / 2.5));  // some values saturate
    Device<T> x_(static_cast<size_t>(n));
    x_.set(x);
    Device<float> scale_(1), amax_(1), current_(1);
    scale_.set({scale});
    amax_.set({1.5});  // an earlier amax, smaller than this tensor's
    DeviceRaw<uint8_t> codes_(std::vector<uint8_t>(size_t(n), 0xAA));
    backend->fp8_cast(x_.p, codes_.p, n, scale_.p, amax_.p, format);
    std::vector<uint8_t> want = cpu_codes(x, scale, format), got = codes_.get();
    int64_t differ = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (got[size_t(i)] == want[size_t(i)]) continue;
      ++differ;
      INFO("x " << x[size_t(i)] << " code " << int(got[size_t(i)]) << " against " << int(want[size_t(i)]));
    }
    CHECK(differ == 0);  // x·scale is the same float on both sides (bf16 inputs are floats exactly)
    double most = 0;
    for (double v : x) most = std::max(most, std::abs(v));
    CHECK(amax_.get()[0] == float(std::max(1.5, most)));
    backend->fp8_absmax(x_.p, n, amax_.p, false);
    CHECK(amax_.get()[0] == float(most));
    backend->fp8_set_current_scale(amax_.p, current_.p, format);
    CHECK(current_.get()[0] == fp8_current_scale(float(most), format));
  }
}

TEMPLATE_TEST_CASE("cuda FP8: cuBLASLt FP8 linear layers match the CPU emulation", "[gpu]", bf16, float) {
  using T = TestType;
  auto backend = make_cuda_backend<T, float>(RankGrid(1, 1, 1, "tp-dp-pp"), 0, 1, CudaBackendOptions{});
  // 37 and 5 tokens: an expert's rows, which the wgrad pads to 16 with zero codes in its scratch.
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes = {
      {64, 64, 192}, {256, 128, 512}, {37, 64, 192}, {5, 32, 64}};
  for (Fp8Format recipe : {Fp8Format::e4m3, Fp8Format::hybrid}) {
    const Fp8Storage fwd = Fp8Storage::e4m3, grad = storage_of(recipe, true);
    for (auto [tokens, in, out] : shapes) {
      INFO("tokens " << tokens << " in " << in << " out " << out << (recipe == Fp8Format::hybrid ? " hybrid" : ""));
      auto x = random_values<double>(size_t(tokens * in)), w = random_values<double>(size_t(out * in));
      auto dy = random_values<double>(size_t(tokens * out), -0.01, 0.01);
      auto dx0 = random_values<T>(size_t(tokens * in)), dw0 = random_values<float>(size_t(out * in));
      auto db0 = random_values<float>(size_t(out));
      const double sx = 100, sw = 120, sd = grad == Fp8Storage::e5m2 ? 4e6 : 3e4;
      std::vector<uint8_t> x8 = cpu_codes(x, sx, fwd), w8 = cpu_codes(w, sw, fwd), d8 = cpu_codes(dy, sd, grad);
      // The CPU emulation in fp64 on the same codes and scales.
      std::vector<double> y(size_t(tokens * out)), dx = dx0, dw = dw0, db = db0;
      std::vector<double> scratch(size_t(cpu::kFp8Scratch));
      const cpu::Fp8Operand<double> cx{x8.data(), in, sx, fwd}, cw{w8.data(), in, sw, fwd},
          cd{d8.data(), out, sd, grad};
      cpu::fp8_linear_forward(cx, cw, static_cast<const double*>(nullptr), y.data(), tokens, in, out, scratch.data());
      cpu::fp8_linear_backward_data(cd, cw, dx.data(), tokens, in, out, true, scratch.data());
      cpu::fp8_linear_backward_weight(cd, cx, dw.data(), db.data(), tokens, in, out, scratch.data());
      DeviceRaw<uint8_t> x8_(x8), w8_(w8), d8_(d8);
      Device<float> scales_(3);
      scales_.set({sx, sw, sd});
      Device<T> y_(y.size()), dx_(dx0.size());
      Device<float> dw_(dw0.size()), db_(db0.size());
      dx_.set(dx0);
      dw_.set(dw0);
      db_.set(db0);
      const Fp8Codes<float> gx{x8_.p, scales_.p, fwd}, gw{w8_.p, scales_.p + 1, fwd}, gd{d8_.p, scales_.p + 2, grad};
      backend->fp8_linear_forward(gx, gw, nullptr, y_.p, tokens, in, out);
      backend->fp8_linear_backward_data(gd, gw, dx_.p, tokens, in, out, true);
      backend->fp8_linear_backward_weight(gd, gx, dw_.p, db_.p, tokens, in, out);
      backend->synchronize();
      CHECK_CLOSE(T, y_.get(), y);
      CHECK_CLOSE(T, dx_.get(), dx);
      CHECK(relative_error(dw_.get(), dw) < 1e-5);  // fp32 gradients in both cases
      CHECK(relative_error(db_.get(), db) < 1e-5);
      if (tokens % 16 != 0) continue;  // the program's transposed copies need rows of 16s (run checks it)
      // The same wgrad from the program's transposed copies of the codes (fp8_transpose, on the
      // device), as a topology with fp8_columnwise transposed lowers it.
      DeviceRaw<uint8_t> x8t_(x8), d8t_(d8);
      backend->fp8_transpose(x8_.p, x8t_.p, tokens, in);
      backend->fp8_transpose(d8_.p, d8t_.p, tokens, out);
      Device<float> dw_t_(dw0.size()), db_t_(db0.size());
      dw_t_.set(dw0);
      db_t_.set(db0);
      backend->fp8_linear_backward_weight(gd, gx, dw_t_.p, db_t_.p, tokens, in, out, d8t_.p, x8t_.p);
      backend->synchronize();
      CHECK(dw_t_.get() == dw_.get());  // the same codes in the same TN GEMM
      CHECK(db_t_.get() == db_.get());
    }
  }
  // An expert without rows: nothing runs, nothing changes.
  const int64_t in = 32, out = 64;
  auto w = random_values<double>(size_t(out * in));
  std::vector<uint8_t> w8 = cpu_codes(w, 120, Fp8Storage::e4m3);
  DeviceRaw<uint8_t> w8_(w8), none_(std::vector<uint8_t>(16));
  Device<float> scales_(2), dw_(size_t(out * in));
  scales_.set({100, 120});
  dw_.set(random_values<double>(size_t(out * in)));
  const std::vector<double> before = dw_.get();
  const Fp8Codes<float> gx{none_.p, scales_.p, Fp8Storage::e4m3}, gw{w8_.p, scales_.p + 1, Fp8Storage::e4m3};
  backend->fp8_linear_forward(gx, gw, nullptr, static_cast<T*>(nullptr), 0, in, out);
  backend->fp8_linear_backward_weight(gx, gx, dw_.p, static_cast<float*>(nullptr), 0, in, out);
  backend->synchronize();
  CHECK(dw_.get() == before);
}

TEST_CASE("cuda FP8: delayed scaling's update and the amax reduction are the CPU's", "[gpu]") {
  auto backend = make_cuda_backend<bf16, float>(RankGrid(1, 1, 1, "tp-dp-pp"), 0, 1, CudaBackendOptions{});
  Fp8Recipe recipe;
  recipe.format = Fp8Format::hybrid;
  recipe.amax_history_len = 4;
  recipe.amax_compute_algo = Fp8AmaxAlgo::max;
  recipe.margin = 1;
  const int64_t slots = 2 * kFp8SlotsPerLayer;
  std::vector<float> amax(static_cast<size_t>(slots)), history(static_cast<size_t>(slots * 4)),
      scale(static_cast<size_t>(slots), 1.f);
  for (int64_t i = 0; i < slots; ++i) amax[size_t(i)] = float(0.5 + 0.1 * double(i));
  amax[3] = 0;  // keeps its scale
  for (size_t i = 0; i < history.size(); ++i) history[i] = float(0.01 * double(i % 7));
  Device<float> amax_(amax.size()), history_(history.size()), scale_(scale.size());
  auto as_doubles = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
  amax_.set(as_doubles(amax));
  history_.set(as_doubles(history));
  scale_.set(as_doubles(scale));
  backend->all_reduce_max(GroupKind::tp, amax_.p, slots);  // one rank: unchanged
  backend->fp8_scale_update(amax_.p, history_.p, scale_.p, slots, recipe);
  cpu::fp8_scale_update(amax.data(), history.data(), scale.data(), slots, recipe);
  CHECK(scale_.get() == as_doubles(scale));
  CHECK(history_.get() == as_doubles(history));
  CHECK(amax_.get() == as_doubles(amax));  // zeroed for the next step
}

// The GPU's bf16 activations against the CPU's fp32 ones, both through the same FP8 grids: the
// dense bf16 tolerance (test_cuda_gpu_train.cpp).
TEST_CASE("cuda run: the tiny model with FP8 on one GPU gives the CPU's emulated FP8 curve", "[gpu]") {
  for (const char* scaling : {"delayed", "tensorwise"}) {
    INFO("fp8 hybrid, " << scaling);
    Json plan = {{"tp_size", 1},          {"pp_size", 1},           {"dp_size", 1},
                 {"zero_stage", 1},       {"recompute", "none"},    {"attention_impl", "flash"},
                 {"micro_batch_size", 2}, {"global_batch_size", 8}, {"dtype", "fp32"},
                 {"grad_dtype", "fp32"},  {"dropout", 0.0},         {"fp8", "hybrid"},
                 {"fp8_recipe", scaling}};
    check_fp8_curve_against_cpu("tiny", plan);
  }
}
