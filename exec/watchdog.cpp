// The watchdog of watchdog.hpp.
#include "watchdog.hpp"

#include <chrono>
#include <cstdio>
#include <thread>

namespace stepcast {

int world_rank_of(MPI_Comm comm, int index) {
  MPI_Group group, world;
  MPI_Comm_group(comm, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  int out = MPI_UNDEFINED;
  MPI_Group_translate_ranks(group, 1, &index, world, &out);
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  return out;
}

void Watchdog::wait_all(std::vector<MPI_Request>& requests, const std::vector<int>& peers) {
  auto start = std::chrono::steady_clock::now();
  int done = 0;
  int spins = 0;
  while (true) {
    MPI_Testall(int(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE);
    if (done) return;
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited > timeout_s_) break;
    // Spin (latency matters), yielding the core to ranks that share it; sleep only once the
    // wait is long (a sleep after every short wait would add tens of µs to small messages).
    if (++spins > 1000) {
      if (waited > 0.01) std::this_thread::sleep_for(std::chrono::microseconds(50));
      else std::this_thread::yield();
    }
  }
  int me = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  std::string missing;
  for (size_t i = 0; i < peers.size(); ++i) {
    int flag = 0;
    MPI_Test(&requests[i], &flag, MPI_STATUS_IGNORE);
    if (!flag) missing += (missing.empty() ? "" : ", ") + std::to_string(peers[i]);
  }
  std::fprintf(stderr,
               "stepcast run: rank %d: watchdog: no progress for %.0f s in %s, waiting for rank(s) "
               "%s; aborting the job\n",
               me, timeout_s_, current_.c_str(), missing.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 4);
}

}  // namespace stepcast
