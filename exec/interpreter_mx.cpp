// The interpreter's MXFP8 ops (interpreter.hpp; fp8.hpp's MX storage): a linear layer's input,
// weights and output gradient cast into MX buffers, row-wise and, for the GEMMs that reduce along
// their rows, column-wise; the GEMMs on them. No scale buffers and no amax: each 32 elements carry
// their own scale.
#include <string>

#include "errors.hpp"
#include "interpreter.hpp"
#include "param_layout.hpp"

namespace stepcast {

// `name`'s codes (from element `element_offset` of the tensor the buffer is laid out as: a weight
// inside its layer's MX copy), blocked row-wise or column-wise.
template <class T, class G, class W>
Fp8Codes<W> Interpreter<T, G, W>::mx_codes(const std::string& name, const Op& op, bool columnwise,
                                           int64_t element_offset) {
  STEPCAST_CHECK(is_mx_storage(dtype(name, op)), name + " is not an MX buffer");
  STEPCAST_CHECK(element_offset % kMxBlock == 0, name + ": an MX tensor at element " + std::to_string(element_offset) +
                                                     ", not a whole number of 32-element blocks");
  return {codes(name, op) + mx_bytes(element_offset), nullptr, fp8_storage(dtype(name, op)), true, columnwise};
}

template <class T, class G, class W>
void Interpreter<T, G, W>::mx_activation(const Op& op) {
  if (op.name == OpName::fp8_cast || op.name == OpName::fp8_cast_transpose) {
    // [x] → [y, (y_t)]: x [op.m, op.n] row-wise into y, and column-wise into y_t.
    const std::string& x = in(op, "x");
    const std::string& y = out(op, "y");
    backend_.mx_cast(buf(x, op), codes(y, op), op.m, op.n, false, fp8_storage(dtype(y, op)));
    if (op.name == OpName::fp8_cast_transpose) {
      const std::string& y_t = out(op, "y_t");
      backend_.mx_cast(buf(x, op), codes(y_t, op), op.m, op.n, true, fp8_storage(dtype(y_t, op)));
    }
    return;
  }
  // fp8_weights [w] → [w8]: each linear weight row-wise; fp8_weights_transpose [w] → [w8t]: column-wise.
  STEPCAST_CHECK(op.name == OpName::fp8_weights || op.name == OpName::fp8_weights_transpose,
                 std::string("an MXFP8 program's op ") + to_string(op.name));
  const bool columnwise = op.name == OpName::fp8_weights_transpose;
  const std::string& w = in(op, "w");
  const std::string& w8 = out(op, columnwise ? "w8t" : "w8");
  const GroupLayout& layout = layouts_.at(group_of_buffer(w));
  for (const Fp8Weight& weight : kFp8Weights) {
    if (!layout.has(weight.tensor)) continue;
    const TensorSlice& t = layout.at(weight.tensor);
    STEPCAST_CHECK(t.offset % kMxBlock == 0, w + ": " + weight.tensor + " at element " + std::to_string(t.offset) +
                                                 ", not a whole number of 32-element blocks");
    backend_.mx_cast(buf(w, op) + t.offset, codes(w8, op) + mx_bytes(t.offset), t.rows, t.cols, columnwise,
                     fp8_storage(dtype(w8, op)));
  }
}

// The GEMMs as fp8_gemm's, each operand blocked along the GEMM's reduction: forward x and w
// row-wise; dgrad d_y row-wise and w column-wise (the layer's column-wise copy); wgrad x and d_y
// column-wise (the kept input's copy and the gradient's "_T").
template <class T, class G, class W>
void Interpreter<T, G, W>::mx_gemm(const Op& op, const char* weight_tensor, const char* bias_tensor) {
  const bool bias = bias_tensor[0] != '\0';
  auto weight = [&](bool columnwise) {
    const std::string& w = in(op, "w");
    return mx_codes(w, op, columnwise, layouts_.at(group_of_buffer(w)).at(weight_tensor).offset);
  };
  if (op.grad == Grad::none) {  // [x8, w8, (bias_w)] → [y]
    backend_.fp8_linear_forward(mx_codes(in(op, "x"), op, false), weight(false),
                                bias ? slice(in(op, "bias_w"), op, bias_tensor) : nullptr, buf(out(op, "y"), op), op.m,
                                op.k, op.n);
  } else if (op.grad == Grad::dgrad) {  // [d_y8, w8t, (d_x)] → [d_x]
    backend_.fp8_linear_backward_data(mx_codes(in(op, "d_y"), op, false), weight(true), buf(out(op, "d_x"), op), op.m,
                                      op.n, op.k, operands(op).has_in("d_x"), false);
  } else {  // wgrad: [x8 column-wise, d_y8 column-wise] → [dw]
    const std::string& dw = out(op, "dw");
    backend_.fp8_linear_backward_weight(mx_codes(in(op, "d_y"), op, true), mx_codes(in(op, "x"), op, true),
                                        slice<G>(dw, op, weight_tensor), bias ? slice<G>(dw, op, bias_tensor) : nullptr,
                                        op.k, op.m, op.n);
  }
}

#define STEPCAST_INSTANTIATE_MX(T, G, W)                                                                \
  template Fp8Codes<W> Interpreter<T, G, W>::mx_codes(const std::string&, const Op&, bool, int64_t);    \
  template void Interpreter<T, G, W>::mx_activation(const Op&);                                         \
  template void Interpreter<T, G, W>::mx_gemm(const Op&, const char*, const char*);
STEPCAST_FOR_EACH_STORAGE(STEPCAST_INSTANTIATE_MX)
#undef STEPCAST_INSTANTIATE_MX

}  // namespace stepcast
