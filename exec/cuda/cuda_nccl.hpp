// The CUDA backend's NCCL communicators: world from a unique id broadcast over MPI, one split per
// group kind (NCCL ranks equal GroupComms' group indices), and two duplicates of world for the two
// pipeline directions; asynchronous-error polling and abort. The backend issues the collectives.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "mpi_collectives.hpp"
#include "topology.hpp"

namespace stepcast::cuda {

ncclDataType_t nccl_type(Dtype dtype);

// reduce: chunk `me` of `count` elements summed over the group (reduce_scatter); else every
// chunk gathered from its member (all_gather); chunks as chunk_range splits the count. In place
// when n equal chunks hold it, else through `staging` (a buffer of the bytes asked for). Errors
// name `rank` and `during`.
void chunked_collective(bool reduce, ncclComm_t comm, cudaStream_t stream, int64_t n, int64_t me, Dtype dtype,
                        char* data, int64_t count, const std::function<char*(int64_t)>& staging, int rank,
                        const std::string& during);

// Every pair at once, as NCCL's own all_to_all, in bytes: send[send_offsets[i], + send_bytes[i])
// to member i and recv[recv_offsets[j], + recv_bytes[j]) from member j, as grouped sends and
// receives on `stream` (empty blocks skipped). This member's own block is a device copy (none
// where it already lies in place). Errors name `rank` and `during`.
void exchange_blocks(ncclComm_t comm, cudaStream_t stream, int me, const char* send,
                     const std::vector<int64_t>& send_bytes, const std::vector<int64_t>& send_offsets, char* recv,
                     const std::vector<int64_t>& recv_bytes, const std::vector<int64_t>& recv_offsets, int rank,
                     const std::string& during);

class NcclCommunicators {
 public:
  NcclCommunicators() = default;
  NcclCommunicators(const NcclCommunicators&) = delete;
  NcclCommunicators& operator=(const NcclCommunicators&) = delete;

  // Collective over MPI_COMM_WORLD; `comms` gives each group kind's members.
  void create(const GroupComms& comms, int rank);
  // Destroys every communicator (the owner calls it, in its own teardown order).
  void destroy();

  // The communicator of a group kind (abort with file:line where there is none).
  ncclComm_t communicator(GroupKind kind) const;
  // Direction 0 carries traffic to a higher rank, 1 to a lower one.
  ncclComm_t p2p(int direction) const { return p2p_[direction]; }

  // An asynchronous error on any communicator aborts them all and stops the job
  // (cuda_failure.hpp), naming `rank` and `during`.
  void check_async_errors(int rank, const std::string& during);
  void abort_communicators();

 private:
  ncclComm_t world_ = nullptr;
  std::map<GroupKind, ncclComm_t> groups_;
  ncclComm_t p2p_[2] = {nullptr, nullptr};
};

}  // namespace stepcast::cuda
