// Running a command inside MPI (`run`, `profile`): errors on any rank reach the user once, from
// the rank that hit them, in one line; every rank ends with the worst exit code, and no rank
// waits for ever on one that failed or stopped.
#pragma once

#include <functional>
#include <string>

namespace stepcast::cli {

// Runs `body` on every rank, then agrees on the exit code. A rank that failed waits a few
// seconds for the others to arrive (they failed too, or were done) and otherwise ends the whole
// job with its exit code (MPI_Abort: the others may be blocked on it mid-step). A rank that
// succeeded waits `wait_s` for the others, then aborts naming the wait (exit 4).
int with_mpi(const std::string& command, int argc, char** argv,
             const std::function<int(int rank, int size)>& body, double wait_s = 300);

// Runs `body` on rank 0 only (checking an output folder, say) and tells every rank: when it
// throws, rank 0 rethrows it and the others throw an InputError naming rank 0 and `what`. The
// other ranks wait at most `wait_s` (then abort the job, exit 4).
void on_rank0_then_agree(int rank, const std::string& what, const std::function<void()>& body,
                         double wait_s);

}  // namespace stepcast::cli
