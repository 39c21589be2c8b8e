// MPI communicators per group and the collective algorithms; see mpi_collectives.hpp.
#include "mpi_collectives.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "errors.hpp"
#include "mpi_check.hpp"

namespace stepcast {

template <>
MPI_Datatype mpi_type<float>() { return MPI_FLOAT; }
template <>
MPI_Datatype mpi_type<double>() { return MPI_DOUBLE; }

GroupComms::GroupComms(const RankGrid& grid, int64_t rank, int64_t devices_per_node) {
  // A rank past the grid (a parameter server) is in no group, but takes part in every split.
  const bool in_grid = rank < grid.world_size();
  for (GroupKind kind : all_group_kinds()) {
    std::vector<int64_t> members = in_grid ? grid.group(kind, rank) : std::vector<int64_t>{};
    bool member = std::find(members.begin(), members.end(), rank) != members.end();
    if (kind == GroupKind::embedding && in_grid) {
      int64_t stage = grid.coord(rank).pp;
      member = stage == 0 || stage == grid.pp_size() - 1;
    }
    int color = member ? int(*std::min_element(members.begin(), members.end())) : MPI_UNDEFINED;
    int key = member ? int(std::find(members.begin(), members.end(), rank) - members.begin()) : 0;
    MPI_Comm comm = MPI_COMM_NULL;
    STEPCAST_MPI(MPI_Comm_split(MPI_COMM_WORLD, color, key, &comm));
    comms_[kind] = comm;
    MPI_Comm local = MPI_COMM_NULL, cross = MPI_COMM_NULL;
    if (member) {
      int node = int(rank / devices_per_node);
      STEPCAST_MPI(MPI_Comm_split(comm, node, key, &local));
      int local_index = 0;
      STEPCAST_MPI(MPI_Comm_rank(local, &local_index));
      STEPCAST_MPI(MPI_Comm_split(comm, local_index, key, &cross));
    } else {
      // Collective over MPI_COMM_WORLD's split: non-members take part with MPI_UNDEFINED.
    }
    local_[kind] = local;
    cross_[kind] = cross;
  }
}

GroupComms::~GroupComms() {
  for (auto* m : {&comms_, &local_, &cross_}) {
    for (auto& [kind, comm] : *m) {
      if (comm != MPI_COMM_NULL) STEPCAST_MPI(MPI_Comm_free(&comm));
    }
  }
}

int GroupComms::size(GroupKind kind) const {
  int n = 0;
  STEPCAST_MPI(MPI_Comm_size(comm(kind), &n));
  return n;
}

int GroupComms::index(GroupKind kind) const {
  int i = 0;
  STEPCAST_MPI(MPI_Comm_rank(comm(kind), &i));
  return i;
}

template <class T>
void Collectives<T>::exchange(MPI_Comm comm, const void* send, int64_t send_count, int to, void* recv,
                              int64_t recv_count, int from, int tag, MPI_Datatype type) {
  std::vector<MPI_Request> requests;
  std::vector<int> peers;
  // The send is posted before the receive. A rank that comes late to an exchange then announces
  // its own message before it grants the peer's: over a transport with one byte stream per pair
  // (Open MPI's TCP), the grant for a large message sent the other way round started the early
  // peer's bulk data first, and the late rank's grant from the peer queued behind it, so the
  // two directions took turns (small-gpt pp 2's tied all-reduce, 8.4 MB, at 200 Mbit/s: 456 ms
  // against 360 ms; bench/netns_put.sh).
  if (send) {
    requests.emplace_back();
    STEPCAST_MPI(MPI_Isend(send, int(send_count), type, to, tag, comm, &requests.back()));
    peers.push_back(world_rank_of(comm, to));
  }
  if (recv) {
    requests.emplace_back();
    STEPCAST_MPI(MPI_Irecv(recv, int(recv_count), type, from, tag, comm, &requests.back()));
    peers.push_back(world_rank_of(comm, from));
  }
  watchdog_.wait_all(requests, peers);
}

template <class T>
void Collectives<T>::take_scratch(int64_t count) {
  if (scratch_) {
    work_ = scratch_;
    work_count_ = scratch_count_;
    scratch_ = nullptr;
    scratch_count_ = 0;
  } else {
    if (int64_t(owned_.size()) < count) owned_.resize(size_t(count));
    work_ = owned_.data();
    work_count_ = int64_t(owned_.size());
  }
  STEPCAST_CHECK(work_count_ >= 2, "a collective needs a scratch of 2 elements at least");
}

template <class T>
int64_t Collectives<T>::chunk_total(const std::vector<Span<T>>& buffers, int64_t parts, int64_t i) {
  int64_t total = 0;
  for (const auto& b : buffers) {
    auto [first, last] = chunk_range(b.count, parts, i);
    total += last - first;
  }
  return total;
}

namespace {

// Calls f(element pointer, offset in the range, length) for the pieces of the elements
// [from, from + n) of the concatenation of chunk i of every buffer.
template <class T, class F>
void for_range(const std::vector<Span<T>>& buffers, int64_t parts, int64_t i, int64_t from,
               int64_t n, F f) {
  int64_t at = 0;
  for (const auto& b : buffers) {
    if (at >= from + n) break;
    auto [first, last] = chunk_range(b.count, parts, i);
    int64_t lo = std::max(at, from), hi = std::min(at + last - first, from + n);
    if (lo < hi) f(b.data + first + (lo - at), lo - from, hi - lo);
    at += last - first;
  }
}

}  // namespace

template <class T>
void Collectives<T>::pack(const std::vector<Span<T>>& buffers, int64_t parts, int64_t i,
                          int64_t from, int64_t n, T* out) {
  for_range(buffers, parts, i, from, n,
            [&](T* data, int64_t at, int64_t len) { std::copy(data, data + len, out + at); });
}

template <class T>
void Collectives<T>::unpack(std::vector<Span<T>>& buffers, int64_t parts, int64_t i, int64_t from,
                            int64_t n, const T* in, bool add) {
  for_range(buffers, parts, i, from, n, [&](T* data, int64_t at, int64_t len) {
    for (int64_t e = 0; e < len; ++e) data[e] = add ? data[e] + in[at + e] : in[at + e];
  });
}

// One ring step: send chunk `send_chunk` to `to` while receiving chunk `recv_chunk` from
// `from`, in segments of half the scratch (sender and receiver cut the same segments).
template <class T>
void Collectives<T>::ring_step(MPI_Comm comm, std::vector<Span<T>>& buffers, int64_t send_chunk,
                               int to, int64_t recv_chunk, int from, int tag, bool add) {
  int n = 0;
  STEPCAST_MPI(MPI_Comm_size(comm, &n));
  int64_t segment = work_count_ / 2;
  T* send = work_;
  T* recv = work_ + segment;
  int64_t send_total = chunk_total(buffers, n, send_chunk);
  int64_t recv_total = chunk_total(buffers, n, recv_chunk);
  for (int64_t at = 0; at < std::max(send_total, recv_total); at += segment) {
    int64_t sn = std::clamp<int64_t>(send_total - at, 0, segment);
    int64_t rn = std::clamp<int64_t>(recv_total - at, 0, segment);
    pack(buffers, n, send_chunk, at, sn, send);
    exchange(comm, sn > 0 ? send : nullptr, sn, to, rn > 0 ? recv : nullptr, rn, from, tag);
    unpack(buffers, n, recv_chunk, at, rn, recv, add);
  }
}

template <class T>
void Collectives<T>::ring_reduce_scatter(MPI_Comm comm, std::vector<Span<T>>& buffers) {
  int n = 0, me = 0;
  STEPCAST_MPI(MPI_Comm_size(comm, &n));
  STEPCAST_MPI(MPI_Comm_rank(comm, &me));
  int next = (me + 1) % n, prev = (me + n - 1) % n;
  // Step k: send chunk (me−k−1), receive chunk (me−k−2) and add; member me ends with chunk me.
  for (int k = 0; k < n - 1; ++k) {
    int64_t send_chunk = ((me - k - 1) % n + n) % n;
    int64_t recv_chunk = ((me - k - 2) % n + n) % n;
    ring_step(comm, buffers, send_chunk, next, recv_chunk, prev, 900 + k, true);
  }
}

template <class T>
void Collectives<T>::ring_all_gather(MPI_Comm comm, std::vector<Span<T>>& buffers) {
  int n = 0, me = 0;
  STEPCAST_MPI(MPI_Comm_size(comm, &n));
  STEPCAST_MPI(MPI_Comm_rank(comm, &me));
  int next = (me + 1) % n, prev = (me + n - 1) % n;
  for (int k = 0; k < n - 1; ++k) {
    int64_t send_chunk = ((me - k) % n + n) % n;
    int64_t recv_chunk = ((me - k - 1) % n + n) % n;
    ring_step(comm, buffers, send_chunk, next, recv_chunk, prev, 950 + k, false);
  }
}

template <class T>
void Collectives<T>::tree_all_reduce(MPI_Comm comm, std::vector<Span<T>>& buffers) {
  int n = 0, me = 0;
  STEPCAST_MPI(MPI_Comm_size(comm, &n));
  STEPCAST_MPI(MPI_Comm_rank(comm, &me));
  int depth = 0;
  while ((1 << depth) < n) ++depth;
  int64_t segment = work_count_ / 2;
  T* acc = work_;
  T* recv = work_ + segment;
  int64_t total = chunk_total(buffers, 1, 0);
  for (int64_t at = 0; at < total; at += segment) {
    int64_t m = std::min(segment, total - at);
    pack(buffers, 1, 0, at, m, acc);
    for (int k = 0; k < depth; ++k) {  // reduce up
      int span = 1 << k;
      if (me % (2 * span) == span) {
        exchange(comm, acc, m, me - span, nullptr, 0, 0, 1000 + k);
      } else if (me % (2 * span) == 0 && me + span < n) {
        exchange(comm, nullptr, 0, 0, recv, m, me + span, 1000 + k);
        for (int64_t e = 0; e < m; ++e) acc[e] += recv[e];
      }
    }
    for (int k = depth - 1; k >= 0; --k) {  // broadcast down
      int span = 1 << k;
      if (me % (2 * span) == 0 && me + span < n) {
        exchange(comm, acc, m, me + span, nullptr, 0, 0, 1100 + k);
      } else if (me % (2 * span) == span) {
        exchange(comm, nullptr, 0, 0, acc, m, me - span, 1100 + k);
      }
    }
    unpack(buffers, 1, 0, at, m, acc, false);
  }
}

// MPI's own all_reduce, in place on segments of the whole scratch.
template <class T>
void Collectives<T>::mpi_all_reduce(MPI_Comm comm, std::vector<Span<T>>& buffers) {
  int64_t total = chunk_total(buffers, 1, 0);
  for (int64_t at = 0; at < total; at += work_count_) {
    int64_t m = std::min(work_count_, total - at);
    pack(buffers, 1, 0, at, m, work_);
    STEPCAST_MPI(MPI_Allreduce(MPI_IN_PLACE, work_, int(m), mpi_type<T>(), MPI_SUM, comm));
    unpack(buffers, 1, 0, at, m, work_, false);
  }
}

template <class T>
void Collectives<T>::all_reduce(GroupKind group, Algorithm algorithm, std::vector<Span<T>> buffers) {
  MPI_Comm comm = comms_.comm(group);
  if (comms_.size(group) <= 1) return use_scratch(nullptr, 0);  // nothing to exchange
  take_scratch(2 * chunk_total(buffers, algorithm == Algorithm::tree || use_mpi_ ? 1 : comms_.size(group), 0));
  if (use_mpi_) {
    ++algorithms_used["mpi"];
    mpi_all_reduce(comm, buffers);
    return;
  }
  switch (algorithm) {
    case Algorithm::tree:
      ++algorithms_used["tree"];
      tree_all_reduce(comm, buffers);
      return;
    case Algorithm::hierarchical: {
      ++algorithms_used["hierarchical"];
      // Reduce-scatter inside the node, all_reduce of my chunk across nodes, all_gather inside.
      MPI_Comm local = comms_.local(group), cross = comms_.cross(group);
      int k = 0, local_index = 0;
      STEPCAST_MPI(MPI_Comm_size(local, &k));
      STEPCAST_MPI(MPI_Comm_rank(local, &local_index));
      ring_reduce_scatter(local, buffers);
      std::vector<Span<T>> mine;
      for (auto& b : buffers) {
        auto [first, last] = chunk_range(b.count, k, local_index);
        mine.push_back({b.data + first, last - first});
      }
      ring_reduce_scatter(cross, mine);
      ring_all_gather(cross, mine);
      ring_all_gather(local, buffers);
      return;
    }
    default:
      ++algorithms_used["ring"];
      ring_reduce_scatter(comm, buffers);
      ring_all_gather(comm, buffers);
  }
}

template <class T>
void Collectives<T>::reduce_scatter(GroupKind group, std::vector<Span<T>> buffers) {
  if (comms_.size(group) <= 1) return use_scratch(nullptr, 0);  // nothing to exchange
  take_scratch(2 * chunk_total(buffers, use_mpi_ ? 1 : comms_.size(group), 0));
  ++algorithms_used[use_mpi_ ? "mpi" : "ring"];
  if (use_mpi_) {
    // MPI_Allreduce then keep the own chunk: same result, MPI's own algorithm.
    mpi_all_reduce(comms_.comm(group), buffers);
    return;
  }
  std::vector<Span<T>> b = buffers;
  ring_reduce_scatter(comms_.comm(group), b);
}

template <class T>
void Collectives<T>::all_gather(GroupKind group, std::vector<Span<T>> buffers) {
  if (comms_.size(group) <= 1) return use_scratch(nullptr, 0);  // nothing to exchange
  take_scratch(2 * chunk_total(buffers, comms_.size(group), 0));
  ++algorithms_used[use_mpi_ ? "mpi" : "ring"];
  std::vector<Span<T>> b = buffers;
  ring_all_gather(comms_.comm(group), b);
}

template <class T>
void Collectives<T>::all_to_all(GroupKind group, Span<T> send, Span<T> recv) {
  const int n = comms_.size(group);
  STEPCAST_CHECK(send.count == recv.count && send.count % n == 0,
                 "an all_to_all of " + std::to_string(send.count) + " elements sent and " +
                     std::to_string(recv.count) + " received over " + std::to_string(n) + " members");
  const int64_t block = send.count / n;
  const int me = comms_.index(group);
  std::copy(send.data + me * block, send.data + (me + 1) * block, recv.data + me * block);
  if (n <= 1) return;
  MPI_Comm comm = comms_.comm(group);
  ++algorithms_used[use_mpi_ ? "mpi" : "pairwise"];
  if (use_mpi_) {
    STEPCAST_MPI(MPI_Alltoall(send.data, int(block), mpi_type<T>(), recv.data, int(block), mpi_type<T>(), comm));
    return;
  }
  for (int k = 1; k < n; ++k) {
    const int to = (me + k) % n, from = (me + n - k) % n;
    exchange(comm, send.data + to * block, block, to, recv.data + from * block, block, from, k);
  }
}

template <class T>
void Collectives<T>::all_to_allv(GroupKind group, const char* send, const std::vector<int64_t>& send_bytes,
                                 const std::vector<int64_t>& send_offsets, char* recv,
                                 const std::vector<int64_t>& recv_bytes, const std::vector<int64_t>& recv_offsets) {
  const int n = comms_.size(group);
  STEPCAST_CHECK(int(send_bytes.size()) == n && int(recv_bytes.size()) == n && int(send_offsets.size()) == n &&
                     int(recv_offsets.size()) == n,
                 "an all_to_allv's counts are not one per member of its group");
  const int me = comms_.index(group);
  STEPCAST_CHECK(send_bytes[size_t(me)] == recv_bytes[size_t(me)], "an all_to_allv keeps a different size than it sends itself");
  if (send + send_offsets[size_t(me)] != recv + recv_offsets[size_t(me)]) {
    std::memmove(recv + recv_offsets[size_t(me)], send + send_offsets[size_t(me)], size_t(send_bytes[size_t(me)]));
  }
  if (n <= 1) return;
  MPI_Comm comm = comms_.comm(group);
  ++algorithms_used[use_mpi_ ? "mpi" : "pairwise"];
  if (use_mpi_) {
    const size_t members = static_cast<size_t>(n);
    std::vector<int> sc(members), so(members), rc(members), ro(members);
    for (int i = 0; i < n; ++i) {
      sc[size_t(i)] = i == me ? 0 : int(send_bytes[size_t(i)]);
      so[size_t(i)] = int(send_offsets[size_t(i)]);
      rc[size_t(i)] = i == me ? 0 : int(recv_bytes[size_t(i)]);
      ro[size_t(i)] = int(recv_offsets[size_t(i)]);
    }
    STEPCAST_MPI(MPI_Alltoallv(send, sc.data(), so.data(), MPI_BYTE, recv, rc.data(), ro.data(), MPI_BYTE, comm));
    return;
  }
  for (int k = 1; k < n; ++k) {
    const int to = (me + k) % n, from = (me + n - k) % n;
    exchange(comm, send + send_offsets[size_t(to)], send_bytes[size_t(to)], to, recv + recv_offsets[size_t(from)],
             recv_bytes[size_t(from)], from, 1100 + k, MPI_BYTE);
  }
}

template class Collectives<float>;
template class Collectives<double>;

}  // namespace stepcast
