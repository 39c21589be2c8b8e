// Checkpoint files; see checkpoint.hpp.
#include "checkpoint.hpp"

#include <algorithm>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string_view>
#include <vector>

#include "errors.hpp"
#include "sha256.hpp"

namespace stepcast {

namespace {

constexpr const char* kMagic = "STEPCAST-CHECKPOINT 2\n";
constexpr const char* kMagicV1 = "STEPCAST-CHECKPOINT 1\n";
constexpr int64_t kManifestSchema = 5;  // 3: the shard layout; 4: its dp_shard_size; 5: cp, ep and etp

// A name unique to this process and call, next to `path`: writers never share a temporary.
std::string temporary_name(const std::string& path) {
  static std::mt19937_64 random{std::random_device{}()};
  char suffix[64];
  std::snprintf(suffix, sizeof suffix, ".%ld.%016llx.tmp", long(::getpid()),
                (unsigned long long)random());
  return path + suffix;
}

// Writes `pieces` one after the other to a temporary beside `path`, fsyncs it and renames it
// over `path`; hashes what it writes when `hash` is given (nothing is copied or held twice).
void write_fsync_rename(const std::string& path, const std::vector<std::string_view>& pieces,
                        Sha256* hash = nullptr) {
  std::string tmp = temporary_name(path);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw InputError(path + ": cannot write: " + std::strerror(errno));
  for (std::string_view piece : pieces) {
    if (hash) hash->update(piece);
    size_t done = 0;
    while (done < piece.size()) {
      ssize_t n = ::write(fd, piece.data() + done, piece.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        std::string why = n < 0 ? std::strerror(errno) : "no progress";
        ::close(fd);
        ::unlink(tmp.c_str());
        throw InputError(path + ": write failed: " + why);
      }
      done += size_t(n);
    }
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw InputError(path + ": fsync failed: " + why);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw InputError(path + ": rename failed: " + why);
  }
}

constexpr size_t kChunk = size_t(4) << 20;  // what a checkpoint file is read and hashed in

// Size and SHA-256 of a file, read in chunks.
std::pair<int64_t, std::string> hash_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open checkpoint file: " + std::strerror(errno));
  Sha256 hash;
  std::string chunk(kChunk, '\0');
  int64_t bytes = 0;
  while (in) {
    in.read(chunk.data(), std::streamsize(chunk.size()));
    std::streamsize n = in.gcount();
    if (n <= 0) break;
    hash.update(std::string_view(chunk.data(), size_t(n)));
    bytes += n;
  }
  if (in.bad()) throw InputError(path + ": read failed: " + std::strerror(errno));
  return {bytes, hash.hex_digest()};
}

// A count written by this code: decimal digits only, at most 18 of them.
int64_t parse_count(const std::string& digits, const std::string& path, const std::string& what) {
  if (digits.empty() || digits.size() > 18 ||
      digits.find_first_not_of("0123456789") != std::string::npos) {
    throw InputError(path + ": " + what + " '" + printable_excerpt(digits, 40) +
                     "' is not a count: the file is damaged");
  }
  return std::stoll(digits);
}

// A rank file read front to back: header lines, then each buffer's bytes straight into place.
class RankFileReader {
 public:
  explicit RankFileReader(const std::string& path) : path_(path), in_(path, std::ios::binary) {
    if (!in_) throw InputError(path + ": cannot open checkpoint file: " + std::strerror(errno));
  }
  // The next line ("KEY VALUE" or "VALUE"), at most kMaxLine bytes.
  std::string line(const std::string& what) {
    std::string out;
    for (char c; in_.get(c);) {
      if (c == '\n') return out;
      if (out.size() >= kMaxLine) throw InputError(path_ + ": a line longer than any this code writes (in " + what + ")");
      out.push_back(c);
    }
    throw InputError(path_ + ": truncated (in " + what + ")");
  }
  int64_t field(const std::string& key) {
    std::string text = line("its header");
    if (text.rfind(key + " ", 0) != 0) {
      throw InputError(path_ + ": header line '" + printable_excerpt(text, 60) + "' where '" + key +
                       " N' belongs: the file is damaged");
    }
    return parse_count(text.substr(key.size() + 1), path_, key);
  }
  void bytes(char* out, int64_t n, const std::string& what) {
    for (int64_t done = 0; done < n;) {
      std::streamsize want = std::streamsize(std::min<int64_t>(n - done, int64_t(kChunk)));
      in_.read(out + done, want);
      if (in_.gcount() != want) throw InputError(path_ + ": truncated in " + what);
      done += want;
    }
  }
  bool at_end() { return in_.peek() == std::ifstream::traits_type::eof(); }

