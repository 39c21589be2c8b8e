// The executor's watchdog: every wait on communication polls non-blocking requests against a
// deadline. When a peer does not answer in time (a hung or stopped rank), the waiting rank prints
// the op it waits in and the ranks it waits for, then aborts the whole job with a non-zero exit.
// ControlChannel carries the executor's own bookkeeping (step time and loss, checkpoint hashes,
// per-op records, agreement on errors) under the same watchdog, so no barrier, gather or
// reduction of the executor can block for ever.
#pragma once

#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

namespace stepcast {

class Watchdog {
 public:
  explicit Watchdog(double timeout_s) : timeout_s_(timeout_s) {}
  // What the rank is doing, for the message ("op 123 (all_reduce grad_bucket)").
  void set_current(std::string what) { current_ = std::move(what); }
  // Waits for every request; `peers[i]` is the world rank request i talks to. Past the timeout
  // (times `patience`), names the ranks of the requests still open and aborts the job (exit 4).
  void wait_all(std::vector<MPI_Request>& requests, const std::vector<int>& peers,
                double patience = 1);
  double timeout_s() const { return timeout_s_; }

 private:
  double timeout_s_;
  std::string current_;
};

// World rank of member `index` of communicator `comm`.
int world_rank_of(MPI_Comm comm, int index);

// Point-to-point messages between every rank and rank 0 on a duplicate of MPI_COMM_WORLD (so
// they never match the program's own sends). Rank 0 waits for each rank by name: a rank that
// does not arrive is the one the watchdog names. The other ranks wait for rank 0 twice as long,
// so rank 0, which sees every rank, is the one that reports.
class ControlChannel {
 public:
  // Collective over MPI_COMM_WORLD.
  explicit ControlChannel(double timeout_s);
  ~ControlChannel();
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Rank 0 gets every rank's `values` (its own first), the others an empty list.
  std::vector<std::vector<double>> gather(const std::vector<double>& values, const std::string& what);
  // Rank 0's `values` on every rank (the count must agree).
  void broadcast(std::vector<double>& values, const std::string& what);
  void barrier(const std::string& what);
  double max(double value, const std::string& what);
  // Summed in rank order (the same result on every rank and every run).
  double sum(double value, const std::string& what);
  // Runs `body` on this rank. When it throws on any rank, it throws on every rank: the rank that
  // failed its own error, the others an InputError naming that rank and `what`.
  void agree(const std::string& what, const std::function<void()>& body);

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  Watchdog watchdog_;
};

}  // namespace stepcast
