// The shape interner; see op_shape.hpp.
#include "op_shape.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

namespace stepcast {

namespace {

// An interned shape: its dims, in storage that never moves or goes.
struct Entry {
  const int64_t* dims = nullptr;
  uint32_t size = 0;
};

constexpr uint32_t kChunkBits = 12;
constexpr uint32_t kChunkSize = 1u << kChunkBits;
constexpr uint32_t kMaxChunks = 1u << 16;

struct DimsHash {
  using is_transparent = void;
  size_t operator()(std::span<const int64_t> dims) const {
    size_t h = dims.size();
    for (int64_t d : dims) h = h * 1000003u ^ std::hash<int64_t>()(d);
    return h;
  }
  size_t operator()(const std::vector<int64_t>& dims) const { return (*this)(std::span<const int64_t>(dims)); }
};
struct DimsEqual {
  using is_transparent = void;
  static bool same(std::span<const int64_t> a, std::span<const int64_t> b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
  }
  bool operator()(const std::vector<int64_t>& a, const std::vector<int64_t>& b) const { return a == b; }
  bool operator()(const std::vector<int64_t>& a, std::span<const int64_t> b) const { return same(a, b); }
  bool operator()(std::span<const int64_t> a, const std::vector<int64_t>& b) const { return same(a, b); }
};

// Entries are published in chunks that are never moved: a handle's entry is read without a lock
// (the handle reached its reader after the entry was written: through the lock, or through
// whatever handed the op over).
struct Table {
  std::mutex mutex;
  std::unordered_map<std::vector<int64_t>, uint32_t, DimsHash, DimsEqual> index;
  std::array<std::atomic<Entry*>, kMaxChunks> chunks{};
  uint32_t next = 1;  // 0 is the empty shape
};

Table& table() {
  static Table* t = new Table;  // never destroyed: handles outlive static destruction
  return *t;
}

const Entry& entry(uint32_t id) {
  return table().chunks[id >> kChunkBits].load(std::memory_order_acquire)[id & (kChunkSize - 1)];
}

uint32_t intern(std::span<const int64_t> dims) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto it = t.index.find(dims);
  if (it != t.index.end()) return it->second;
  const uint32_t id = t.next;
  if ((id >> kChunkBits) >= kMaxChunks) throw std::length_error("more distinct op shapes than the interner holds");
  Entry* chunk = t.chunks[id >> kChunkBits].load(std::memory_order_relaxed);
  if (!chunk) {
    chunk = new Entry[kChunkSize];
    t.chunks[id >> kChunkBits].store(chunk, std::memory_order_release);
  }
  int64_t* stored = new int64_t[dims.size()];
  std::copy(dims.begin(), dims.end(), stored);
  chunk[id & (kChunkSize - 1)] = {stored, uint32_t(dims.size())};
  t.index.emplace(std::vector<int64_t>(dims.begin(), dims.end()), id);
  ++t.next;
  return id;
}

// Each thread's recently interned shapes: lowering repeats a few shapes millions of times.
struct Recent {
  static constexpr size_t kSize = 16;
  std::array<uint32_t, kSize> ids{};
  size_t next = 0;
  uint32_t find(std::span<const int64_t> dims) const {
    for (uint32_t id : ids) {
      if (id == 0) continue;
      const Entry& e = entry(id);
      if (DimsEqual::same({e.dims, e.size}, dims)) return id;
    }
    return 0;
  }
  void add(uint32_t id) {
    ids[next] = id;
    next = (next + 1) % kSize;
  }
};

}  // namespace

OpShape::OpShape(std::span<const int64_t> dims) {
  if (dims.empty()) return;
  thread_local Recent recent;
  id_ = recent.find(dims);
  if (id_ == 0) {
    id_ = intern(dims);
    recent.add(id_);
  }
}

std::span<const int64_t> OpShape::dims() const {
  if (id_ == 0) return {};
  const Entry& e = entry(id_);
  return {e.dims, e.size};
}

uint32_t interned_shapes() {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  return t.next - 1;
}

}  // namespace stepcast
