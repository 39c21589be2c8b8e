// The arguments the kernels take beside their buffers: a dropout application, the local
// attention problem, AdamW's hyperparameters. The backend interface (backend.hpp) and every
// backend share them; the kernels' semantics are cpu_kernels.hpp's.
#pragma once

#include <cstdint>

namespace stepcast::cpu {

// Where a mask is drawn; the value is part of the hash, so it must never change.
enum class DropoutSite : uint64_t {
  embedding = 1,           // after word (+ learned position) embedding, [s, b, h]
  attention_probs = 2,     // on the attention probabilities, [b, heads, s, s]
  attention_residual = 3,  // attention output before the residual add, [s, b, h]
  mlp_residual = 4,        // MLP output before the residual add, [s, b, h]
};

// One dropout application: the mask stream and the drop probability p ∈ [0, 1).
// `step` is the training iteration, `layer` the GLOBAL layer index (any fixed value, e.g. -1,
// for the embedding site). The same stream and coordinates give the same mask on every rank,
// in every plan, and again under activation recompute: no RNG state to carry.
struct Dropout {
  double p;
  uint64_t seed;
  int64_t step;
  int64_t layer;
  DropoutSite site;
};

// The local attention problem (cpu_kernels.hpp, "Attention", gives the layouts it describes).
struct AttentionShape {
  int64_t s, b, heads, kv_heads, d;
  int64_t qkv_width() const { return (heads + 2 * kv_heads) * d; }
};

// AdamW's hyperparameters for one step (cpu_kernels.hpp: adamw_step).
struct AdamW {
  double lr, beta1, beta2, eps, weight_decay;
};

}  // namespace stepcast::cpu
