// stepcast_sgemm_rate: one thread's cblas_sgemm rate on the GEMMs of a GPT-2 124M training step
// (micro batch 4, sequence 256: M = 1024 tokens, h 768, f 3072, V 50257), in the layouts the CPU
// executor calls them (exec/cpu_kernels.cpp). The physical limit bench/cpu_run.sh compares the
// executor's step against. Not a test: it prints figures. Run with OPENBLAS_NUM_THREADS=1.
//
// Each shape is called once untimed, then repeated until --min-time-s (0.3 s) has passed. The
// headline rate weights the shapes as one step does: the step's GEMM flops over the time they
// take at the per-shape rates, Σ flops / Σ (flops / rate), in flop/s.
#include <cblas.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

// GPT-2 124M at micro batch 4, sequence 256 (names as DESIGN.md's B, T, C, L, V).
constexpr int64_t kTokens = 4 * 256;  // M = b·s rows of every linear layer
constexpr int64_t kHidden = 768;
constexpr int64_t kMlp = 4 * kHidden;
constexpr int64_t kVocab = 50257;
constexpr int64_t kLayers = 12;

// One GEMM of the step: C[m,n] = op(A)[m,k]·op(B)[k,n] + beta·C, row-major.
struct GemmShape {
  std::string name;   // the program's gemm name
  std::string grad;   // "" (forward), "dgrad" or "wgrad"
  bool trans_a, trans_b;
  int64_t m, n, k;
  float beta;
  int64_t calls_per_step;
  double flops() const { return 2.0 * double(m) * double(n) * double(k); }
};

struct GemmRate {
  GemmShape shape;
  int64_t calls = 0;
  double time_s = 0;
  double flops_per_s() const { return shape.flops() * double(calls) / time_s; }
};

// A linear layer y[M,out] = x[M,in]·W[out,in]^T and its two backward GEMMs, as
// cpu::linear_forward / linear_backward_data / linear_backward_weight call them.
void add_linear(std::vector<GemmShape>& shapes, const std::string& name, int64_t in, int64_t out,
                int64_t calls_per_step) {
  shapes.push_back({name, "", false, true, kTokens, out, in, 0.0f, calls_per_step});
  shapes.push_back({name, "dgrad", false, false, kTokens, in, out, 0.0f, calls_per_step});
  shapes.push_back({name, "wgrad", true, false, out, in, kTokens, 1.0f, calls_per_step});
}

std::vector<GemmShape> step_gemms() {
  std::vector<GemmShape> shapes;
  add_linear(shapes, "qkv", kHidden, 3 * kHidden, kLayers);
  add_linear(shapes, "attn_out", kHidden, kHidden, kLayers);
  add_linear(shapes, "mlp_up", kHidden, kMlp, kLayers);
  add_linear(shapes, "mlp_down", kMlp, kHidden, kLayers);
  add_linear(shapes, "logits", kHidden, kVocab, 1);  // tied embedding [V, h]
  return shapes;
}

// Values in [-1, 1) from a fixed LCG: no zeros or denormals to flatter or slow the kernel.
void fill(std::vector<float>& v, uint32_t seed) {
  for (float& x : v) {
    seed = seed * 1664525u + 1013904223u;
    x = float(seed >> 8) / float(1u << 23) - 1.0f;
  }
}

GemmRate measure(const GemmShape& g, double min_time_s) {
  size_t a_elems = size_t(g.m * g.k), b_elems = size_t(g.k * g.n), c_elems = size_t(g.m * g.n);
  std::vector<float> a(a_elems), b(b_elems), c(c_elems);
  fill(a, 1);
  fill(b, 2);
  fill(c, 3);
  int lda = int(g.trans_a ? g.m : g.k), ldb = int(g.trans_b ? g.k : g.n), ldc = int(g.n);
  auto call = [&] {
    cblas_sgemm(CblasRowMajor, g.trans_a ? CblasTrans : CblasNoTrans,
                g.trans_b ? CblasTrans : CblasNoTrans, int(g.m), int(g.n), int(g.k), 1.0f, a.data(),
                lda, b.data(), ldb, g.beta, c.data(), ldc);
  };
  call();  // warm-up: OpenBLAS's buffers, first touch of C
  using Clock = std::chrono::steady_clock;
  GemmRate r;
  r.shape = g;
  auto start = Clock::now();
  do {
    call();
    ++r.calls;
    r.time_s = std::chrono::duration<double>(Clock::now() - start).count();
  } while (r.time_s < min_time_s);
  return r;
}

