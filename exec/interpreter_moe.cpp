// The interpreter's mixture-of-experts ops (interpreter.hpp), the alltoall dispatcher: routing
// (softmax, top-k, capacity dropping), the permutation into expert order and back, the local
// experts' grouped GEMMs, the aux loss, and the dispatch and combine all_to_alls. The program's
// buffers are sized for the worst case; the rows they really hold are the counts [ep, E] (int32):
// row r the token copies ep rank r's routing keeps for each expert. Layouts:
//   this rank's side (perm, comb and their gradients): by global expert, counts[me][e] rows each;
//   the experts' side (xe, ye, ...): by source rank, then local expert, counts[i][me·E_l + l] rows.
// The aux loss counts the copies routed over the whole sequence where tp or cp splits it
// (`routed`, summed by the program's moe_aux_counts all_reduce).
// Under etp the counts are [etp, ep, E] (this rank's row etp rank · ep + ep rank): the etp gather
// brings the other etp ranks' blocks, and the experts' buffers hold one block of rows per etp rank
// (its rows by source rank, then local expert, counts[j·ep + i][me·E_l + l] rows each; the rest of
// the block unused), so the etp gather and scatter move whole blocks.
// The allgather dispatcher: every token of the expert block gathered over ep, then etp, with its
// routing (moe_route_gather); each rank permutes the copies of its local experts (by source rank,
// then local expert, as above, in one block), and the way back is a reduce_scatter, the routing
// weights' gradient too. Its counts are taken from the gathered routing (moe_map_gathered_rows).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "errors.hpp"
#include "interpreter.hpp"
#include "moe.hpp"