 private:
  static constexpr size_t kMaxLine = 4096;
  std::string path_;
  std::ifstream in_;
};


bool is_sha256_hex(const std::string& s) {
  return s.size() == 64 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

}  // namespace

std::string rank_file_name(int64_t rank) {
  char name[32];
  std::snprintf(name, sizeof name, "rank-%05lld.bin", (long long)rank);
  return name;
}

std::string step_dir_name(int64_t steps_done) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", (long long)steps_done);
  return name;
}

void write_file_atomically(const std::string& path, const std::string& text) {
  write_fsync_rename(path, {text});
}

std::pair<int64_t, std::string> write_rank_checkpoint(const std::string& step_dir,
                                                      const CheckpointIdentity& identity,
                                                      const StateBuffers& buffers) {
  // The header and each buffer's name and size as text, the buffers' bytes as they are: written
  // and hashed in place, never copied into one string.
  std::vector<std::string> lines;
  lines.push_back(std::string(kMagic) + "rank " + std::to_string(identity.rank) + "\n" + "world_size " +
                  std::to_string(identity.world_size) + "\n" + "steps_done " +
                  std::to_string(identity.steps_done) + "\n" + "program " + identity.program_sha256 + "\n");
  for (const auto& [name, data] : buffers) lines.push_back(name + "\n" + std::to_string(data.second) + "\n");
  std::vector<std::string_view> pieces = {lines[0]};
  int64_t bytes = int64_t(lines[0].size());
  size_t i = 1;
  for (const auto& [name, data] : buffers) {
    pieces.push_back(lines[i]);
    pieces.push_back(std::string_view(data.first, size_t(data.second)));
    bytes += int64_t(lines[i++].size()) + data.second;
  }
  Sha256 hash;
  write_fsync_rename(step_dir + "/" + rank_file_name(identity.rank), pieces, &hash);
  return {bytes, hash.hex_digest()};
}

void read_rank_checkpoint(const std::string& step_dir, const CheckpointFile& entry,
                          const CheckpointIdentity& expected, const StateBuffers& buffers) {
  std::string path = step_dir + "/" + entry.file;
  // First the whole file against the manifest (read in chunks), so that nothing of an altered
  // file reaches the state; then read again, each buffer straight into place.
  auto [size, sha256] = hash_file(path);
  if (size != entry.bytes) {
    throw InputError(path + ": " + std::to_string(size) + " bytes where the manifest says " +
                     std::to_string(entry.bytes) + ": truncated or replaced");
  }
  if (sha256 != entry.sha256) {
    throw InputError(path + ": SHA-256 differs from the manifest: the file was altered");
  }
  RankFileReader file(path);
  std::string magic = file.line("its header") + "\n";
  if (magic == kMagicV1) {
    throw InputError(path + ": a checkpoint of an older stepcast (format 1, no identity): "
                            "valid: a checkpoint written by this version");
  }
  if (magic != kMagic) throw InputError(path + ": not a stepcast checkpoint file");
  CheckpointIdentity found;
  found.rank = file.field("rank");
  found.world_size = file.field("world_size");
  found.steps_done = file.field("steps_done");
  std::string program = file.line("its header");
  if (program.rfind("program ", 0) != 0) throw InputError(path + ": no program line: the file is damaged");
  found.program_sha256 = program.substr(8);
  auto mismatch = [&](const std::string& what, const std::string& got, const std::string& want) {
    throw InputError(path + ": holds " + what + " " + got + " where the manifest and this run have " +
                     want + ": not this checkpoint's file");
  };
  if (found.rank != expected.rank) mismatch("rank", std::to_string(found.rank), std::to_string(expected.rank));
  if (found.world_size != expected.world_size) {
    mismatch("world size", std::to_string(found.world_size), std::to_string(expected.world_size));
  }
  if (found.steps_done != expected.steps_done) {
    mismatch("the state after step", std::to_string(found.steps_done),
             std::to_string(expected.steps_done));
  }
  if (found.program_sha256 != expected.program_sha256) {
    mismatch("program", printable_excerpt(found.program_sha256, 12), expected.program_sha256.substr(0, 12));
  }
  for (const auto& [name, data] : buffers) {
    std::string got = file.line("buffer " + name);
    int64_t bytes = parse_count(file.line("buffer " + name), path, "the size of " + got);
    if (got != name || bytes != data.second) {
      throw InputError(path + ": holds buffer '" + printable_excerpt(got) + "' of " + std::to_string(bytes) +
                       " bytes where this program has '" + name + "' of " +
                       std::to_string(data.second) + ": a checkpoint of another plan");
    }
    file.bytes(data.first, bytes, "buffer " + name);
  }
  if (!file.at_end()) throw InputError(path + ": has trailing bytes: not this program's checkpoint");
}

