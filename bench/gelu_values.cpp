// stepcast_gelu_values: the CPU kernels' GeLU (exec/cpu_kernels_activations.cpp) on 256 Ki fp32
// elements whose values are spread as the profiler's (|x| 0.25–0.41, random signs) and as a
// step's activations (normal, standard deviation 0.1 … 3), beside the same GeLU on libm's tanh.
// The kernel's time should not depend on the values (the profiler measures one spread, steps
// run another); libm's tanh branches on |z| and did. Not a test: it prints figures.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "cpu_kernels.hpp"

namespace {

constexpr int64_t kElements = 256 * 1024;
constexpr int kRepeats = 30;

// GPT-2's GeLU on std::tanh, as the kernel computed it before (the comparison row).
__attribute__((noinline)) void gelu_libm(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    double v = x[i];
    y[i] = float(0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))));
  }
}

template <class F>
double best_ms(F&& f) {
  double best = 1e300;
  for (int r = 0; r < kRepeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  return best;
}

}  // namespace

int main() {
  std::vector<float> x(kElements), y(kElements), dy(kElements, 0.5f), dx(kElements);
  std::mt19937_64 random(1);
  std::printf("GeLU over %lld fp32 elements, best of %d (ms)\n", static_cast<long long>(kElements), kRepeats);
  std::printf("%-32s %10s %10s %10s\n", "inputs", "forward", "backward", "libm tanh");
  double first = 0;
  for (double sd : {0.0, 0.1, 0.32, 1.0, 3.0}) {
    std::normal_distribution<double> normal(0.0, sd > 0 ? sd : 1.0);
    uint64_t state = 0x9E3779B97F4A7C15ull;  // the profiler's buffer values (exec/profiler.cpp)
    for (int64_t i = 0; i < kElements; ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const double profiler_value = ((state >> 63) ? -1.0 : 1.0) * (0.25 + 0.01 * double(i % 17));
      x[size_t(i)] = float(sd > 0 ? normal(random) : profiler_value);
    }
    double forward = best_ms([&] { stepcast::cpu::gelu_forward(x.data(), y.data(), kElements); });
    double backward = best_ms([&] { stepcast::cpu::gelu_backward(x.data(), dy.data(), dx.data(), kElements); });
    double libm = best_ms([&] { gelu_libm(x.data(), y.data(), kElements); });
    if (sd == 0) first = forward;
    char label[64];
    if (sd > 0) std::snprintf(label, sizeof label, "normal, sd %.2f", sd);
    else std::snprintf(label, sizeof label, "the profiler's (|x| 0.25-0.41)");
    std::printf("%-32s %10.3f %10.3f %10.3f   forward / the profiler's %.2f\n", label, forward, backward, libm,
                forward / first);
  }
  return 0;
}