namespace stepcast {

template <class T, class G, class W>
int64_t Interpreter<T, G, W>::moe_tokens(const Op& op) const {
  const std::string& idx = operands(op).has_in("route_idx") ? in(op, "route_idx") : out(op, "route_idx");
  return count(idx, op) / p_.moe.top_k;
}

template <class T, class G, class W>
void Interpreter<T, G, W>::moe_read_counts(const Op& op) {
  const std::string& name = operands(op).has_in("counts") ? in(op, "counts") : out(op, "counts");
  const int64_t n = count(name, op);
  STEPCAST_CHECK(n == grid_.etp_size() * grid_.ep_size() * p_.moe.num_experts,
                 "counts buffer " + name + " is not [etp, ep, experts] (" + std::to_string(n) + " elements)");
  moe_counts_.resize(size_t(n));
  backend_.download(moe_counts_.data(), arena_.buffer(name, op.id), n * int64_t(sizeof(int32_t)));
}

// moe_rows_[t·k + j]: the row of copy j of token t on this rank's side (by expert, in token order).
template <class T, class G, class W>
void Interpreter<T, G, W>::moe_map_rows(const Op& op) {
  moe_read_counts(op);
  const int64_t E = p_.moe.num_experts, k = p_.moe.top_k, tokens = moe_tokens(op);
  moe_idx_.resize(size_t(tokens * k));
  backend_.download(moe_idx_.data(), arena_.buffer(in(op, "route_idx"), op.id), tokens * k * int64_t(sizeof(int32_t)));
  moe_cursor_.assign(size_t(E), 0);
  const int32_t* mine = moe_counts_.data() + moe_row_ * E;
  for (int64_t e = 1; e < E; ++e) moe_cursor_[size_t(e)] = moe_cursor_[size_t(e - 1)] + mine[e - 1];
  moe_rows_.resize(size_t(tokens * k));
  for (int64_t i = 0; i < tokens * k; ++i) {
    int32_t e = moe_idx_[size_t(i)];
    moe_rows_[size_t(i)] = e >= 0 ? moe_cursor_[size_t(e)]++ : -1;
  }
}

template <class T, class G, class W>
int64_t Interpreter<T, G, W>::moe_map_gathered_rows(const Op& op) {
  const int64_t E = p_.moe.num_experts, k = p_.moe.top_k, tokens = moe_tokens(op);
  const int64_t sources = grid_.etp_size() * grid_.ep_size(), copies = tokens / sources * k;  // copies: a source's
  STEPCAST_CHECK(copies * sources == tokens * k,
                 "gathered routing " + in(op, "route_idx") + " is not " + std::to_string(sources) + " ranks' tokens");
  moe_idx_.resize(size_t(tokens * k));
  backend_.download(moe_idx_.data(), arena_.buffer(in(op, "route_idx"), op.id), tokens * k * int64_t(sizeof(int32_t)));
  moe_counts_.assign(size_t(sources * E), 0);
  if (p_.moe.pad_to_capacity) {  // every source's capacity for each expert (as moe_route pads its own)
    moe_counts_.assign(size_t(sources * E), int32_t(expert_capacity(copies, E, p_.moe.capacity_factor)));
  } else {
    for (int64_t i = 0; i < tokens * k; ++i) {
      const int32_t e = moe_idx_[size_t(i)];
      if (e >= 0) ++moe_counts_[size_t(i / copies * E + e)];
    }
  }
  moe_cursor_.assign(size_t(sources * moe_local_), 0);
  int64_t rows = 0;
  for (int64_t r = 0; r < sources; ++r) {
    for (int64_t l = 0; l < moe_local_; ++l) {
      moe_cursor_[size_t(r * moe_local_ + l)] = rows;
      rows += moe_received(r, l);
    }
  }
  const int64_t first = ep_index_ * moe_local_;
  moe_rows_.resize(size_t(tokens * k));
  for (int64_t i = 0; i < tokens * k; ++i) {
    const int64_t l = moe_idx_[size_t(i)] - first;
    const bool local = moe_idx_[size_t(i)] >= 0 && l >= 0 && l < moe_local_;
    moe_rows_[size_t(i)] = local ? moe_cursor_[size_t(i / copies * moe_local_ + l)]++ : -1;
  }
  return rows;
}

template <class T, class G, class W>
void Interpreter<T, G, W>::reserve_moe_routing(int64_t steps) {
  const int64_t E = p_.moe.num_experts;
  if (E == 0) return;
  int64_t routes = 0;
  for (const Op& op : role_.ops) routes += op.name == OpName::moe_route && op.phase == Phase::forward;
  moe_routed_by_layer_.assign(size_t(model_.num_hidden_layers * E), 0.0);
  moe_routing_samples_.assign(size_t(std::max<int64_t>(steps, 0) * routes * (3 + E)), 0.0);  // (faulted in)
  moe_routing_samples_.clear();
}

template <class T, class G, class W>
void Interpreter<T, G, W>::moe_activation(const Op& op) {
  const bool backward = op.phase == Phase::backward;
  const int64_t E = p_.moe.num_experts, k = p_.moe.top_k;
  if (op.name == OpName::moe_add) {  // [x, acc] → [acc]: acc += x
    backend_.moe_add(buf(out(op, "acc"), op), buf(in(op, "x"), op), count(in(op, "x"), op));
    return;
  }
  if (op.name == OpName::moe_route && !backward) {  // [logits] → [probs, route_w, route_idx, counts]
    const int64_t tokens = moe_tokens(op);
    STEPCAST_CHECK(operands(op).has_out("counts"), "moe_route op " + std::to_string(op.id) + " writes no counts");
    const int64_t capacity =
        p_.moe.capacity_factor > 0 ? expert_capacity(tokens * k, E, p_.moe.capacity_factor) : 0;
    int32_t* counts = buf<int32_t>(out(op, "counts"), op) + moe_row_ * E;
    backend_.moe_route_forward(buf(in(op, "logits"), op), buf(out(op, "probs"), op), buf(out(op, "route_w"), op),
                               buf<int32_t>(out(op, "route_idx"), op), counts, tokens, E, k, capacity,
                               model_.norm_topk_prob, p_.moe.drop_by_probs);
    // This rank's copies per expert, dropped ones too: for the aux loss and the run's routing.
    moe_idx_.resize(size_t(tokens * k));
    backend_.download(moe_idx_.data(), buf<int32_t>(out(op, "route_idx"), op), tokens * k * int64_t(sizeof(int32_t)));
    const std::vector<double> copies = routed_copies(moe_idx_.data(), tokens * k, E);
    if (operands(op).has_out("routed")) {
      const std::vector<W> routed(copies.begin(), copies.end());
      backend_.upload(buf<W>(out(op, "routed"), op), routed.data(), E * int64_t(sizeof(W)));
    }
    if (op.phase == Phase::forward && op.layer >= 0 && !moe_routed_by_layer_.empty()) {
      for (int64_t e = 0; e < E; ++e) moe_routed_by_layer_.at(size_t(op.layer * E + e)) += copies[size_t(e)];
      if (moe_routing_samples_.size() + size_t(3 + E) <= moe_routing_samples_.capacity()) {
        for (double v : {double(step_), double(op.microbatch), double(op.layer)}) moe_routing_samples_.push_back(v);
        moe_routing_samples_.insert(moe_routing_samples_.end(), copies.begin(), copies.end());
      }
    }
    if (op.phase == Phase::forward && capacity > 0) {  // (a recompute routes the same tokens again)
      moe_read_counts(op);
      int64_t kept = 0;
      for (int64_t e = 0; e < E; ++e) kept += moe_counts_[size_t(moe_row_ * E + e)];
      moe_dropped_ += tokens * k - kept;
    }
    if (p_.moe.pad_to_capacity) {
      // Every expert's input padded to its capacity (Megatron's moe_pad_expert_input_to_capacity):
      // the counts say `capacity` rows each, which the permutation fills past the kept copies with
      // zero rows. Their outputs are never gathered back and their gradients are zero, so the
      // experts compute the padded rows as Megatron does and the curve is the unpadded one.
      const std::vector<int32_t> padded(static_cast<size_t>(E), static_cast<int32_t>(capacity));
      backend_.upload(counts, padded.data(), E * int64_t(sizeof(int32_t)));
    }
    return;
  }
  if (op.name == OpName::moe_route) {  // [probs, route_idx, d_route_w(, routed)] → [d_logits]
    // The aux loss's gradient (moe_aux below).
    const std::vector<double> routed = moe_routed(op);
    backend_.moe_route_backward(buf(in(op, "probs"), op), buf<int32_t>(in(op, "route_idx"), op),
                                buf(in(op, "d_route_w"), op), buf(out(op, "d_logits"), op), moe_tokens(op), E, k,
                                moe_aux_scale(op, routed), routed.empty() ? nullptr : routed.data(),
                                model_.norm_topk_prob);
    return;
  }
  if (moe_allgather()) {
    const int64_t rows = moe_map_gathered_rows(op);
    if (op.name == OpName::moe_permute && !backward) {  // [x, route_idx] → [y, counts]
      const int64_t capacity = count(out(op, "y"), op) / h_;
      if (rows > capacity) moe_overflow(op, rows, capacity);
      backend_.upload(buf<int32_t>(out(op, "counts"), op), moe_counts_.data(),
                      int64_t(moe_counts_.size() * sizeof(int32_t)));
    }
  } else {
    moe_map_rows(op);
  }
  const int64_t tokens = moe_tokens(op);
  if (op.name == OpName::moe_permute) {  // [x, route_idx, counts] → [y]; backward [d_y, …] → [d_x]
    const std::string& x = in(op, backward ? "d_y" : "x");
    const std::string& y = out(op, backward ? "d_x" : "y");
    if (!backward) moe_zero_padding(op, y);
    backend_.moe_permute(buf(x, op), buf(y, op), moe_rows_.data(), tokens, k, h_, backward);
    return;
  }
  STEPCAST_CHECK(op.name == OpName::moe_unpermute, std::string("unknown MoE op ") + to_string(op.name));
  if (!backward) {  // [x, route_w, route_idx, counts] → [y]
    backend_.moe_unpermute_forward(buf(in(op, "x"), op), buf(in(op, "route_w"), op), moe_rows_.data(),
                                   buf(out(op, "y"), op), tokens, k, h_);
  } else {  // [d_y, x, route_w, route_idx, counts] → [d_x, d_route_w]
    moe_zero_padding(op, out(op, "d_x"));
    backend_.moe_unpermute_backward(buf(in(op, "d_y"), op), buf(in(op, "x"), op), buf(in(op, "route_w"), op),
                                    moe_rows_.data(), buf(out(op, "d_x"), op), buf(out(op, "d_route_w"), op), tokens,
                                    k, h_);
  }
}

// Padded to capacity: the rows the permutation (forward) or the un-permutation's backward leaves
// unwritten are zero (the experts compute them; their gradients must add nothing).
template <class T, class G, class W>
void Interpreter<T, G, W>::moe_zero_padding(const Op& op, const std::string& rows) {
  if (p_.moe.pad_to_capacity) backend_.zero(buf(rows, op), count(rows, op) * element_bytes(rows, op));
}

// The copies routed to each expert over the whole sequence (an op's `routed`, which
// moe_aux_counts summed over the ranks that split it), or none: this rank holds the sequence.
template <class T, class G, class W>
std::vector<double> Interpreter<T, G, W>::moe_routed(const Op& op) {
  if (!operands(op).has_in("routed")) return {};
  const int64_t E = p_.moe.num_experts;
  STEPCAST_CHECK(count(in(op, "routed"), op) == E, "routed buffer " + in(op, "routed") + " is not [experts]");
  std::vector<W> host(static_cast<size_t>(E));
  backend_.download(host.data(), buf<W>(in(op, "routed"), op), E * int64_t(sizeof(W)));
  return std::vector<double>(host.begin(), host.end());
}

// coef · E / (k · T²) averaged over the step's microbatches, T the tokens the counts are of: this
// rank's, or with `routed` the sequence's (Σ_e routed / k, Megatron's total_num_tokens).
template <class T, class G, class W>
double Interpreter<T, G, W>::moe_aux_scale(const Op& op, const std::vector<double>& routed) const {
  const int64_t E = p_.moe.num_experts, k = p_.moe.top_k;
  double tokens = double(moe_tokens(op));
  if (!routed.empty()) {
    double copies = 0;
    for (double c : routed) copies += c;
    tokens = copies / double(k);
  }
  const double microbatches = double(plan_.global_batch_size) / double(b_);
  return model_.router_aux_loss_coef * double(E) / (double(k) * tokens * tokens * microbatches);
}

// The load-balancing loss of this microbatch's tokens on this rank (Switch Transformer's, as
// Megatron's switch_load_balancing_loss): coef · E / (k · T²) · Σ_e P_e · C_e with P_e the
// probabilities summed over this rank's tokens and C_e the copies routed to e (over the sequence
// where `routed` holds them, so the ranks' losses sum to the sequence's), averaged over the step's
// microbatches. Its value goes to the op's output; its gradient is moe_route's backward.
template <class T, class G, class W>
void Interpreter<T, G, W>::moe_aux(const Op& op) {
  const int64_t E = p_.moe.num_experts, k = p_.moe.top_k;
  const std::vector<double> routed = moe_routed(op);
  W value = W(backend_.moe_aux_loss(buf(in(op, "probs"), op), buf<int32_t>(in(op, "route_idx"), op), moe_tokens(op),
                                    E, k, moe_aux_scale(op, routed), routed.empty() ? nullptr : routed.data()));
  backend_.upload(buf<W>(out(op, "aux"), op), &value, sizeof(W));
}

// Grouped GEMMs: each local expert's rows (one segment per source rank) through its own weights,
// y[rows, out] = x[rows, in] · W_eᵀ; dgrad and wgrad as the dense GEMMs (interpreter_layers.cpp).
// The segments with rows go to the backend as one call per op (the CUDA backend groups them);
// under etp one call per etp rank's block of the buffers (each block's real rows first).
template <class T, class G, class W>
void Interpreter<T, G, W>::moe_gemm(const Op& op) {
  moe_read_counts(op);
  const char* tensor = op.name == OpName::expert_gate ? "gate.weight"
                       : op.name == OpName::expert_up ? "up.weight"
                                                      : "down.weight";
  const std::string& weights = op.grad == Grad::wgrad ? out(op, "dw") : in(op, "w");
  const GroupLayout& layout = layouts_.at(group_of_buffer(weights));
  const int64_t first = ep_index_ * moe_local_;
  const TensorSlice& shape = layout.at(expert_tensor_name(first, tensor));
  const int64_t out_features = shape.rows, in_features = shape.cols;
  // The buffers' capacity in rows: x (forward, wgrad) or d_y (dgrad) rows of its width.
  const std::string& rows_of = op.grad == Grad::dgrad ? in(op, "d_y") : in(op, "x");
  const int64_t capacity = count(rows_of, op) / (op.grad == Grad::dgrad ? out_features : in_features);
  const int64_t blocks = moe_blocks(), block = capacity / blocks;
  const int64_t sources = grid_.etp_size() * grid_.ep_size() / blocks;
  STEPCAST_CHECK(block * blocks == capacity, "expert buffer " + rows_of + " is not etp blocks of rows");
  // Expert biases (use_bias): added to each expert's rows, the down projection's by etp rank 0
  // alone (its output is summed over the etp ranks); their gradient is the sum of the rows'.
  const char* bias = !model_.use_bias                    ? nullptr
                     : op.name == OpName::expert_gate ? "gate.bias"
                     : op.name == OpName::expert_up   ? "up.bias"
                                                      : "down.bias";
  const bool adds_bias = bias != nullptr && (op.name != OpName::expert_down || etp_index_ == 0);
  std::vector<int64_t> rows, experts;
  std::vector<const T*> w;
  std::vector<G*> dw;
  for (int64_t b = 0; b < blocks; ++b) {
    rows.clear();
    experts.clear();
    w.clear();
    dw.clear();
    int64_t total = 0;
    for (int64_t source = b * sources; source < (b + 1) * sources; ++source) {
      for (int64_t l = 0; l < moe_local_; ++l) {
        const int64_t n = moe_received(source, l);
        if (n == 0) continue;
        const std::string name = expert_tensor_name(first + l, tensor);
        rows.push_back(n);
        experts.push_back(first + l);
        if (op.fp8_slots[0] >= 0) {
          // (FP8: moe_fp8_gemm reads the experts' codes)
        } else if (op.grad == Grad::wgrad) {
          dw.push_back(slice<G>(weights, op, name));
        } else {
          w.push_back(slice(weights, op, name));
        }
        total += n;
      }
    }
    STEPCAST_CHECK(total <= block, "expert rows beyond the program's buffer " + rows_of);
    if (rows.empty()) continue;
    const int64_t in_at = b * block * in_features, out_at = b * block * out_features;
    if (op.fp8_slots[0] >= 0) {
      moe_fp8_gemm(op, weights, tensor, bias, experts, rows, in_at, out_at, in_features, out_features);
    } else if (op.grad == Grad::none) {  // [x, w, counts] → [y]
      backend_.expert_linear_forward(buf(in(op, "x"), op) + in_at, w, rows, buf(out(op, "y"), op) + out_at,
                                     in_features, out_features);
    } else if (op.grad == Grad::dgrad) {  // [d_y, w, counts, (d_x)] → [d_x]
      backend_.expert_linear_backward_data(buf(in(op, "d_y"), op) + out_at, w, rows, buf(out(op, "d_x"), op) + in_at,
                                           in_features, out_features, operands(op).has_in("d_x"));
    } else {  // wgrad: [x, d_y, counts] → [dw]
      backend_.expert_linear_backward_weight(buf(in(op, "d_y"), op) + out_at, buf(in(op, "x"), op) + in_at, dw, rows,
                                             in_features, out_features);
    }
    // (An FP8 wgrad's bias gradient is its kernel's, from the gradient's codes.)
    if (bias == nullptr || op.grad == Grad::dgrad || (op.fp8_slots[0] >= 0 && op.grad == Grad::wgrad)) continue;
    int64_t at = out_at;  // the segment's first output element
    for (size_t i = 0; i < rows.size(); ++i) {
      const std::string name = expert_tensor_name(experts[i], bias);
      if (op.grad == Grad::none && adds_bias) {  // (under FP8 read beside the FP8 copy: bias_w)
        const std::string& biases = operands(op).has_in("bias_w") ? in(op, "bias_w") : weights;
        backend_.add_rows(buf(out(op, "y"), op) + at, slice(biases, op, name), rows[i], out_features);
      } else if (op.grad == Grad::wgrad) {
        backend_.sum_rows(buf(in(op, "d_y"), op) + at, slice<G>(weights, op, name), rows[i], out_features);
      }
      at += rows[i] * out_features;
    }
  }
}

// The etp gather [x, counts] → [y, counts]: every etp rank's block of the counts (its [ep, E]
// rows), then every etp rank's x as block i of y (the program's all_gather).
template <class T, class G, class W>
void Interpreter<T, G, W>::moe_etp_gather(const Op& op) {
  moe_share_counts(op, grid_.ep_size() * p_.moe.num_experts, etp_index_, 0);
}

// Rows of `row` counts: this rank's row `mine` of the op's counts to every member of its group,
// member i's into row first + i (an all_gather of rows, over all_to_allv's byte blocks).
template <class T, class G, class W>
void Interpreter<T, G, W>::moe_share_counts(const Op& op, int64_t row, int64_t mine, int64_t first) {
  const int64_t bytes = row * int64_t(sizeof(int32_t));
  char* c = arena_.buffer(out(op, "counts"), op.id);
  gather_blocks(op.group, c + mine * bytes, c + first * bytes, bytes);
}

// moe_route_gather [x] → [y]: every member's x as block i of y, in bytes (x is int32 in an fp64
// run too, which the backends' typed all_gather does not take).
template <class T, class G, class W>
void Interpreter<T, G, W>::moe_gather_route(const Op& op) {
  const std::string& x = in(op, "x");
  const std::string& y = out(op, "y");
  const int64_t bytes = count(x, op) * element_bytes(x, op);
  STEPCAST_CHECK(count(y, op) * element_bytes(y, op) == bytes * backend_.group_size(op.group),
                 "routing gather " + y + " is not its group's blocks of " + x);
  gather_blocks(op.group, arena_.buffer(x, op.id), arena_.buffer(y, op.id), bytes);
}

template <class T, class G, class W>
void Interpreter<T, G, W>::gather_blocks(GroupKind group, const char* send, char* recv, int64_t bytes) {
  const int64_t n = backend_.group_size(group);
  std::vector<int64_t>& sizes = moe_bytes_[0];
  std::vector<int64_t>& send_offsets = moe_bytes_[1];
  std::vector<int64_t>& recv_offsets = moe_bytes_[2];
  sizes.assign(size_t(n), bytes);
  send_offsets.assign(size_t(n), 0);
  recv_offsets.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) recv_offsets[size_t(i)] = i * bytes;
  backend_.all_to_allv(group, send, sizes, send_offsets, recv, sizes, recv_offsets);
}

