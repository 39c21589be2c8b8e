// The ranks 1..N-1 of a spread command (distributed_simulations.hpp): each runs the simulations
// rank 0 sends, as children of its own in a temporary folder, as many at once as it was sent
// (rank 0 keeps each rank to --jobs), and answers each with its outcome. One thread: it polls
// MPI and its children every millisecond or so, says it is alive each second, and gives up
// (ending the job) when rank 0 has said nothing for the silence limit.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <thread>

#include "errors.hpp"
#include "mpi_check.hpp"
#include "simulation_protocol.hpp"
#include "simulation_request.hpp"

extern char** environ;

namespace stepcast::cli {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

struct Running {
  int64_t id = 0;
  fs::path folder;
};

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Starts `command` under /bin/sh; its pid, or -1 with errno's reason in `why`.
pid_t spawn_shell(const std::string& command, std::string& why) {
  pid_t pid = -1;
  const char* argv[] = {"sh", "-c", command.c_str(), nullptr};
  int error = posix_spawn(&pid, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ);
  if (error != 0) {
    why = "cannot start /bin/sh: " + std::string(strerror(error));
    return -1;
  }
  return pid;
}

}  // namespace

int serve_simulations(int rank, const std::string& head, double silence_limit_s) {
  const fs::path dir = make_temp_folder("server");
  const std::string executable = this_executable();
  const std::string host = host_name();
  std::map<pid_t, Running> running;
  Outbox outbox;
  int64_t count = 0;  // simulations started: the folder DIR/K of the K-th
  auto heard = Clock::now(), said = Clock::now() - std::chrono::seconds(2);
  std::optional<int> stop_code;
  auto answer = [&](int64_t id, const SimulationOutcome& outcome) {
    outbox.send(0, kTagOutcome, Json{{"id", id}, {"host", host}, {"outcome", outcome_to_json(outcome)}}.dump());
  };
  while (!stop_code) {
    while (auto message = receive_waiting(0)) {
      heard = Clock::now();
      if (message->tag == kTagStop) {
        stop_code = std::stoi(message->text);
        break;
      }
      if (message->tag != kTagRequest) continue;
      Json j = Json::parse(message->text);
      int64_t id = j.at("id").get<int64_t>();
      fs::path folder = dir / std::to_string(count++);
      std::string why;
      pid_t pid = -1;
      try {
        pid = spawn_shell(prepare_simulation(request_from_json(j.at("request")), folder, executable), why);
      } catch (const std::exception& e) {
        why = e.what();  // a full disk, a folder it cannot write
      }
      if (pid < 0) {
        SimulationOutcome failed;
        failed.exit_code = 126;
        failed.log = "rank " + std::to_string(rank) + " (" + host + ") cannot run the simulation: " + why;
        answer(id, failed);
        continue;
      }
      running[pid] = {id, folder};
    }
    for (auto it = running.begin(); it != running.end();) {
      int status = 0;
      pid_t done = waitpid(it->first, &status, WNOHANG);
      if (done == 0) {
        ++it;
        continue;
      }
      answer(it->second.id, collect_simulation(it->second.folder, done < 0 ? -1 : status));
      it = running.erase(it);
    }
    if (seconds_since(said) >= 1) {
      outbox.send(0, kTagHeartbeat, "");
      said = Clock::now();
    }
    outbox.progress();
    if (seconds_since(heard) > silence_limit_s) {
      char line[256];
      std::snprintf(line, sizeof line, "%srank %d: no word from rank 0 for %.0f s; aborting the job\n", head.c_str(),
                    rank, silence_limit_s);
      write_stderr_line(line);
      MPI_Abort(MPI_COMM_WORLD, 4);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (const auto& [pid, r] : running) {  // none when rank 0 stops it: it waits for every answer
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  auto start = Clock::now();
  while (!outbox.progress() && seconds_since(start) < 10) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::error_code ec;
  fs::remove_all(dir, ec);
  return *stop_code;
}

}  // namespace stepcast::cli
