// The CUDA backend's NCCL communicators (cuda_nccl.hpp).
#include "cuda_nccl.hpp"

#include <mpi.h>

#include "cuda_failure.hpp"
#include "device_checks.hpp"
#include "errors.hpp"
#include "mpi_check.hpp"

namespace stepcast::cuda {

ncclDataType_t nccl_type(Dtype dtype) {
  switch (dtype) {
    case Dtype::bf16:
      return ncclBfloat16;
    case Dtype::fp16:
      return ncclFloat16;
    case Dtype::fp64:
      return ncclFloat64;
    case Dtype::int32:
      return ncclInt32;
    case Dtype::int64:
      return ncclInt64;
    case Dtype::fp8_e4m3:
    case Dtype::fp8_e5m2:
    case Dtype::mxfp8_e4m3:
    case Dtype::mxfp8_e5m2:
    case Dtype::fp8_block_e4m3:
    case Dtype::fp8_block_e5m2:
    case Dtype::fp8_tile_e4m3:
    case Dtype::u8:
      return ncclUint8;  // (FP8 codes are gathered, never reduced)
    default:
      return ncclFloat32;
  }
}

void chunked_collective(bool reduce, ncclComm_t comm, cudaStream_t stream, int64_t n, int64_t me, Dtype dtype,
                        char* data, int64_t count, const std::function<char*(int64_t)>& staging_of, int rank,
                        const std::string& during) {
  const int64_t e = dtype_bytes(dtype), chunk = (count + n - 1) / n;
  const ncclDataType_t type = nccl_type(dtype);
  if (chunk == 0) return;
  auto copy = [&](char* to, const char* from, int64_t bytes) {
    check_cuda(cudaMemcpyAsync(to, from, size_t(bytes), cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync", rank,
               during);
  };
  if (chunk * n == count) {
    if (reduce) {
      check_nccl(ncclReduceScatter(data, data + me * chunk * e, size_t(chunk), type, ncclSum, comm, stream),
                 "ncclReduceScatter", rank, during);
    } else {
      check_nccl(ncclAllGather(data + me * chunk * e, data, size_t(chunk), type, comm, stream), "ncclAllGather", rank,
                 during);
    }
    return;
  }
  char* staging = staging_of(chunk * n * e);
  auto [first, last] = chunk_range(count, n, me);
  if (reduce) {
    check_cuda(cudaMemsetAsync(staging + count * e, 0, size_t((chunk * n - count) * e), stream), "cudaMemsetAsync",
               rank, during);
    copy(staging, data, count * e);
    check_nccl(ncclReduceScatter(staging, staging + me * chunk * e, size_t(chunk), type, ncclSum, comm, stream),
               "ncclReduceScatter", rank, during);
    if (last > first) copy(data + first * e, staging + me * chunk * e, (last - first) * e);
  } else {
    if (last > first) copy(staging + me * chunk * e, data + first * e, (last - first) * e);
    check_nccl(ncclAllGather(staging + me * chunk * e, staging, size_t(chunk), type, comm, stream), "ncclAllGather",
               rank, during);
    copy(data, staging, count * e);
  }
}

void exchange_blocks(ncclComm_t comm, cudaStream_t stream, int me, const char* send,
                     const std::vector<int64_t>& send_bytes, const std::vector<int64_t>& send_offsets, char* recv,
                     const std::vector<int64_t>& recv_bytes, const std::vector<int64_t>& recv_offsets, int rank,
                     const std::string& during) {
  const size_t n = send_bytes.size();
  STEPCAST_CHECK(send_offsets.size() == n && recv_bytes.size() == n && recv_offsets.size() == n && size_t(me) < n,
                 "an exchange's blocks are not one per member");
  STEPCAST_CHECK(send_bytes[size_t(me)] == recv_bytes[size_t(me)], "a member's block to itself changes size");
  const char* own_from = send + send_offsets[size_t(me)];
  char* own_to = recv + recv_offsets[size_t(me)];
  if (own_from != own_to && send_bytes[size_t(me)] > 0) {
    check_cuda(cudaMemcpyAsync(own_to, own_from, size_t(send_bytes[size_t(me)]), cudaMemcpyDeviceToDevice, stream),
               "cudaMemcpyAsync", rank, during);
  }
  check_nccl(ncclGroupStart(), "ncclGroupStart", rank, during);
  for (size_t peer = 0; peer < n; ++peer) {
    if (int(peer) == me) continue;
    if (send_bytes[peer] > 0) {
      check_nccl(ncclSend(send + send_offsets[peer], size_t(send_bytes[peer]), ncclInt8, int(peer), comm, stream),
                 "ncclSend", rank, during);
    }
    if (recv_bytes[peer] > 0) {
      check_nccl(ncclRecv(recv + recv_offsets[peer], size_t(recv_bytes[peer]), ncclInt8, int(peer), comm, stream),
                 "ncclRecv", rank, during);
    }
  }
  check_nccl(ncclGroupEnd(), "ncclGroupEnd", rank, during);
}

// World from a unique id broadcast over MPI; one split per group kind (color: the group's
// first world rank; key: the index in the group, so NCCL ranks equal group indices); two
// duplicates of world for the two pipeline directions.
void NcclCommunicators::create(const GroupComms& comms, int rank) {
  int size = 0;
  STEPCAST_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size));
  ncclUniqueId id{};
  if (rank == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId", rank, "NCCL bootstrap");
  STEPCAST_MPI(MPI_Bcast(&id, int(sizeof id), MPI_BYTE, 0, MPI_COMM_WORLD));
  check_nccl(ncclCommInitRank(&world_, size, id, rank), "ncclCommInitRank", rank, "NCCL bootstrap");
  for (GroupKind kind : all_group_kinds()) {
    MPI_Comm mpi = comms.comm(kind);
    int color = NCCL_SPLIT_NOCOLOR, key = 0;
    if (mpi != MPI_COMM_NULL) {
      MPI_Group group, world_group;
      STEPCAST_MPI(MPI_Comm_group(mpi, &group));
      STEPCAST_MPI(MPI_Comm_group(MPI_COMM_WORLD, &world_group));
      int first = 0, first_world = 0;
      STEPCAST_MPI(MPI_Group_translate_ranks(group, 1, &first, world_group, &first_world));
      STEPCAST_MPI(MPI_Group_free(&group));
      STEPCAST_MPI(MPI_Group_free(&world_group));
      color = first_world;
      STEPCAST_MPI(MPI_Comm_rank(mpi, &key));
    }
    ncclComm_t comm = nullptr;
    check_nccl(ncclCommSplit(world_, color, key, &comm, nullptr), "ncclCommSplit", rank,
               std::string("NCCL communicator for group ") + to_string(kind));
    groups_[kind] = comm;
  }
  for (ncclComm_t& comm : p2p_) {
    check_nccl(ncclCommSplit(world_, 0, rank, &comm, nullptr), "ncclCommSplit", rank, "NCCL pipeline communicators");
  }
}

void NcclCommunicators::destroy() {
  for (auto& [kind, comm] : groups_) {
    if (comm) ncclCommDestroy(comm);
  }
  for (ncclComm_t comm : p2p_) {
    if (comm) ncclCommDestroy(comm);
  }
  if (world_) ncclCommDestroy(world_);
}

ncclComm_t NcclCommunicators::communicator(GroupKind kind) const {
  auto it = groups_.find(kind);
  STEPCAST_CHECK(it != groups_.end() && it->second != nullptr,
                 std::string("no NCCL communicator for group ") + to_string(kind));
  return it->second;
}

void NcclCommunicators::check_async_errors(int rank, const std::string& during) {
  auto check = [&](ncclComm_t comm) {
    if (!comm) return;
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress) {
      std::string detail = ncclGetErrorString(async);
      if (const char* last = ncclGetLastError(comm)) detail += std::string("; ") + last;
      abort_communicators();
      fail_job(device_failure_message(rank, "NCCL", "ncclResult " + std::to_string(int(async)), detail, during));
    }
  };
  check(world_);
  for (auto& [kind, comm] : groups_) check(comm);
  for (ncclComm_t comm : p2p_) check(comm);
}

void NcclCommunicators::abort_communicators() {
  for (auto& [kind, comm] : groups_) {
    if (comm) ncclCommAbort(comm);
    comm = nullptr;
  }
  for (ncclComm_t& comm : p2p_) {
    if (comm) ncclCommAbort(comm);
    comm = nullptr;
  }
  if (world_) ncclCommAbort(world_);
  world_ = nullptr;
}

}  // namespace stepcast::cuda
