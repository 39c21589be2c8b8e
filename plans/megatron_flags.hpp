// The importer's view of a launch line (megatron_import.cpp, megatron_import_moe.cpp): each
// flag's value by name, read as an integer, a number or a choice, every refusal naming the flag
// (InputError: source, --flag, value, why, what is valid). Internal to the import.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "errors.hpp"
#include "json_input.hpp"
#include "megatron_import.hpp"

namespace stepcast {

// Flags that take no value (store_true / store_false), as megatron_import.cpp lists them.
bool megatron_switch(const std::string& name);

// The flags by name (each once; a switch without a value; no '$' left), read on demand.
class MegatronFlags {
 public:
  MegatronFlags(const std::vector<MegatronFlag>& flags, const std::string& source) : source_(source) {
    for (const MegatronFlag& f : flags) {
      if (megatron_switch(f.name) && !f.value.empty()) {
        fail(f.name, f.value, "is a switch and takes no value", "--" + f.name + " alone");
      }
      auto [it, fresh] = values_.emplace(f.name, f.value);
      if (!fresh && it->second != f.value) {
        fail(f.name, f.value, "is given twice, the first time as '" + printable_excerpt(it->second) + "'",
             "one value (argparse would silently keep the last)");
      }
      if (f.value.find('$') != std::string::npos) {
        fail(f.name, f.value, "holds a shell expression this reader does not evaluate",
             "a literal value (assign the variable as NAME=value above, or write the number)");
      }
    }
  }

  [[noreturn]] void fail(const std::string& name, const std::string& value, const std::string& why,
                         const std::string& valid) const {
    throw_input_error(source_, "--" + name, value.empty() ? "(set)" : "'" + printable_excerpt(value) + "'",
                      why, valid);
  }

  bool has(const std::string& name) const { return values_.count(name) > 0; }
  bool on(const std::string& name) const { return has(name); }
  std::optional<std::string> text(const std::string& name) const {
    auto it = values_.find(name);
    if (it == values_.end()) return std::nullopt;
    if (it->second.empty()) fail(name, "", "needs a value", "--" + name + " VALUE");
    return it->second;
  }
  std::optional<int64_t> integer(const std::string& name, int64_t min = 1) const {
    std::optional<std::string> v = text(name);
    if (!v) return std::nullopt;
    try {
      size_t used = 0;
      int64_t out = std::stoll(*v, &used);
      if (used == v->size() && out >= min && out < (int64_t{1} << 40)) return out;
    } catch (const std::exception&) {
    }
    fail(name, *v, "is not an integer in range", "an integer >= " + std::to_string(min));
  }
  int64_t required(const std::string& name) const {
    std::optional<int64_t> v = integer(name);
    if (!v) {
      throw_input_error(source_, "--" + name, "(absent)", "is required to build the model and plan",
                        "--" + name + " N");
    }
    return *v;
  }
  std::optional<double> number(const std::string& name, double min, double max) const {
    std::optional<std::string> v = text(name);
    if (!v) return std::nullopt;
    try {
      size_t used = 0;
      double out = std::stod(*v, &used);
      if (used == v->size() && out >= min && out <= max) return out;
    } catch (const std::exception&) {
    }
    fail(name, *v, "is not a number in range", "a number in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
  }
  std::string choice(const std::string& name, const std::vector<std::string>& valid,
                     const std::string& fallback) const {
    std::optional<std::string> v = text(name);
    if (!v) return fallback;
    for (const auto& c : valid) {
      if (*v == c) return c;
    }
    std::string list;
    for (const auto& c : valid) list += (list.empty() ? "" : ", ") + c;
    fail(name, *v, "is not one stepcast models", list);
  }
  const std::map<std::string, std::string>& all() const { return values_; }
  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::map<std::string, std::string> values_;
};

// The mixture-of-experts flags (megatron_import_moe.cpp): --num-experts and the rest into the model
// keys (num_local_experts, num_experts_per_tok, moe_intermediate_size, n_shared_experts,
// first_k_dense_replace, router_aux_loss_coef) beside `model`'s num_hidden_layers and
// intermediate_size, and the plan keys (expert_model_parallel_size, expert_tensor_parallel_size,
// moe_token_dispatcher_type, moe_expert_capacity_factor); without --num-experts, refuses them.
void import_moe(const MegatronFlags& f, int64_t tp, Json& model, Json& plan);

}  // namespace stepcast
