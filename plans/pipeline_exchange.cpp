// Megatron-LM's blocking interleaved schedule as rounds of compute and transfers
// (pipeline_exchange.hpp); the flags are a line-by-line port of megatron/schedules.py, 2021.
#include "pipeline_exchange.hpp"

#include <deque>
#include <string>

#include "errors.hpp"

namespace stepcast {

namespace {

// What a round posts before the receives learn their passes.
struct RawExchange {
  std::vector<PassAction> passes;
  std::optional<PassAction> send_prev, send_next;
  bool recv_prev = false, recv_next = false;
};

// Python's modulo (non-negative for a positive divisor), as get_model_chunk_id computes it.
int64_t floor_mod(int64_t a, int64_t n) { return ((a % n) + n) % n; }

// megatron/schedules.py forward_backward_pipelining_with_interleaving (commit de7dc40f88), the
// training case (forward_only false).
std::vector<RawExchange> raw_exchanges(const ScheduleShape& shape, int64_t stage) {
  const int64_t pp = shape.pp_size, v = shape.virtual_pp_size;
  const int64_t total = shape.num_microbatches * v;  // Megatron's num_microbatches
  const int64_t warmup = warmup_forwards(ScheduleKind::interleaved_1f1b, shape, stage);
  const int64_t remaining = total - warmup;
  const bool all_warmup = shape.num_microbatches == pp;
  const bool first = stage == 0, last = stage == pp - 1;  // is_pipeline_*_stage(ignore_virtual=True)
  auto chunk_id = [&](int64_t k, bool forward) {  // get_model_chunk_id
    int64_t c = floor_mod(k, pp * v) / pp;
    return forward ? c : v - 1 - c;
  };
  auto vs = [&](const PassAction& a) { return a.chunk * pp + stage; };
  const int64_t last_vs = pp * v - 1;
  std::vector<RawExchange> out;
  // recv_forward before the warm-up loop, at virtual rank 0: nothing on the first stage.
  out.push_back({{}, {}, {}, !first, false});
  for (int64_t k = 0; k < warmup; ++k) {  // send_forward_recv_forward
    RawExchange x;
    PassAction f = interleaved_action(shape, k, true);
    x.passes = {f};
    if (vs(f) != last_vs) x.send_next = f;
    x.recv_prev = !(first && chunk_id(k + 1, true) == 0) && k != total - 1;
    // The last warm-up round also receives the first backward's gradient.
    if (k == warmup - 1 && !all_warmup) x.recv_next = !last;
    out.push_back(x);
  }
  for (int64_t k = 0; k < remaining; ++k) {  // send_forward_backward_recv_forward_backward
    RawExchange x;
    PassAction f = interleaved_action(shape, warmup + k, true);
    PassAction b = interleaved_action(shape, k, false);
    x.passes = {f, b};
    if (vs(f) != last_vs) x.send_next = f;
    if (vs(b) != 0) x.send_prev = b;
    // The first stage is ahead of the last by pp - 1 passes, and the other way round.
    x.recv_prev = !(first && chunk_id(warmup + k - (pp - 1), true) == v - 1) && k != remaining - 1;
    x.recv_next = !(last && chunk_id(k - (pp - 1), false) == 0);
    out.push_back(x);
  }
  // With all forwards first, recv_backward before the cool-down, at the last forward's chunk
  // (v - 1): nothing on the last stage.
  if (all_warmup) out.push_back({{}, {}, {}, false, !last});
  for (int64_t k = remaining; k < total; ++k) {  // send_backward_recv_backward
    RawExchange x;
    PassAction b = interleaved_action(shape, k, false);
    x.passes = {b};
    if (vs(b) != 0) x.send_prev = b;
    x.recv_next = !(last && chunk_id(k + 1, false) == v - 1) && k != total - 1;
    out.push_back(x);
  }
  return out;
}

}  // namespace

std::vector<PassExchange> interleaved_exchanges(const ScheduleShape& shape, int64_t stage) {
  const int64_t pp = shape.pp_size;
  const int64_t prev = (stage + pp - 1) % pp, next = (stage + 1) % pp;
  std::vector<RawExchange> mine = raw_exchanges(shape, stage);
  // What the neighbours send towards this stage, in posting order; a sent pass of virtual stage
  // u is read by this stage's pass of virtual stage u + 1 (forward) or u - 1 (backward).
  std::deque<PassAction> from_prev, from_next;
  for (const RawExchange& x : raw_exchanges(shape, prev)) {
    if (x.send_next) {
      int64_t u = x.send_next->chunk * pp + prev + 1;
      from_prev.push_back({true, x.send_next->microbatch, u / pp});
    }
  }
  for (const RawExchange& x : raw_exchanges(shape, next)) {
    if (x.send_prev) {
      int64_t u = x.send_prev->chunk * pp + next - 1;
      from_next.push_back({false, x.send_prev->microbatch, u / pp});
    }
  }
  std::vector<PassExchange> out;
  out.reserve(mine.size());
  for (const RawExchange& x : mine) {
    PassExchange e;
    e.passes = x.passes;
    e.send_prev = x.send_prev;
    e.send_next = x.send_next;
    auto take = [&](std::deque<PassAction>& q, const char* from) {
      STEPCAST_CHECK(!q.empty(), "stage " + std::to_string(stage) + " receives more than it is sent from " + from);
      PassAction a = q.front();
      q.pop_front();
      return a;
    };
    if (x.recv_prev) e.recv_prev = take(from_prev, "the previous stage");
    if (x.recv_next) e.recv_next = take(from_next, "the next stage");
    out.push_back(e);
  }
  STEPCAST_CHECK(from_prev.empty() && from_next.empty(),
                 "stage " + std::to_string(stage) + " is sent more than it receives");
  return out;
}

}  // namespace stepcast
