// What a checkpoint of a program holds and how long storage takes to write and read it back.
// A rank saves its persistent weights and optimizer buffers, and under asynchronous data
// parallelism its stale gradients (is_checkpointed_state; exec/checkpoint_run.cpp writes exactly
// these, each rank its own file, replicas included); ranks sit on nodes in order,
// devices_per_node each. Bytes and seconds; pure (no I/O).
#pragma once

#include <cstdint>

#include "program.hpp"
#include "topology.hpp"

namespace stepcast {

struct CheckpointSize {
  double rank_bytes_max = 0;   // the largest rank's state
  double node_bytes_max = 0;   // the largest node's: the sum of its ranks
  double total_bytes = 0;      // every rank's file together
};
CheckpointSize checkpoint_size(const StepProgram& program);
// The checkpointed state bytes of one role: what each of its ranks saves.
double role_state_bytes(const Role& role);

struct CheckpointTimes {
  double write_s = 0;     // every node writes its ranks' files at once
  double read_s = 0;      // and reads them back on a restart
  double snapshot_s = 0;  // a rank's state copied from the device to host memory (0: no figure)
};
// max(node bytes / node bandwidth, total bytes / aggregate bandwidth), for writing and reading.
CheckpointTimes checkpoint_times(const CheckpointSize& size, const StorageSpec& storage);

}  // namespace stepcast
