// Nelder–Mead (Nelder and Mead, "A simplex method for function minimization", Computer Journal
// 1965) with the standard coefficients: reflection 1, expansion 2, contraction 1/2, shrink 1/2.
#include "minimize.hpp"

#include <algorithm>
#include <numeric>

namespace stepcast {

MinimizeResult minimize_nelder_mead(const std::function<double(const std::vector<double>&)>& f,
                                    std::vector<double> start, double step, double tolerance,
                                    int max_evaluations) {
  const size_t n = start.size();
  MinimizeResult result;
  std::vector<std::vector<double>> simplex(n + 1, start);
  for (size_t i = 0; i < n; ++i) simplex[i + 1][i] += step;
  std::vector<double> values(n + 1);
  auto eval = [&](const std::vector<double>& x) {
    ++result.evaluations;
    return f(x);
  };
  for (size_t i = 0; i <= n; ++i) values[i] = eval(simplex[i]);
  std::vector<size_t> order(n + 1);
  auto point = [&](const std::vector<double>& centroid, const std::vector<double>& worst, double t) {
    std::vector<double> x(n);
    for (size_t j = 0; j < n; ++j) x[j] = centroid[j] + t * (worst[j] - centroid[j]);
    return x;
  };
  while (result.evaluations < max_evaluations) {
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return values[a] < values[b]; });
    size_t best = order.front(), worst = order.back(), second = order[n - 1];
    if (values[worst] - values[best] < tolerance) break;
    std::vector<double> centroid(n, 0.0);
    for (size_t i : order) {
      if (i == worst) continue;
      for (size_t j = 0; j < n; ++j) centroid[j] += simplex[i][j] / double(n);
    }
    std::vector<double> reflected = point(centroid, simplex[worst], -1.0);
    double fr = eval(reflected);
    if (fr < values[best]) {
      std::vector<double> expanded = point(centroid, simplex[worst], -2.0);
      double fe = eval(expanded);
      if (fe < fr) {
        simplex[worst] = expanded;
        values[worst] = fe;
      } else {
        simplex[worst] = reflected;
        values[worst] = fr;
      }
      continue;
    }
    if (fr < values[second]) {
      simplex[worst] = reflected;
      values[worst] = fr;
      continue;
    }
    bool outside = fr < values[worst];
    std::vector<double> contracted = point(centroid, outside ? reflected : simplex[worst], 0.5);
    double fc = eval(contracted);
    if (fc < std::min(fr, values[worst])) {
      simplex[worst] = contracted;
      values[worst] = fc;
      continue;
    }
    for (size_t i = 0; i <= n; ++i) {
      if (i == best) continue;
      for (size_t j = 0; j < n; ++j) simplex[i][j] = simplex[best][j] + 0.5 * (simplex[i][j] - simplex[best][j]);
      values[i] = eval(simplex[i]);
    }
  }
  size_t best = size_t(std::min_element(values.begin(), values.end()) - values.begin());
  result.x = simplex[best];
  result.value = values[best];
  return result;
}

}  // namespace stepcast
