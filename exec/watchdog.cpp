// The watchdog and the control channel of watchdog.hpp.
#include "watchdog.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <thread>

#include "errors.hpp"
#include "mpi_check.hpp"

namespace stepcast {

namespace {

constexpr int kControlTag = 7;

}  // namespace

int world_rank_of(MPI_Comm comm, int index) {
  MPI_Group group, world;
  STEPCAST_MPI(MPI_Comm_group(comm, &group));
  STEPCAST_MPI(MPI_Comm_group(MPI_COMM_WORLD, &world));
  int out = MPI_UNDEFINED;
  STEPCAST_MPI(MPI_Group_translate_ranks(group, 1, &index, world, &out));
  STEPCAST_MPI(MPI_Group_free(&group));
  STEPCAST_MPI(MPI_Group_free(&world));
  return out;
}

void Watchdog::wait_all(std::vector<MPI_Request>& requests, const std::vector<int>& peers,
                        double patience) {
  const double limit = timeout_s_ * patience;
  auto start = std::chrono::steady_clock::now();
  int done = 0;
  int spins = 0;
  while (true) {
    STEPCAST_MPI(MPI_Testall(int(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE));
    if (done) return;
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited > limit) break;
    // Spin (latency matters), yielding the core to ranks that share it; sleep only once the
    // wait is long (a sleep after every short wait would add tens of µs to small messages).
    if (++spins > 1000) {
      if (waited > 0.01) std::this_thread::sleep_for(std::chrono::microseconds(50));
      else std::this_thread::yield();
    }
  }
  int me = 0;
  STEPCAST_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &me));
  std::vector<int> missing;
  for (size_t i = 0; i < peers.size() && i < requests.size(); ++i) {
    int flag = 0;
    STEPCAST_MPI(MPI_Test(&requests[i], &flag, MPI_STATUS_IGNORE));
    if (!flag) missing.push_back(peers[i]);
  }
  std::sort(missing.begin(), missing.end());
  missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
  std::string names;
  for (int r : missing) names += (names.empty() ? "" : ", ") + std::to_string(r);
  // One write: the line of one rank never interleaves with another's.
  char line[1024];
  std::snprintf(line, sizeof line,
                "stepcast run: rank %d: watchdog: no progress for %.0f s in %s, waiting for rank%s "
                "%s; aborting the job\n",
                me, limit, current_.c_str(), missing.size() == 1 ? "" : "s", names.c_str());
  write_stderr_line(line);
  MPI_Abort(MPI_COMM_WORLD, 4);
}

ControlChannel::ControlChannel(double timeout_s) : watchdog_(timeout_s) {
  STEPCAST_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
  STEPCAST_MPI(MPI_Comm_rank(comm_, &rank_));
  STEPCAST_MPI(MPI_Comm_size(comm_, &size_));
}

ControlChannel::~ControlChannel() {
  if (comm_ != MPI_COMM_NULL) STEPCAST_MPI(MPI_Comm_free(&comm_));
}

std::vector<std::vector<double>> ControlChannel::gather(const std::vector<double>& values,
                                                        const std::string& what) {
  watchdog_.set_current(what);
  if (rank_ != 0) {
    int count = int(values.size());
    std::vector<MPI_Request> requests(2);
    STEPCAST_MPI(MPI_Isend(&count, 1, MPI_INT, 0, kControlTag, comm_, &requests[0]));
    STEPCAST_MPI(MPI_Isend(values.data(), count, MPI_DOUBLE, 0, kControlTag + 1, comm_, &requests[1]));
    watchdog_.wait_all(requests, {0, 0}, 2);
    return {};
  }
  std::vector<std::vector<double>> out(static_cast<size_t>(size_));
  out[0] = values;
  std::vector<int> counts(size_t(size_), 0);
  std::vector<MPI_Request> requests;
  std::vector<int> peers;
  for (int r = 1; r < size_; ++r) {
    requests.emplace_back();
    STEPCAST_MPI(MPI_Irecv(&counts[size_t(r)], 1, MPI_INT, r, kControlTag, comm_, &requests.back()));
    peers.push_back(r);
  }
  watchdog_.wait_all(requests, peers);
  requests.clear();
  peers.clear();
  for (int r = 1; r < size_; ++r) {
    out[size_t(r)].resize(size_t(counts[size_t(r)]));
    requests.emplace_back();
    STEPCAST_MPI(MPI_Irecv(out[size_t(r)].data(), counts[size_t(r)], MPI_DOUBLE, r, kControlTag + 1, comm_,
              &requests.back()));
    peers.push_back(r);
  }
  watchdog_.wait_all(requests, peers);
  return out;
}

void ControlChannel::broadcast(std::vector<double>& values, const std::string& what) {
  watchdog_.set_current(what);
  std::vector<MPI_Request> requests;
  std::vector<int> peers;
  if (rank_ == 0) {
    for (int r = 1; r < size_; ++r) {
      requests.emplace_back();
      STEPCAST_MPI(MPI_Isend(values.data(), int(values.size()), MPI_DOUBLE, r, kControlTag + 2, comm_,
                &requests.back()));
      peers.push_back(r);
    }
    watchdog_.wait_all(requests, peers);
  } else {
    requests.emplace_back();
    STEPCAST_MPI(MPI_Irecv(values.data(), int(values.size()), MPI_DOUBLE, 0, kControlTag + 2, comm_,
              &requests.back()));
    watchdog_.wait_all(requests, {0}, 2);
  }
}

void ControlChannel::barrier(const std::string& what) {
  gather({}, what);
  std::vector<double> none;
  broadcast(none, what);
}

double ControlChannel::max(double value, const std::string& what) {
  std::vector<std::vector<double>> all = gather({value}, what);
  std::vector<double> result{value};
  for (const auto& v : all) result[0] = std::max(result[0], v.at(0));
  broadcast(result, what);
  return result[0];
}

double ControlChannel::sum(double value, const std::string& what) {
  std::vector<std::vector<double>> all = gather({value}, what);
  std::vector<double> result{0};
  for (const auto& v : all) result[0] += v.at(0);
  broadcast(result, what);
  return result[0];
}

void ControlChannel::agree(const std::string& what, const std::function<void()>& body) {
  std::exception_ptr error;
  try {
    body();
  } catch (...) {
    error = std::current_exception();
  }
  std::vector<std::vector<double>> all = gather({error ? 1.0 : 0.0}, what);
  std::vector<double> first_failed{-1};
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].at(0) != 0) {
      first_failed[0] = double(r);
      break;
    }
  }
  broadcast(first_failed, what);
  if (error) std::rethrow_exception(error);
  if (first_failed[0] >= 0) {
    throw InputError("stopped: rank " + std::to_string(int(first_failed[0])) + " failed in " + what +
                     " (its error is on its own line)");
  }
}

}  // namespace stepcast
