// The interpreter's block-scaled FP8 ops, MXFP8 and blockwise (interpreter.hpp; fp8.hpp's storage):
// a linear layer's input, weights and output gradient cast into block-scaled buffers, row-wise and,
// for the GEMMs that reduce along their rows, column-wise (blockwise weights: 128×128 tiles, the
// same both ways); the GEMMs on them. No scale buffers and no amax: each block carries its own scale.
#include <string>

#include "errors.hpp"
#include "interpreter.hpp"
#include "param_layout.hpp"

namespace stepcast {

namespace {

// Where a linear weight's storage starts inside its layer's block-scaled copy (laid out as the
// layer's weights): its element offset, plus the scales of the linear weights before it.
int64_t weight_storage_offset(const GroupLayout& layout, const std::string& tensor, Fp8Blocks blocks) {
  int64_t scales = 0;
  for (const Fp8Weight& weight : kFp8Weights) {
    if (!layout.has(weight.tensor)) continue;
    const TensorSlice& t = layout.at(weight.tensor);
    if (t.offset < layout.at(tensor).offset) scales += block_bytes(blocks, t.elements()) - t.elements();
  }
  return layout.at(tensor).offset + scales;
}

}  // namespace

template <class T, class G, class W>
Fp8Codes<W> Interpreter<T, G, W>::block_codes(const std::string& name, const Op& op, bool columnwise,
                                              int64_t offset) {
  const Fp8Blocks blocks = fp8_blocks(dtype(name, op));
  STEPCAST_CHECK(blocks != Fp8Blocks::none, name + " is not a block-scaled buffer");
  return {codes(name, op) + offset, nullptr, fp8_storage(dtype(name, op)), blocks, columnwise};
}

template <class T, class G, class W>
void Interpreter<T, G, W>::block_activation(const Op& op) {
  if (op.name == OpName::fp8_cast || op.name == OpName::fp8_cast_transpose) {
    // [x] → [y, (y_t)]: x [op.m, op.n] row-wise into y, and column-wise into y_t.
    const std::string& x = in(op, "x");
    const std::string& y = out(op, "y");
    backend_.block_cast(buf(x, op), codes(y, op), op.m, op.n, fp8_blocks(dtype(y, op)), false,
                        fp8_storage(dtype(y, op)), p_.fp8.power_of_two_scales);
    if (op.name == OpName::fp8_cast_transpose) {
      const std::string& y_t = out(op, "y_t");
      backend_.block_cast(buf(x, op), codes(y_t, op), op.m, op.n, fp8_blocks(dtype(y_t, op)), true,
                          fp8_storage(dtype(y_t, op)), p_.fp8.power_of_two_scales);
    }
    return;
  }
  // fp8_weights [w] → [w8]: each linear weight row-wise (MX) or in tiles; fp8_weights_transpose: MX
  // [w] → [w8t] column-wise; tiles [w8] → [w8t], the same tiles (a tile's scale serves both ways,
  // and the emulated GEMM reads either copy by its layout, so the copy keeps w8's).
  STEPCAST_CHECK(op.name == OpName::fp8_weights || op.name == OpName::fp8_weights_transpose,
                 std::string("a block-scaled program's op ") + to_string(op.name));
  const bool columnwise = op.name == OpName::fp8_weights_transpose;
  const std::string& w = in(op, "w");
  const std::string& w8 = out(op, columnwise ? "w8t" : "w8");
  const Fp8Blocks blocks = fp8_blocks(dtype(w8, op));
  const GroupLayout& layout = layouts_.at(group_of_buffer(w));
  for (const Fp8Weight& weight : kFp8Weights) {
    if (!layout.has(weight.tensor)) continue;
    const TensorSlice& t = layout.at(weight.tensor);
    const int64_t at = weight_storage_offset(layout, weight.tensor, blocks);
    if (is_fp8_storage(dtype(w, op))) {  // the tiles' copy
      backend_.copy(codes(w8, op) + at, codes(w, op) + at, block_bytes(blocks, t.elements()));
      continue;
    }
    backend_.block_cast(buf(w, op) + t.offset, codes(w8, op) + at, t.rows, t.cols, blocks, columnwise,
                        fp8_storage(dtype(w8, op)), p_.fp8.power_of_two_scales);
  }
}

// The GEMMs as fp8_gemm's, each operand blocked along the GEMM's reduction: forward x and w
// row-wise; dgrad d_y row-wise and w column-wise (the layer's column-wise or transposed copy, or
// its tiles); wgrad x and d_y column-wise (the kept input's copy and the gradient's "_T").
template <class T, class G, class W>
void Interpreter<T, G, W>::block_gemm(const Op& op, const char* weight_tensor, const char* bias_tensor) {
  const bool bias = bias_tensor[0] != '\0';
  auto weight = [&](bool columnwise) {
    const std::string& w = in(op, "w");
    const GroupLayout& layout = layouts_.at(group_of_buffer(w));
    return block_codes(w, op, columnwise, weight_storage_offset(layout, weight_tensor, fp8_blocks(dtype(w, op))));
  };
  if (op.grad == Grad::none) {  // [x8, w8, (bias_w)] → [y]
    backend_.fp8_linear_forward(block_codes(in(op, "x"), op, false), weight(false),
                                bias ? slice(in(op, "bias_w"), op, bias_tensor) : nullptr, buf(out(op, "y"), op), op.m,
                                op.k, op.n);
  } else if (op.grad == Grad::dgrad) {  // [d_y8, w8t, (d_x)] → [d_x]
    backend_.fp8_linear_backward_data(block_codes(in(op, "d_y"), op, false), weight(true), buf(out(op, "d_x"), op),
                                      op.m, op.n, op.k, operands(op).has_in("d_x"), false);
  } else {  // wgrad: [x8 column-wise, d_y8 column-wise] → [dw]
    const std::string& dw = out(op, "dw");
    backend_.fp8_linear_backward_weight(block_codes(in(op, "d_y"), op, true), block_codes(in(op, "x"), op, true),
                                        slice<G>(dw, op, weight_tensor), bias ? slice<G>(dw, op, bias_tensor) : nullptr,
                                        op.k, op.m, op.n);
  }
}

#define STEPCAST_INSTANTIATE_BLOCKS(T, G, W)                                                              \
  template Fp8Codes<W> Interpreter<T, G, W>::block_codes(const std::string&, const Op&, bool, int64_t); \
  template void Interpreter<T, G, W>::block_activation(const Op&);                                      \
  template void Interpreter<T, G, W>::block_gemm(const Op&, const char*, const char*);
STEPCAST_FOR_EACH_STORAGE(STEPCAST_INSTANTIATE_BLOCKS)
#undef STEPCAST_INSTANTIATE_BLOCKS

}  // namespace stepcast
