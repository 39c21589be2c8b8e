// Strict JSON input reading; see json_input.hpp.
#include "json_input.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "errors.hpp"
#include "gzip_file.hpp"

namespace stepcast {

namespace {

std::string render(const Json& value) {
  std::string text = value.dump();
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

// nlohmann reports a byte offset; users want line and column.
void line_column(const std::string& text, size_t byte, size_t& line, size_t& column) {
  line = 1;
  column = 1;
  for (size_t i = 0; i < byte && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
}

// The strict checks of parse_json_text, as a SAX pass that builds nothing: objects deeper than
// kMaxJsonDepth are refused (no input needs them, and a deep enough one would exhaust the stack
// of anything that walks it), and so is a key that appears twice in one object (the reader would
// otherwise keep the last, silently). (nlohmann's parser with a callback does the same checks
// but rescans a container's elements at the end of each child: quadratic in an array of
// objects, minutes for a 100 MB prediction.json.)
class StrictnessCheck {
 public:
  explicit StrictnessCheck(const std::string& file) : file_(file) {}
  bool null() { return value(); }
  bool boolean(bool) { return value(); }
  bool number_integer(Json::number_integer_t) { return value(); }
  bool number_unsigned(Json::number_unsigned_t) { return value(); }
  bool number_float(Json::number_float_t, const std::string&) { return value(); }
  bool string(std::string&) { return value(); }
  bool binary(Json::binary_t&) { return value(); }
  bool start_object(std::size_t) { return open(true); }
  bool start_array(std::size_t) { return open(false); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(std::string& key) {
    path_.push_back(key);
    if (!open_.back().keys.insert(key).second) {
      throw InputError(file_ + ": key '" + where() + "' appears twice in one object; valid: each key once");
    }
    return true;
  }
  template <class Exception>
  bool parse_error(std::size_t, const std::string&, const Exception& e) {
    throw e;  // its own type: parse_json_text words each kind
  }

 private:
  struct Container {
    bool object = false;
    std::set<std::string> keys;
  };
  std::string where() const {
    std::string out;
    for (const std::string& k : path_) out += (out.empty() ? "" : ".") + k;
    return out.empty() ? std::string("(top level)") : out;
  }
  // A value of an object ends: its key leaves the path.
  bool value() {
    if (!open_.empty() && open_.back().object && !path_.empty()) path_.pop_back();
    return true;
  }
  bool open(bool object) {
    if (open_.size() >= size_t(kMaxJsonDepth)) {
      throw InputError(file_ + ": nesting deeper than " + std::to_string(kMaxJsonDepth) + " levels under '" +
                       where() + "'; valid: a stepcast input (a few levels)");
    }
    open_.push_back({object, {}});
    return true;
  }
  bool close() {
    open_.pop_back();
    return value();
  }
  const std::string& file_;
  std::vector<Container> open_;    // the containers being read, innermost last
  std::vector<std::string> path_;  // the keys leading to the current value
};

}  // namespace

Json parse_json_text(const std::string& text, const std::string& file) {
  try {
    StrictnessCheck check(file);
    Json::sax_parse(text, &check);
    return Json::parse(text);
  } catch (const Json::parse_error& e) {
    size_t line = 0, column = 0;
    // e.byte is one past the offending character.
    line_column(text, e.byte > 0 ? e.byte - 1 : 0, line, column);
    std::string what = e.what();
    // nlohmann's text repeats the position ("parse error at line 3, column 16: ..."): keep
    // only what follows it.
    auto pos = what.find("parse error");
    if (pos != std::string::npos) what = what.substr(pos);
    auto colon = what.find(": ");
    if (what.rfind("parse error at line", 0) == 0 && colon != std::string::npos) {
      what = what.substr(colon + 2);
    }
    std::ostringstream out;
    out << file << ":" << line << ":" << column << ": malformed JSON: " << what;
    throw InputError(out.str());
  } catch (const Json::exception& e) {
    // Number overflow (1e400) and the like: nlohmann's own words, with the file.
    std::string what = e.what();
    auto bracket = what.find("] ");
    if (bracket != std::string::npos) what = what.substr(bracket + 2);
    throw InputError(file + ": malformed JSON: " + what + "; valid: numbers a double holds (about ±1.8e308)");
  }
}

std::string read_text_file(const std::string& path) {
  std::error_code ec;  // a name the system refuses (too long, ...) is not an error of its own here
  if (std::filesystem::is_directory(path, ec)) throw InputError(path + ": is a directory; valid: a file");
  if (has_gzip_suffix(path)) return read_gzip_file(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open file");
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

Json load_json_file(const std::string& path) {
  Json json = parse_json_text(read_text_file(path), path);
  if (!json.is_object()) throw InputError(path + ": top level must be a JSON object");
  return json;
}

int edit_distance(const std::string& a, const std::string& b) {
  std::vector<int> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = static_cast<int>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    int diagonal = row[0];
    row[0] = static_cast<int>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      int above = row[j];
      int substitute = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      row[j] = std::min({above + 1, row[j - 1] + 1, substitute});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string closest_name(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  int best_distance = 1 << 30;
  for (const auto& c : candidates) {
    int d = edit_distance(word, c);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  return best;
}

ObjectReader::ObjectReader(const Json& object, std::string file, std::string prefix)
    : object_(object), file_(std::move(file)), prefix_(std::move(prefix)) {
  if (!object_.is_object()) {
    throw_input_error(file_, prefix_.empty() ? "(top level)" : prefix_.substr(0, prefix_.size() - 1),
                      render(object_), "must be a JSON object", "{...}");
  }
}

bool ObjectReader::has(const std::string& key) const { return object_.contains(key); }

void ObjectReader::fail(const std::string& key, const std::string& why,
                        const std::string& valid) const {
  std::string value = object_.contains(key) ? render(object_.at(key)) : "";
  throw_input_error(file_, key_path(key), value, why, valid);
}

const Json* ObjectReader::lookup(const std::string& key) {
  known_.insert(key);
  auto it = object_.find(key);
  if (it == object_.end()) return nullptr;
  return &*it;
}

std::optional<int64_t> ObjectReader::get_optional_int(const std::string& key, int64_t min_value) {
  const Json* v = lookup(key);
  if (!v) return std::nullopt;
  std::string valid = "an integer >= " + std::to_string(min_value);
  if (!v->is_number_integer()) fail(key, "wrong type", valid);
  int64_t value = v->get<int64_t>();
  if (value < min_value) fail(key, "out of range", valid);
  return value;
}

int64_t ObjectReader::get_int(const std::string& key, int64_t min_value) {
  auto value = get_optional_int(key, min_value);
  if (!value) fail(key, "missing required key", "an integer >= " + std::to_string(min_value));
  return *value;
}

int64_t ObjectReader::get_int_or(const std::string& key, int64_t min_value,
                                 int64_t default_value) {
  return get_optional_int(key, min_value).value_or(default_value);
}

double ObjectReader::get_number(const std::string& key, double min_value, bool min_exclusive) {
  const Json* v = lookup(key);
  std::ostringstream valid;
  valid << "a number " << (min_exclusive ? "> " : ">= ") << min_value;
  if (!v) fail(key, "missing required key", valid.str());
  if (!v->is_number()) fail(key, "wrong type", valid.str());
  double value = v->get<double>();
  if (!std::isfinite(value) || value < min_value || (min_exclusive && value == min_value)) {
    fail(key, "out of range", valid.str());
  }
  return value;
}

double ObjectReader::get_number_or(const std::string& key, double min_value, bool min_exclusive,
                                   double default_value) {
  if (!has(key)) {
    known_.insert(key);
    return default_value;
  }
  return get_number(key, min_value, min_exclusive);
}

double ObjectReader::get_number_in(const std::string& key, double lo, double hi,
                                   double default_value) {
  const Json* v = lookup(key);
  if (!v) return default_value;
  std::ostringstream valid;
  valid << "a number in [" << lo << ", " << hi << "]";
  if (!v->is_number()) fail(key, "wrong type", valid.str());
  double value = v->get<double>();
  if (!(value >= lo && value <= hi)) fail(key, "out of range", valid.str());
  return value;
}

double ObjectReader::get_number_between(const std::string& key, double lo, double hi) {
  std::ostringstream valid;
  valid << "a number in [" << lo << ", " << hi << "]";
  if (!has(key)) fail(key, "missing required key", valid.str());
  return get_number_in(key, lo, hi, 0);
}

bool ObjectReader::get_bool_or(const std::string& key, bool default_value) {
  const Json* v = lookup(key);
  if (!v) return default_value;
  if (!v->is_boolean()) fail(key, "wrong type", "true or false");
  return v->get<bool>();
}

std::string ObjectReader::get_string(const std::string& key) {
  const Json* v = lookup(key);
  if (!v) fail(key, "missing required key", "a string");
  if (!v->is_string()) fail(key, "wrong type", "a string");
  std::string value = v->get<std::string>();
  // Names reach terminals and reports: no control characters (notes may hold line breaks).
  for (unsigned char c : value) {
    bool allowed_in_notes = c == '\n' || c == '\t';
    if ((c < 0x20 || c == 0x7f) && !(key == "notes" && allowed_in_notes)) {
      fail(key, "holds a control character (code " + std::to_string(int(c)) + ")",
           "printable text");
    }
  }
  return value;
}

std::string ObjectReader::get_string_or(const std::string& key, const std::string& default_value) {
  if (!has(key)) {
    known_.insert(key);
    return default_value;
  }
  return get_string(key);
}

static std::string join_quoted(const std::vector<std::string>& words) {
  std::string out;
  for (size_t i = 0; i < words.size(); ++i) {
    if (i) out += ", ";
    out += "\"" + words[i] + "\"";
  }
  return out;
}

std::string ObjectReader::get_enum(const std::string& key, const std::vector<std::string>& valid) {
  const Json* v = lookup(key);
  if (!v) fail(key, "missing required key", "one of " + join_quoted(valid));
  if (!v->is_string()) fail(key, "wrong type", "one of " + join_quoted(valid));
  std::string value = v->get<std::string>();
  if (std::find(valid.begin(), valid.end(), value) == valid.end()) {
    fail(key, "unknown value (closest: \"" + closest_name(value, valid) + "\")",
         "one of " + join_quoted(valid));
  }
  return value;
}

std::string ObjectReader::get_enum_or(const std::string& key, const std::vector<std::string>& valid,
                                      const std::string& default_value) {
  if (!has(key)) {
    known_.insert(key);
    return default_value;
  }
  return get_enum(key, valid);
}

std::vector<int64_t> ObjectReader::get_int_list(const std::string& key, int64_t min_value) {
  const Json* v = lookup(key);
  std::string valid = "a list of integers >= " + std::to_string(min_value);
  if (!v) fail(key, "missing required key", valid);
  if (!v->is_array()) fail(key, "wrong type", valid);
  std::vector<int64_t> out;
  for (const auto& item : *v) {
    if (!item.is_number_integer() || item.get<int64_t>() < min_value) {
      fail(key, "element " + render(item) + " is invalid", valid);
    }
    out.push_back(item.get<int64_t>());
  }
  return out;
}

ObjectReader ObjectReader::get_object(const std::string& key) {
  const Json* v = lookup(key);
  if (!v) fail(key, "missing required key", "a JSON object");
  if (!v->is_object()) fail(key, "wrong type", "a JSON object");
  return ObjectReader(*v, file_, prefix_ + key + ".");
}

void ObjectReader::accept(const std::string& key) { known_.insert(key); }

void ObjectReader::accept_any_of(const std::vector<std::string>& keys) {
  for (const auto& k : keys) known_.insert(k);
}

void ObjectReader::finish() const {
  for (auto it = object_.begin(); it != object_.end(); ++it) {
    if (known_.count(it.key())) continue;
    std::vector<std::string> names(known_.begin(), known_.end());
    throw_input_error(file_, key_path(it.key()), "", "unknown key",
                      "did you mean '" + closest_name(it.key(), names) + "'?");
  }
}

}  // namespace stepcast
