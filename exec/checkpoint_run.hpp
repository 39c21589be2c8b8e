// Checkpoints of a run (the files and their formats: checkpoint.hpp): DIR/step-NNNNNNNN/ holds
// one file per rank (its weights and optimizer state; the data position and dropout masks follow
// from the step number) and manifest.json, written by rank 0 once every rank's file is on disk;
// DIR/latest names the newest complete one and its manifest's hash. A checkpoint fits a run when
// its shard layout and its program's hash are the run's.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "checkpoint.hpp"
#include "plan.hpp"
#include "program.hpp"
#include "watchdog.hpp"

namespace stepcast {

// How the program cuts the state over its ranks.
CheckpointShardLayout checkpoint_shard_layout(const StepProgram& program, const Plan& plan);

struct CheckpointInfo {
  std::string path;  // the step directory
  int64_t step = 0;  // steps completed
  CheckpointManifest manifest;
};
// The newest complete checkpoint in `dir`, its pointer and manifest verified (InputError when
// there is none or it does not verify; the shard layout, `program_sha256` and `world_size` must
// match). Each rank's file is verified when that rank reads it.
CheckpointInfo find_checkpoint(const std::string& dir, const std::string& program_sha256,
                               const CheckpointShardLayout& layout, int64_t world_size);

// Every rank writes its file (`state` gives its buffers, downloaded; `before_write` runs first:
// the backend's hook); rank 0 writes the manifest once every file is on disk, then `latest`. A
// rank that cannot write (a full or read-only disk) stops every rank, each with one line; every
// wait is under the watchdog.
void save_checkpoint(const StepProgram& program, const Plan& plan, const std::string& dir, int64_t steps_done,
                     ControlChannel& control, const std::function<StateBuffers()>& state,
                     const std::function<void()>& before_write);

}  // namespace stepcast
