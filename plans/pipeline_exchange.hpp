// The blocking exchanges of Megatron-LM's interleaved 1F1B schedule, as a pure function: after
// each round of compute a stage posts its pipeline sends and receives as one batch and waits for
// all of them before computing again. Counts only: no ops, bytes or time (lower_role.cpp emits).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "schedule.hpp"

namespace stepcast {

// One round: the passes computed (none before the first exchange, one in warm-up and cool-down,
// a forward then a backward in the steady state), then one batch of transfers. Each transfer
// names the pass it belongs to: a send the pass on this stage whose output (forward) or input
// gradient (backward) it carries; a receive the pass on this stage that will read what it brings.
struct PassExchange {
  std::vector<PassAction> passes;
  std::optional<PassAction> send_prev;  // backward: input gradient to the previous stage
  std::optional<PassAction> recv_prev;  // forward: its input, from the previous stage
  std::optional<PassAction> send_next;  // forward: its output, to the next stage
  std::optional<PassAction> recv_next;  // backward: its output gradient, from the next stage
};

// Stage `stage`'s rounds, following Megatron-LM's forward_backward_pipelining_with_interleaving
// as the SC'21 runs used it (commit de7dc40f88 "scripts for sc21", megatron/schedules.py: the
// recv_forward before the warm-up loop, send_forward_recv_forward per warm-up forward,
// send_forward_backward_recv_forward_backward after the last warm-up forward and each steady
// forward+backward, send_backward_recv_backward per cool-down backward, recv_prev / recv_next as
// that code decides them). Megatron's NCCL matches a pair's transfers in posting order, so the
// k-th receive from a neighbour carries that neighbour's k-th send towards this stage: that is how
// a receive learns its pass. The previous stage of stage 0 is the last (the interleaved schedule's
// ring). Throws InputError as schedule_actions for interleaved_1f1b.
std::vector<PassExchange> interleaved_exchanges(const ScheduleShape& shape, int64_t stage);

}  // namespace stepcast
