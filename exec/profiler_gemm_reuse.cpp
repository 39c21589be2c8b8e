// The GEMMs of a linear layer at a few shapes again, with their operands at reuse distances
// (profiler_tools.hpp's measure_gemm_reuse): back to back, and rotating through pools of the
// grid's reuse sizes, as a step finds a GEMM's weights, activations and gradients after its other
// ops touched their own data.
#include <algorithm>
#include <array>
#include <deque>
#include <functional>
#include <sstream>

#include "bf16.hpp"
#include "profiler_tools.hpp"

namespace stepcast {

namespace {

int64_t round_up16(int64_t elements) { return (elements + 15) / 16 * 16; }

// Elements of one call's operands (a, b, c as measure_gemms passes them) in the program's
// (m, n, k) of the variant.
std::array<int64_t, 3> operand_elements(const std::string& variant, int64_t m, int64_t n, int64_t k) {
  if (variant == "forward") return {m * k, n * k, m * n};
  if (variant == "dgrad") return {m * k, k * n, m * n};
  return {k * n, k * m, n * m};  // wgrad: dy, x, dw
}

}  // namespace

template <class T, class G, class W>
void measure_gemm_reuse(ProfilerTools<T, G, W>& tools, Backend<T, G, W>& backend, MeasuredTables& t) {
  const ProfileGrid& grid = tools.grid();
  const std::vector<double>& pools = tools.quick() ? grid.collective_reuse_bytes_quick : grid.collective_reuse_bytes;
  // A CPU's caches only (a GPU's operands are out of its caches at the profiled sizes either way),
  // and only where the grid's table rotated its operands through a pool the points are relative to.
  if (std::string(backend.name()) != "cpu" || pools.empty() || grid.gemm_reuse_axis.empty() ||
      !(t.gemm_table_pool_bytes > 0)) {
    return;
  }
  const int64_t e = int64_t(sizeof(T));
  const int64_t pool_elements = int64_t(pools.back()) / e;
  // Small non-zero values, written (so that the pool's pages are its own, not the zero page).
  T* pool = reinterpret_cast<T*>(tools.allocate_owned(backend, pool_elements * e));
  {
    const int64_t chunk = std::min<int64_t>(pool_elements, int64_t(1) << 22);
    std::vector<T> host(static_cast<size_t>(chunk));
    for (int64_t i = 0; i < chunk; ++i) host[size_t(i)] = T(0.25 + 0.01 * double(i % 17));
    for (int64_t at = 0; at < pool_elements; at += chunk) {
      backend.upload(pool + at, host.data(), std::min(chunk, pool_elements - at) * e);
    }
  }
  struct Slots {
    int64_t count = 1, elements = 0, next = 0;
  };
  std::deque<Slots> slots;
  std::vector<TimedPoint> points;
  std::vector<GemmPoint> rows;
  // Distance 0: back to back on one slot; then each pool, the calls taking its slots in turn and
  // the pool read through before each sample from the next slot on, so that every call finds its
  // operands a pool's worth of touched bytes earlier.
  std::vector<double> distances = {0.0};
  distances.insert(distances.end(), pools.begin(), pools.end());
  for (double distance : distances) {
    for (const std::string variant : {"forward", "dgrad", "wgrad"}) {
      for (int64_t m : grid.gemm_reuse_axis) {
        for (int64_t n : grid.gemm_reuse_axis) {
          for (int64_t k : grid.gemm_reuse_axis) {
            const std::array<int64_t, 3> sizes = operand_elements(variant, m, n, k);
            const int64_t slot = round_up16(sizes[0]) + round_up16(sizes[1]) + round_up16(sizes[2]);
            const int64_t count = distance > 0 ? int64_t(distance) / e / slot : 1;
            if (count < (distance > 0 ? 2 : 1)) continue;  // the pool holds fewer than two calls
            slots.push_back({count, slot, 0});
            Slots* s = &slots.back();
            const int64_t b_at = round_up16(sizes[0]), c_at = b_at + round_up16(sizes[1]);
            const int which = variant == "forward" ? 0 : variant == "dgrad" ? 1 : 2;
            auto body = [&backend, which, m, n, k, pool, s, b_at, c_at] {
              T* a = pool + s->next * s->elements;
              s->next = (s->next + 1) % s->count;
              if (which == 0) backend.linear_forward(a, a + b_at, nullptr, a + c_at, m, k, n);
              else if (which == 1) backend.linear_backward_data(a, a + b_at, a + c_at, m, n, k, false);
              else backend.linear_backward_weight(a, a + b_at, reinterpret_cast<G*>(a + c_at), nullptr, k, m, n);
            };
            std::function<void()> prepare;
            if (distance > 0) {
              // One word a cache line, from the next slot on, round the slots.
              prepare = [&tools, pool, s] {
                const int64_t bytes = int64_t(sizeof(T));
                tools.read_round(reinterpret_cast<const char*>(pool), s->count * s->elements * bytes,
                                 s->next * s->elements * bytes);
              };
            } else {
              prepare = body;  // warm: the sample's first call finds them as the others do
            }
            points.push_back({body, true, prepare});
            rows.push_back({variant, m, n, k, 0, "", 1, distance});
          }
        }
      }
    }
  }
  if (points.empty()) return;
  std::vector<double> seconds = tools.time("gemm with operands at reuse distances", points);
  double warm = 0, far = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    rows[i].time_s = seconds[i];
    t.gemm_reuse.push_back(rows[i]);
  }
  // The largest shape's forward, back to back against the farthest pool.
  for (const GemmPoint& p : t.gemm_reuse) {
    const int64_t top = grid.gemm_reuse_axis.back();
    if (p.variant != "forward" || p.m != top || p.n != top || p.k != top) continue;
    if (p.reuse_distance_bytes == 0) warm = p.time_s;
    else far = p.time_s;  // the points come by distance: the last is the farthest pool's
  }
  std::ostringstream line;
  line.precision(3);
  line << "gemm with operands at reuse distances: " << rows.size() << " points";
  if (warm > 0 && far > 0) {
    line << "; forward " << grid.gemm_reuse_axis.back() << "³ " << far / warm
         << "× its back-to-back time after " << pools.back() / double(1 << 20) << " MiB";
  }
  tools.progress(line.str());
}

template void measure_gemm_reuse<float, float, float>(ProfilerTools<float, float, float>&,
                                                      Backend<float, float, float>&, MeasuredTables&);
template void measure_gemm_reuse<double, double, double>(ProfilerTools<double, double, double>&,
                                                         Backend<double, double, double>&, MeasuredTables&);
template void measure_gemm_reuse<bf16, float, float>(ProfilerTools<bf16, float, float>&, Backend<bf16, float, float>&,
                                                     MeasuredTables&);

}  // namespace stepcast
