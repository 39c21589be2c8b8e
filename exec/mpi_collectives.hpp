// The CPU backend's communication: one MPI communicator per group of the rank grid, and each
// collective run with exactly the algorithm the program records (ring, binomial tree,
// hierarchical all_reduce) over MPI point-to-point in a fixed order, so results are
// bit-reproducible run to run; or MPI's own collectives (--collectives mpi). A collective works
// on a list of buffers: chunk i of the list is chunk i of every buffer, each buffer of n elements
// split in ⌈n/size⌉-element chunks (ZeRO's shard of member i is chunk i, buffer by buffer).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "program.hpp"
#include "rank_grid.hpp"
#include "watchdog.hpp"

namespace stepcast {

template <class T>
struct Span {
  T* data;
  int64_t count;
};

class GroupComms {
 public:
  GroupComms(const RankGrid& grid, int64_t rank, int64_t devices_per_node);
  ~GroupComms();
  GroupComms(const GroupComms&) = delete;
  GroupComms& operator=(const GroupComms&) = delete;

  // MPI_COMM_NULL where this rank is in no group of `kind` (embedding on middle stages).
  MPI_Comm comm(GroupKind kind) const { return comms_.at(kind); }
  int size(GroupKind kind) const;
  int index(GroupKind kind) const;  // this rank's position in its group
  // Sub-communicators of a group for the hierarchical algorithm: members on this rank's node,
  // and members with this rank's local index on every node.
  MPI_Comm local(GroupKind kind) const { return local_.at(kind); }
  MPI_Comm cross(GroupKind kind) const { return cross_.at(kind); }

 private:
  std::map<GroupKind, MPI_Comm> comms_, local_, cross_;
};

// Chunk `i` of `count` elements split over `parts`: [first, last).
inline std::pair<int64_t, int64_t> chunk_range(int64_t count, int64_t parts, int64_t i) {
  int64_t size = (count + parts - 1) / parts;
  int64_t first = std::min(count, i * size);
  return {first, std::min(count, first + size)};
}

template <class T>
class Collectives {
 public:
  Collectives(const GroupComms& comms, bool use_mpi, Watchdog& watchdog)
      : comms_(comms), use_mpi_(use_mpi), watchdog_(watchdog) {}
  // Every buffer summed over the group.
  void all_reduce(GroupKind group, Algorithm algorithm, std::vector<Span<T>> buffers);
  // Chunk `index(group)` of every buffer holds the sum over the group (the rest is undefined).
  void reduce_scatter(GroupKind group, std::vector<Span<T>> buffers);
  // Every member contributes its chunk of every buffer; all receive all chunks.
  void all_gather(GroupKind group, std::vector<Span<T>> buffers);
  // What actually ran (the recorded algorithm, or a fallback): for the measurement.
  std::map<std::string, int64_t> algorithms_used;

 private:
  void ring_reduce_scatter(MPI_Comm comm, std::vector<Span<T>>& buffers);
  void ring_all_gather(MPI_Comm comm, std::vector<Span<T>>& buffers);
  void tree_all_reduce(MPI_Comm comm, std::vector<Span<T>>& buffers);
  void mpi_all_reduce(MPI_Comm comm, std::vector<Span<T>>& buffers);
  // Packs chunk `i` of every buffer (of a group of `parts`) into `out`; unpack the reverse.
  int64_t pack(const std::vector<Span<T>>& buffers, int64_t parts, int64_t i, std::vector<T>& out);
  void unpack(std::vector<Span<T>>& buffers, int64_t parts, int64_t i, const T* in, bool add);
  // Send and receive at once, watched: a hung peer aborts the job with a message.
  void exchange(MPI_Comm comm, const T* send, int64_t send_count, int to, T* recv,
                int64_t recv_count, int from, int tag);
  const GroupComms& comms_;
  bool use_mpi_;
  Watchdog& watchdog_;
  std::vector<T> send_, recv_;  // grow on first use, reused afterwards
};

// The MPI datatype of float and double.
template <class T>
MPI_Datatype mpi_type();

// MPI errors abort with the rank and the call (the executor's MPI calls go through this).
void check_mpi(int code, const char* call, int rank);

}  // namespace stepcast
