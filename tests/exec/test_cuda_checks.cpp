// The CUDA backend's checks that need no GPU (they run everywhere, in the main suite): the
// launcher's local rank, ranks per node against visible GPUs, the out-of-memory and failure
// messages, host bf16 rounding, and `run`/`profile --backend cuda` where no GPU is visible
// (CUDA_VISIBLE_DEVICES="" hides any GPU, so these run on GPU machines too).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>

#include "bf16.hpp"
#include "device_checks.hpp"
#include "test_support.hpp"

using namespace stepcast;
using namespace stepcast::test;

namespace {

std::function<const char*(const char*)> env_of(std::map<std::string, std::string> values) {
  auto shared = std::make_shared<std::map<std::string, std::string>>(std::move(values));
  return [shared](const char* key) -> const char* {
    auto it = shared->find(key);
    return it == shared->end() ? nullptr : it->second.c_str();
  };
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}


}  // namespace

TEST_CASE("cuda checks: the local rank comes from OpenMPI, Slurm or Hydra", "[cuda]") {
  auto ompi = local_rank_from_environment(
      env_of({{"OMPI_COMM_WORLD_LOCAL_RANK", "3"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "8"}}));
  REQUIRE(ompi);
  CHECK(ompi->local_rank == 3);
  CHECK(ompi->local_size == 8);
  CHECK(ompi->source == "OMPI_COMM_WORLD_LOCAL_RANK");
  auto slurm = local_rank_from_environment(
      env_of({{"SLURM_LOCALID", "1"}, {"SLURM_NTASKS_PER_NODE", "4"}}));
  REQUIRE(slurm);
  CHECK(slurm->local_rank == 1);
  CHECK(slurm->local_size == 4);
  auto hydra = local_rank_from_environment(env_of({{"MPI_LOCALRANKID", "2"}}));
  REQUIRE(hydra);
  CHECK(hydra->local_rank == 2);
  CHECK(hydra->local_size == 3);  // at least the ranks up to this one
  CHECK_FALSE(local_rank_from_environment(env_of({})));
  CHECK_FALSE(local_rank_from_environment(env_of({{"SLURM_LOCALID", "x"}})));
}

TEST_CASE("placement: the launcher's hosts must match the topology's nodes", "[cuda]") {
  auto local = [](int r, int s) { return LocalRank{r, s, "OMPI_COMM_WORLD_LOCAL_RANK"}; };
  CHECK(placement_problem(3, 8, local(3, 8), 2).empty());  // one host: oversubscribed test runs
  CHECK(placement_problem(3, 4, local(1, 2), 2).empty());  // 2 hosts of 2
  CHECK(placement_problem(1, 2, local(0, 1), 1).empty());  // 2 hosts of 1
  std::string wrong = placement_problem(1, 4, local(0, 1), 2);
  CHECK(contains(wrong, "rank 1: the launcher made it local rank 0 of 1"));
  CHECK(contains(wrong, "the hostfile does not match the topology"));
  CHECK_FALSE(placement_problem(2, 4, local(0, 2), 1).empty());
}

TEST_CASE("cuda checks: more ranks on a node than GPUs is refused with the figures", "[cuda]") {
  CHECK(gpu_assignment_problem(0, 1, 1, std::nullopt).empty());
  CHECK(gpu_assignment_problem(1, 8, 8, std::nullopt).empty());
  std::string none = gpu_assignment_problem(0, 1, 0, std::nullopt);
  CHECK(contains(none, "no GPU visible (CUDA_VISIBLE_DEVICES unset)"));
  CHECK(contains(none, "--backend cpu"));
  CHECK(contains(gpu_assignment_problem(0, 1, 0, std::string("")), "CUDA_VISIBLE_DEVICES \"\""));
  std::string crowded = gpu_assignment_problem(3, 4, 2, std::string("0,1"));
  CHECK(contains(crowded, "local rank 3"));
  CHECK(contains(crowded, "4 ranks on this node but 2 GPU(s)"));
  CHECK(contains(crowded, "\"0,1\""));
  CHECK(contains(crowded, "at most 2 ranks per node"));
  // A local rank beyond the GPUs (a launcher that reports no local size) is refused too.
  CHECK_FALSE(gpu_assignment_problem(1, 1, 1, std::nullopt).empty());
}