namespace {

Json manifest_json(const CheckpointManifest& m) {
  Json files = Json::array();
  for (const CheckpointFile& f : m.files) {
    files.push_back({{"rank", f.rank}, {"file", f.file}, {"bytes", f.bytes}, {"sha256", f.sha256}});
  }
  return {{"kind", "stepcast.checkpoint"},
          {"schema_version", kManifestSchema},
          {"plan", m.plan},
          {"program_sha256", m.program_sha256},
          {"shard_layout",
           {{"tp_size", m.layout.tp_size},
            {"pp_size", m.layout.pp_size},
            {"dp_size", m.layout.dp_size},
            {"cp_size", m.layout.cp_size},
            {"ep_size", m.layout.ep_size},
            {"etp_size", m.layout.etp_size},
            {"zero_stage", m.layout.zero_stage},
            {"dp_shard_size", m.layout.dp_shard_size},
            {"order", m.layout.order}}},
          {"steps_done", m.steps_done},
          {"world_size", m.world_size},
          {"files", files}};
}

}  // namespace

std::string to_string(const CheckpointShardLayout& layout) {
  std::string experts;
  if (layout.ep_size > 1 || layout.etp_size > 1) {
    experts = ", ep " + std::to_string(layout.ep_size) +
              (layout.etp_size > 1 ? " etp " + std::to_string(layout.etp_size) : std::string());
  }
  return "tp " + std::to_string(layout.tp_size) + " × pp " + std::to_string(layout.pp_size) + " × dp " +
         std::to_string(layout.dp_size) + (layout.cp_size > 1 ? " × cp " + std::to_string(layout.cp_size) : "") +
         " (" + layout.order + ")" + experts + ", ZeRO-" + std::to_string(layout.zero_stage) +
         (layout.dp_shard_size != layout.dp_size * layout.cp_size
              ? ", shards over " + std::to_string(layout.dp_shard_size) + (layout.cp_size > 1 ? " of dp × cp" : " of dp")
              : "");
}

std::string checkpoint_manifest_text(CheckpointManifest& manifest) {
  Json j = manifest_json(manifest);
  manifest.manifest_sha256 = sha256_hex(j.dump());
  j["manifest_sha256"] = manifest.manifest_sha256;
  return j.dump(2) + "\n";
}

