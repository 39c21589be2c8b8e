// `run --backend cuda`: picks this rank's GPU, checks the plan against what the CUDA backend runs,
// makes the backend for the plan's dtypes and runs the shared interpreter (executor.hpp) on it;
// an allocation that does not fit becomes a message with the plan's own memory figures.
#include <cuda_runtime_api.h>
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "arena.hpp"
#include "cuda_backend.hpp"
#include "cuda_kernels.hpp"
#include "errors.hpp"
#include "memory.hpp"
#include "mpi_check.hpp"
#include "program_inputs.hpp"

namespace stepcast {

int select_cuda_device() {
  int count = 0;
  cudaError_t code = cudaGetDeviceCount(&count);
  if (code != cudaSuccess) {
    cudaGetLastError();
    count = 0;  // no driver, no device: the same message
  }
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  std::optional<LocalRank> local = local_rank_from_environment([](const char* k) { return std::getenv(k); });
  LocalRank where = local.value_or(LocalRank{0, 1, "none (a single rank per node assumed)"});
  std::string problem =
      gpu_assignment_problem(where.local_rank, where.local_size, count,
                             visible ? std::optional<std::string>(visible) : std::nullopt);
  if (!problem.empty()) {
    if (code != cudaSuccess && count == 0) problem += " [cudaGetDeviceCount: " + std::string(cudaGetErrorName(code)) + "]";
    throw InputError(problem);
  }
  return where.local_rank;
}

bool moe_grouped_gemms_from_environment(const char* value) {
  if (!value || std::string(value) == "1") return true;
  if (std::string(value) == "0") return false;
  throw InputError(std::string("environment variable STEPCAST_CUDA_MOE_GROUPED: '") + value +
                   "'; valid: 1 (the default: one cuBLAS grouped GEMM per MoE expert op) or 0 (a cuBLASLt GEMM per "
                   "expert segment)");
}

namespace {

template <class T, class G>
RunOutput run_typed(const StepProgram& program, const Topology& topology, const RunOptions& options,
                    int device) {
  int rank = 0;
  STEPCAST_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  CudaBackendOptions backend_options;
  backend_options.device = device;
  backend_options.watchdog_s = options.watchdog_s;
  backend_options.moe_grouped_gemms = moe_grouped_gemms_from_environment(std::getenv("STEPCAST_CUDA_MOE_GROUPED"));
  auto backend = make_cuda_backend<T, G>(program.grid(), rank, program.devices_per_node, backend_options);
  try {
    return run_with_backend<T, G, float>(program, options, *backend);
  } catch (const DeviceOutOfMemory& e) {
    // The arena (every buffer of the program, planned once) or the interpreter's scratch.
    const Role& role = program.role_of_rank(rank);
    RankMemory classes = walk_role_memory(role);
    MemoryReport report = memory_report(program, topology);
    OutOfMemory oom;
    oom.bytes = e.bytes;
    oom.free_bytes = e.free_bytes;
    oom.total_bytes = e.total_bytes;
    oom.predicted_peak_bytes = report.ranks.at(size_t(role.index)).peak_bytes;
    bool arena = int64_t(e.bytes) == plan_arena(role).extent_bytes;
    oom.what = arena ? "the arena (the program's buffers; by class at the peak)"
                     : "the executor's scratch (token ids, loss statistics, masks)";
    if (arena) {
      oom.class_bytes = {{"weights", classes.weights_bytes},
                         {"grads", classes.grads_bytes},
                         {"optimizer", classes.optimizer_bytes},
                         {"activations", classes.activations_bytes},
                         {"workspace", classes.workspace_bytes},
                         {"comm", classes.comm_bytes},
                         {"placement", report.ranks.at(size_t(role.index)).placement_bytes}};
    }
    throw InputError(out_of_memory_message(oom));
  }
}

}  // namespace

void check_cuda_plan(const ModelConfig& model, const Plan& plan) {
  if (plan.param_dtype != Dtype::bf16 && plan.param_dtype != Dtype::fp32) {
    throw_input_error(plan.file, "dtype", std::string("\"") + to_string(plan.param_dtype) + "\"",
                      "the CUDA backend computes in bf16 (fp32 master weights) or fp32",
                      "\"bf16\" or \"fp32\"");
  }
  if (plan.param_dtype == Dtype::fp32 && plan.grad_dtype != Dtype::fp32) {
    throw_input_error(plan.file, "grad_dtype", std::string("\"") + to_string(plan.grad_dtype) + "\"",
                      "fp32 weights keep fp32 gradients", "\"fp32\"");
  }
  if (plan.param_dtype == Dtype::bf16 && plan.grad_dtype != Dtype::fp32 && plan.grad_dtype != Dtype::bf16) {
    throw_input_error(plan.file, "grad_dtype", std::string("\"") + to_string(plan.grad_dtype) + "\"",
                      "the CUDA backend accumulates gradients in fp32 or bf16", "\"fp32\" or \"bf16\"");
  }
  if (plan.attention_impl == AttentionImpl::flash &&
      !cuda::flash_supports_head_dim(model.head_dim())) {
    throw_input_error(plan.file, "attention_impl", "\"flash\"",
                      "the CUDA flash kernel supports head dims 16, 32, 64 and 128, the model's is " +
                          std::to_string(model.head_dim()),
                      "\"materialized\", or a model with one of those head dims");
  }
  if (plan.fp8.block_scaled()) {
    throw_input_error(plan.file, "fp8_recipe", std::string("\"") + to_string(plan.fp8.scaling) + "\"",
                      "the CUDA backend does not run block-scaled FP8 yet (its FP8 GEMMs take one scale per tensor)",
                      "--backend cpu (emulated), or fp8_recipe \"delayed\" or \"tensorwise\"");
  }
  if (plan.fp8.param_gather) {
    throw_input_error(plan.file, "fp8_param_gather", "true",
                      "the CUDA backend does not run FP8 parameters yet (it casts its weights at their first use)",
                      "--backend cpu (emulated), or fp8_param_gather false");
  }
  if (plan.fp8.enabled()) {
    // cuBLASLt's FP8 GEMMs read both operands K-major with leading dimensions multiples of 16. An
    // expert's rows need not be: its wgrad reads them transposed into scratch padded with zero rows
    // to a multiple of 16 (cuda_fp8.hpp), as Megatron-LM pads each expert's tokens for FP8.
    const int64_t tp = plan.tp_size, d = model.head_dim();
    const int64_t etp = std::max<int64_t>(1, plan.moe.etp_size);
    std::vector<std::pair<std::string, int64_t>> dims = {
        {"hidden_size / tp_size", model.hidden_size / tp},
        {"intermediate_size / tp_size", model.intermediate_size / tp},
        {"num_attention_heads · head_dim / tp_size", model.num_attention_heads * d / tp},
        {"num_key_value_heads · head_dim / tp_size", model.num_key_value_heads * d / tp},
        {"a microbatch's tokens on a rank (seq_length / context_parallel_size · micro_batch_size)",
         model.seq_length / plan.cp_size * plan.micro_batch_size}};
    if (model.is_moe()) {
      dims.emplace_back("moe_intermediate_size / expert_tensor_parallel_size", model.moe_intermediate_size / etp);
      if (model.n_shared_experts > 0) {
        dims.emplace_back("n_shared_experts · moe_intermediate_size / tp_size",
                          model.n_shared_experts * model.moe_intermediate_size / tp);
      }
    }
    for (const auto& [what, value] : dims) {
      if (value % 16 == 0) continue;
      throw_input_error(plan.file, "fp8", std::string("\"") + to_string(plan.fp8.format) + "\"",
                        "the CUDA backend's FP8 GEMMs (cuBLASLt) need every GEMM dimension a multiple of 16; " +
                            what + " = " + std::to_string(value) + " (model " + model.file + ")",
                        "no fp8, or a model and plan whose dimensions are multiples of 16");
    }
  }
}

RunOutput run_program_cuda(const StepProgram& program, const RunOptions& options) {
  ProgramInputs in = program_inputs(program);
  check_cuda_plan(in.model, in.plan);
  int device = select_cuda_device();
  if (in.plan.param_dtype == Dtype::fp32) {
    return run_typed<float, float>(program, in.topology, options, device);
  }
  if (in.plan.grad_dtype == Dtype::bf16) {
    return run_typed<bf16, bf16>(program, in.topology, options, device);
  }
  return run_typed<bf16, float>(program, in.topology, options, device);
}

}  // namespace stepcast