template <class T, class G, class W>
void Interpreter<T, G, W>::moe_overflow(const Op& op, int64_t rows, int64_t capacity) const {
  throw InputError("MoE layer " + std::to_string(op.layer) + ", microbatch " + std::to_string(op.microbatch) +
                   ": the routing sends " + std::to_string(rows) + " token copies to ep rank " +
                   std::to_string(ep_index_) + ", whose dispatch buffers hold " + std::to_string(capacity) +
                   " (dropless: sized by the heaviest load the plan's moe_routing draws give, which real routing "
                   "may exceed); valid: moe_dropless_buffers \"any_routing\" (buffers for any routing), "
                   "moe_expert_capacity_factor >= experts / top-k = " +
                   std::to_string(double(p_.moe.num_experts) / double(p_.moe.top_k)) +
                   " to drop nothing, or a moe_routing with more headroom");
}

// Dispatch (to the experts) or combine (back), forward or backward: the counts first when the op
// writes them (every ep rank's row to every other), then each member's rows as the counts say.
template <class T, class G, class W>
void Interpreter<T, G, W>::moe_all_to_all(const Op& op) {
  const int64_t n = grid_.ep_size(), E = p_.moe.num_experts;
  const std::string& x = in(op, "x");
  const std::string& y = out(op, "y");
  if (operands(op).has_out("counts")) moe_share_counts(op, E, moe_row_, moe_row_of(0));
  moe_read_counts(op);
  // To the experts: dispatch forward and the combine's backward; back: the others.
  const bool to_experts = (op.name == OpName::ep_dispatch) == (op.phase != Phase::backward);
  const int64_t row_bytes = h_ * element_bytes(x, op);
  std::vector<int64_t>& mine = moe_bytes_[0];    // this rank's side: rows to / from each member
  std::vector<int64_t>& theirs = moe_bytes_[1];  // the experts' side
  std::vector<int64_t>& mine_at = moe_bytes_[2];
  std::vector<int64_t>& theirs_at = moe_bytes_[3];
  mine.assign(size_t(n), 0);
  theirs.assign(size_t(n), 0);
  mine_at.assign(size_t(n), 0);
  theirs_at.assign(size_t(n), 0);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t l = 0; l < moe_local_; ++l) {
      mine[size_t(j)] += moe_counts_[size_t(moe_row_ * E + j * moe_local_ + l)] * row_bytes;
      theirs[size_t(j)] += moe_received(moe_row_of(j), l) * row_bytes;
    }
    if (j > 0) {
      mine_at[size_t(j)] = mine_at[size_t(j - 1)] + mine[size_t(j - 1)];
      theirs_at[size_t(j)] = theirs_at[size_t(j - 1)] + theirs[size_t(j - 1)];
    }
  }
  const int64_t experts_side = theirs_at.back() + theirs.back(), my_side = mine_at.back() + mine.back();
  const std::string& expert_buffer = to_experts ? y : x;
  const int64_t expert_capacity_bytes = count(expert_buffer, op) * element_bytes(expert_buffer, op);
  if (experts_side > expert_capacity_bytes) {
    moe_overflow(op, experts_side / row_bytes, expert_capacity_bytes / row_bytes);
  }
  STEPCAST_CHECK(my_side <= count(to_experts ? x : y, op) * element_bytes(x, op), "MoE rows beyond " + x);
  char* send = arena_.buffer(x, op.id);
  char* recv = arena_.buffer(y, op.id);
  if (to_experts) {
    backend_.all_to_allv(op.group, send, mine, mine_at, recv, theirs, theirs_at);
  } else {
    backend_.all_to_allv(op.group, send, theirs, theirs_at, recv, mine, mine_at);
  }
}

