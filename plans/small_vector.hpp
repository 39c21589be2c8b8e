// A vector of trivially copyable values that keeps up to N of them inside itself and goes to the
// heap only beyond: an op's deps, operands and shape are a few values each, and a deep pipeline's
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

  T* data() { return on_heap() ? heap_ : reinterpret_cast<T*>(inline_); }
  const T* data() const { return on_heap() ? heap_ : reinterpret_cast<const T*>(inline_); }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  bool empty() const { return size_ == 0; }
  T* begin() { return data(); }
  T* end() { return data() + size_; }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size_; }
  T& operator[](size_t i) { return data()[i]; }
  const T& operator[](size_t i) const { return data()[i]; }
  T& at(size_t i) {
    if (i >= size_) throw std::out_of_range("SmallVector::at");
    return data()[i];
  }
  const T& at(size_t i) const {
    if (i >= size_) throw std::out_of_range("SmallVector::at");
    return data()[i];
  }
  T& front() { return data()[0]; }
  const T& front() const { return data()[0]; }
  T& back() { return data()[size_ - 1]; }
  const T& back() const { return data()[size_ - 1]; }

  void reserve(size_t n) {
    if (n <= capacity_) return;
    T* grown = static_cast<T*>(std::malloc(n * sizeof(T)));
    if (!grown) throw std::bad_alloc();
    if (size_ > 0) std::memcpy(static_cast<void*>(grown), data(), size_ * sizeof(T));
    if (on_heap()) std::free(heap_);
    heap_ = grown;
    capacity_ = uint32_t(n);
  }
  void push_back(const T& value) {
    if (size_ == capacity_) {
      const T copy = value;  // `value` may live in this vector
      reserve(size_t(capacity_) * 2);
      data()[size_++] = copy;
      return;
    }
    data()[size_++] = value;
  }
  void pop_back() { --size_; }
  void clear() { size_ = 0; }
  template <class It>
  T* insert(const T* at, It first, It last) {
    const size_t offset = size_t(at - begin());
    std::vector<T> tail(begin() + offset, end());
    size_ = uint32_t(offset);
    for (; first != last; ++first) push_back(*first);
    for (const T& value : tail) push_back(value);
    return begin() + offset;
  }
  T* insert(const T* at, const T& value) { return insert(at, &value, &value + 1); }
  T* erase(const T* first, const T* last) {
    T* to = begin() + (first - begin());
    const size_t removed = size_t(last - first);
    std::memmove(static_cast<void*>(to), last, size_t(end() - last) * sizeof(T));
    size_ -= uint32_t(removed);
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
  bool on_heap() const { return capacity_ > N; }
  template <class It>
  void assign(It first, It last) {
    clear();
    reserve(size_t(std::distance(first, last)));
    for (; first != last; ++first) data()[size_++] = *first;
  }
  void release() {
    if (on_heap()) std::free(heap_);
    capacity_ = N;
    size_ = 0;
  }
  void take(SmallVector& other) {
    std::memcpy(static_cast<void*>(this), &other, sizeof(SmallVector));
    other.capacity_ = N;
    other.size_ = 0;
  }

  union {
    alignas(T) unsigned char inline_[N * sizeof(T)];
    T* heap_;
  };
  uint32_t size_ = 0;
  uint32_t capacity_ = N;
};

}  // namespace stepcast
