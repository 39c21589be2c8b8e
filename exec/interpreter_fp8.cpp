// The interpreter's FP8 ops (interpreter.hpp; fp8.hpp): casts of activations, gradients and a
// layer's weights to FP8 with their slot's scale, GEMMs on FP8 operands (the local experts' too),
// and delayed scaling's end of step (the amax maximised over the group, the scales updated). Every
// scale is read from the program's persistent fp8.scale buffer at the op's slot; under current
// scaling a local expert l's at l after its op's slot (lower_context.hpp's Fp8SlotLayout).
#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

#include "errors.hpp"
#include "interpreter.hpp"
#include "param_layout.hpp"

namespace stepcast {
Fp8Storage fp8_storage(Dtype dtype) {
  STEPCAST_CHECK(is_fp8_storage(dtype), std::string("an FP8 operand of dtype ") + to_string(dtype));
  const bool e5m2 = dtype == Dtype::fp8_e5m2 || dtype == Dtype::mxfp8_e5m2 || dtype == Dtype::fp8_block_e5m2;
  return e5m2 ? Fp8Storage::e5m2 : Fp8Storage::e4m3;
}

namespace {

// An expert's linear weights ("expert.<e>.up.weight"), each with its slot kind.
constexpr Fp8Weight kExpertFp8Weights[] = {
    {"gate.weight", Fp8Slot::mlp_gate_w}, {"up.weight", Fp8Slot::mlp_up_w}, {"down.weight", Fp8Slot::mlp_down_w}};

}  // namespace

template <class T, class G, class W>
Fp8Codes<W> Interpreter<T, G, W>::fp8_codes(const std::string& name, const Op& op, int32_t slot) {
  return {codes(name, op), buf<W>("fp8.scale", op) + slot, fp8_storage(dtype(name, op))};
}

template <class T, class G, class W>
void Interpreter<T, G, W>::fp8_activation(const Op& op) {
  if (p_.fp8.block_scaled()) return block_activation(op);
  if (op.name == OpName::fp8_transpose) {  // [x8] → [x8t]: a wgrad operand's
    backend_.fp8_transpose(codes(in(op, "x8"), op), codes(out(op, "x8t"), op), op.m, op.n);
    return;
  }
  if (op.name == OpName::fp8_weights_transpose) {  // [w8] → [w8t]: each linear weight's codes transposed
    const std::string& w8 = in(op, "w");
    const std::string& w8t = out(op, "w8t");
    const GroupLayout& layout = layouts_.at(group_of_buffer(w8));
    auto transpose = [&](const std::string& name) {
      if (!layout.has(name)) return;
      const TensorSlice& tensor = layout.at(name);
      backend_.fp8_transpose(codes(w8, op) + tensor.offset, codes(w8t, op) + tensor.offset, tensor.rows, tensor.cols);
    };
    if (is_expert_group(group_of_buffer(w8))) {  // each local expert's, as the dgrads read them
      for (int64_t l = 0; l < moe_local_; ++l) {
        for (const Fp8Weight& weight : kExpertFp8Weights) {
          transpose(expert_tensor_name(ep_index_ * moe_local_ + l, weight.tensor));
        }
      }
      return;
    }
    for (const Fp8Weight& weight : kFp8Weights) transpose(weight.tensor);
    return;
  }
  W* amax = buf<W>(out(op, "amax"), op);
  if (op.name == OpName::fp8_absmax) {  // [x, amax, (counts)] → [amax]: current scaling's amax of x
    if (operands(op).has_in("counts")) return moe_fp8_absmax(op);
    backend_.fp8_absmax(buf(in(op, "x"), op), count(in(op, "x"), op), amax + op.fp8_slots[0], false);
    return;
  }
  W* scale = buf<W>(in(op, "scale"), op);
  const bool current = p_.fp8.scaling == Fp8Scaling::current;
  const bool casts = op.name == OpName::fp8_cast || op.name == OpName::fp8_cast_transpose;
  if (casts && operands(op).has_in("counts")) return moe_fp8_cast(op);
  if (casts) {
    // [x, scale, amax] → [y, (y_t,) amax, (scale)]: y_t the codes transposed, y [op.m, op.n]
    const std::string& y = out(op, "y");
    const int32_t slot = op.fp8_slots[0];
    if (current) backend_.fp8_set_current_scale(amax + slot, scale + slot, fp8_storage(dtype(y, op)));
    backend_.fp8_cast(buf(in(op, "x"), op), codes(y, op), count(in(op, "x"), op), scale + slot, amax + slot,
                      fp8_storage(dtype(y, op)));
    if (op.name == OpName::fp8_cast_transpose) {
      backend_.fp8_transpose(codes(y, op), codes(out(op, "y_t"), op), op.m, op.n);
    }
    return;
  }
  // fp8_weights: [w, scale, amax] → [w8, amax, (scale)], each linear weight with its slot's scale
  // (current scaling: from the weight's own amax); a MoE layer's experts, each local expert's gate,
  // up and down weights with the layer's MLP slots (delayed scaling) or its own (current).
  const std::string& w = in(op, "w");
  const std::string& w8 = out(op, "w8");
  const GroupLayout& layout = layouts_.at(group_of_buffer(w));
  auto cast = [&](const TensorSlice& tensor, int32_t slot) {
    if (current) {
      backend_.fp8_absmax(buf(w, op) + tensor.offset, tensor.elements(), amax + slot, false);
      backend_.fp8_set_current_scale(amax + slot, scale + slot, fp8_storage(dtype(w8, op)));
    }
    backend_.fp8_cast(buf(w, op) + tensor.offset, codes(w8, op) + tensor.offset, tensor.elements(), scale + slot,
                      amax + slot, fp8_storage(dtype(w8, op)));
  };
  if (is_expert_group(group_of_buffer(w))) {
    for (int64_t l = 0; l < moe_local_; ++l) {
      for (const Fp8Weight& weight : kExpertFp8Weights) {
        const std::string name = expert_tensor_name(ep_index_ * moe_local_ + l, weight.tensor);
        if (!layout.has(name)) continue;
        const int64_t slot = current ? int64_t(weight.slot) * moe_local_ + l : int64_t(weight.slot);
        cast(layout.at(name), op.fp8_slots[0] + int32_t(slot));
      }
    }
    return;
  }
  for (const Fp8Weight& weight : kFp8Weights) {
    if (layout.has(weight.tensor)) cast(layout.at(weight.tensor), op.fp8_slots[0] + weight.slot);
  }
}

template <class T, class G, class W>
void Interpreter<T, G, W>::fp8_gemm(const Op& op, const char* weight_tensor, const char* bias_tensor) {
  if (p_.fp8.block_scaled()) return block_gemm(op, weight_tensor, bias_tensor);
  const int32_t a = op.fp8_slots[0], b = op.fp8_slots[1];
  const bool bias = bias_tensor[0] != '\0';
  // The weight tensor's codes inside the layer's FP8 copy (laid out as its weights).
  auto weight = [&]() {
    const std::string& w = in(op, "w");
    Fp8Codes<W> w8 = fp8_codes(w, op, b);
    w8.codes += layouts_.at(group_of_buffer(w)).at(weight_tensor).offset;
    return w8;
  };
  if (op.grad == Grad::none) {  // [x8, w8, (bias_w)] → [y]
    backend_.fp8_linear_forward(fp8_codes(in(op, "x"), op, a), weight(),
                                bias ? slice(in(op, "bias_w"), op, bias_tensor) : nullptr, buf(out(op, "y"), op), op.m,
                                op.k, op.n);
  } else if (op.grad == Grad::dgrad) {  // [d_y8, w8 or its transposed copy w8t, (d_x)] → [d_x]
    backend_.fp8_linear_backward_data(fp8_codes(in(op, "d_y"), op, a), weight(), buf(out(op, "d_x"), op), op.m, op.n,
                                      op.k, operands(op).has_in("d_x"), is_fp8_transposed_copy(in(op, "w")));
  } else {  // wgrad: [x8, d_y8, (x8's and d_y8's transposed copies)] → [dw]
    const std::string& dw = out(op, "dw");
    const bool transposed = operands(op).has_in("x_t");
    backend_.fp8_linear_backward_weight(fp8_codes(in(op, "d_y"), op, b), fp8_codes(in(op, "x"), op, a),
                                        slice<G>(dw, op, weight_tensor), bias ? slice<G>(dw, op, bias_tensor) : nullptr,
                                        op.k, op.m, op.n, transposed ? codes(in(op, "d_y_t"), op) : nullptr,
                                        transposed ? codes(in(op, "x_t"), op) : nullptr);
  }
}

// An FP8 grouped GEMM's segments (moe_gemm's, one block from row offsets in_at and out_at of its
// x and y): each expert's rows through the FP8 linear kernels, on the codes of the experts' FP8
// weight copy (fp8w.X<l>, laid out as their weights); scales at the op's slots (x or d_y: a; the
// weights or a wgrad's d_y: b, as the dense FP8 GEMMs), local expert l's l after them under current
// scaling.
template <class T, class G, class W>
void Interpreter<T, G, W>::moe_fp8_gemm(const Op& op, const std::string& weights, const char* tensor,
                                        const char* bias, const std::vector<int64_t>& experts,
                                        const std::vector<int64_t>& rows,
                                        int64_t in_at, int64_t out_at, int64_t in_features, int64_t out_features) {
  const bool current = p_.fp8.scaling == Fp8Scaling::current;
  int64_t in_row = in_at, out_row = out_at;  // the segment's first element of x (d_x) and y (d_y)
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string name = expert_tensor_name(experts[i], tensor);
    const int32_t local = current ? int32_t(experts[i] - ep_index_ * moe_local_) : 0;
    const int32_t a = op.fp8_slots[0] + local, b = op.fp8_slots[1] + local;
    if (op.grad == Grad::wgrad) {  // [x8, d_y8, counts] → [dw]
      Fp8Codes<W> x8 = fp8_codes(in(op, "x"), op, a), dy8 = fp8_codes(in(op, "d_y"), op, b);
      x8.codes += in_row;
      dy8.codes += out_row;
      G* dbias = bias ? slice<G>(weights, op, expert_tensor_name(experts[i], bias)) : nullptr;
      backend_.fp8_linear_backward_weight(dy8, x8, slice<G>(weights, op, name), dbias, rows[i], in_features,
                                          out_features);
    } else {
      Fp8Codes<W> w8 = fp8_codes(weights, op, b);
      w8.codes += layouts_.at(group_of_buffer(weights)).at(name).offset;
      if (op.grad == Grad::none) {  // [x8, w8, counts] → [y]
        Fp8Codes<W> x8 = fp8_codes(in(op, "x"), op, a);
        x8.codes += in_row;
        backend_.fp8_linear_forward(x8, w8, nullptr, buf(out(op, "y"), op) + out_row, rows[i], in_features,
                                    out_features);
      } else {  // dgrad: [d_y8, w8, counts, (d_x)] → [d_x]
        Fp8Codes<W> dy8 = fp8_codes(in(op, "d_y"), op, a);
        dy8.codes += out_row;
        backend_.fp8_linear_backward_data(dy8, w8, buf(out(op, "d_x"), op) + in_row, rows[i], in_features,
                                          out_features, operands(op).has_in("d_x"), is_fp8_transposed_copy(weights));
      }
    }
    in_row += rows[i] * in_features;
    out_row += rows[i] * out_features;
  }
}

