// Checkpoint files of the executor (format in executor.hpp): one file per rank holding its
// persistent buffers, a manifest written last, all written atomically (write, fsync, rename).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "json_input.hpp"

namespace stepcast {

using StateBuffers = std::vector<std::pair<std::string, std::pair<char*, int64_t>>>;

// Writes `step_dir`/rank-RRRRR.bin; returns {file size, SHA-256 hex}.
std::pair<int64_t, std::string> write_rank_checkpoint(const std::string& step_dir, int64_t rank,
                                                      const StateBuffers& buffers);
// Reads it back into `buffers` (names and sizes must match): InputError otherwise.
void read_rank_checkpoint(const std::string& step_dir, int64_t rank, const StateBuffers& buffers);
// Writes `text` to `path` atomically.
void write_file_atomically(const std::string& path, const std::string& text);
std::string rank_file_name(int64_t rank);

}  // namespace stepcast
