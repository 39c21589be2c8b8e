// `stepcast-with-faults`: the stepcast command line with a fault-injecting decorator around the
// backend of every CPU run, for the fault tests (test_run.cpp, test_run_faults.cpp,
// test_validate.cpp, bad_inputs.json). Faults are set in the environment, which mpirun passes on
// to every rank and `validate` to the runs it launches (it runs this same executable):
//   STEPCAST_TEST_HANG=RANK:OP     rank RANK sleeps before op OP of its first step (a hung rank);
//   STEPCAST_TEST_DIE=RANK:STEP    rank RANK is killed (SIGKILL) as step STEP (0-based) begins;
//                                  several as RANK:STEP,RANK:STEP,...;
//   STEPCAST_TEST_DIE_ONCE_DIR=DIR each of those kills happens once: the rank leaves DIR/die-RANK-STEP
//                                  behind, and a restarted job (scripts/train-with-restarts.sh)
//                                  passes that step (a failure is an event in time, not a step);
//   STEPCAST_TEST_STOP=RANK:POINT  rank RANK stops (SIGSTOP, as a debugger or a frozen node would)
//                                  at POINT: "checkpoint" (before it writes its checkpoint file)
//                                  or "gather" (before the per-op records go to rank 0).
//   STEPCAST_TEST_SIM_DIE=RANK:K   a command spread over an MPI job (plan, scale, ...: a child
//                                  `simulate` of rank RANK, which inherits the launcher's rank
//                                  variable) is killed (SIGKILL) as it starts, from that rank's
//                                  K-th simulation on (0-based: its --out is RUNNER_DIR/K/out).
// Production code has none of this: the executor only calls the backend's progress hooks.
#include <mpi.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "commands.hpp"
#include "executor.hpp"
#include "forwarding_backend.hpp"

namespace {

using namespace stepcast;

struct Faults {
  long long hang_rank = -1, hang_op = -1;
  std::vector<std::pair<long long, long long>> deaths;  // (rank, step)
  std::string die_once_dir;
  long long stop_rank = -1;
  std::string stop_point;
};

Faults faults_from_environment() {
  Faults f;
  if (const char* hang = std::getenv("STEPCAST_TEST_HANG")) std::sscanf(hang, "%lld:%lld", &f.hang_rank, &f.hang_op);
  if (const char* die = std::getenv("STEPCAST_TEST_DIE")) {
    std::string list = die;
    for (size_t at = 0; at < list.size();) {
      long long rank = -1, step = -1;
      if (std::sscanf(list.c_str() + at, "%lld:%lld", &rank, &step) == 2) f.deaths.push_back({rank, step});
      size_t comma = list.find(',', at);
      at = comma == std::string::npos ? list.size() : comma + 1;
    }
  }
  if (const char* once = std::getenv("STEPCAST_TEST_DIE_ONCE_DIR")) f.die_once_dir = once;
  if (const char* stop = std::getenv("STEPCAST_TEST_STOP")) {
    char point[32] = {0};
    if (std::sscanf(stop, "%lld:%31s", &f.stop_rank, point) == 2) f.stop_point = point;
  }
  return f;
}

void say(long long rank, const std::string& what) {
  std::fprintf(stderr, "stepcast run: rank %lld: %s\n", rank, what.c_str());
  std::fflush(stderr);
}

template <class T>
class FaultBackend : public ForwardingBackend<T> {
 public:
  FaultBackend(std::unique_ptr<Backend<T>> inner, Faults faults, long long rank)
      : ForwardingBackend<T>(std::move(inner)), faults_(std::move(faults)), rank_(rank) {}

  void begin_step(int64_t step_index) override {
    for (const auto& [rank, step] : faults_.deaths) {
      if (rank != rank_ || step != step_index) continue;
      if (!faults_.die_once_dir.empty()) {
        std::string mark = faults_.die_once_dir + "/die-" + std::to_string(rank) + "-" + std::to_string(step);
        if (std::FILE* seen = std::fopen(mark.c_str(), "r")) {
          std::fclose(seen);
          continue;  // this failure has happened
        }
        if (std::FILE* made = std::fopen(mark.c_str(), "w")) std::fclose(made);
      }
      say(rank_, "STEPCAST_TEST_DIE: killing this rank at step " + std::to_string(step));
      std::raise(SIGKILL);
    }
    first_step_ = steps_++ == 0;
    this->inner().begin_step(step_index);
  }
  void begin_op(const Op& op) override {
    if (first_step_ && rank_ == faults_.hang_rank && op.id == faults_.hang_op) {
      say(rank_, "STEPCAST_TEST_HANG: sleeping in op " + std::to_string(op.id));
      std::this_thread::sleep_for(std::chrono::hours(1));
    }
    this->inner().begin_op(op);
  }
  void reached(RunPoint point) override {
    const char* name = point == RunPoint::checkpoint_write ? "checkpoint" : "gather";
    if (rank_ == faults_.stop_rank && faults_.stop_point == name) {
      say(rank_, std::string("STEPCAST_TEST_STOP: stopping at ") + name);
      std::raise(SIGSTOP);
    }
    this->inner().reached(point);
  }

 private:
  Faults faults_;
  long long rank_;
  int64_t steps_ = 0;
  bool first_step_ = false;
};

class FaultWrapper : public BackendWrapper {
 public:
  std::unique_ptr<Backend<float>> wrap(std::unique_ptr<Backend<float>> backend) const override {
    return make(std::move(backend));
  }
  std::unique_ptr<Backend<double>> wrap(std::unique_ptr<Backend<double>> backend) const override {
    return make(std::move(backend));
  }

 private:
  template <class T>
  static std::unique_ptr<Backend<T>> make(std::unique_ptr<Backend<T>> backend) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);  // unchecked: the run has initialised MPI before it makes a backend
    return std::make_unique<FaultBackend<T>>(std::move(backend), faults_from_environment(), rank);
  }
};

// STEPCAST_TEST_SIM_DIE in a `simulate` child (see the head of this file).
void die_in_simulation_if_asked(int argc, char** argv) {
  const char* spec = std::getenv("STEPCAST_TEST_SIM_DIE");
  long long rank = -1, from = -1;
  if (!spec || argc < 2 || std::strcmp(argv[1], "simulate") != 0) return;
  if (std::sscanf(spec, "%lld:%lld", &rank, &from) != 2) return;
  const char* mine = std::getenv("OMPI_COMM_WORLD_RANK");
  if (!mine) mine = std::getenv("PMI_RANK");
  if (!mine) mine = std::getenv("PMIX_RANK");
  if (!mine || std::atoll(mine) != rank) return;
  for (int i = 2; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--out") != 0) continue;
    std::string folder = std::filesystem::path(argv[i + 1]).parent_path().filename().string();
    if (folder.empty() || folder.find_first_not_of("0123456789") != std::string::npos) return;
    long long k = std::atoll(folder.c_str());
    if (k < from) return;
    std::fprintf(stderr, "STEPCAST_TEST_SIM_DIE: killing simulation %lld of rank %lld\n", k, rank);
    std::fflush(stderr);
    std::raise(SIGKILL);
  }
}

}  // namespace

int main(int argc, char** argv) {
  die_in_simulation_if_asked(argc, argv);
  static const FaultWrapper wrapper;
  set_backend_wrapper(&wrapper);
  return stepcast::cli::stepcast_main(argc, argv);
}
