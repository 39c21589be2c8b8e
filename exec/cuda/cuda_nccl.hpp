// The CUDA backend's NCCL communicators: world from a unique id broadcast over MPI, one split per
// group kind (NCCL ranks equal GroupComms' group indices), and two duplicates of world for the two
// pipeline directions; asynchronous-error polling and abort. The backend issues the collectives.
#pragma once

#include <nccl.h>

#include <map>
#include <string>

#include "mpi_collectives.hpp"
#include "topology.hpp"

namespace stepcast::cuda {

ncclDataType_t nccl_type(Dtype dtype);

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
