// What the profile file's reader and writer share (profile_json.cpp: the profile;
// profile_measured_json.cpp: its measured tables).
#pragma once

#include <map>
#include <optional>
#include <string>

#include "json_input.hpp"
#include "profile.hpp"

namespace stepcast {

// The array at `key` of `parent`, each element handed to `read_one` with an ObjectReader
// prefixed "KEY[i].".
template <class F>
void read_points(ObjectReader& reader, const Json& parent, const std::string& key, F read_one) {
  reader.accept(key);
  if (!parent.contains(key)) return;
  const Json& list = parent.at(key);
  if (!list.is_array()) reader.fail(key, "must be a JSON array", "[{...}, ...]");
  for (size_t i = 0; i < list.size(); ++i) {
    if (!list[i].is_object()) reader.fail(key, "element " + std::to_string(i) + " is not an object", "{...}");
    ObjectReader point(list[i], reader.file(), reader.key_path(key) + "[" + std::to_string(i) + "].");
    read_one(point, i);
    point.finish();
  }
}

inline std::optional<double> optional_number(ObjectReader& reader, const std::string& key, bool exclusive) {
  if (!reader.has(key)) {
    reader.accept(key);
    return std::nullopt;
  }
  return reader.get_number(key, 0, exclusive);
}

// The profile's `measured` section, read strictly (every point's source one of `sources`) and
// written back.
MeasuredTables parse_measured(ObjectReader& reader, const Json& json,
                              const std::map<std::string, std::string>& sources);
Json measured_to_json(const MeasuredTables& t);

}  // namespace stepcast