const char* layout(const GemmShape& g) {
  if (g.trans_a) return g.trans_b ? "TT" : "TN";
  return g.trans_b ? "NT" : "NN";
}

int usage(const char* argv0, int code) {
  std::fprintf(code ? stderr : stdout,
               "usage: %s [--min-time-s S]\n"
               "Single-thread cblas_sgemm GFLOP/s on the GEMMs of a GPT-2 124M training step\n"
               "(micro batch 4, sequence 256); set OPENBLAS_NUM_THREADS=1. Each shape repeats for\n"
               "at least S seconds (default 0.3).\n",
               argv0);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  double min_time_s = 0.3;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0) return usage(argv[0], 0);
    if (std::strcmp(argv[i], "--min-time-s") == 0 && i + 1 < argc) {
      char* end = nullptr;
      min_time_s = std::strtod(argv[++i], &end);
      if (*end != '\0' || !(min_time_s > 0)) {
        std::fprintf(stderr, "%s: --min-time-s '%s': valid: a positive number of seconds\n",
                     argv[0], argv[i]);
        return 2;
      }
      continue;
    }
    std::fprintf(stderr, "%s: unknown argument '%s'\n", argv[0], argv[i]);
    return usage(argv[0], 2);
  }

  const char* threads = std::getenv("OPENBLAS_NUM_THREADS");
  std::printf("cblas_sgemm, GPT-2 124M step GEMMs (M = %lld tokens, h %lld, f %lld, V %lld), "
              "OPENBLAS_NUM_THREADS=%s",
              (long long)kTokens, (long long)kHidden, (long long)kMlp, (long long)kVocab,
              threads ? threads : "(unset)");
#ifdef OPENBLAS_VERSION
  std::printf(",%s(%s)", OPENBLAS_VERSION, openblas_get_corename());
#endif
  std::printf("\n%-9s %-6s %-6s %6s %6s %6s %6s %9s %7s %9s %7s\n", "gemm", "grad", "layout", "m",
              "n", "k", "calls", "GFLOP", "timed", "GFLOP/s", "share");

  std::vector<GemmShape> shapes = step_gemms();
  double step_flops = 0;
  for (const GemmShape& g : shapes) step_flops += g.flops() * double(g.calls_per_step);
  double step_gemm_time_s = 0;
  for (const GemmShape& g : shapes) {
    GemmRate r = measure(g, min_time_s);
    double step_share = g.flops() * double(g.calls_per_step);
    step_gemm_time_s += step_share / r.flops_per_s();
    std::printf("%-9s %-6s %-6s %6lld %6lld %6lld %6lld %9.3f %7lld %9.1f %6.1f%%\n",
                g.name.c_str(), g.grad.empty() ? "fwd" : g.grad.c_str(), layout(g),
                (long long)g.m, (long long)g.n, (long long)g.k, (long long)g.calls_per_step,
                g.flops() / 1e9, (long long)r.calls, r.flops_per_s() / 1e9,
                100.0 * step_share / step_flops);
    std::fflush(stdout);
  }
  std::printf("calls: per step; GFLOP: per call; timed: calls measured; share: of the step's "
              "GEMM flops\n");
  std::printf("step GEMM flops %.1f GFLOP, %.3f s at these rates\n", step_flops / 1e9,
              step_gemm_time_s);
  // The line bench/cpu_run.sh reads: field 3 is the rate in GFLOP/s.
  std::printf("sgemm rate %.2f GFLOP/s (step-weighted: step GEMM flops / their time)\n",
              step_flops / step_gemm_time_s / 1e9);
  return 0;
}
