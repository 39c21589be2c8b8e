// stepcast_after_gemm: how much slower the CPU kernels' RMSNorm (exec/cpu_kernels.hpp) runs right
// after a BLAS GEMM than back to back, as the profiler times it since it times each memory-bound
// and attention call after a 128³ GEMM (exec/profiler_tools.hpp's step_gemm). Rows: the norm
// alone, after a memcpy of a GEMM's bytes (cache, no AVX-512), after a 64³ and a 128³ cblas_sgemm.
// Each figure: the median over 31 passes of 1 ms samples, each call timed alone. Run it with
// OPENBLAS_CORETYPE=Haswell too (AVX2 kernels) to see whether the GEMM's AVX-512 is the cause
// (bench/after_gemm.sh runs both). Not a test: it prints figures.
#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "cpu_kernels.hpp"
#include "per_call.hpp"

namespace {

// Seconds per call of `kernel`, each call after `before` (untimed): median of 31 samples of 1 ms.
double per_call(const std::function<void()>& before, const std::function<void()>& kernel) {
  return stepcast::bench::per_call(before, kernel, 31, 1e-3, 1);
}

}  // namespace

int main() {
  constexpr int64_t h = 64;
  std::vector<float> a(128 * 128, 0.01f), b(128 * 128, 0.02f), c(128 * 128), w(h, 1.0f);
  std::vector<char> from(3 * 128 * 128 * 4), to(from.size());
  auto sgemm = [&](int n) {
    return [&, n] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
    };
  };
  auto copy = [&] { std::memcpy(to.data(), from.data(), from.size()); };
  std::printf("%-10s %12s %18s %18s %18s\n", "rmsnorm", "alone (us)", "after memcpy", "after 64^3 sgemm",
              "after 128^3 sgemm");
  for (int64_t bytes : {int64_t(65536), int64_t(1) << 20, int64_t(16) << 20}) {
    const int64_t elements = bytes / 2 / int64_t(sizeof(float));  // in and out
    std::vector<float> x(static_cast<size_t>(elements), 0.3f), y(static_cast<size_t>(elements));
    auto norm = [&] { stepcast::cpu::rmsnorm_forward(x.data(), w.data(), y.data(), elements / h, h, 1e-5); };
    const double alone = per_call(nullptr, norm);
    std::printf("%-10s %12.2f", (std::to_string(bytes >> 10) + " KiB").c_str(), alone * 1e6);
    for (const std::function<void()>& before : {std::function<void()>(copy), std::function<void()>(sgemm(64)),
                                                std::function<void()>(sgemm(128))}) {
      const double after = per_call(before, norm);
      std::printf(" %10.2f (%.2fx)", after * 1e6, after / alone);
    }
    std::printf("\n");
  }
}
