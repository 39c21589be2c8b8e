// Derivative-free minimisation for the few-parameter fits stepcast makes (a profile's GEMM shape
// model to published GEMM points, `stepcast calibrate` to measured steps): Nelder–Mead on an
// unconstrained vector (callers map bounded parameters through exp or a logistic themselves).
// Pure function; deterministic for a given start.
#pragma once

#include <functional>
#include <vector>

namespace stepcast {

struct MinimizeResult {
  std::vector<double> x;
  double value = 0;
  int evaluations = 0;
};

// Minimises f from `start`, the first simplex spanning `step` along each coordinate; stops when
// the simplex's values differ by less than `tolerance` (absolute) or after `max_evaluations`.
MinimizeResult minimize_nelder_mead(const std::function<double(const std::vector<double>&)>& f,
                                    std::vector<double> start, double step, double tolerance = 1e-10,
                                    int max_evaluations = 4000);

}  // namespace stepcast
