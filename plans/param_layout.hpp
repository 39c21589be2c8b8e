// Where each tensor sits inside a parameter group's buffer on one tensor-parallel rank, and how
// its local elements map to the global tensor — so every rank initialises its shard from global
// coordinates and any plan starts from the same model. Layer buffers hold the tp-sharded tensors
// first, then the replicated ones (norms, row-parallel biases): the trailing
// LowerContext::layer_sp_replicated() elements.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "model.hpp"

namespace stepcast {

struct TensorSlice {
  std::string name;       // "qkv.weight", "ln1.weight", "embedding.weight", ...
  int64_t offset = 0;     // first element in the group's buffer
  int64_t rows = 0;       // local shape [rows, cols] (cols 1 for vectors)
  int64_t cols = 1;
  bool replicated = false;   // same on every tp rank (norms, row-parallel biases, positions); in an
                             // expert group, on every etp rank (the down projection's bias)
  bool decay = false;        // AdamW weight decay applies (matrices; not biases or norms)
  int64_t elements() const { return rows * cols; }
};

struct GroupLayout {
  std::vector<TensorSlice> tensors;
  int64_t elements = 0;
  const TensorSlice& at(const std::string& name) const;
  bool has(const std::string& name) const;
};

// Layout of "L<l>", "embedding", "position", "final_norm" or "output" for tensor-parallel rank
// tp_rank of tp_size; vocab is padded to a multiple of tp_size (lower.hpp).
GroupLayout param_group_layout(const ModelConfig& model, int64_t tp_size, const std::string& group);

// The local experts of a MoE layer ("X<l>") on expert-parallel rank ep_rank: experts
// [ep_rank · E/ep, (ep_rank + 1) · E/ep), each its gate (SwiGLU), up and down projections
// moe_intermediate_size / etp_size wide, named by the global expert ("expert.5.up.weight"), so their
// initial values do not depend on ep; under etp each etp rank holds rows (gate, up) or columns
// (down) [etp_rank · f/etp, + f/etp) of every expert's tensors (TensorInitializer's r).
GroupLayout expert_group_layout(const ModelConfig& model, int64_t ep_size, int64_t ep_rank, int64_t etp_size);
std::string expert_tensor_name(int64_t expert, const char* tensor);

// Initial value of local element (row, col) of `tensor` of `group` on tp rank `tp_rank` (for an
// expert group "X<l>", the etp rank):
// GPT-2 / Megatron initialisation (normal 0.02; output projections 0.02/√(2L); biases 0; norm
// weights 1) drawn from a hash of (seed, group, tensor, global row, global col), so it does not
// depend on the sharding. Padded vocabulary rows are 0.
double initial_parameter(const ModelConfig& model, int64_t tp_size, int64_t tp_rank,
                         const std::string& group, const TensorSlice& tensor, int64_t row,
                         int64_t col, uint64_t seed);

// initial_parameter of every element of one tensor, with the per-tensor work (names, the global
// tensor's key, the standard deviation) done once: at(row, col) is initial_parameter(..., row,
// col, seed), bit for bit, at a hash and a Box–Muller draw per element (a 1.3B model's weights
// and master copy are 2.6 billion of them).
class TensorInitializer {
 public:
  TensorInitializer(const ModelConfig& model, int64_t tp_size, int64_t tp_rank, const std::string& group,
                    const TensorSlice& tensor, uint64_t seed);
  double at(int64_t row, int64_t col) const;

 private:
  double constant_ = 0.0;  // biases 0, norm weights 1 (when std_ is 0)
  double std_ = 0.0;
  uint64_t keys_[3] = {0, 0, 0};  // the global tensor's key; q, k, v for qkv.weight
  int64_t row_offset_ = 0, col_offset_ = 0;
  int64_t row_limit_ = std::numeric_limits<int64_t>::max();
  bool qkv_ = false;
  int64_t q_rows_ = 0, k_rows_ = 0, tp_rank_ = 0;
};

}  // namespace stepcast
