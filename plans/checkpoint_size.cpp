// checkpoint_size.hpp: the state bytes of a program's ranks, and their time to storage.
#include "checkpoint_size.hpp"

#include <algorithm>

namespace stepcast {

double role_state_bytes(const Role& role) {
  double bytes = 0;
  for (const Op& op : role.ops) {
    if (is_checkpointed_state(op)) bytes += op.bytes;
  }
  return bytes;
}

CheckpointSize checkpoint_size(const StepProgram& program) {
  CheckpointSize size;
  std::vector<double> per_role;
  for (const Role& role : program.roles) per_role.push_back(role_state_bytes(role));
  double node_bytes = 0;
  // Every rank, parameter servers included (they hold the optimizer state).
  for (int64_t rank = 0; rank < program.ranks(); ++rank) {
    double bytes = per_role[size_t(program.role_of_rank(rank).index)];
    size.rank_bytes_max = std::max(size.rank_bytes_max, bytes);
    size.total_bytes += bytes;
    node_bytes += bytes;
    bool node_ends = (rank + 1) % program.devices_per_node == 0 || rank + 1 == program.ranks();
    if (node_ends) {
      size.node_bytes_max = std::max(size.node_bytes_max, node_bytes);
      node_bytes = 0;
    }
  }
  return size;
}

CheckpointTimes checkpoint_times(const CheckpointSize& size, const StorageSpec& storage) {
  auto time_s = [&](double node_bandwidth, double aggregate_bandwidth) {
    double t = size.node_bytes_max / node_bandwidth;
    if (aggregate_bandwidth > 0) t = std::max(t, size.total_bytes / aggregate_bandwidth);
    return t;
  };
  CheckpointTimes times;
  times.write_s = time_s(storage.node_write_bandwidth_bytes_per_s, storage.aggregate_write_bandwidth_bytes_per_s);
  times.read_s = time_s(storage.node_read_bandwidth_bytes_per_s, storage.aggregate_read_bandwidth_bytes_per_s);
  if (storage.device_to_host_bandwidth_bytes_per_s > 0) {
    times.snapshot_s = size.rank_bytes_max / storage.device_to_host_bandwidth_bytes_per_s;
  }
  return times;
}

}  // namespace stepcast