// The rows an expert buffer x [rows, width] really holds, as moe_gemm reads them: in each etp
// block its real rows first, one segment per source rank and local expert.
template <class T, class G, class W>
std::vector<typename Interpreter<T, G, W>::ExpertRows> Interpreter<T, G, W>::moe_expert_rows(const Op& op,
                                                                                            const std::string& x) {
  moe_read_counts(op);
  const OpShape shape = role_.ops[size_t(arena_.alloc_of(x, op.id))].shape;
  STEPCAST_CHECK(shape.size() == 2, "expert buffer " + x + " is not [rows, width]");
  const int64_t width = shape[1];
  const int64_t blocks = moe_blocks(), block = shape[0] / blocks;
  const int64_t sources = grid_.etp_size() * grid_.ep_size() / blocks;
  std::vector<ExpertRows> rows;
  for (int64_t b = 0; b < blocks; ++b) {
    int64_t at = b * block * width;
    for (int64_t source = b * sources; source < (b + 1) * sources; ++source) {
      for (int64_t l = 0; l < moe_local_; ++l) {
        const int64_t elements = moe_received(source, l) * width;
        if (elements > 0) rows.push_back({l, at, elements});
        at += elements;
      }
    }
  }
  return rows;
}

// An expert buffer's amax under current scaling [x, amax, counts] → [amax]: each local expert's
// over its rows (every source's, every etp block's), into its own slot.
template <class T, class G, class W>
void Interpreter<T, G, W>::moe_fp8_absmax(const Op& op) {
  const std::string& x = in(op, "x");
  W* amax = buf<W>(out(op, "amax"), op) + op.fp8_slots[0];
  for (int64_t l = 0; l < moe_local_; ++l) backend_.fp8_absmax(buf(x, op), 0, amax + l, false);
  for (const ExpertRows& r : moe_expert_rows(op, x)) {
    backend_.fp8_absmax(buf(x, op) + r.at, r.elements, amax + r.local, true);
  }
}

