// A program's buffer names, interned: an op holds a 4-byte handle to its text instead of its own
// std::string. A name appears in its alloc, its free and every op that reads or writes it, and a
// deep pipeline's program holds about 10^7 ops (a 1T-parameter GPT on 512 devices), so each text
// is kept once per process. Handles compare as their texts do (equal texts, equal handles; order
// by text) and convert to `const std::string&`, valid until the process exits. Interning is
// thread-safe (the planner lowers programs on several threads); reading a handle's text is
// lock-free.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <string_view>
#include <utility>

namespace stepcast {

class BufferName {
 public:
  BufferName() = default;  // ""
  BufferName(std::string_view text);  // NOLINT: a name is written as its text
  BufferName(const std::string& text) : BufferName(std::string_view(text)) {}
  BufferName(const char* text) : BufferName(std::string_view(text)) {}

  const std::string& str() const;
  operator const std::string&() const { return str(); }  // NOLINT: used where a text is
  uint32_t handle() const { return handle_; }

  // The std::string members the program's readers use.
  bool empty() const { return handle_ == 0; }
  size_t size() const { return str().size(); }
  const char* c_str() const { return str().c_str(); }
  template <class... A>
  size_t find(A&&... a) const { return str().find(std::forward<A>(a)...); }
  template <class... A>
  size_t rfind(A&&... a) const { return str().rfind(std::forward<A>(a)...); }
  template <class... A>
  std::string substr(A&&... a) const { return str().substr(std::forward<A>(a)...); }
  template <class... A>
  int compare(A&&... a) const { return str().compare(std::forward<A>(a)...); }
  char operator[](size_t i) const { return str()[i]; }

  friend bool operator==(BufferName a, BufferName b) { return a.handle_ == b.handle_; }
  friend bool operator==(BufferName a, const std::string& b) { return a.str() == b; }
  friend bool operator==(BufferName a, std::string_view b) { return std::string_view(a.str()) == b; }
  friend bool operator==(BufferName a, const char* b) { return a.str() == b; }
  friend bool operator<(BufferName a, BufferName b) { return a.handle_ != b.handle_ && a.str() < b.str(); }
  friend std::string operator+(const std::string& a, BufferName b) { return a + b.str(); }
  friend std::string operator+(const char* a, BufferName b) { return a + b.str(); }
  friend std::string operator+(BufferName a, const std::string& b) { return a.str() + b; }
  friend std::string operator+(BufferName a, const char* b) { return a.str() + b; }
  friend std::ostream& operator<<(std::ostream& out, BufferName name);

 private:
  void intern(std::string_view text, size_t hash);
  uint32_t handle_ = 0;
};

// Distinct texts interned so far, and their bytes (for benchmarks and tests).
struct BufferNameStats {
  uint64_t names = 0;
  uint64_t text_bytes = 0;
};
BufferNameStats buffer_name_stats();

}  // namespace stepcast

template <>
struct std::hash<stepcast::BufferName> {
  size_t operator()(stepcast::BufferName name) const noexcept { return std::hash<uint32_t>()(name.handle()); }
};