CheckpointManifest parse_checkpoint_manifest(const std::string& text, const std::string& file) {
  Json j = parse_json_text(text, file);
  if (!j.is_object()) throw_input_error(file, "(top level)", "", "not a JSON object", "a checkpoint manifest");
  ObjectReader r(j, file);
  r.get_enum("kind", {"stepcast.checkpoint"});
  int64_t schema = r.get_int("schema_version", 1);
  if (schema != kManifestSchema) {
    r.fail("schema_version", "format " + std::to_string(schema) + " (another stepcast's: format 3 adds the shard layout, 4 its dp_shard_size, 5 its cp, ep and etp sizes)",
           std::to_string(kManifestSchema) + ": a checkpoint written by this version");
  }
  CheckpointManifest m;
  m.plan = r.get_string("plan");
  m.program_sha256 = r.get_string("program_sha256");
  if (!is_sha256_hex(m.program_sha256)) r.fail("program_sha256", "not a SHA-256", "64 hex digits");
  if (!j.contains("shard_layout") || !j["shard_layout"].is_object()) {
    r.fail("shard_layout", "missing or not an object",
           "{tp_size, pp_size, dp_size, cp_size, ep_size, etp_size, zero_stage, dp_shard_size, order}");
  }
  r.accept("shard_layout");
  {
    ObjectReader l(j["shard_layout"], file, "shard_layout.");
    m.layout.tp_size = l.get_int("tp_size", 1);
    m.layout.pp_size = l.get_int("pp_size", 1);
    m.layout.dp_size = l.get_int("dp_size", 1);
    m.layout.cp_size = l.get_int("cp_size", 1);
    m.layout.ep_size = l.get_int("ep_size", 1);
    m.layout.etp_size = l.get_int("etp_size", 1);
    for (const char* key : {"tp_size", "pp_size", "dp_size", "cp_size", "ep_size", "etp_size"}) {
      if (l.get_int(key, 1) > (int64_t(1) << 24)) l.fail(key, "out of range", "1 … 16777216");
    }
    m.layout.zero_stage = l.get_int("zero_stage", 0);
    if (m.layout.zero_stage > 3) l.fail("zero_stage", std::to_string(m.layout.zero_stage), "0, 1, 2 or 3");
    m.layout.dp_shard_size = l.get_int("dp_shard_size", 1);
    const int64_t dp_cp = m.layout.dp_size * m.layout.cp_size;  // ZeRO shards over dp × cp
    if (dp_cp % m.layout.dp_shard_size != 0) {
      l.fail("dp_shard_size", "does not divide the " + std::to_string(dp_cp) + " ranks ZeRO shards over",
             "a divisor of dp_size · cp_size = " + std::to_string(dp_cp));
    }
    m.layout.order = l.get_string("order");
    std::vector<std::string> axes;
    for (size_t at = 0; at <= m.layout.order.size();) {
      size_t dash = std::min(m.layout.order.find('-', at), m.layout.order.size());
      axes.push_back(m.layout.order.substr(at, dash - at));
      at = dash + 1;
    }
    std::sort(axes.begin(), axes.end());
    // As a plan's `order` may be written: with or without cp (plan.cpp's valid_order).
    if (axes != std::vector<std::string>{"dp", "pp", "tp"} && axes != std::vector<std::string>{"cp", "dp", "pp", "tp"}) {
      l.fail("order", "\"" + printable_excerpt(m.layout.order) + "\"",
             "a permutation of tp, dp, pp (and cp) joined by '-'");
    }
    l.finish();
  }
  m.steps_done = r.get_int("steps_done", 1);
  m.world_size = r.get_int("world_size", 1);
  if (m.world_size > (int64_t(1) << 24)) r.fail("world_size", "out of range", "1 … 16777216");
  m.manifest_sha256 = r.get_string("manifest_sha256");
  if (!j.contains("files") || !j["files"].is_array()) {
    r.fail("files", "missing or not a list", "one entry per rank, ranks 0 … world_size − 1");
  }
  r.accept("files");
  r.finish();
  const Json& files = j["files"];
  if (int64_t(files.size()) != m.world_size) {
    r.fail("files", "names " + std::to_string(files.size()) + " files for " +
                        std::to_string(m.world_size) + " ranks",
           "one entry per rank");
  }
  for (size_t i = 0; i < files.size(); ++i) {
    std::string prefix = "files[" + std::to_string(i) + "].";
    if (!files[i].is_object()) r.fail("files[" + std::to_string(i) + "]", "not an object", "{rank, file, bytes, sha256}");
    ObjectReader f(files[i], file, prefix);
    CheckpointFile entry;
    entry.rank = f.get_int("rank", 0);
    if (entry.rank != int64_t(i)) f.fail("rank", "rank " + std::to_string(entry.rank) + " in place " + std::to_string(i), "ranks 0 … world_size − 1 in order");
    entry.file = f.get_string("file");
    if (entry.file != rank_file_name(entry.rank)) {
      f.fail("file", "\"" + printable_excerpt(entry.file) + "\" for rank " + std::to_string(entry.rank),
             "\"" + rank_file_name(entry.rank) + "\"");
    }
    entry.bytes = f.get_int("bytes", 1);
    entry.sha256 = f.get_string("sha256");
    if (!is_sha256_hex(entry.sha256)) f.fail("sha256", "not a SHA-256", "64 lowercase hex digits");
    f.finish();
    m.files.push_back(entry);
  }
  Json content = j;
  content.erase("manifest_sha256");
  if (sha256_hex(content.dump()) != m.manifest_sha256) {
    r.fail("manifest_sha256", "does not match the manifest's content: the manifest was edited",
           "a manifest as stepcast wrote it");
  }
  return m;
}

std::string checkpoint_latest_text(const CheckpointLatest& latest) {
  return latest.step_dir + " " + latest.manifest_sha256 + "\n";
}

CheckpointLatest parse_checkpoint_latest(const std::string& text, const std::string& file) {
  std::istringstream in(text);
  CheckpointLatest out;
  std::string rest;
  in >> out.step_dir >> out.manifest_sha256;
  std::getline(in, rest);
  bool step_ok = out.step_dir.size() == 13 && out.step_dir.rfind("step-", 0) == 0 &&
                 out.step_dir.find_first_not_of("0123456789", 5) == std::string::npos;
  if (!step_ok || !is_sha256_hex(out.manifest_sha256) || !rest.empty() ||
      (text.size() != out.step_dir.size() + 1 + 64 + 1)) {
    throw InputError(file + ": '" + printable_excerpt(text) +
                     "': not a checkpoint pointer; valid: \"step-NNNNNNNN <manifest SHA-256>\" "
                     "as stepcast writes it");
  }
  return out;
}

}  // namespace stepcast