TEST_CASE("cuda checks: out of memory names the class, the bytes and the predicted peak", "[cuda]") {
  OutOfMemory oom;
  oom.what = "the arena";
  oom.bytes = 3.0 * double(1ull << 30);
  oom.free_bytes = 1.0 * double(1ull << 30);
  oom.total_bytes = 80.0 * double(1ull << 30);
  oom.predicted_peak_bytes = 2.5 * double(1ull << 30);
  oom.class_bytes = {{"weights", 1.0 * double(1ull << 30)}, {"activations", 2.0 * double(1ull << 30)}};
  std::string m = out_of_memory_message(oom);
  CHECK(contains(m, "out of GPU memory allocating the arena"));
  CHECK(contains(m, "3.000 GiB"));
  CHECK(contains(m, std::to_string(3ll << 30) + " bytes"));
  CHECK(contains(m, "weights 1.000 GiB"));
  CHECK(contains(m, "activations 2.000 GiB"));
  CHECK(contains(m, "1.000 GiB free of 80.000 GiB"));
  CHECK(contains(m, "predicted peak on this rank is 2.500 GiB"));
  CHECK(contains(m, "valid:"));
  oom.predicted_peak_bytes = 0;  // not known (the workspace, before the program's arena)
  CHECK_FALSE(contains(out_of_memory_message(oom), "predicted peak"));
}

TEST_CASE("cuda checks: a failed CUDA or NCCL call names the rank, the call and the op", "[cuda]") {
  std::string m = device_failure_message(3, "ncclAllReduce", "ncclResult 2", "unhandled system error",
                                         "op 17 (all_reduce grad_bucket)");
  CHECK(m == "rank 3: ncclAllReduce failed: ncclResult 2 (unhandled system error) during op 17 "
             "(all_reduce grad_bucket)");
  CHECK(device_failure_message(0, "cudaMalloc", "cudaErrorMemoryAllocation", "", "") ==
        "rank 0: cudaMalloc failed: cudaErrorMemoryAllocation");
}

TEST_CASE("cuda checks: host bf16 rounds to nearest even like __float2bfloat16_rn", "[cuda]") {
  auto bits = [](float f) { return bf16(f).bits; };
  CHECK(bits(1.0f) == 0x3f80);
  CHECK(bits(-2.0f) == 0xc000);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  CHECK(bits(1.0f + 0x1p-8f) == 0x3f80);
  // 1 + 3·2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: to even (1 + 2^-6 = 0x3f82).
  CHECK(bits(1.0f + 3 * 0x1p-8f) == 0x3f82);
  CHECK(bits(1.0f + 0x1p-8f + 0x1p-20f) == 0x3f81);  // above halfway: up
  CHECK(float(bf16(3.140625f)) == 3.140625f);        // representable: exact
  CHECK(std::isinf(float(bf16(std::numeric_limits<float>::infinity()))));
  CHECK(std::isnan(float(bf16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(bits(3.4e38f) == 0x7f80);  // rounds past the largest bf16 to infinity, as CUDA's
}

TEST_CASE("cuda checks: run --backend cuda with no GPU visible says so and fails", "[cuda]") {
  // Two ranks through mpirun, every GPU hidden.
  CommandResult r = run_shell("CUDA_VISIBLE_DEVICES= " + source_path("scripts/mpirun") + " -np 2 " +
                              std::string(STEPCAST_BINARY) + " run" + model_arg("tiny") +
                              plan_arg("tiny-cpu") + topology_arg("h200-1gpu") +
                              " --nodes 2 --backend cuda --steps 2");
  const std::string& output = r.output;
  INFO(output);
  CHECK(r.exit_code == 2);
#ifdef STEPCAST_HAVE_CUDA
  // The job stops, a rank naming itself; no crash, no hang. (Which ranks get to print before
  // mpirun ends the others is a race, so one is required, not both.)
  CHECK((contains(output, "rank 0: error: no GPU visible (CUDA_VISIBLE_DEVICES \"\")") ||
         contains(output, "rank 1: error: no GPU visible (CUDA_VISIBLE_DEVICES \"\")")));
  CHECK_FALSE(contains(output, "internal error"));
#else
  CHECK(contains(output, "built without CUDA"));
#endif
}

TEST_CASE("cuda checks: run --backend cuda needs a topology, profile --backend cuda a GPU", "[cuda]") {
  CommandResult r = run_stepcast("run" + model_arg("tiny") + plan_arg("tiny-cpu") +
                                 " --backend cuda --steps 2");
  CHECK(r.exit_code == 2);
#ifdef STEPCAST_HAVE_CUDA
  CHECK(contains(r.output, "--backend cuda needs --topology"));
  CommandResult p = run_shell("CUDA_VISIBLE_DEVICES= " + std::string(STEPCAST_BINARY) +
                              " profile --backend cuda --quick --out " +
                              write_temp_file("no-gpu-profile.json", "") + topology_arg("h200-1gpu"));
  INFO(p.output);
  CHECK(p.exit_code == 2);
  CHECK(contains(p.output, "no GPU visible"));
#else
  CHECK(contains(r.output, "built without CUDA"));
#endif
}