// An expert buffer's FP8 cast [x, scale, amax, counts] → [y, (y_t,) amax, (scale)]: only the rows
// its counts say it holds, so that the worst-case buffer's other rows stay out of the amax; delayed
// scaling with the layer's slot, current scaling each local expert with its own scale (from the
// amax moe_fp8_absmax took), as Transformer Engine's grouped linear quantizes each expert's input.
// fp8_cast_transpose (a device reading FP8 row-wise only) also writes the codes transposed, as the
// program has them; the grouped wgrads read each expert's rows of y (their backends transpose).
template <class T, class G, class W>
void Interpreter<T, G, W>::moe_fp8_cast(const Op& op) {
  const std::string& x = in(op, "x");
  const std::string& y = out(op, "y");
  const bool current = p_.fp8.scaling == Fp8Scaling::current;
  const int32_t slot = op.fp8_slots[0];
  W* scale = buf<W>(in(op, "scale"), op) + slot;
  W* amax = buf<W>(out(op, "amax"), op) + slot;
  const Fp8Storage format = fp8_storage(dtype(y, op));
  if (current) {
    for (int64_t l = 0; l < moe_local_; ++l) backend_.fp8_set_current_scale(amax + l, scale + l, format);
  }
  for (const ExpertRows& r : moe_expert_rows(op, x)) {
    const int64_t l = current ? r.local : 0;
    backend_.fp8_cast(buf(x, op) + r.at, codes(y, op) + r.at, r.elements, scale + l, amax + l, format);
  }
  if (op.name == OpName::fp8_cast_transpose) {
    backend_.fp8_transpose(codes(y, op), codes(out(op, "y_t"), op), op.m, op.n);
  }
}

