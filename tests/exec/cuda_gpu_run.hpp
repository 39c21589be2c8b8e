// The [gpu] tests' training runs (test_cuda_gpu_*.cpp): `stepcast run` on one rank over the
// shipped corpus, the CUDA backend on topologies/h200-1gpu.json or the CPU backend on
// topologies/localhost-cpu.json, and how far two loss curves are apart.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "json_input.hpp"
#include "test_support.hpp"

extern char** environ;

namespace stepcast::test {

// The names in the environment before main() initialised MPI (cuda_gpu_main.cpp).
extern std::set<std::string> environment_before_mpi;

// `env -u NAME ...` for the variables the MPI singleton added to this process's environment
// (OMPI_*, PMIX_*): the [gpu] tests' main initialises MPI as a singleton, and an mpirun started
// with those variables set takes itself for a process of that job and fails (exit 1, no output).
inline std::string without_singleton_mpi_environment() {
  std::string prefix = "env";
  for (char** e = environ; *e; ++e) {
    std::string entry = *e;
    std::string name = entry.substr(0, entry.find('='));
    bool mpi = name.rfind("OMPI_", 0) == 0 || name.rfind("PMIX_", 0) == 0;
    if (mpi && !environment_before_mpi.count(name)) prefix += " -u " + name;
  }
  return prefix + " ";
}

// One rank on this machine, through scripts/mpirun with `--mca plm isolated`: a local launch
// needs no remote agent (OpenMPI's rsh launcher stops mpirun where no ssh is installed, as on
// the H200 device machine).
inline RunResult run_one_rank(const std::string& model, const Json& plan, const std::string& backend, int steps) {
  static int counter = 0;
  std::string file = write_temp_file("gpu-run-" + std::to_string(++counter) + ".plan.json", plan.dump());
  std::string out = file + ".out";
  std::filesystem::remove_all(out);
  std::ostringstream cmd;
  cmd << without_singleton_mpi_environment() << source_path("scripts/mpirun") << " --mca plm isolated -np 1 "
      << STEPCAST_BINARY
      << " run --model "
      << source_path("models/" + model + ".json") << " --plan " << file << " --topology "
      << source_path(backend == "cuda" ? "topologies/h200-1gpu.json" : "topologies/localhost-cpu.json") << " --corpus "
      << source_path("data/corpus/shakespeare.txt") << " --backend " << backend << " --steps " << steps
      << " --quiet --out " << out;
  return run_measured(cmd.str(), out);
}

// The largest |a − b| / |b| over two curves of the same length.
inline double max_relative_difference(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / std::abs(b[i]));
  return worst;
}

// An FP8 plan (dtype fp32) of `model` on the CPU, then in bf16 on the GPU: the GPU's bf16
// activations against the CPU's fp32 ones, both through the same FP8 grids, held to the dense bf16
// tolerance (test_cuda_gpu_train.cpp), and the GPU's curve falls.
inline void check_fp8_curve_against_cpu(const std::string& model, Json plan) {
  RunResult cpu = run_one_rank(model, plan, "cpu", 20);
  plan["dtype"] = "bf16";
  RunResult gpu = run_one_rank(model, plan, "cuda", 20);
  INFO(cpu.output << gpu.output);
  REQUIRE(cpu.exit_code == 0);
  REQUIRE(gpu.exit_code == 0);
  auto want = cpu.measurement.at("losses").get<std::vector<double>>();
  auto got = gpu.measurement.at("losses").get<std::vector<double>>();
  CHECK(max_relative_difference(got, want) < 3e-2);
  CHECK(got.back() < 0.8 * got.front());
}

}  // namespace stepcast::test
