// Writing JSON text by hand, for outputs of millions of records (prediction.json's records,
// trace.json's events) that would take a JSON tree of the same size to dump.
#pragma once

#include <charconv>
#include <cmath>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

namespace stepcast {

// Two number formats: append_json_number writes the shortest text that reads back as the same
// number (std::to_chars: 2.0 as "2"); append_json_double the text nlohmann's writer gives a double
// ("2.0"), where a file's numbers were written by it before.

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

// `value` as nlohmann's JSON writer writes a double (Json(value).dump(): its shortest round-trip
// text, e.g. "2.0", and null for inf and nan), without a JSON value and string per number.
inline void append_json_double(std::string& text, double value) {
  if (!std::isfinite(value)) {
    text += "null";
    return;
  }
  char buffer[64];
  text.append(buffer, nlohmann::detail::to_chars(buffer, buffer + sizeof buffer, value));
}

}  // namespace stepcast
