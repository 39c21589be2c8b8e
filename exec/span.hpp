// A buffer of `count` elements of T at `data` (backend memory): what collectives take.
#pragma once

#include <cstdint>

namespace stepcast {

template <class T>
struct Span {
  T* data;
  int64_t count;
};

}  // namespace stepcast
