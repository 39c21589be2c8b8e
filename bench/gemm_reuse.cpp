// stepcast_gemm_reuse: how much slower a BLAS GEMM of small-gpt's shapes runs when its operands
// were last touched a pool's worth of reads ago than back to back, as `stepcast profile` times it
// (its GEMM table is of warm operands). Rows: the forward GEMMs of one small-gpt layer and its LM
// head at micro batch 2 (256 tokens), y = x·Wᵀ as the CPU backend calls cblas_sgemm. Columns: back
// to back, after reading a 64 MiB pool (the operands out of the core's L2, in a large L3), after
// reading a 1 GiB one (out of the L3 too). Each figure: the median of 15 samples of at least 5 ms,
// each call timed alone after its pool read (untimed). Not a test: it prints figures.
#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <vector>

#include "per_call.hpp"

namespace {

// Seconds per call of `kernel`, each call after `before` (untimed): median of 15 samples of at
// least 5 ms and 3 calls.
double per_call(const std::function<void()>& before, const std::function<void()>& kernel) {
  return stepcast::bench::per_call(before, kernel, 15, 5e-3, 3);
}

struct Shape {
  int m, n, k;
  const char* what;
};

}  // namespace

int main() {
  std::vector<float> pool_l3(size_t(16) << 20, 1.f), pool_dram(size_t(256) << 20, 1.f);  // 64 MiB, 1 GiB
  volatile float sink = 0;
  auto read = [&sink](const std::vector<float>& pool) {
    float s = 0;
    for (size_t i = 0; i < pool.size(); i += 16) s += pool[i];  // one float a 64-byte line
    sink = sink + s;
  };
  std::printf("%-8s %17s %12s %16s %16s\n", "GEMM", "m x n x k", "warm", "after 64 MiB", "after 1 GiB");
  for (Shape s : {Shape{256, 768, 256, "qkv"}, Shape{256, 256, 256, "proj"}, Shape{256, 1024, 256, "fc1"},
                  Shape{256, 256, 1024, "fc2"}, Shape{256, 8192, 256, "lm head"}}) {
    std::vector<float> a(size_t(s.m) * s.k, 1.f), b(size_t(s.k) * s.n, 1.f), c(size_t(s.m) * s.n);
    auto gemm = [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s.m, s.n, s.k, 1.f, a.data(), s.k, b.data(), s.k, 0.f,
                  c.data(), s.n);
    };
    double warm = per_call(nullptr, gemm);
    double l3 = per_call([&] { read(pool_l3); }, gemm);
    double dram = per_call([&] { read(pool_dram); }, gemm);
    std::printf("%-8s %5d x %4d x %4d %9.1f us %15.3fx %15.3fx\n", s.what, s.m, s.n, s.k, warm * 1e6, l3 / warm,
                dram / warm);
  }
  return 0;
}