template <class T, class G, class W>
void Interpreter<T, G, W>::fp8_step_end(const Op& op) {
  if (op.kind == OpKind::all_reduce) {  // fp8_amax: [amax] → [amax], the maximum over the group
    const std::string& amax = out(op, "amax");
    if (op.fp8_slots[0] >= 0) {  // current scaling: one slot's, over tp
      backend_.all_reduce_max(op.group, buf<W>(amax, op) + op.fp8_slots[0], 1);
      return;
    }
    backend_.all_reduce_max(op.group, buf<W>(amax, op), count(amax, op));
    return;
  }
  // fp8_scale_update: [amax, history, scale] → [history, scale, amax]
  const std::string& scale = out(op, "scale");
  backend_.fp8_scale_update(buf<W>(out(op, "amax"), op), buf<W>(out(op, "history"), op), buf<W>(scale, op),
                            count(scale, op), p_.fp8);
}

// fp8_param_absmax [master, amax] → [amax]: each FP8 weight's amax over this rank's master shard
// (0 where it holds none of it), maximised over the shard group next (fp8_amax). fp8_param_cast
// [master, scale, amax] → [w8, amax, (scale)]: the shard's elements of each FP8 weight cast at
// their places in w8 with the weight's slot scale (current scaling: from the amax just reduced;
// delayed: the amax written for the next update's maximum over every rank). The master holds the
// weights' values exactly where T is W (the CPU backend; the CUDA backend refuses the plan).
template <class T, class G, class W>
void Interpreter<T, G, W>::fp8_param(const Op& op) {
  if constexpr (!std::is_same_v<T, W>) {
    STEPCAST_CHECK(false, "fp8_param_gather needs weights in their master's precision (the CPU backend)");
  } else {
    const std::string& master = in(op, "master");
    const std::string group = group_of_buffer(master);
    const GroupLayout& layout = layouts_.at(group);
    auto [first, last] = owned(layout.elements, group);
    const int64_t held = held_first(ShardedState::optimizer, layout.elements, group);
    const int64_t states = optimizer_states(role_.ops[size_t(arena_.alloc_of(master, op.id))]);
    W* values = buf<W>(master, op) + 2 * (count(master, op) / states);  // [m | v | master]
    W* amax = buf<W>(out(op, "amax"), op);
    const bool absmax = op.name == OpName::fp8_param_absmax;
    for (const Fp8Weight& weight : kFp8Weights) {
      if (!layout.has(weight.tensor)) continue;
      const TensorSlice& t = layout.at(weight.tensor);
      const int32_t slot = op.fp8_slots[0] + weight.slot;
      const int64_t a = std::max(first, t.offset);
      const int64_t n = std::max<int64_t>(0, std::min(last, t.offset + t.elements()) - a);
      const W* x = n > 0 ? values + (a - held) : values;
      if (absmax) {
        backend_.fp8_absmax(x, n, amax + slot, false);
        continue;
      }
      const std::string& w8 = out(op, "w8");
      const Fp8Storage format = fp8_storage(dtype(w8, op));
      W* scale = buf<W>(in(op, "scale"), op);
      if (p_.fp8.scaling == Fp8Scaling::current) backend_.fp8_set_current_scale(amax + slot, scale + slot, format);
      const int64_t at = a - held_first(ShardedState::weights, layout.elements, group);  // (ZeRO-3: a shard)
      if (n > 0) backend_.fp8_cast(x, codes(w8, op) + at, n, scale + slot, amax + slot, format);
    }
  }
}

