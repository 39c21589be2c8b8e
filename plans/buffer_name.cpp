#include "buffer_name.hpp"

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <ostream>
#include <stdexcept>
#include <vector>

namespace stepcast {

namespace {

// The texts in 16 shards chosen by hash, each with its own lock, so that threads lowering at once
// seldom wait for each other. A handle is (index in its shard + 1) << 4 | shard; 0 is "". A shard
// keeps its texts in chunks that never move: a reader finds a text through the chunk's pointer,
// published (release) before any handle into the chunk is handed out.
constexpr uint32_t kShardBits = 4, kShards = 1u << kShardBits;
constexpr uint32_t kChunkBits = 14, kChunkSize = 1u << kChunkBits;
constexpr uint32_t kMaxChunks = 1u << (32 - kShardBits - kChunkBits);

// A shard's index of its texts: open addressing, each slot the text's hash bits above the shard's
// (32 of them) and its handle, so that a probe reads one slot and a text only where the bits match.
struct Shard {
  std::mutex lock;
  std::vector<uint64_t> slots;  // (hash bits << 32) | handle; 0: empty
  uint32_t count = 0;
  uint64_t text_bytes = 0;
  std::array<std::atomic<std::string*>, kMaxChunks> chunks{};

  const std::string& text(uint32_t index) const {
    return chunks[index >> kChunkBits].load(std::memory_order_relaxed)[index & (kChunkSize - 1)];
  }
  static uint32_t bits(size_t hash) { return uint32_t(uint64_t(hash) >> kShardBits); }
  // The slot holding `text`'s handle, or the empty slot where it goes.
  uint64_t& find(std::string_view text, uint32_t hash_bits) {
    const size_t mask = slots.size() - 1;
    for (size_t at = hash_bits & mask;; at = (at + 1) & mask) {
      uint64_t& slot = slots[at];
      if (slot == 0) return slot;
      if (uint32_t(slot >> 32) == hash_bits && text == this->text((uint32_t(slot) >> kShardBits) - 1)) return slot;
    }
  }
  // Doubles the index once it is half full (every text hashed again).
  void grow() {
    std::vector<uint64_t> old = std::move(slots);
    slots.assign(old.empty() ? 1024 : old.size() * 2, 0);
    for (uint64_t slot : old) {
      if (slot == 0) continue;
      const std::string& t = text((uint32_t(slot) >> kShardBits) - 1);
      find(t, bits(std::hash<std::string_view>()(t))) = slot;
    }
  }
};

struct Interner {
  std::array<Shard, kShards> shards;
  const std::string empty;
};

Interner& interner() {
  static Interner* const instance = new Interner;  // never destroyed: handles outlive static destructors
  return *instance;
}

// Each thread's recent names by hash: a lowering uses a buffer's name at its alloc, its users and
// its free, a few ops apart, so most names are found here without the lock or the shard's index.
struct RecentName {
  size_t hash = 0;
  uint32_t handle = 0;
};
constexpr size_t kRecentNames = 4096;
thread_local std::array<RecentName, kRecentNames> recent_names;

}  // namespace

BufferName::BufferName(std::string_view text) {
  if (text.empty()) return;
  const size_t hash = std::hash<std::string_view>()(text);
  RecentName& recent = recent_names[hash & (kRecentNames - 1)];
  if (recent.handle != 0 && recent.hash == hash) {
    handle_ = recent.handle;
    if (str() == text) return;
  }
  intern(text, hash);
  recent = {hash, handle_};
}

void BufferName::intern(std::string_view text, size_t hash) {
  const uint32_t shard_index = uint32_t(hash) & (kShards - 1);
  Shard& shard = interner().shards[shard_index];
  const uint32_t hash_bits = Shard::bits(hash);
  std::lock_guard<std::mutex> guard(shard.lock);
  if (2 * (size_t(shard.count) + 1) > shard.slots.size()) shard.grow();
  uint64_t& slot = shard.find(text, hash_bits);
  if (slot != 0) {
    handle_ = uint32_t(slot);
    return;
  }
  const uint32_t index = shard.count;
  if ((index >> kChunkBits) >= kMaxChunks - 1) throw std::length_error("too many distinct buffer names");
  std::string* chunk = shard.chunks[index >> kChunkBits].load(std::memory_order_relaxed);
  if (!chunk) {
    chunk = new std::string[kChunkSize];
    shard.chunks[index >> kChunkBits].store(chunk, std::memory_order_release);
  }
  std::string& stored = chunk[index & (kChunkSize - 1)];
  stored.assign(text);
  ++shard.count;
  shard.text_bytes += text.size();
  handle_ = ((index + 1) << kShardBits) | shard_index;
  slot = uint64_t(hash_bits) << 32 | handle_;
}

const std::string& BufferName::str() const {
  Interner& all = interner();
  if (handle_ == 0) return all.empty;
  const uint32_t index = (handle_ >> kShardBits) - 1;
  const std::string* chunk =
      all.shards[handle_ & (kShards - 1)].chunks[index >> kChunkBits].load(std::memory_order_acquire);
  return chunk[index & (kChunkSize - 1)];
}

std::ostream& operator<<(std::ostream& out, BufferName name) { return out << name.str(); }

BufferNameStats buffer_name_stats() {
  BufferNameStats stats;
  for (Shard& shard : interner().shards) {
    std::lock_guard<std::mutex> guard(shard.lock);
    stats.names += shard.count;
    stats.text_bytes += shard.text_bytes;
  }
  return stats;
}

}  // namespace stepcast
