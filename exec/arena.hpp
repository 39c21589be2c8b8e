// One arena per rank for every buffer of the StepProgram, laid out as plan_arena placed it
// (plans/arena_plan.hpp): nothing is allocated during steps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "arena_plan.hpp"
#include "program.hpp"

namespace stepcast {

class Arena {
 public:
  Arena() = default;
  // Indexes the buffers by name (host bookkeeping, no buffer memory)...
  void index(const Role& role, const ArenaPlan& plan);
  // ...and lays them out in `memory` (extent_bytes(), owned by the caller: the backend
  // allocates it).
  void place(char* memory);
  void create(const Role& role, const ArenaPlan& plan, char* memory) {
    index(role, plan);
    place(memory);
  }
  // Address of the buffer the op `alloc_op` created.
  char* at(int32_t alloc_op) const { return base_ + plan_.offset_of_op[alloc_op]; }
  // The alloc op that made `name` most recently at or before op `now` (names are reused across
  // microbatches only after a free, so the latest alloc before `now` is the live one).
  int32_t alloc_of(const std::string& name, int32_t now) const;
  char* buffer(const std::string& name, int32_t now) const { return at(alloc_of(name, now)); }
  int64_t bytes_of(int32_t alloc_op) const { return bytes_[alloc_op]; }
  int64_t extent_bytes() const { return plan_.extent_bytes; }

 private:
  char* base_ = nullptr;
  ArenaPlan plan_;
  std::vector<int64_t> bytes_;
  std::unordered_map<std::string, std::vector<int32_t>> allocs_of_name_;  // ascending op ids
};

}  // namespace stepcast
