// Rank 0's side of a spread command, the job around it, and the messages' plumbing; see
// distributed_simulations.hpp (the serving ranks: simulation_server.cpp).
#include "distributed_simulations.hpp"

#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "errors.hpp"
#include "mpi_check.hpp"
#include "simulation_protocol.hpp"

namespace stepcast::cli {

int serve_simulations(int rank, const std::string& head, double silence_limit_s);  // simulation_server.cpp

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::optional<long> environment_integer(const char* name) {
  const char* value = std::getenv(name);
  if (!value || !*value) return std::nullopt;
  char* end = nullptr;
  long n = std::strtol(value, &end, 10);
  if (*end != '\0') return std::nullopt;
  return n;
}

std::string rank_name(int rank, const std::string& host) { return "rank " + std::to_string(rank) + " (" + host + ")"; }

// Rank 0's runner: each simulation goes to a rank with a free slot (rank 0's own children
// first), as JSON text through the main thread, which owns every MPI call (dispatch).
class SpreadRunner : public SimulationRunner {
 public:
  SpreadRunner(std::vector<std::string> hosts, std::string head, double silence_limit_s)
      : head_(std::move(head)), silence_limit_s_(silence_limit_s) {
    servers_.resize(hosts.size());
    for (size_t r = 0; r < hosts.size(); ++r) servers_[r].host = std::move(hosts[r]);
  }
  int ranks() const override { return int(servers_.size()); }
  int threads(int jobs) const override { return jobs * ranks(); }
  SimulationOutcome run(const SimulationRequest& request, int jobs) override;

  // The main thread's loop: sends the requests, takes the answers, says it is alive each second,
  // and gives up a rank silent for the limit; returns once finish() was called.
  void dispatch();
  void finish();
  // Tells every rank still answering to stop with the job's exit code (`code`, or 1 where a rank
  // failed), names the failed ranks, and ends the job; the exit code.
  int stop(int code);

 private:
  struct Server {
    std::string host;
    int in_flight = 0;
    bool silent = false;  // gave up: no word from it for the limit
    std::string failure;  // why it gets no more simulations; empty while it does
    Clock::time_point heard = Clock::now();
  };
  struct Pending {
    int rank = 0;
    std::string text;
    bool sent = false;
    bool lost = false;  // its rank was given up before it answered
    std::optional<SimulationOutcome> outcome;
  };

  // The rank to run on next, -1 when every usable one is busy, -2 when none is usable; under the lock.
  int pick(int jobs, const std::set<int>& avoid) const;
  // No more simulations go to `rank`; under the lock.
  void give_up(int rank, const std::string& why);

  const std::string head_;
  const double silence_limit_s_;
  LocalRunner local_;
  Outbox outbox_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Server> servers_;  // by rank; rank 0's in_flight counts its own children
  std::map<int64_t, Pending> pending_;
  int64_t next_id_ = 0;
  bool finished_ = false;
};

int SpreadRunner::pick(int jobs, const std::set<int>& avoid) const {
  bool usable = false;
  for (int rank = 0; rank < ranks(); ++rank) {
    const Server& s = servers_[size_t(rank)];
    if (!s.failure.empty() || avoid.count(rank)) continue;
    usable = true;
    if (s.in_flight < jobs) return rank;
  }
  return usable ? -1 : -2;
}

void SpreadRunner::give_up(int rank, const std::string& why) {
  Server& s = servers_[size_t(rank)];
  if (!s.failure.empty()) return;
  s.failure = why;
  write_stderr_line(head_ + rank_name(rank, s.host) + " failed: " + why + "; no more simulations go to it\n");
  changed_.notify_all();
}

SimulationOutcome SpreadRunner::run(const SimulationRequest& request, int jobs) {
  std::set<int> avoid;         // ranks that lost this request, or whose child was killed running it
  std::optional<int> suspect;  // the rank whose child was killed, until it runs elsewhere
  std::string suspicion;
  SimulationOutcome killed;
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    int rank = -1;
    changed_.wait(lock, [&] { return (rank = pick(jobs, avoid)) != -1; });
    if (rank == -2) {  // killed wherever it ran, or no rank left to run it
      killed.log += "\n(the simulation was killed by a signal on every rank that ran it)";
      return killed;
    }
    SimulationOutcome outcome;
    bool lost = false;
    ++servers_[size_t(rank)].in_flight;
    if (rank == 0) {
      lock.unlock();
      outcome = local_.run(request, jobs);
      lock.lock();
    } else {
      int64_t id = next_id_++;
      Pending& p = pending_[id];
      p.rank = rank;
      p.text = Json{{"id", id}, {"request", request_to_json(request)}}.dump();
      changed_.wait(lock, [&] { return pending_.at(id).outcome || pending_.at(id).lost; });
      lost = pending_.at(id).lost;
      if (!lost) outcome = *pending_.at(id).outcome;
      pending_.erase(id);
    }
    --servers_[size_t(rank)].in_flight;
    changed_.notify_all();
    if (lost) {
      avoid.insert(rank);
      continue;
    }
    if (outcome.signal == 0) {
      // It ran elsewhere: the rank that was killed on it is at fault, not the simulation.
      if (suspect) give_up(*suspect, suspicion);
      return outcome;
    }
    const char* name = strsignal(outcome.signal);
    std::string what = "a simulation's child was killed by signal " + std::to_string(outcome.signal) + " (" +
                       (name ? name : "?") + ")";
    killed = outcome;
    avoid.insert(rank);
    if (suspect) continue;  // killed again: one more rank, if any is left
    suspect = rank;
    suspicion = what;
    write_stderr_line(head_ + rank_name(rank, servers_[size_t(rank)].host) + ": " + what +
                      "; running it again on another rank\n");
  }
}

