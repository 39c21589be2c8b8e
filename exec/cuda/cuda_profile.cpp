// `stepcast profile --backend cuda`: profiler.hpp's tables measured through the CUDA backend
// (cuBLASLt GEMMs in bf16 with fp32 accumulation, the own memory-bound kernels, NCCL
// collectives and send/recv), plus the flash attention kernels timed with CUDA events, whose
// achieved rate over the topology's bf16 peak becomes the profile's flash fractions.
#include <cuda_runtime_api.h>
#include <cublasLt.h>
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "cuda_backend.hpp"
#include "cuda_kernels.hpp"
#include "errors.hpp"
#include "mpi_collectives.hpp"
#include "profiler.hpp"
#include "version.hpp"

namespace stepcast {

namespace {

void check(cudaError_t code, const char* call, int rank) {
  if (code != cudaSuccess) {
    throw std::runtime_error(device_failure_message(rank, call, cudaGetErrorName(code),
                                                    cudaGetErrorString(code), "the profile"));
  }
}

ProfileGrid cuda_profile_grid() {
  ProfileGrid grid;
  // 15·2^i: off the powers of two and the 1.5× steps model shapes use (768, 1536, 3072, ...).
  grid.gemm_axis = {120, 240, 480, 960, 1920, 3840, 7680, 15360};
  grid.gemm_axis_quick = {480, 1920, 7680};
  grid.memory_max_bytes = 256.0 * (1 << 20);
  grid.collective_max_bytes = 1024.0 * (1 << 20);
  grid.collective_algorithm = "nccl";
  grid.mpi_collectives = false;
  // Flash attention at training shapes: batch·heads 64 fills the GPU from s 256 up.
  grid.attention_dims = {64, 128};
  grid.attention_dims_quick = {64, 128};
  grid.attention_seqs = {256, 512, 1024, 2048, 4096};
  grid.attention_seqs_quick = {512, 2048};
  grid.attention_b = 4;
  grid.attention_heads = 16;
  // Memory-bound rows as GPT-scale models have them (hidden 2048, keys 1024, vocabulary 32768):
  // on the H200 the CPU's rows (160, 80, 640) left the block-per-row kernels mostly idle, and
  // simulate put the norms at 1.5x and the cross entropy at 3.5x their time in a step.
  grid.memory_hidden = 2048;
  grid.memory_softmax_cols = 1024;
  grid.memory_vocab = 32768;
  return grid;
}

struct FlashRate {
  int64_t d = 0;
  double forward_flops_per_s = 0, backward_flops_per_s = 0;
};

// Forward and backward at s 1024, b·heads 64 (as GPT-2 and GPT-3 1.3B at micro batch 4–8),
// flops as lowering counts them (4·b·heads·s²·d forward, 2.5× that backward).
FlashRate time_flash(int rank, int64_t d, const ProfileOptions& options) {
  const cpu::AttentionShape shape{1024, 4, 1024 / d * 1, 1024 / d * 1, d};
  const int64_t tokens = shape.s * shape.b;
  const int64_t qkv_n = tokens * shape.qkv_width(), ctx_n = tokens * shape.heads * d;
  const int64_t lse_n = shape.b * shape.heads * shape.s;
  bf16 *qkv = nullptr, *ctx = nullptr, *d_ctx = nullptr, *d_qkv = nullptr;
  float *lse = nullptr, *delta = nullptr;
  check(cudaMalloc(reinterpret_cast<void**>(&qkv), size_t(qkv_n) * 2), "cudaMalloc", rank);
  check(cudaMalloc(reinterpret_cast<void**>(&d_qkv), size_t(qkv_n) * 2), "cudaMalloc", rank);
  check(cudaMalloc(reinterpret_cast<void**>(&ctx), size_t(ctx_n) * 2), "cudaMalloc", rank);
  check(cudaMalloc(reinterpret_cast<void**>(&d_ctx), size_t(ctx_n) * 2), "cudaMalloc", rank);
  check(cudaMalloc(reinterpret_cast<void**>(&lse), size_t(lse_n) * 4), "cudaMalloc", rank);
  check(cudaMalloc(reinterpret_cast<void**>(&delta), size_t(lse_n) * 4), "cudaMalloc", rank);
  std::vector<bf16> host(size_t(std::max(qkv_n, ctx_n)));
  for (size_t i = 0; i < host.size(); ++i) host[i] = bf16(0.02 * double(int(i % 101) - 50));
  check(cudaMemcpy(qkv, host.data(), size_t(qkv_n) * 2, cudaMemcpyHostToDevice), "cudaMemcpy", rank);
  check(cudaMemcpy(d_ctx, host.data(), size_t(ctx_n) * 2, cudaMemcpyHostToDevice), "cudaMemcpy", rank);
  cudaStream_t stream = nullptr;
  check(cudaStreamCreate(&stream), "cudaStreamCreate", rank);
  cuda::Launch l{stream, rank};
  const double scale = 1.0 / std::sqrt(double(d));
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate", rank);
  check(cudaEventCreate(&stop), "cudaEventCreate", rank);
  auto seconds = [&](auto&& body) {
    body();  // warm-up
    std::vector<double> samples;
    for (int r = 0; r < std::max(1, options.repetitions); ++r) {
      check(cudaEventRecord(start, stream), "cudaEventRecord", rank);
      const int calls = options.quick ? 2 : 5;
      for (int c = 0; c < calls; ++c) body();
      check(cudaEventRecord(stop, stream), "cudaEventRecord", rank);
      check(cudaEventSynchronize(stop), "cudaEventSynchronize", rank);
      float ms = 0;
      check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime", rank);
      samples.push_back(double(ms) * 1e-3 / calls);
    }
    std::sort(samples.begin(), samples.end());
    return samples[samples.size() / 2];
  };
  double fwd = seconds([&] {
    cuda::flash_attention_forward(l, qkv, ctx, lse, shape, scale, nullptr, 0, nullptr);
  });
  double bwd = seconds([&] {
    cuda::flash_attention_backward(l, qkv, ctx, lse, d_ctx, d_qkv, delta, shape, scale, nullptr, 0,
                                   nullptr);
  });
  double flops = 4.0 * double(shape.b * shape.heads) * double(shape.s) * double(shape.s) * double(d);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  for (void* p : {static_cast<void*>(qkv), static_cast<void*>(d_qkv), static_cast<void*>(ctx),
                  static_cast<void*>(d_ctx), static_cast<void*>(lse), static_cast<void*>(delta)}) {
    cudaFree(p);
  }
  return {d, flops / fwd, 2.5 * flops / bwd};
}

}  // namespace

DeviceProfile measure_cuda_profile(const ProfileOptions& options) {
  const RankPlacement placement = place_this_rank();
  const int rank = placement.rank, size = placement.size;
  const int ranks_per_node = placement.ranks_per_node, nodes = placement.nodes;
  const int device = select_cuda_device();
  STEPCAST_CHECK(options.dtype == Dtype::bf16, "the CUDA profile measures bf16");

  double start = MPI_Wtime();
  BackendFactory<bf16, float, float> factory = [&](const RankGrid& grid, bool) {
    CudaBackendOptions backend_options;
    backend_options.device = device;
    return make_cuda_backend<bf16, float>(grid, rank, ranks_per_node, backend_options);
  };
  MeasuredTables tables = measure_tables<bf16, float, float>(options, rank, size, ranks_per_node,
                                                              factory, cuda_profile_grid());
  check(cudaSetDevice(device), "cudaSetDevice", rank);
  std::vector<FlashRate> flash;
  for (int64_t d : {int64_t(64), int64_t(128)}) flash.push_back(time_flash(rank, d, options));
  if (options.progress) {
    std::ostringstream line;
    line.precision(3);
    line << "flash attention (s 1024, bf16):";
    for (const FlashRate& f : flash) {
      line << " d " << f.d << " forward " << f.forward_flops_per_s / 1e12 << " TFLOP/s, backward "
           << f.backward_flops_per_s / 1e12 << " TFLOP/s;";
    }
    if (rank == 0) options.progress(line.str());
  }
  double wall_s = MPI_Wtime() - start;

  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties", rank);
  int runtime_version = 0, nccl_version = 0;
  cudaRuntimeGetVersion(&runtime_version);
  ncclGetVersion(&nccl_version);
  DeviceProfile p;
  p.name = std::string("cuda-") + prop.name;
  p.device = options.device_name.empty() ? std::string(prop.name) : options.device_name;
  p.backend = "cuda";
  p.machine = describe_machine();
  p.libraries = library_versions();
  p.libraries["gpu"] = prop.name;
  p.libraries["cuda_runtime"] = std::to_string(runtime_version);
  p.libraries["cublasLt"] = std::to_string(cublasLtGetVersion());
  p.libraries["nccl"] = std::to_string(nccl_version);
  p.gemm[Dtype::bf16] = GemmEfficiency{1.0, 0.0};
  if (options.peak_flops_per_s > 0) {
    double forward = 0, backward = 0;
    for (const FlashRate& f : flash) {
      forward += f.forward_flops_per_s / double(flash.size());
      backward += f.backward_flops_per_s / double(flash.size());
    }
    p.flash_forward_peak_fraction = forward / options.peak_flops_per_s;
    p.flash_backward_peak_fraction = backward / options.peak_flops_per_s;
  }
  if (rank != 0) return p;

  Json flash_json = Json::array();
  for (const FlashRate& f : flash) {
    flash_json.push_back({{"head_dim", f.d},
                          {"forward_flops_per_s", f.forward_flops_per_s},
                          {"backward_flops_per_s", f.backward_flops_per_s}});
  }
  tables.fits = apply_measured_fits(p, tables, nodes == 1 ? size : 2,
                                    "NCCL collectives of the ranks in a node",
                                    "NCCL send/recv ping-pong, one way");
  tables.fits["flash_attention"] = flash_json;
  tables.method = profile_method(placement, options,
                                 "median over every rank's samples; a sample is the mean of back-to-back calls, "
                                 "the streams synchronised before the clock is read",
                                 wall_s);
  tables.method["gpu"] = prop.name;
  tables.method["peak_flops_per_s_for_flash_fractions"] = options.peak_flops_per_s;
  p.measured = std::move(tables);
  p.notes =
      "Measured by `stepcast profile --backend cuda` on " + std::string(prop.name) + " with " +
      std::to_string(size) + " rank(s) busy at once: GEMMs through cuBLASLt (bf16 in, fp32 "
      "accumulate), the CUDA backend's own memory-bound kernels, NCCL collectives and send/recv "
      "(with more than one rank). measured holds the points (cost_model.hpp interpolates them). "
      "flash_attention fractions: the flash kernels' achieved rate (s 1024, head dims 64 and 128, "
      "mean) over the topology's bf16 peak; links from the NCCL fit where measured, else the "
      "topology's figures.";
  return p;
}

}  // namespace stepcast
