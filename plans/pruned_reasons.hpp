// Why the planner's candidates were pruned, in words a person reads: a validation message's
// category (candidates refused for the same reason share one) and, for a category, its reason
// with the values it took ("pp_size · virtual_pp_size = 128–384 exceeds the 96 layers of F")
// where the category writes N and <file>.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "search.hpp"

namespace stepcast {

// "FILE: key 'KEY' = VALUE: WHY; valid: VALID" → "KEY: WHY" with numbers as N and the model's and
// topology's file names as <file>. A message without a key is "plan: MESSAGE".
std::string reason_category(const std::string& message, const std::string& model_file,
                            const std::string& topology_file);

// The "KEY: WHY" of `messages` (validation messages of one category, in any order), each number
// the range it takes over them: the value where all agree, else "min–max". Empty for no messages.
std::string reason_with_ranges(const std::vector<std::string>& messages);

// Each pruned category of `candidates` in words: a validation category (its candidates' messages
// name them: "candidate NAME: ...") as reason_with_ranges over its messages, any other (memory,
// Megatron) as it is.
std::map<std::string, std::string> pruned_reasons_in_words(const std::vector<Candidate>& candidates);

// pruned_counts keyed by pruned_reasons_in_words.
std::map<std::string, int64_t> pruned_counts_in_words(const std::vector<Candidate>& candidates);

}  // namespace stepcast
