// The CPU backend's communication: one MPI communicator per group of the rank grid, and each
// collective run with exactly the algorithm the program records (ring, binomial tree,
// hierarchical all_reduce, pairwise all_to_all) over MPI point-to-point in a fixed order, so results are
// bit-reproducible run to run; or MPI's own collectives (--collectives mpi). A collective works
// on a list of buffers: chunk i of the list is chunk i of every buffer, each buffer of n elements
// split in ⌈n/size⌉-element chunks (ZeRO's shard of member i is chunk i, buffer by buffer).
// Chunks are packed into a scratch the caller gives for each collective (the executor: the
// program's comm buffer of the op), one send and one receive segment of half of it each, and
// exchanged segment by segment: any scratch size gives the same result, bit for bit.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "program.hpp"
#include "rank_grid.hpp"
#include "span.hpp"
#include "watchdog.hpp"
#include "mpi_check.hpp"

namespace stepcast {

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

// The MPI datatype of float and double.
template <class T>
MPI_Datatype mpi_type();

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
  // Block i of `send` (n / size elements each) to member i, block j of `recv` from member j:
  // pairwise, member + k and member − k at step k (or MPI_Alltoall). No scratch.
  void all_to_all(GroupKind group, Span<T> send, Span<T> recv);
  // Variable blocks in bytes (MoE's dispatch and combine, their counts first): send
  // [send_offsets[i], + send_bytes[i]) to member i, recv [recv_offsets[j], + recv_bytes[j]) from
  // member j; pairwise in the same order as all_to_all, or MPI_Alltoallv. No scratch.
  void all_to_allv(GroupKind group, const char* send, const std::vector<int64_t>& send_bytes,
                   const std::vector<int64_t>& send_offsets, char* recv, const std::vector<int64_t>& recv_bytes,
                   const std::vector<int64_t>& recv_offsets);
  // The scratch of the next collective (consumed by it). Without one, a collective uses a
  // buffer of this object's own (the profiler's calls; the executor always gives one).
  void use_scratch(T* data, int64_t count) {
    scratch_ = data;
    scratch_count_ = count;
  }
  // What actually ran (the recorded algorithm, or a fallback): for the measurement.
  std::map<std::string, int64_t> algorithms_used;

 private:
  void ring_reduce_scatter(MPI_Comm comm, std::vector<Span<T>>& buffers);
  void ring_all_gather(MPI_Comm comm, std::vector<Span<T>>& buffers);
  void ring_step(MPI_Comm comm, std::vector<Span<T>>& buffers, int64_t send_chunk, int to,
                 int64_t recv_chunk, int from, int tag, bool add);
  void tree_all_reduce(MPI_Comm comm, std::vector<Span<T>>& buffers);
  void mpi_all_reduce(MPI_Comm comm, std::vector<Span<T>>& buffers);
  // Takes the scratch given for this collective, or sizes the own one to `count` elements.
  void take_scratch(int64_t count);
  // Elements of chunk `i` (of `parts`) over all buffers; the range [from, from + n) of that
  // concatenation packed into `out`, or unpacked from `in` (added or copied).
  static int64_t chunk_total(const std::vector<Span<T>>& buffers, int64_t parts, int64_t i);
  static void pack(const std::vector<Span<T>>& buffers, int64_t parts, int64_t i, int64_t from,
                   int64_t n, T* out);
  static void unpack(std::vector<Span<T>>& buffers, int64_t parts, int64_t i, int64_t from,
                     int64_t n, const T* in, bool add);
  // Send and receive at once, watched: a hung peer aborts the job with a message. Counts are of
  // `type` (T's by default; all_to_allv's bytes).
  void exchange(MPI_Comm comm, const void* send, int64_t send_count, int to, void* recv,
                int64_t recv_count, int from, int tag, MPI_Datatype type = mpi_type<T>());
  const GroupComms& comms_;
  bool use_mpi_;
  Watchdog& watchdog_;
  T* scratch_ = nullptr;  // given for the next collective
  int64_t scratch_count_ = 0;
  T* work_ = nullptr;  // the current collective's scratch
  int64_t work_count_ = 0;
  std::vector<T> owned_;  // grows on first use when no scratch is given
};

}  // namespace stepcast
