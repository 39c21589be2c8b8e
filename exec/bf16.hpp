// bf16 as host code sees it: 16 bits of storage (the upper half of an IEEE fp32) with conversions
// that round to nearest even, bit-compatible with CUDA's __nv_bfloat16. Host code only stores,
// converts and passes it through; arithmetic on it happens in device kernels, in fp32.
#pragma once

#include <cstdint>
#include <cstring>

namespace stepcast {

struct bf16 {
  uint16_t bits = 0;

  bf16() = default;
  explicit bf16(double value) : bf16(float(value)) {}
  explicit bf16(float value) {
    uint32_t u = 0;
    std::memcpy(&u, &value, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN stays a (quiet) NaN
      bits = uint16_t((u >> 16) | 0x40u);
      return;
    }
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
    bits = uint16_t(u >> 16);
  }
  explicit operator float() const {
    uint32_t u = uint32_t(bits) << 16;
    float f = 0;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
  explicit operator double() const { return double(float(*this)); }
};
static_assert(sizeof(bf16) == 2, "bf16 is two bytes");

}  // namespace stepcast
