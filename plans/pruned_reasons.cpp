// Pruned candidates' reasons; see pruned_reasons.hpp.
#include "pruned_reasons.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>

namespace stepcast {

namespace {

// A message's key and the reason after it, "; valid: ..." left out.
std::pair<std::string, std::string> key_and_why(const std::string& message) {
  std::string key = "plan";
  std::string why = message;
  auto k = message.find("key '");
  if (k != std::string::npos) {
    auto end = message.find('\'', k + 5);
    key = message.substr(k + 5, end - k - 5);
    auto colon = message.find(": ", end);
    why = colon == std::string::npos ? "" : message.substr(colon + 2);
  }
  auto valid = why.find("; valid:");
  if (valid != std::string::npos) why.resize(valid);
  return {key, why};
}

// `text` cut into pieces that alternate text and number (a run of digits and dots), text first.
std::vector<std::string> pieces(const std::string& text) {
  std::vector<std::string> out(1);
  for (size_t i = 0; i < text.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(text[i]))) {
      out.back() += text[i];
      continue;
    }
    std::string number(1, text[i]);
    while (i + 1 < text.size() && (std::isdigit(static_cast<unsigned char>(text[i + 1])) || text[i + 1] == '.')) {
      number += text[++i];
    }
    out.push_back(number);
    out.emplace_back();
  }
  return out;
}

}  // namespace

std::string reason_category(const std::string& message, const std::string& model_file,
                            const std::string& topology_file) {
  auto [key, why] = key_and_why(message);
  for (const std::string& file : {model_file, topology_file}) {
    for (auto at = why.find(file); !file.empty() && at != std::string::npos; at = why.find(file)) {
      why.replace(at, file.size(), "<file>");
    }
  }
  std::vector<std::string> parts = pieces(why);
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += i % 2 ? "N" : parts[i];
  return key + ": " + out;
}

std::string reason_with_ranges(const std::vector<std::string>& messages) {
  if (messages.empty()) return "";
  auto [key, why] = key_and_why(messages.front());
  std::vector<std::string> first = pieces(why);
  // Per number slot: the smallest and largest value, as written.
  std::vector<std::pair<std::string, std::string>> range;
  for (size_t i = 1; i < first.size(); i += 2) range.emplace_back(first[i], first[i]);
  for (const std::string& message : messages) {
    std::vector<std::string> parts = pieces(key_and_why(message).second);
    if (parts.size() != first.size()) continue;  // another shape: not of this category
    for (size_t i = 1; i < parts.size(); i += 2) {
      auto& [low, high] = range[i / 2];
      const double v = std::strtod(parts[i].c_str(), nullptr);
      if (v < std::strtod(low.c_str(), nullptr)) low = parts[i];
      if (v > std::strtod(high.c_str(), nullptr)) high = parts[i];
    }
  }
  std::string out = key + ": ";
  for (size_t i = 0; i < first.size(); ++i) {
    if (i % 2 == 0) {
      out += first[i];
      continue;
    }
    const auto& [low, high] = range[i / 2];
    out += low == high ? low : low + "–" + high;
  }
  return out;
}

std::map<std::string, std::string> pruned_reasons_in_words(const std::vector<Candidate>& candidates) {
  std::map<std::string, std::vector<std::string>> messages;  // per validation category
  std::map<std::string, std::string> out;
  for (const auto& c : candidates) {
    if (c.kept()) continue;
    out[c.pruned] = c.pruned;
    if (c.pruned_detail.rfind("candidate ", 0) == 0) messages[c.pruned].push_back(c.pruned_detail);
  }
  for (const auto& [category, texts] : messages) out[category] = reason_with_ranges(texts);
  return out;
}

std::map<std::string, int64_t> pruned_counts_in_words(const std::vector<Candidate>& candidates) {
  const std::map<std::string, std::string> words = pruned_reasons_in_words(candidates);
  std::map<std::string, int64_t> out;
  for (const auto& [category, n] : pruned_counts(candidates)) out[words.at(category)] += n;
  return out;
}

}  // namespace stepcast
