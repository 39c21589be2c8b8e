// The interpreter's FP8 ops (interpreter.hpp; fp8.hpp): casts of activations, gradients and a
// layer's weights to FP8 with their slot's scale, GEMMs on FP8 operands, and delayed scaling's
// end of step (the amax maximised over the group, the scales updated). Every scale is read from
// the program's persistent fp8.scale buffer at the op's slot.
#include "errors.hpp"
#include "interpreter.hpp"

namespace stepcast {
namespace {

Fp8Storage storage(Dtype dtype) {
  STEPCAST_CHECK(is_fp8_storage(dtype), std::string("an FP8 operand of dtype ") + to_string(dtype));
  return dtype == Dtype::fp8_e4m3 ? Fp8Storage::e4m3 : Fp8Storage::e5m2;
}

// The linear weights of a layer's group, each with its weight slot kind.
struct Fp8Weight {
  const char* tensor;
  Fp8Slot slot;
};
// An expert tensor's weight slot kind ("expert.<e>.up.weight": mlp_up_w), −1 for its biases.
int32_t expert_weight_slot(const std::string& name) {
  if (name.ends_with(".gate.weight")) return Fp8Slot::mlp_gate_w;
  if (name.ends_with(".up.weight")) return Fp8Slot::mlp_up_w;
  if (name.ends_with(".down.weight")) return Fp8Slot::mlp_down_w;
  return -1;
}

constexpr Fp8Weight kFp8Weights[] = {{"qkv.weight", Fp8Slot::qkv_w},
                                     {"attn_out.weight", Fp8Slot::attn_out_w},
                                     {"mlp_up.weight", Fp8Slot::mlp_up_w},
                                     {"mlp_gate.weight", Fp8Slot::mlp_gate_w},
                                     {"mlp_down.weight", Fp8Slot::mlp_down_w}};

}  // namespace

template <class T, class G, class W>
Fp8Codes<W> Interpreter<T, G, W>::fp8_codes(const std::string& name, const Op& op, int32_t slot) {
  return {codes(name, op), buf<W>("fp8.scale", op) + slot, storage(dtype(name, op))};
}

template <class T, class G, class W>
void Interpreter<T, G, W>::fp8_activation(const Op& op) {
  if (op.name == OpName::fp8_transpose && operands(op).has_in("x8")) {  // [x8] → [x8t]: a wgrad operand's
    backend_.fp8_transpose(codes(in(op, "x8"), op), codes(out(op, "x8t"), op), op.m, op.n);
    return;
  }
  if (op.name == OpName::fp8_transpose) {  // [w8] → [w8t]: each linear weight's codes transposed in place of it
    const std::string& w8 = in(op, "w8");
    const std::string& w8t = out(op, "w8t");
    const GroupLayout& layout = layouts_.at(group_of_buffer(w8));
    for (const Fp8Weight& weight : kFp8Weights) {
      if (!layout.has(weight.tensor)) continue;
      const TensorSlice& tensor = layout.at(weight.tensor);
      backend_.fp8_transpose(codes(w8, op) + tensor.offset, codes(w8t, op) + tensor.offset, tensor.rows, tensor.cols);
    }
    return;
  }
  W* amax = buf<W>(out(op, "amax"), op);
  if (op.name == OpName::fp8_absmax) {  // [x, amax] → [amax]: current scaling's amax of x
    backend_.fp8_absmax(buf(in(op, "x"), op), count(in(op, "x"), op), amax + op.fp8_slots[0]);
    return;
  }
  W* scale = buf<W>(in(op, "scale"), op);
  const bool current = p_.fp8.scaling == Fp8Scaling::current;
  if (op.name == OpName::fp8_cast && operands(op).has_in("counts")) return moe_fp8_cast(op);
  if (op.name == OpName::fp8_cast || op.name == OpName::fp8_cast_transpose) {
    // [x, scale, amax] → [y, (y_t,) amax, (scale)]: y_t the codes transposed, y [op.m, op.n]
    const std::string& y = out(op, "y");
    const int32_t slot = op.fp8_slots[0];
    if (current) backend_.fp8_set_current_scale(amax + slot, scale + slot, storage(dtype(y, op)));
    backend_.fp8_cast(buf(in(op, "x"), op), codes(y, op), count(in(op, "x"), op), scale + slot, amax + slot,
                      storage(dtype(y, op)));
    if (op.name == OpName::fp8_cast_transpose) {
      backend_.fp8_transpose(codes(y, op), codes(out(op, "y_t"), op), op.m, op.n);
    }
    return;
  }
  // fp8_weights: [w, scale, amax] → [w8, amax, (scale)], each linear weight with its slot's scale
  // (current scaling: from the weight's own amax); a MoE layer's experts, each expert's gate, up
  // and down weights with the layer's MLP slots (delayed scaling).
  const std::string& w = in(op, "w");
  const std::string& w8 = out(op, "w8");
  const GroupLayout& layout = layouts_.at(group_of_buffer(w));
  if (is_expert_group(group_of_buffer(w))) {
    STEPCAST_CHECK(!current, "current scaling of expert weights");
    for (const TensorSlice& tensor : layout.tensors) {
      const int32_t slot = op.fp8_slots[0] + expert_weight_slot(tensor.name);
      if (slot < op.fp8_slots[0]) continue;  // a bias
      backend_.fp8_cast(buf(w, op) + tensor.offset, codes(w8, op) + tensor.offset, tensor.elements(), scale + slot,
                        amax + slot, storage(dtype(w8, op)));
    }
    return;
  }
  for (const Fp8Weight& weight : kFp8Weights) {
    if (!layout.has(weight.tensor)) continue;
    const TensorSlice& tensor = layout.at(weight.tensor);
    const int32_t slot = op.fp8_slots[0] + weight.slot;
    if (current) {
      backend_.fp8_absmax(buf(w, op) + tensor.offset, tensor.elements(), amax + slot);
      backend_.fp8_set_current_scale(amax + slot, scale + slot, storage(dtype(w8, op)));
    }
    backend_.fp8_cast(buf(w, op) + tensor.offset, codes(w8, op) + tensor.offset, tensor.elements(), scale + slot,
                      amax + slot, storage(dtype(w8, op)));
  }
}

template <class T, class G, class W>
void Interpreter<T, G, W>::fp8_gemm(const Op& op, const char* weight_tensor, const char* bias_tensor) {
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

#define STEPCAST_INSTANTIATE_FP8(T, G, W)                                                                   \
  template Fp8Codes<W> Interpreter<T, G, W>::fp8_codes(const std::string&, const Op&, int32_t);             \
  template void Interpreter<T, G, W>::fp8_activation(const Op&);                                            \
  template void Interpreter<T, G, W>::fp8_gemm(const Op&, const char*, const char*);                        \
  template void Interpreter<T, G, W>::fp8_step_end(const Op&);
STEPCAST_FOR_EACH_STORAGE(STEPCAST_INSTANTIATE_FP8)
#undef STEPCAST_INSTANTIATE_FP8

}  // namespace stepcast
