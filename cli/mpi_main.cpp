// with_mpi of mpi_main.hpp.
#include "mpi_main.hpp"

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <thread>

#include "errors.hpp"
#include "mpi_check.hpp"

namespace stepcast::cli {

namespace {

// How long a failed rank waits for the others before it ends the job: ranks that fail at the
// same point (a refused checkpoint, an input check) arrive within it and exit cleanly.
constexpr double kErrorGraceS = 5;

}  // namespace

namespace {

// Waits for `request` at most `limit_s`; false when it did not complete.
bool wait_at_most(MPI_Request& request, double limit_s) {
  auto start = std::chrono::steady_clock::now();
  while (true) {
    int done = 0;
    STEPCAST_MPI(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return true;
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited > limit_s) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace

void on_rank0_then_agree(int rank, const std::string& what, const std::function<void()>& body,
                         double wait_s) {
  std::exception_ptr error;
  if (rank == 0) {
    try {
      body();
    } catch (...) {
      error = std::current_exception();
    }
  }
  int failed = error ? 1 : 0;
  MPI_Request request;
  STEPCAST_MPI(MPI_Ibcast(&failed, 1, MPI_INT, 0, MPI_COMM_WORLD, &request));
  if (!wait_at_most(request, wait_s)) {
    char line[256];
    std::snprintf(line, sizeof line, "rank %d: no answer from rank 0 for %.0f s in %s; aborting the job\n",
                  rank, wait_s, what.c_str());
    write_stderr_line(line);
    MPI_Abort(MPI_COMM_WORLD, 4);
  }
  if (error) std::rethrow_exception(error);
  if (failed) throw InputError("stopped: rank 0 failed in " + what + " (its error is on its own line)");
}

int with_mpi(const std::string& command, int argc, char** argv,
             const std::function<int(int rank, int size)>& body, double wait_s) {
  MPI_Init(&argc, &argv);
  // Errors return to the caller (STEPCAST_MPI names the call and the rank, then aborts) instead
  // of MPI's default abort that names neither; communicators made from the world inherit it.
  STEPCAST_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  int rank = 0, size = 0;
  STEPCAST_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  STEPCAST_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size));
  const std::string head = "stepcast " + command + ": rank " + std::to_string(rank) + ": ";
  int code = 0;
  try {
    code = body(rank, size);
  } catch (const InputError& e) {
    write_stderr_line(head + "error: " + e.what() + "\n");
    code = kInputErrorExitCode;
  } catch (const std::exception& e) {
    write_stderr_line(head + "internal error: " + e.what() + "\n");
    code = 3;
  }
  int worst = 0;
  MPI_Request request;
  STEPCAST_MPI(MPI_Iallreduce(&code, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &request));
  const double limit = code != 0 ? kErrorGraceS : wait_s;
  if (!wait_at_most(request, limit)) {
    if (code == 0) {
      char line[256];
      std::snprintf(line, sizeof line, "waited %.0f s for the other ranks to finish; aborting the job\n",
                    limit);
      write_stderr_line(head + line);
      MPI_Abort(MPI_COMM_WORLD, 4);
    }
    MPI_Abort(MPI_COMM_WORLD, code);
  }
  MPI_Finalize();
  return worst;
}

}  // namespace stepcast::cli
