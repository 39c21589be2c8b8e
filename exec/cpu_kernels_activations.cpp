// The CPU kernels' MLP activations (cpu_kernels.hpp): GPT-2's tanh GELU and SwiGLU, forward and
// backward, element-wise in double.
#include <cmath>

#include "cpu_kernels.hpp"

namespace stepcast::cpu {

namespace {
constexpr double kGeluC = 0.7978845608028654;  // √(2/π)
constexpr double kGeluA = 0.044715;
double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
}  // namespace

template <class T>
void gelu_forward(const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    double v = x[i];
    y[i] = T(0.5 * v * (1.0 + std::tanh(kGeluC * (v + kGeluA * v * v * v))));
  }
}

template <class T>
void gelu_backward(const T* x, const T* dy, T* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    double v = x[i];
    double t = std::tanh(kGeluC * (v + kGeluA * v * v * v));
    double grad = 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * kGeluC * (1.0 + 3.0 * kGeluA * v * v);
    dx[i] = T(dy[i] * grad);
  }
}

template <class T>
void swiglu_forward(const T* gate, const T* up, T* act, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    double g = gate[i];
    act[i] = T(g * sigmoid(g) * up[i]);
  }
}

template <class T>
void swiglu_backward(const T* gate, const T* up, const T* d_act, T* d_gate, T* d_up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    double g = gate[i], sg = sigmoid(g);
    d_gate[i] = T(double(d_act[i]) * up[i] * sg * (1.0 + g * (1.0 - sg)));
    d_up[i] = T(double(d_act[i]) * g * sg);
  }
}

// ---- Explicit instantiations ----

#define STEPCAST_CPU_KERNELS_ACTIVATIONS(T)                         \
  template void gelu_forward<T>(const T*, T*, int64_t);             \
  template void gelu_backward<T>(const T*, const T*, T*, int64_t);  \
  template void swiglu_forward<T>(const T*, const T*, T*, int64_t); \
  template void swiglu_backward<T>(const T*, const T*, const T*, T*, T*, int64_t);

STEPCAST_CPU_KERNELS_ACTIVATIONS(float)
STEPCAST_CPU_KERNELS_ACTIVATIONS(double)

#undef STEPCAST_CPU_KERNELS_ACTIVATIONS

}  // namespace stepcast::cpu
