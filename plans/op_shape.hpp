// An alloc's shape, interned: the dims of each distinct shape are kept once per process and an op
// holds a 4-byte handle. A deep pipeline's program holds about 10^7 ops and a few hundred distinct
// shapes; the shape was 32 bytes of every op. Reads as a read-only list of int64 dims; equal
// handles are equal dims. Thread-safe (the planner lowers on several threads).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

namespace stepcast {

class OpShape {
 public:
  using value_type = int64_t;
  using const_iterator = const int64_t*;

  OpShape() = default;  // no dims
  OpShape(std::initializer_list<int64_t> dims) : OpShape(std::span<const int64_t>(dims.begin(), dims.size())) {}
  OpShape(const std::vector<int64_t>& dims) : OpShape(std::span<const int64_t>(dims)) {}  // NOLINT: implicit
  explicit OpShape(std::span<const int64_t> dims);

  size_t size() const { return dims().size(); }
  bool empty() const { return id_ == 0; }
  int64_t operator[](size_t i) const { return dims()[i]; }
  int64_t back() const { return dims().back(); }
  const int64_t* begin() const { return dims().data(); }
  const int64_t* end() const { return dims().data() + dims().size(); }
  std::vector<int64_t> to_vector() const { return {begin(), end()}; }

  friend bool operator==(OpShape a, OpShape b) { return a.id_ == b.id_; }
  friend bool operator==(OpShape a, const std::vector<int64_t>& b) { return a.to_vector() == b; }

 private:
  std::span<const int64_t> dims() const;
  uint32_t id_ = 0;  // 0: no dims; otherwise the interned entry
};

// How many distinct non-empty shapes this process has interned.
uint32_t interned_shapes();

}  // namespace stepcast
