// [gpu] The tiny models trained on one GPU through `stepcast run --backend cuda` under several
// one-GPU plans (ZeRO stages, recompute modes, micro batch counts, flash and materialized
// attention, dropout) give the CPU backend's fp32 loss curve within bf16 tolerance over 20 steps;
// an fp32 plan on the GPU gives it within 1e-3; measurement.json carries the device's memory.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "cuda_gpu_run.hpp"

using namespace stepcast;
using namespace stepcast::test;

namespace {

Json one_gpu_plan(int zero, const char* recompute, bool flash, int micro_batch, double dropout,
                  const char* dtype, const char* grad_dtype) {
  return {{"tp_size", 1}, {"pp_size", 1}, {"dp_size", 1}, {"zero_stage", zero},
          {"recompute", recompute}, {"attention_impl", flash ? "flash" : "materialized"},
          {"micro_batch_size", micro_batch}, {"global_batch_size", 8}, {"dtype", dtype},
          {"grad_dtype", grad_dtype}, {"dropout", dropout}};
}

// The bf16 tolerance on a loss curve: bf16 keeps 8 mantissa bits (relative step 2^-8 ≈ 0.4%);
// rounding the activations of 4 layers and the weights after each step compounds to a few of
// those over 20 steps of a 64-wide model, well below the loss's own fall (≈ 40%).
constexpr double kBf16CurveTolerance = 3e-2;

}  // namespace

TEST_CASE("cuda run: one-GPU plans of the tiny models give the CPU loss curve in bf16", "[gpu]") {
  struct Case {
    const char* model;
    int zero;
    const char* recompute;
    bool flash;
    int micro_batch;
    double dropout;
    const char* grad_dtype;
  };
  for (const Case& c : {Case{"tiny", 0, "none", false, 2, 0.0, "fp32"},
                        Case{"tiny", 1, "selective", true, 4, 0.0, "fp32"},
                        Case{"tiny", 2, "full", true, 1, 0.1, "fp32"},
                        Case{"tiny", 3, "none", false, 8, 0.1, "fp32"},
                        Case{"tiny-gpt", 0, "selective", false, 2, 0.1, "fp32"},
                        Case{"tiny-gpt", 1, "full", true, 4, 0.0, "fp32"},
                        Case{"tiny", 0, "none", true, 2, 0.0, "bf16"}}) {
    INFO(c.model << " zero " << c.zero << " recompute " << c.recompute << (c.flash ? " flash" : " materialized")
                 << " micro batch " << c.micro_batch << " dropout " << c.dropout << " grads " << c.grad_dtype);
    RunResult cpu = run_one_rank(
        c.model, one_gpu_plan(c.zero, c.recompute, c.flash, c.micro_batch, c.dropout, "fp32", "fp32"), "cpu", 20);
    RunResult gpu = run_one_rank(
        c.model, one_gpu_plan(c.zero, c.recompute, c.flash, c.micro_batch, c.dropout, "bf16", c.grad_dtype), "cuda",
        20);
    INFO(cpu.output << gpu.output);
    REQUIRE(cpu.exit_code == 0);
    REQUIRE(gpu.exit_code == 0);
    auto want = cpu.measurement.at("losses").get<std::vector<double>>();
    auto got = gpu.measurement.at("losses").get<std::vector<double>>();
    double tolerance = std::string(c.grad_dtype) == "bf16" ? 2 * kBf16CurveTolerance : kBf16CurveTolerance;
    CHECK(max_relative_difference(got, want) < tolerance);
    CHECK(got.back() < 0.8 * got.front());  // it learns
  }
}

TEST_CASE("cuda run: an fp32 plan on the GPU gives the CPU fp32 curve within 1e-3", "[gpu]") {
  Json plan = one_gpu_plan(1, "selective", true, 2, 0.1, "fp32", "fp32");
  RunResult cpu = run_one_rank("tiny", plan, "cpu", 20);
  RunResult gpu = run_one_rank("tiny", plan, "cuda", 20);
  INFO(cpu.output << gpu.output);
  REQUIRE(cpu.exit_code == 0);
  REQUIRE(gpu.exit_code == 0);
  CHECK(max_relative_difference(gpu.measurement.at("losses").get<std::vector<double>>(),
                                cpu.measurement.at("losses").get<std::vector<double>>()) < 1e-3);
}

TEST_CASE("cuda run: measurement.json has per-op records and the device's memory", "[gpu]") {
  RunResult gpu = run_one_rank("tiny-gpt", one_gpu_plan(1, "none", true, 2, 0.0, "bf16", "fp32"), "cuda", 4);
  INFO(gpu.output);
  REQUIRE(gpu.exit_code == 0);
  const Json& m = gpu.measurement;
  CHECK(m.at("backend") == "cuda");
  CHECK(m.at("source") == "executor");
  CHECK(m.at("ops").size() > 10);
  const Json& device = m.at("memory").at("device_rank0");
  CHECK(device.at("total_bytes").get<double>() > 1e9);
  // The allocator's high-water mark holds at least the program's peak (the arena is one block).
  double model_peak = m.at("memory").at("ranks")[0].at("peak_bytes").get<double>() -
                      m.at("memory").at("ranks")[0].at("memory_runtime_bytes").get<double>();
  CHECK(device.at("allocator_high_water_bytes").get<double>() >= model_peak);
  CHECK(device.at("used_high_water_bytes").get<double>() >= device.at("allocator_high_water_bytes").get<double>());
}
