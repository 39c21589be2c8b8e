// Writing JSON text by hand, for outputs of millions of records (prediction.json's records,
// trace.json's events) that would take a JSON tree of the same size to dump.
#pragma once

#include <charconv>
#include <cmath>
#include <string>
#include <type_traits>

namespace stepcast {

// Appends the shortest text that reads back as the same number (std::to_chars), null for inf and
// nan, as the JSON writer writes them (JSON has neither).
template <class Number>
void append_json_number(std::string& out, Number value) {
  if constexpr (std::is_floating_point_v<Number>) {
    if (!std::isfinite(value)) {
      out += "null";
      return;
    }
  }
  char text[32];
  out.append(text, std::to_chars(text, text + sizeof text, value).ptr);
}

}  // namespace stepcast
