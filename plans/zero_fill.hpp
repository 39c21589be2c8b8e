// The zero fills a role's buffers need before their first use: part of what a StepProgram means,
// derived from its ops (no op of their own). An interpreter fills each such buffer with zeros just
// before the first op that touches it (reads or writes it). The simulator charges that op the
// every-step fills (`step_fills_before`: the persistent gradient buffers, as Megatron-LM's
// zero_grad_buffer and PyTorch's zero_grad fill theirs each iteration); the per-use fills are how
// this executor accumulates (a first write that overwrote would need none, as frameworks' GEMMs
// and autograd do), and stay uncosted.
//   - every step, each persistent gradient buffer (not a stale-gradient copy): the step's
//     gradients accumulate into it;
//   - at each alloc of a per-step buffer that is a gradient buffer, a communication buffer that
//     is not scratch (staging is overwritten before it is read), or a buffer whose first writer
//     accumulates into it (+=: it reads it, a wgrad, a norm's or an embedding's gradient).
#pragma once

#include <cstdint>
#include <vector>

#include "program.hpp"

namespace stepcast {

struct ZeroFills {
  // By op id: the alloc ops whose buffer is filled (every step where persistent).
  std::vector<char> filled;
  // By op id: the filled allocs (their ids) the op is the first toucher of, filled just before it.
  std::vector<std::vector<int32_t>> fills_before;
  // By op id: those of fills_before that are every-step fills (persistent buffers).
  std::vector<std::vector<int32_t>> step_fills_before;
  // By op id: the bytes filled just before the op (Σ bytes of fills_before's allocs).
  std::vector<double> bytes_before;
  // Filled allocs no op touches (filled at the step's start or at their alloc, charged to none).
  std::vector<int32_t> untouched;
};

ZeroFills zero_fills(const Role& role);

}  // namespace stepcast
