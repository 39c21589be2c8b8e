// Checkpoint files of the executor: DIR/step-NNNNNNNN/ holds one file per rank with its
// persistent buffers (weights and optimizer state) and manifest.json; DIR/latest names the
// newest complete one. Every file is written atomically (write, fsync, rename).
//
// Nothing in a checkpoint is trusted unless it verifies completely:
// - a rank file starts with its identity (rank, world size, steps done, program hash) and then
//   its buffers by name and size;
// - the manifest names the plan, the program hash, the steps done, the world size and every
//   rank's file (exactly ranks 0 … N−1, in order) with its size and SHA-256, and carries the
//   SHA-256 of its own content (`manifest_sha256`, over the manifest without that key);
// - `latest` names the step directory and that manifest hash.
// An edited manifest (a step, a file list), a file altered or truncated, or a file of another
// rank, step or program is refused. Parsing is pure (no MPI): the loaders are fuzzed.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "json_input.hpp"

namespace stepcast {

using StateBuffers = std::vector<std::pair<std::string, std::pair<char*, int64_t>>>;

// Who a rank file belongs to; written into it and checked when it is read back.
struct CheckpointIdentity {
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t steps_done = 0;
  std::string program_sha256;
};

struct CheckpointFile {
  int64_t rank = 0;
  std::string file;       // rank_file_name(rank)
  int64_t bytes = 0;
  std::string sha256;     // 64 lowercase hex digits
};

// How the state is cut over the ranks (the rank grid's sizes and which ZeRO stage shards what,
// shard_layout.hpp): with the program's hash, what decides whether a checkpoint fits a run.
struct CheckpointShardLayout {
  int64_t tp_size = 1, pp_size = 1, dp_size = 1;
  int64_t cp_size = 1;        // context parallelism: cp ranks hold the same weights, ZeRO shards over dp × cp
  int64_t ep_size = 1;        // expert parallelism: each ep rank holds its own experts
  int64_t etp_size = 1;       // expert tensor parallelism: each etp rank a slice of its experts
  int64_t zero_stage = 0;
  int64_t dp_shard_size = 1;  // the ranks a shard spreads over: dp_size, or less under hybrid sharding
  std::string order = "tp-dp-pp";
  bool operator==(const CheckpointShardLayout&) const = default;
};
// "tp 2 × pp 1 × dp 2 (tp-dp-pp), ZeRO-1", with " × cp 2" after dp under context parallelism,
// ", ep 2" (and " etp 2") with experts and ", shards over 2 of dp" under hybrid sharding
std::string to_string(const CheckpointShardLayout& layout);

struct CheckpointManifest {
  std::string plan;
  std::string program_sha256;
  CheckpointShardLayout layout;
  int64_t steps_done = 0;
  int64_t world_size = 0;
  std::vector<CheckpointFile> files;
  std::string manifest_sha256;  // of the manifest's content without this key
};

// What DIR/latest says: the step directory and its manifest's hash.
struct CheckpointLatest {
  std::string step_dir;   // step_dir_name(steps)
  std::string manifest_sha256;
};

std::string rank_file_name(int64_t rank);        // "rank-00003.bin"
std::string step_dir_name(int64_t steps_done);   // "step-00000004"

// Writes `step_dir`/rank_file_name(rank); returns {file size, SHA-256 hex}.
std::pair<int64_t, std::string> write_rank_checkpoint(const std::string& step_dir,
                                                      const CheckpointIdentity& identity,
                                                      const StateBuffers& buffers);
// Reads it back into `buffers`, checking its size and hash against `entry`, its identity against
// `expected`, and the buffers' names and sizes; InputError naming the file otherwise.
void read_rank_checkpoint(const std::string& step_dir, const CheckpointFile& entry,
                          const CheckpointIdentity& expected, const StateBuffers& buffers);

// The manifest's text, `manifest_sha256` filled in (and returned in `manifest`).
std::string checkpoint_manifest_text(CheckpointManifest& manifest);
// Strict: every key, type and range, ranks 0 … world_size−1 in order, and the self-hash.
CheckpointManifest parse_checkpoint_manifest(const std::string& text, const std::string& file);
std::string checkpoint_latest_text(const CheckpointLatest& latest);
CheckpointLatest parse_checkpoint_latest(const std::string& text, const std::string& file);

// Writes `text` to `path` atomically (a temporary name of this process, fsync, rename).
void write_file_atomically(const std::string& path, const std::string& text);

}  // namespace stepcast
