// The executor's watchdog: every wait on communication polls non-blocking requests against a
// deadline. When a peer does not answer in time (a hung rank), the waiting rank prints the op it
// waits in and the ranks it waits for, then aborts the whole job with a non-zero exit.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

namespace stepcast {

class Watchdog {
 public:
  explicit Watchdog(double timeout_s) : timeout_s_(timeout_s) {}
  // What the rank is doing, for the message ("op 123 (all_reduce grad_bucket)").
  void set_current(std::string what) { current_ = std::move(what); }
  // Waits for every request; `peers` are the world ranks the requests talk to.
  void wait_all(std::vector<MPI_Request>& requests, const std::vector<int>& peers);
  double timeout_s() const { return timeout_s_; }

 private:
  double timeout_s_;
  std::string current_;
};

// World rank of member `index` of communicator `comm`.
int world_rank_of(MPI_Comm comm, int index);

}  // namespace stepcast
