// A vector of trivially copyable values that keeps up to N of them inside itself and goes to the
// heap only beyond: an op's deps and operands are a few values each, and a deep pipeline's
// program holds about 10^7 ops, so one heap block per field and op was most of its allocations.
// The std::vector members the program's code uses, with the same meaning.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <new>
#include <stdexcept>
#include <type_traits>
#include <vector>

namespace stepcast {

template <class T, uint32_t N>
class SmallVector {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>);

 public:
  using value_type = T;
  using size_type = size_t;
  using difference_type = std::ptrdiff_t;
  using reference = T&;
  using const_reference = const T&;
  using pointer = T*;
  using const_pointer = const T*;
  using iterator = T*;
  using const_iterator = const T*;

  SmallVector() = default;
  SmallVector(std::initializer_list<T> values) { assign(values.begin(), values.end()); }
  SmallVector(const std::vector<T>& values) { assign(values.data(), values.data() + values.size()); }  // NOLINT
  template <class It>
  SmallVector(It first, It last) {
    for (; first != last; ++first) push_back(*first);
  }
  SmallVector(const SmallVector& other) { assign(other.begin(), other.end()); }
  SmallVector(SmallVector&& other) noexcept { take(other); }
  SmallVector& operator=(const SmallVector& other) {
    if (this != &other) assign(other.begin(), other.end());
    return *this;
  }
  SmallVector& operator=(SmallVector&& other) noexcept {
    if (this != &other) {
      release();
      take(other);
    }
    return *this;
  }
  SmallVector& operator=(std::initializer_list<T> values) {
    assign(values.begin(), values.end());
    return *this;
  }
  SmallVector& operator=(const std::vector<T>& values) {
    assign(values.data(), values.data() + values.size());
    return *this;
  }
  ~SmallVector() { release(); }

  T* data() { return on_heap() ? heap_values() : reinterpret_cast<T*>(storage_); }
  const T* data() const { return on_heap() ? heap_values() : reinterpret_cast<const T*>(storage_); }
  size_t size() const { return size_ & ~kOnHeap; }
  size_t capacity() const { return on_heap() ? heap_capacity() : N; }
  bool empty() const { return size() == 0; }
  T* begin() { return data(); }
  T* end() { return data() + size(); }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size(); }
  T& operator[](size_t i) { return data()[i]; }
  const T& operator[](size_t i) const { return data()[i]; }
  T& at(size_t i) {
    if (i >= size()) throw std::out_of_range("SmallVector::at");
    return data()[i];
  }
  const T& at(size_t i) const {
    if (i >= size()) throw std::out_of_range("SmallVector::at");
    return data()[i];
  }
  T& front() { return data()[0]; }
  const T& front() const { return data()[0]; }
  T& back() { return data()[size() - 1]; }
  const T& back() const { return data()[size() - 1]; }

  void reserve(size_t n) {
    if (n <= capacity()) return;
    if (n >= kOnHeap) throw std::length_error("SmallVector: too many values");
    unsigned char* block = static_cast<unsigned char*>(std::malloc(kHeader + n * sizeof(T)));
    if (!block) throw std::bad_alloc();
    const uint32_t capacity = uint32_t(n);
    std::memcpy(block, &capacity, sizeof(capacity));
    if (size() > 0) std::memcpy(block + kHeader, static_cast<const void*>(data()), size() * sizeof(T));
    if (on_heap()) std::free(heap_block());
    std::memcpy(storage_, &block, sizeof(block));
    size_ |= kOnHeap;
  }
  void push_back(const T& value) {
    if (size() == capacity()) {
      const T copy = value;  // `value` may live in this vector
      reserve(capacity() * 2);
      data()[size()] = copy;
      ++size_;
      return;
    }
    data()[size()] = value;
    ++size_;
  }
  void pop_back() { --size_; }
  void clear() { size_ &= kOnHeap; }
  template <class It>
  T* insert(const T* at, It first, It last) {
    const size_t offset = size_t(at - begin());
    std::vector<T> tail(begin() + offset, end());
    set_size(offset);
    for (; first != last; ++first) push_back(*first);
    for (const T& value : tail) push_back(value);
    return begin() + offset;
  }
  T* insert(const T* at, const T& value) { return insert(at, &value, &value + 1); }
  T* erase(const T* first, const T* last) {
    T* to = begin() + (first - begin());
    const size_t removed = size_t(last - first);
    std::memmove(static_cast<void*>(to), last, size_t(end() - last) * sizeof(T));
    set_size(size() - removed);
    return to;
  }
  T* erase(const T* at) { return erase(at, at + 1); }

  std::vector<T> to_vector() const { return std::vector<T>(begin(), end()); }

  friend bool operator==(const SmallVector& a, const SmallVector& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
  friend bool operator==(const SmallVector& a, const std::vector<T>& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  // The values are inline, or (the top bit of size_) in a heap block: its capacity in a header of
  // kHeader bytes, the values after it. The block's address is kept in the inline bytes, copied
  // in and out, so that the vector aligns as T and not as a pointer: an op holds three of these,
  // 20, 20 and 12 bytes instead of 24, 24 and 16.
  static constexpr uint32_t kOnHeap = uint32_t(1) << 31;
  static constexpr size_t kHeader = alignof(T) > sizeof(uint32_t) ? alignof(T) : sizeof(uint32_t);
  static constexpr size_t kInlineBytes = N * sizeof(T) > sizeof(void*) ? N * sizeof(T) : sizeof(void*);

  bool on_heap() const { return (size_ & kOnHeap) != 0; }
  unsigned char* heap_block() const {
    unsigned char* block;
    std::memcpy(&block, storage_, sizeof(block));
    return block;
  }
  T* heap_values() const { return reinterpret_cast<T*>(heap_block() + kHeader); }
  size_t heap_capacity() const {
    uint32_t capacity;
    std::memcpy(&capacity, heap_block(), sizeof(capacity));
    return capacity;
  }
  void set_size(size_t n) { size_ = (size_ & kOnHeap) | uint32_t(n); }
  template <class It>
  void assign(It first, It last) {
    clear();
    reserve(size_t(std::distance(first, last)));
    for (; first != last; ++first) {
      data()[size()] = *first;
      ++size_;
    }
  }
  void release() {
    if (on_heap()) std::free(heap_block());
    size_ = 0;
  }
  void take(SmallVector& other) {
    std::memcpy(static_cast<void*>(this), &other, sizeof(SmallVector));
    other.size_ = 0;
  }

  alignas(T) unsigned char storage_[kInlineBytes];
  uint32_t size_ = 0;
};

}  // namespace stepcast