#define STEPCAST_INSTANTIATE_MOE(T, G, W)                                  \
  template int64_t Interpreter<T, G, W>::moe_tokens(const Op&) const;      \
  template void Interpreter<T, G, W>::moe_read_counts(const Op&);          \
  template void Interpreter<T, G, W>::moe_map_rows(const Op&);             \
  template void Interpreter<T, G, W>::moe_activation(const Op&);           \
  template void Interpreter<T, G, W>::moe_aux(const Op&);                  \
  template void Interpreter<T, G, W>::moe_gemm(const Op&);                 \
  template void Interpreter<T, G, W>::moe_all_to_all(const Op&);          \
  template void Interpreter<T, G, W>::moe_etp_gather(const Op&);         \
  template void Interpreter<T, G, W>::reserve_moe_routing(int64_t);       \
  template void Interpreter<T, G, W>::moe_share_counts(const Op&, int64_t, int64_t, int64_t);  \
  template void Interpreter<T, G, W>::moe_gather_route(const Op&);                           \
  template void Interpreter<T, G, W>::gather_blocks(GroupKind, const char*, char*, int64_t); \
  template void Interpreter<T, G, W>::moe_overflow(const Op&, int64_t, int64_t) const;       \
  template int64_t Interpreter<T, G, W>::moe_map_gathered_rows(const Op&);
STEPCAST_FOR_EACH_STORAGE(STEPCAST_INSTANTIATE_MOE)
#undef STEPCAST_INSTANTIATE_MOE

}  // namespace stepcast
