// Strict reading of the JSON input files (model, topology, plan, profile).
// Every key is consumed through an ObjectReader; finish() rejects keys nobody read, naming the
// closest valid key. Values are checked against their valid range here, so callers never see
// zero sizes, wrong types or unknown enum strings. No I/O besides load_json_file.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace stepcast {

using Json = nlohmann::json;

// The whole of a text file (decompressed where its name ends in ".gz"); InputError naming it when
// it is missing, unreadable or a directory.
std::string read_text_file(const std::string& path);
// Deepest nesting an input may have (stepcast's inputs need a handful of levels).
inline constexpr int kMaxJsonDepth = 64;
// Parses FILE; malformed JSON throws InputError with line and column, as do nesting deeper than
// kMaxJsonDepth, a key twice in one object, and numbers out of a double's range.
Json load_json_file(const std::string& path);
// Same for text already in memory; `file` only names it in messages.
Json parse_json_text(const std::string& text, const std::string& file);

// Levenshtein distance, for "did you mean" suggestions.
int edit_distance(const std::string& a, const std::string& b);
// The candidate closest to `word`; empty when the list is empty.
std::string closest_name(const std::string& word, const std::vector<std::string>& candidates);

// Reads one JSON object. `file` and `prefix` (e.g. "node.device.") locate keys in messages.
class ObjectReader {
 public:
  ObjectReader(const Json& object, std::string file, std::string prefix = "");

  bool has(const std::string& key) const;

  // Integers: must be JSON integers (not 2.5, not "2").
  int64_t get_int(const std::string& key, int64_t min_value);
  int64_t get_int_or(const std::string& key, int64_t min_value, int64_t default_value);
  std::optional<int64_t> get_optional_int(const std::string& key, int64_t min_value);

  // Numbers: any JSON number; `min_exclusive` true means value > min_value.
  double get_number(const std::string& key, double min_value, bool min_exclusive);
  double get_number_or(const std::string& key, double min_value, bool min_exclusive,
                       double default_value);
  double get_number_in(const std::string& key, double lo, double hi, double default_value);
  // A required number in [lo, hi] (finite).
  double get_number_between(const std::string& key, double lo, double hi);

  bool get_bool_or(const std::string& key, bool default_value);
  std::string get_string(const std::string& key);
  std::string get_string_or(const std::string& key, const std::string& default_value);
  // One of `valid`; an unknown value names the valid ones.
  std::string get_enum(const std::string& key, const std::vector<std::string>& valid);
  std::string get_enum_or(const std::string& key, const std::vector<std::string>& valid,
                          const std::string& default_value);
  std::vector<int64_t> get_int_list(const std::string& key, int64_t min_value);

  ObjectReader get_object(const std::string& key);
  // Marks keys as known but unused (e.g. HuggingFace fields stepcast does not model).
  void accept(const std::string& key);
  void accept_any_of(const std::vector<std::string>& keys);

  // Throws for the first key never read, naming the closest key that was read or accepted.
  void finish() const;

  const std::string& file() const { return file_; }
  std::string key_path(const std::string& key) const { return prefix_ + key; }
  [[noreturn]] void fail(const std::string& key, const std::string& why,
                         const std::string& valid) const;

 private:
  const Json* lookup(const std::string& key);
  const Json& object_;
  std::string file_;
  std::string prefix_;
  std::set<std::string> known_;
};

}  // namespace stepcast