template <class T, class G, class W>
void Interpreter<T, G, W>::prime_fp8_params() {
  for (const Op& op : role_.ops) {
    if (op.phase != Phase::optimizer) continue;
    const bool casts = op.name == OpName::fp8_param_absmax || op.name == OpName::fp8_param_cast;
    const bool shard_amax = op.name == OpName::fp8_amax && op.group != GroupKind::world;  // (not delayed scaling's)
    if (casts || shard_amax || op.name == OpName::param_gather) execute(op);
  }
}

#define STEPCAST_INSTANTIATE_FP8(T, G, W)                                                                   \
  template Fp8Codes<W> Interpreter<T, G, W>::fp8_codes(const std::string&, const Op&, int32_t);             \
  template void Interpreter<T, G, W>::fp8_activation(const Op&);                                            \
  template void Interpreter<T, G, W>::fp8_gemm(const Op&, const char*, const char*);                        \
  template void Interpreter<T, G, W>::fp8_step_end(const Op&);                                              \
  template void Interpreter<T, G, W>::fp8_param(const Op&);                                                 \
  template void Interpreter<T, G, W>::prime_fp8_params();                                                   \
  template void Interpreter<T, G, W>::moe_fp8_absmax(const Op&);                                            \
  template void Interpreter<T, G, W>::moe_fp8_cast(const Op&);                                              \
  template void Interpreter<T, G, W>::moe_fp8_gemm(const Op&, const std::string&, const char*, const char*, \
                                                   const std::vector<int64_t>&, const std::vector<int64_t>&, \
                                                   int64_t, int64_t, int64_t, int64_t);
STEPCAST_FOR_EACH_STORAGE(STEPCAST_INSTANTIATE_FP8)
#undef STEPCAST_INSTANTIATE_FP8

}  // namespace stepcast
