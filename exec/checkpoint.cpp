// Checkpoint file I/O; see checkpoint.hpp and executor.hpp.
#include "checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "errors.hpp"
#include "sha256.hpp"

namespace stepcast {

namespace {

constexpr const char* kMagic = "STEPCAST-CHECKPOINT 1\n";

void write_fsync_rename(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw InputError(path + ": cannot write checkpoint file: " + std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n <= 0) {
      ::close(fd);
      throw InputError(path + ": write failed: " + std::strerror(errno));
    }
    done += size_t(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    throw InputError(path + ": fsync failed: " + std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    throw InputError(path + ": rename failed: " + std::strerror(errno));
  }
}

}  // namespace

std::string rank_file_name(int64_t rank) {
  char name[32];
  std::snprintf(name, sizeof name, "rank-%05lld.bin", (long long)rank);
  return name;
}

void write_file_atomically(const std::string& path, const std::string& text) {
  write_fsync_rename(path, text);
}

std::pair<int64_t, std::string> write_rank_checkpoint(const std::string& step_dir, int64_t rank,
                                                      const StateBuffers& buffers) {
  std::string text = kMagic;
  for (const auto& [name, data] : buffers) {
    text += name + "\n" + std::to_string(data.second) + "\n";
    text.append(data.first, size_t(data.second));
  }
  write_fsync_rename(step_dir + "/" + rank_file_name(rank), text);
  return {int64_t(text.size()), sha256_hex(text)};
}

void read_rank_checkpoint(const std::string& step_dir, int64_t rank, const StateBuffers& buffers) {
  std::string path = step_dir + "/" + rank_file_name(rank);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open checkpoint file");
  std::stringstream all;
  all << in.rdbuf();
  std::string text = all.str();
  if (text.rfind(kMagic, 0) != 0) throw InputError(path + ": not a stepcast checkpoint file");
  size_t at = std::strlen(kMagic);
  for (const auto& [name, data] : buffers) {
    size_t eol = text.find('\n', at);
    size_t eol2 = eol == std::string::npos ? eol : text.find('\n', eol + 1);
    if (eol2 == std::string::npos) throw InputError(path + ": truncated (before buffer " + name + ")");
    std::string got = text.substr(at, eol - at);
    int64_t bytes = std::stoll(text.substr(eol + 1, eol2 - eol - 1));
    if (got != name || bytes != data.second) {
      throw InputError(path + ": holds buffer '" + got + "' of " + std::to_string(bytes) +
                       " bytes where this program has '" + name + "' of " +
                       std::to_string(data.second) + ": a checkpoint of another plan");
    }
    at = eol2 + 1;
    if (text.size() < at + size_t(bytes)) throw InputError(path + ": truncated in buffer " + name);
    std::memcpy(data.first, text.data() + at, size_t(bytes));
    at += size_t(bytes);
  }
  if (at != text.size()) throw InputError(path + ": has trailing bytes: not this program's checkpoint");
}

}  // namespace stepcast