void SpreadRunner::dispatch() {
  auto said = Clock::now() - std::chrono::seconds(2);
  while (true) {
    std::vector<std::pair<int, std::string>> to_send;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (finished_ && pending_.empty()) return;
      for (auto& [id, p] : pending_) {
        if (p.sent) continue;
        p.sent = true;
        to_send.push_back({p.rank, std::move(p.text)});
      }
    }
    for (auto& [rank, text] : to_send) outbox_.send(rank, kTagRequest, std::move(text));
    while (auto message = receive_waiting(MPI_ANY_SOURCE)) {
      std::lock_guard<std::mutex> lock(mutex_);
      Server& s = servers_[size_t(message->source)];
      s.heard = Clock::now();
      if (message->tag != kTagOutcome) continue;
      Json j = Json::parse(message->text);
      auto it = pending_.find(j.at("id").get<int64_t>());
      if (it != pending_.end() && !it->second.lost) it->second.outcome = outcome_from_json(j.at("outcome"));
      changed_.notify_all();
    }
    bool say = seconds_since(said) >= 1;
    if (say) said = Clock::now();
    for (int rank = 1; rank < ranks(); ++rank) {
      std::lock_guard<std::mutex> lock(mutex_);
      Server& s = servers_[size_t(rank)];
      if (s.silent) continue;
      if (say) outbox_.send(rank, kTagHeartbeat, "");
      if (seconds_since(s.heard) > silence_limit_s_) {
        s.silent = true;
        for (auto& [id, p] : pending_) p.lost = p.lost || (p.rank == rank && !p.outcome);
        changed_.notify_all();
        char why[128];
        std::snprintf(why, sizeof why, "no word from it for %.0f s", silence_limit_s_);
        give_up(rank, why);
      }
    }
    outbox_.progress();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void SpreadRunner::finish() {
  std::lock_guard<std::mutex> lock(mutex_);
  finished_ = true;
}

int SpreadRunner::stop(int code) {
  std::string failed;
  bool silent = false;
  for (int rank = 0; rank < ranks(); ++rank) {
    const Server& s = servers_[size_t(rank)];
    if (s.failure.empty()) continue;
    failed += (failed.empty() ? "" : "; ") + rank_name(rank, s.host) + ": " + s.failure;
    silent = silent || s.silent;
  }
  const int exit_code = code != 0 ? code : failed.empty() ? 0 : 1;
  if (!failed.empty()) {
    write_stderr_line(head_ + "ranks that failed during the sweep: " + failed +
                      "; every simulation of theirs ran on another rank; exit " + std::to_string(exit_code) + "\n");
  }
  for (int rank = 1; rank < ranks(); ++rank) {
    if (!servers_[size_t(rank)].silent) outbox_.send(rank, kTagStop, std::to_string(exit_code));
  }
  auto start = Clock::now();
  while (!outbox_.progress() && seconds_since(start) < 10) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // A rank that stopped answering cannot finalize: end the job (the outputs are written).
  if (silent) {
    local_.remove_folder();
    std::cout.flush();
    MPI_Abort(MPI_COMM_WORLD, exit_code);
  }
  return exit_code;
}

}  // namespace

