// The messages between rank 0 and the ranks that serve its simulations
// (distributed_simulations.cpp, simulation_server.cpp): one tag per kind, JSON text over
// MPI_CHAR, every send non-blocking so that no rank blocks on one that stopped answering.
#pragma once

#include <mpi.h>

#include <list>
#include <optional>
#include <string>

namespace stepcast::cli {

enum SimulationTag : int {
  kTagRequest = 1701,  // rank 0 → server: {"id", "request"}
  kTagOutcome,         // server → rank 0: {"id", "outcome"}
  kTagHeartbeat,       // either way, each second: "" (rank 0 also learns the server's host)
  kTagStop,            // rank 0 → server: the exit code, as text
};

struct Message {
  int source = 0;
  int tag = 0;
  std::string text;
};

// Sends in flight, each with its buffer, until MPI has them.
class Outbox {
 public:
  Outbox() = default;
  Outbox(const Outbox&) = delete;
  Outbox& operator=(const Outbox&) = delete;
  void send(int rank, int tag, std::string text);
  // Forgets the sends that completed; true when none is left.
  bool progress();

 private:
  struct Send {
    std::string text;
    MPI_Request request;
  };
  std::list<Send> sends_;
};

// A message waiting from `source` (MPI_ANY_SOURCE for any), received; nullopt when none waits.
std::optional<Message> receive_waiting(int source);

// This machine's host name.
std::string host_name();

}  // namespace stepcast::cli
