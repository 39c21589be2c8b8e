// The operand signature of every op the lowering emits: for each (kind, name, grad, pass) the
// named slots of its inputs and outputs, each with a role, a dtype rule and a shape rule. The
// table (op_signature.cpp) is the one place an op's operands are described: check_program
// enforces it, program.json names every operand by its slot, an interpreter reads operands by
// slot. Shape rules count elements against the op's (batch, m, n, k); a rule that the op's
// fields cannot decide (a flat parameter group, a buffer whose width depends on the model) is
// `any`.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "program.hpp"

namespace stepcast {

// What a slot holds. `comm_scratch` is the staging a host collective or a send writes
// (is_comm_scratch); `data` the token ids, targets or sample indices of a microbatch.
enum class SlotRole { activation, weights, grads, optimizer_state, statistics, mask, data, comm_scratch };
// `one`: exactly one buffer; `optional`: zero or one (optional slots fill in order: the first k
// optional slots are present when the op has k operands more than its `one` slots); `repeated`:
// one or more buffers, every repeated slot of a side the same number of times, one slot's
// buffers after the other's. A side has optional or repeated slots, not both; a comm_scratch
// slot, always last and optional, is present when the last buffer is comm scratch.
enum class SlotCount { one, optional, repeated };
enum class DtypeRule {
  any,
  floating,     // a floating-point dtype (not int32, int64)
  wide,         // fp32 or fp64: statistics kept at least in fp32
  int32,
  int64,
  mask,         // u8: one byte per element
  fp8,            // fp8_e4m3 or fp8_e5m2
  same_as_first,  // the dtype of the op's first input
  unpacked        // the first input's, or any non-FP8 floating dtype when that is FP8 storage
};
// Element count of the slot's buffer, from the op's batch, m, n, k.
enum class ShapeRule { any, m_k, m_n, k_m, k_n, batch_m_n, batch_m_k, batch_m, one };

// Which passes a signature covers: forward (forward and recompute), backward, optimizer, any.
enum class Pass { forward, backward, optimizer, any };

struct Slot {
  const char* name;
  SlotRole role;
  SlotCount count = SlotCount::one;
  DtypeRule dtype = DtypeRule::any;
  ShapeRule shape = ShapeRule::any;
};

struct OpSignature {
  OpKind kind;
  std::vector<OpName> names;  // the names that share this signature
  Grad grad;
  Pass pass;
  std::vector<Slot> inputs;
  std::vector<Slot> outputs;
};

const char* to_string(SlotRole role);
const char* to_string(DtypeRule rule);
const char* to_string(ShapeRule rule);

// Every signature, in table order.
const std::vector<OpSignature>& op_signatures();
// The signature of an op's (kind, name, grad, phase); null when none (alloc and free have none).
const OpSignature* find_signature(const Op& op);

// The slot of each operand of an op; `error` says why the operands do not fit when they do not.
struct SlotBinding {
  std::vector<const Slot*> inputs;
  std::vector<const Slot*> outputs;
  std::string error;  // empty when every operand has a slot and every required slot a buffer
};
SlotBinding bind_slots(const OpSignature& signature, const Op& op);

// An op's buffers by the slot names of its signature: what an interpreter reads, instead of
// positions. alloc and free have no operands. A slot may be named on both sides (a buffer read
// and accumulated into); in() and out() look at one side each.
class Operands {
 public:
  Operands() = default;
  explicit Operands(const Op& op);  // an internal error (STEPCAST_CHECK) when the op does not fit
  const std::string& in(const char* slot) const;   // the slot's (first) buffer; it must be there
  const std::string& out(const char* slot) const;
  bool has_in(const char* slot) const;             // an optional slot that is filled
  bool has_out(const char* slot) const;
  std::vector<BufferName> ins(const char* slot) const;  // every buffer of a repeated slot
  std::vector<BufferName> outs(const char* slot) const;

 private:
  const Op* op_ = nullptr;
  std::vector<const char*> inputs_, outputs_;  // the slot name of each operand
};

// Elements a shape rule asks of a buffer of `op`; nullopt for ShapeRule::any.
std::optional<int64_t> expected_elements(ShapeRule rule, const Op& op);
// Whether `dtype` satisfies `rule` (same_as_first compares with `first`).
bool dtype_fits(DtypeRule rule, Dtype dtype, Dtype first);

}  // namespace stepcast