void Outbox::send(int rank, int tag, std::string text) {
  sends_.push_back({std::move(text), MPI_REQUEST_NULL});
  Send& s = sends_.back();
  STEPCAST_MPI(MPI_Isend(s.text.data(), int(s.text.size()), MPI_CHAR, rank, tag, MPI_COMM_WORLD, &s.request));
}

bool Outbox::progress() {
  for (auto it = sends_.begin(); it != sends_.end();) {
    int done = 0;
    STEPCAST_MPI(MPI_Test(&it->request, &done, MPI_STATUS_IGNORE));
    it = done ? sends_.erase(it) : std::next(it);
  }
  return sends_.empty();
}

std::optional<Message> receive_waiting(int source) {
  int waiting = 0;
  MPI_Status status;
  STEPCAST_MPI(MPI_Iprobe(source, MPI_ANY_TAG, MPI_COMM_WORLD, &waiting, &status));
  if (!waiting) return std::nullopt;
  int count = 0;
  STEPCAST_MPI(MPI_Get_count(&status, MPI_CHAR, &count));
  Message m{status.MPI_SOURCE, status.MPI_TAG, std::string(size_t(count), '\0')};
  STEPCAST_MPI(MPI_Recv(m.text.data(), count, MPI_CHAR, m.source, m.tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
  return m;
}

std::string host_name() {
  char name[256] = {0};
  if (gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

int launched_job_size() {
  if (auto n = environment_integer("OMPI_COMM_WORLD_SIZE")) return int(*n);
  if (auto n = environment_integer("PMI_SIZE")) return int(*n);
  if (std::getenv("PMIX_RANK")) return int(environment_integer("SLURM_STEP_NUM_TASKS").value_or(-1));
  auto tasks = environment_integer("SLURM_STEP_NUM_TASKS");
  if (std::getenv("SLURM_PROCID") && tasks && *tasks > 1) {
    throw InputError("srun started " + std::to_string(*tasks) +
                     " tasks without an MPI plugin (no PMI_SIZE or PMIX_RANK in the environment): each would run "
                     "the whole command; valid: srun --mpi=pmix (or pmi2), or mpirun");
  }
  return 1;
}

int run_spread(const std::string& command_name, int argc, char** argv,
               const std::function<int(SimulationRunner& runner)>& command, double silence_limit_s) {
  int provided = 0;
  STEPCAST_MPI(MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided));
  STEPCAST_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  int rank = 0, size = 0;
  STEPCAST_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  STEPCAST_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size));
  const std::string head = "stepcast " + command_name + ": ";
  if (provided < MPI_THREAD_FUNNELED) {
    if (rank == 0) write_stderr_line(head + "this MPI cannot have a thread beside the one that calls it; aborting\n");
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  constexpr int kHostChars = 256;
  std::string mine = host_name().substr(0, kHostChars - 1);
  mine.resize(kHostChars, '\0');
  std::vector<char> all(size_t(kHostChars) * size_t(rank == 0 ? size : 1));
  STEPCAST_MPI(MPI_Gather(mine.data(), kHostChars, MPI_CHAR, all.data(), kHostChars, MPI_CHAR, 0, MPI_COMM_WORLD));
  int code = 0;
  if (size == 1) {
    LocalRunner local;
    code = command(local);
  } else if (rank != 0) {
    try {
      code = serve_simulations(rank, head, silence_limit_s);
    } catch (const std::exception& e) {
      write_stderr_line(head + "rank " + std::to_string(rank) + ": internal error: " + e.what() + "\n");
      MPI_Abort(MPI_COMM_WORLD, 3);
    }
  } else {
    std::vector<std::string> hosts;
    for (int r = 0; r < size; ++r) hosts.push_back(std::string(all.data() + size_t(r) * kHostChars).c_str());
    SpreadRunner runner(hosts, head, silence_limit_s);
    std::thread body([&] {
      code = command(runner);
      runner.finish();
    });
    try {
      runner.dispatch();
    } catch (const std::exception& e) {
      write_stderr_line(head + "rank 0: internal error: " + e.what() + "\n");
      MPI_Abort(MPI_COMM_WORLD, 3);
    }
    body.join();
    code = runner.stop(code);
  }
  MPI_Finalize();
  return code;
}

}  // namespace stepcast::cli
