// The measured tables of profiler.hpp (measure_tables); profiler_memory.cpp measures the
// memory-bound families, point_timer.cpp times them,
// cpu_profile.cpp makes the CPU backend's profile of them, machine_info.cpp says where. Every
// rank runs the same list of points at the same time (a barrier before each sample), as ranks compete for caches and memory bandwidth in a
// training step; PointTimer says how a point is timed (interleaved passes, median of every
// rank's samples). Default: 5 samples of at least 1 ms per point and rank — not the ~50 ms a
// lone benchmark would take, so that ~2,400 points fit in well under a minute on two cores.
//
// Grids. GEMM m, n, k each over 10, 14, 20, 28, 40, 80, 160, 320, 640 (quick: 20, 80, 320) for
// each of the three GEMMs of a linear layer: √2 steps where the rate bends most, 2× above —
// off the powers of two and their 1.5× steps that model shapes use, so predicting a model's
// GEMM is never a lookup of its own measurement. Memory-bound families
// at 16 KiB · 4^i (… 16 MiB, past the caches; quick: 64 KiB, 1 MiB, 16 MiB) of lowering-counted
// bytes.
// Collectives at 1 KiB · 4^i (… 64 MiB; quick: 4 KiB, 256 KiB, 4 MiB) on the world group (the
// program's ring and tree over point-to-point, and MPI's own) and, with more than two ranks, on
// groups of two; the program's again with operands out of cache (pools of the grid's
// collective_reuse_bytes per rank); ping-pong between rank pairs (2i, 2i+1) at 8 B · 4^i (… 32
// MiB; quick: 8 B, 4 KiB, 1 MiB).
#include "profiler.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <tuple>

#include "collective.hpp"
#include "cpu_kernels.hpp"
#include "errors.hpp"
#include "mpi_check.hpp"
#include "point_timer.hpp"
#include "profiler_tools.hpp"

namespace stepcast {

int ping_pong_peer(int rank, int size, int stride) {
  const int peer = (rank / stride) % 2 == 0 ? rank + stride : rank - stride;
  if (peer >= size || (stride > 1 && rank % stride != 0)) return -1;
  return peer;
}

namespace {

std::string format_rate(double value, const char* unit) {
  std::ostringstream out;
  out.precision(3);
  if (value >= 1e9) out << value / 1e9 << " G" << unit;
  else if (value >= 1e6) out << value / 1e6 << " M" << unit;
  else out << value << " " << unit;
  return out.str();
}

std::string format_bytes_short(double bytes) {
  std::ostringstream out;
  if (bytes >= 1 << 20) out << bytes / double(1 << 20) << " MiB";
  else if (bytes >= 1 << 10) out << bytes / double(1 << 10) << " KiB";
  else out << bytes << " B";
  return out.str();
}

template <class T, class G, class W>
class Profiler : public ProfilerTools<T, G, W> {
 public:
  using ProfilerTools<T, G, W>::buffer;

  Profiler(const ProfileOptions& options, int rank, int size, int ranks_per_node,
           const BackendFactory<T, G, W>& factory, const ProfileGrid& grid)
      : options_(options), rank_(rank), size_(size), ranks_per_node_(ranks_per_node),
        timer_(options, rank, size, [this] { for (auto& b : backends_) b->synchronize(); }),
        factory_(factory), grid_(grid) {}

  MeasuredTables run() {
    MeasuredTables t;
    t.dtype = options_.dtype;
    Backend<T, G, W>& world = make_backend(RankGrid(1, size_, 1, "tp-dp-pp"), false);
    if (options_.links_only) {
      measure_collectives(world, GroupKind::dp, grid_.collective_algorithm, t, {OpKind::all_gather});
      measure_p2p(world, ranks_per_node_, "send/recv ping-pong across nodes", {8, 4 << 20, 16 << 20},
                  t.p2p_inter_node);
      return t;
    }
    measure_gemms(world, t);
    measure_gemm_reuse(*this, world, t);
    measure_memory_families(*this, world, t);
    measure_attention(world, t);
    if (size_ > 1) {
      measure_collectives(world, GroupKind::dp, grid_.collective_algorithm, t);
      measure_collective_reuse(world, GroupKind::dp, t);
      if (!options_.quick && grid_.mpi_collectives) {
        measure_collectives(make_backend(RankGrid(1, size_, 1, "tp-dp-pp"), true), GroupKind::dp,
                            "mpi", t);
      }
      if (size_ > 2 && size_ % 2 == 0 && nodes_spanned(2)) {
        measure_collectives(make_backend(RankGrid(2, size_ / 2, 1, "tp-dp-pp"), false),
                            GroupKind::tp, "ring", t);
      }
      // Ping-pong inside a node (pairs of neighbouring ranks), and across nodes (node 2j's first
      // rank with node 2j+1's, one pair at a time: ping_pong_peer) when the ranks span more than one.
      const int nodes = size_ / ranks_per_node_;
      // Quick, across nodes: two sizes past a shaper's burst (its β is their marginal rate).
      if (nodes == 1 || ranks_per_node_ >= 2) {
        measure_p2p(world, 1, "send/recv ping-pong", {8, 4096, 1 << 20}, t.p2p);
      }
      if (nodes > 1) {
        measure_p2p(world, ranks_per_node_, "send/recv ping-pong across nodes", {8, 4 << 20, 16 << 20},
                    t.p2p_inter_node);
      }
    }
    return t;
  }

  ~Profiler() {
    for (auto& [backend, memory] : owned_) backend->release(memory);
  }

 private:
  void progress(const std::string& line) override {
    if (rank_ == 0 && options_.progress) options_.progress(line);
  }

  std::vector<double> sizes(double first, double last, const std::vector<double>& quick) const override {
    if (options_.quick) return quick;
    std::vector<double> out;
    for (double s = first; s <= last; s *= 4) out.push_back(s);
    return out;
  }

  // Collective over MPI_COMM_WORLD (the backend splits its communicators); lives as long as
  // the profiler, so its buffers are released before it.
  Backend<T, G, W>& make_backend(const RankGrid& grid, bool use_mpi_collectives) {
    backends_.push_back(factory_(grid, use_mpi_collectives));
    return *backends_.back();
  }

  // The nodes every group of n consecutive ranks spans (ranks are placed node by node), where all
  // such groups span the same number.
  std::optional<int64_t> nodes_spanned(int n) const {
    if (ranks_per_node_ % n == 0) return 1;
    if (n % ranks_per_node_ == 0) return n / ranks_per_node_;
    return std::nullopt;
  }

  // Times `points`, printing a line per pass: "LABEL: pass P/R".
  char* allocate_owned(Backend<T, G, W>& backend, int64_t bytes) override {
    char* memory = backend.allocate(bytes);
    owned_.push_back({&backend, memory});
    return memory;
  }
  const ProfileGrid& grid() const override { return grid_; }
  bool quick() const override { return options_.quick; }

  std::vector<double> time(const std::string& label, const std::vector<TimedPoint>& points) override {
    double start = MPI_Wtime();
    return timer_.seconds_per_call(points, [&](int pass) {
      std::ostringstream line;
      line.precision(3);
      line << label << ": " << points.size() << " points, pass " << pass << "/"
           << options_.repetitions << " (" << MPI_Wtime() - start << " s)";
      progress(line.str());
    });
  }

  // Elements of the GEMM operand pool: 4× this core's L2 on the CPU backend, none on others.
  int64_t gemm_operand_pool_elements(Backend<T, G, W>& backend) const {
    if (std::string(backend.name()) != "cpu") return 0;
    long l2_bytes = sysconf(_SC_LEVEL2_CACHE_SIZE);
    if (l2_bytes <= 0) l2_bytes = 1 << 20;  // not reported: a common size
    return 4 * int64_t(l2_bytes) / int64_t(sizeof(T));
  }

  void measure_gemms(Backend<T, G, W>& backend, MeasuredTables& t) {
    std::vector<int64_t> axis = options_.quick ? grid_.gemm_axis_quick : grid_.gemm_axis;
    int64_t largest = axis.back() * axis.back();
    // In a training step a GEMM's operands were last touched several ops ago: on a CPU they come
    // from the shared cache, not the core's own. So successive calls of a point rotate through
    // operand copies spanning a pool of 4× the core's L2 (each of a, b, c), rather than hitting
    // the same hot lines; the GPU backend keeps one copy (its operands are not cache-resident
    // at the profiled sizes either way).
    const int64_t pool = gemm_operand_pool_elements(backend);
    t.gemm_table_pool_bytes = double(pool) * double(sizeof(T));
    T* a = buffer(backend, largest + pool);
    T* b = buffer(backend, largest + pool);
    T* c = buffer(backend, largest + pool);
    G* cg = this->template buffer<G>(backend, largest + pool);  // weight gradients accumulate in G
    std::vector<TimedPoint> points;
    std::vector<GemmPoint> shapes;
    for (const std::string variant : {"forward", "dgrad", "wgrad"}) {
      for (int64_t m : axis) {
        for (int64_t n : axis) {
          for (int64_t k : axis) {
            // Operand copies `stride` elements apart (the point's largest operand, whole cache
            // lines), as many as the pool holds.
            const int64_t stride = (std::max({m * k, n * k, m * n}) + 15) / 16 * 16;
            const int64_t slots = std::max<int64_t>(1, pool / stride);
            auto at = [stride, slots](int64_t call) { return (call % slots) * stride; };
            // The program's (m, n, k) of each variant mapped onto the linear layer's kernels.
            if (variant == "forward") {
              points.push_back({[&, m, n, k, at, call = int64_t(0)]() mutable {
                int64_t o = at(call++);
                backend.linear_forward(a + o, b + o, nullptr, c + o, m, k, n);
              }});
            } else if (variant == "dgrad") {
              points.push_back({[&, m, n, k, at, call = int64_t(0)]() mutable {
                int64_t o = at(call++);
                backend.linear_backward_data(a + o, b + o, c + o, m, n, k, false);
              }});
            } else {
              points.push_back({[&, m, n, k, at, call = int64_t(0)]() mutable {
                int64_t o = at(call++);
                backend.linear_backward_weight(a + o, b + o, cg + o, nullptr, k, m, n);
              }});
            }
            shapes.push_back({variant, m, n, k, 0, "", 1});
          }
        }
      }
    }
    std::vector<double> seconds = time("gemm", points);
    double slowest = 1e300, fastest = 0;
    for (size_t i = 0; i < shapes.size(); ++i) {
      shapes[i].time_s = seconds[i];
      slowest = std::min(slowest, shapes[i].flops() / seconds[i]);
      fastest = std::max(fastest, shapes[i].flops() / seconds[i]);
      t.gemm.push_back(shapes[i]);
    }
    progress("gemm: " + std::to_string(shapes.size()) + " shapes (forward, dgrad, wgrad), " +
             format_rate(slowest, "flop/s") + " … " + format_rate(fastest, "flop/s"));
  }

  // Fused (flash) attention, causal, forward and backward, at the grid's head dimensions and
  // sequence lengths (a CPU's: those of the test and validation models): the attention points the cost
  // model interpolates (FlashAttention's flop convention, profile.hpp). Without them a CPU
  // profile had no flash figure and costed the kernel at the roofline.
  void measure_attention(Backend<T, G, W>& backend, MeasuredTables& t) {
    const std::vector<int64_t>& dims = options_.quick ? grid_.attention_dims_quick : grid_.attention_dims;
    const std::vector<int64_t>& seqs = options_.quick ? grid_.attention_seqs_quick : grid_.attention_seqs;
    const int64_t b = grid_.attention_b, heads = grid_.attention_heads;
    const int64_t largest = seqs.back() * b * (heads + 2 * heads) * dims.back();
    T* qkv = buffer(backend, largest, true);
    T* ctx = buffer(backend, largest);
    T* d_ctx = buffer(backend, largest, true);
    T* d_qkv = buffer(backend, largest);
    W* lse = this->template buffer<W>(backend, b * heads * seqs.back());
    std::vector<TimedPoint> points;
    std::vector<AttentionPoint> rows;
    for (int64_t d : dims) {
      for (int64_t seq : seqs) {
        const cpu::AttentionShape shape{seq, b, heads, heads, d};
        const double scale = 1.0 / std::sqrt(double(d));
        // The backward reads the forward's ctx and lse: the forward runs once first below.
        points.push_back({[&backend, qkv, ctx, lse, shape, scale] {
          backend.flash_attention_forward(qkv, ctx, lse, shape, scale, nullptr, 0, nullptr);
        }});
        rows.push_back({"forward", seq, d, true, 4.0 * b * heads * double(seq) * seq * d / 2, ""});
        points.push_back({[&backend, qkv, ctx, lse, d_ctx, d_qkv, shape, scale] {
          backend.flash_attention_backward(qkv, ctx, lse, d_ctx, d_qkv, shape, scale, nullptr, 0, nullptr);
        }});
        rows.push_back({"backward", seq, d, true, 2.5 * 4.0 * b * heads * double(seq) * seq * d / 2, ""});
      }
    }
    // The context-parallel kernel (the CPU backend's: its ring blocks mask by position arrays,
    // not by index), at the same (rows per rank, head_dim): cp rank 0 of 2, holding chunks 0 and
    // 3 of a 2·seq sequence, over its own block (step 0: two causal halves and a full quarter) and
    // its peer's (step 1: chunks 1 and 2, two full quarters), both timed together. Each block has
    // seq²/2 visible pairs, as a causal one: a rate in the same convention.
    std::vector<int64_t> q_pos, peer_pos;  // each shape's at [at, at + seq)
    if (std::string(backend.name()) == "cpu") {
      T* kv = buffer(backend, largest, true);  // [seq, b, 2·heads·d] packed K/V
      T* d_kv = buffer(backend, largest);
      for (int64_t d : dims) {
        for (int64_t seq : seqs) {
          if (seq % 2 != 0) continue;
          const cpu::AttentionShape shape{seq, b, heads, heads, d};
          const double scale = 1.0 / std::sqrt(double(d));
          const size_t at = q_pos.size();
          const int64_t c = seq / 2;
          for (int64_t r = 0; r < seq; ++r) {
            q_pos.push_back(r < c ? r : 3 * c + (r - c));
            peer_pos.push_back(r < c ? c + r : 2 * c + (r - c));
          }
          points.push_back({[&backend, &q_pos, &peer_pos, qkv, kv, ctx, lse, shape, scale, at] {
            const int64_t* q = q_pos.data() + at;
            backend.cp_flash_forward(qkv, kv, shape.s, q, q, ctx, lse, shape, scale, nullptr, 0, nullptr);
            backend.cp_flash_forward(qkv, kv, shape.s, q, peer_pos.data() + at, ctx, lse, shape, scale, nullptr, 0,
                                     nullptr);
          }});
          rows.push_back({"forward", seq, d, true, 2 * 4.0 * b * heads * double(seq) * seq * d / 2, "", "cp_flash"});
          points.push_back({[&backend, &q_pos, &peer_pos, qkv, kv, ctx, lse, d_ctx, d_qkv, d_kv, shape, scale, at] {
            const int64_t* q = q_pos.data() + at;
            backend.cp_flash_backward(qkv, kv, shape.s, q, q, ctx, lse, d_ctx, d_qkv, false, d_kv, shape, scale,
                                      nullptr, 0, nullptr);
            backend.cp_flash_backward(qkv, kv, shape.s, q, peer_pos.data() + at, ctx, lse, d_ctx, d_qkv, false, d_kv,
                                      shape, scale, nullptr, 0, nullptr);
          }});
          rows.push_back(
              {"backward", seq, d, true, 2 * 2.5 * 4.0 * b * heads * double(seq) * seq * d / 2, "", "cp_flash"});
        }
      }
    }
    for (size_t i = 0; i < points.size(); i += 2) points[i].body();  // lse of every shape
    const std::function<void()> after = this->step_gemm(backend);  // each call as a step makes it
    for (TimedPoint& p : points) p.before_each = after;
    std::vector<double> seconds = time("attention", points);
    for (size_t i = 0; i < rows.size(); ++i) {
      rows[i].flops_per_s = rows[i].flops_per_s / seconds[i];  // the flops over the time
    }
    // The table is ordered by (pass, head_dim, causal), seq rising within each.
    std::stable_sort(rows.begin(), rows.end(), [](const AttentionPoint& x, const AttentionPoint& y) {
      return std::tie(x.impl, x.pass, x.head_dim) < std::tie(y.impl, y.pass, y.head_dim);
    });
    for (const AttentionPoint& a : rows) t.attention.push_back(a);
    progress("attention: flash (and context-parallel flash) forward and backward, " + std::to_string(rows.size()) +
             " points");
  }

  // Every kind the program's collectives use, or those of `only`.
  void measure_collectives(Backend<T, G, W>& backend, GroupKind group, const std::string& algorithm,
                           MeasuredTables& t, const std::vector<OpKind>& only = {}) {
    const int n = backend.group_size(group);
    std::vector<double> bytes_list = sizes(1024, grid_.collective_max_bytes, {4096, 262144, 4 << 20});
    int64_t most = int64_t(bytes_list.back() / double(sizeof(T)));
    // Zeros: sums stay zero, however many times a buffer is reduced.
    T* data = reinterpret_cast<T*>(backend.allocate(most * int64_t(sizeof(T))));
    owned_.push_back({&backend, reinterpret_cast<char*>(data)});
    struct Case {
      OpKind kind;
      Algorithm algorithm;
    };
    std::vector<Case> cases = {{OpKind::all_reduce, Algorithm::ring},
                               {OpKind::reduce_scatter, Algorithm::ring},
                               {OpKind::all_gather, Algorithm::ring}};
    if (algorithm == "ring") cases.insert(cases.begin() + 1, {OpKind::all_reduce, Algorithm::tree});
    if (!only.empty()) {
      std::erase_if(cases, [&](const Case& c) { return std::find(only.begin(), only.end(), c.kind) == only.end(); });
    }
    // NCCL picks its own algorithm: one all_reduce row per size, labelled as the backend runs it.
    std::vector<TimedPoint> points;
    std::vector<CollectivePoint> rows;
    std::vector<OpKind> kinds;
    for (const Case& c : cases) {
      for (double bytes : bytes_list) {
        int64_t count = int64_t(bytes / double(sizeof(T)));
        std::function<void()> body;
        if (c.kind == OpKind::all_reduce) {
          body = [&backend, group, c, data, count] { backend.all_reduce(group, c.algorithm, dtype_of<T>(), {{data, count}}); };
        } else if (c.kind == OpKind::reduce_scatter) {
          body = [&backend, group, data, count] { backend.reduce_scatter(group, dtype_of<T>(), {{data, count}}); };
        } else {
          body = [&backend, group, data, count] { backend.all_gather(group, dtype_of<T>(), {{data, count}}); };
        }
        points.push_back({body});
        CollectivePoint p;
        p.kind = to_string(c.kind);
        p.algorithm = algorithm == "ring" ? to_string(c.algorithm) : algorithm;
        p.group_size = n;
        p.nodes = nodes_spanned(n).value_or(1);
        p.bytes = double(count) * double(sizeof(T));
        rows.push_back(p);
        kinds.push_back(c.kind);
      }
    }
    std::string label = "collectives (" + algorithm + ", groups of " + std::to_string(n) + ")";
    std::vector<double> seconds = time(label, points);
    std::ostringstream summary;
    summary.precision(3);
    summary << label << ", busbw at " << format_bytes_short(bytes_list.back()) << ":";
    for (size_t i = 0; i < rows.size(); ++i) {
      CollectivePoint& p = rows[i];
      p.time_s = seconds[i];
      p.algbw_bytes_per_s = p.bytes / p.time_s;
      p.busbw_bytes_per_s = p.algbw_bytes_per_s * bus_bandwidth_factor(kinds[i], n);
      t.collectives.push_back(p);
      if ((i + 1) % bytes_list.size() == 0) {
        summary << " " << p.kind << "/" << p.algorithm << " " << format_rate(p.busbw_bytes_per_s, "B/s");
      }
    }
    progress(summary.str());
  }

  // The program's ring and tree again, each call's operands (the buffer and the backend's scratch)
  // a slot of a pool of P bytes per rank, the slots used in turn and the pool read through before
  // each sample from the next slot on: every call finds its operands last touched P bytes
  // earlier, as a step finds a collective's operands after its other ops did their work (the cost
  // model weighs these points by that distance). Sizes whose operands fill less than two slots
  // are left out (they would be back to back).
  void measure_collective_reuse(Backend<T, G, W>& backend, GroupKind group, MeasuredTables& t) {
    const std::vector<double>& pools =
        options_.quick ? grid_.collective_reuse_bytes_quick : grid_.collective_reuse_bytes;
    if (pools.empty() || grid_.collective_algorithm != "ring") return;
    const int n = backend.group_size(group);
    std::vector<double> bytes_list = sizes(1024, grid_.collective_max_bytes, {4096, 262144, 4 << 20});
    char* pool = allocate_owned(backend, int64_t(pools.back()));
    slots_.clear();
    std::vector<TimedPoint> points;
    std::vector<CollectivePoint> rows;
    auto round_up = [](int64_t b) { return (b + 63) / 64 * 64; };
    for (double pool_bytes : pools) {
      for (auto [kind, algorithm] : {std::pair{OpKind::all_reduce, Algorithm::ring},
                                     {OpKind::all_reduce, Algorithm::tree},
                                     {OpKind::reduce_scatter, Algorithm::ring},
                                     {OpKind::all_gather, Algorithm::ring}}) {
        for (double bytes : bytes_list) {
          const int64_t count = int64_t(bytes / double(sizeof(T)));
          const int64_t scratch =
              collective_scratch_elements(kind, algorithm, GroupShape{n, 1, n}, count) * int64_t(sizeof(T));
          const int64_t footprint = round_up(count * int64_t(sizeof(T))) + round_up(scratch);
          if (int64_t(pool_bytes) / footprint < 2) continue;
          slots_.push_back({int64_t(pool_bytes) / footprint, footprint, 0});
          PoolSlots* s = &slots_.back();
          auto body = [&backend, group, kind, algorithm, pool, s, count, scratch, round_up] {
            char* at = pool + s->next * s->footprint;
            s->next = (s->next + 1) % s->count;
            T* data = reinterpret_cast<T*>(at);
            backend.set_collective_scratch(at + round_up(count * int64_t(sizeof(T))), scratch);
            if (kind == OpKind::all_reduce) backend.all_reduce(group, algorithm, dtype_of<T>(), {{data, count}});
            else if (kind == OpKind::reduce_scatter) backend.reduce_scatter(group, dtype_of<T>(), {{data, count}});
            else backend.all_gather(group, dtype_of<T>(), {{data, count}});
          };
          // One word a cache line, from the next slot on, round the pool.
          auto prepare = [pool, s, this] { this->read_round(pool, s->count * s->footprint, s->next * s->footprint); };
          points.push_back({body, true, prepare});
          CollectivePoint p;
          p.kind = to_string(kind);
          p.algorithm = to_string(algorithm);
          p.group_size = n;
          p.nodes = nodes_spanned(n).value_or(1);
          p.bytes = double(count) * double(sizeof(T));
          p.reuse_distance_bytes = pool_bytes;  // the slots' calls touch up to a footprint less
          rows.push_back(p);
        }
      }
    }
    if (points.empty()) return;
    std::vector<double> seconds = time("collectives with operands out of cache (ring, groups of " +
                                           std::to_string(n) + ")", points);
    std::ostringstream summary;
    summary.precision(3);
    summary << "collectives with operands out of cache, all_gather/ring busbw at the largest size a pool holds:";
    for (size_t i = 0; i < rows.size(); ++i) {
      CollectivePoint& p = rows[i];
      p.time_s = seconds[i];
      p.algbw_bytes_per_s = p.bytes / p.time_s;
      p.busbw_bytes_per_s = p.algbw_bytes_per_s * bus_bandwidth_factor(*collective_kind(p.kind), n);
      t.collective_reuse.push_back(p);
      const bool last_of_pool = i + 1 == rows.size() || rows[i + 1].reuse_distance_bytes != p.reuse_distance_bytes;
      if (p.kind == "all_gather" && last_of_pool) {
        summary << " " << format_rate(p.busbw_bytes_per_s, "B/s") << " at " << format_bytes_short(p.bytes)
                << " (pool " << format_bytes_short(p.reuse_distance_bytes) << ");";
      }
    }
    progress(summary.str());
  }

  // Pairs rank r with r ± stride: blocks of `stride` ranks, block 2j with block 2j+1.
  void measure_p2p(Backend<T, G, W>& backend, int stride, const std::string& label,
                   const std::vector<double>& quick_sizes, std::vector<P2pPoint>& out) {
    std::vector<double> bytes_list = sizes(8, 32.0 * (1 << 20), quick_sizes);
    int64_t most = std::max<int64_t>(1, int64_t(bytes_list.back() / double(sizeof(T))));
    T* data = buffer(backend, most);
    const bool first = (rank_ / stride) % 2 == 0;
    const int peer = ping_pong_peer(rank_, size_, stride);
    const bool paired = peer >= 0;
    std::vector<TimedPoint> points;
    std::vector<double> bytes_sent;
    for (double bytes : bytes_list) {
      int64_t count = std::max<int64_t>(1, int64_t(bytes / double(sizeof(T))));
      // One round trip; the one-way time is half of it. Only the rank that starts it adds
      // samples: its peer's last send completes once the reply is in the transport's buffers,
      // not at the other end, so across TCP its sample of a message up to the socket's buffer
      // was about one way, not a round trip (2 MiB across a 1 Gbit/s link read 1.25 times the
      // link's rate).
      points.push_back({[&backend, data, count, peer, paired, even = first] {
                          if (!paired) return;
                          if (even) {
                            backend.send(data, count, peer, 7);
                            backend.recv(data, count, peer, 8);
                          } else {
                            backend.recv(data, count, peer, 7);
                            backend.send(data, count, peer, 8);
                          }
                          backend.finish_sends();
                        },
                        paired && first});
      bytes_sent.push_back(double(count) * double(sizeof(T)));
    }
    std::vector<double> seconds = time(label, points);
    for (size_t i = 0; i < points.size(); ++i) out.push_back({bytes_sent[i], seconds[i] / 2, ""});
    std::ostringstream line;
    line.precision(3);
    line << label << ": " << out.front().time_s * 1e6 << " us at "
         << format_bytes_short(out.front().bytes) << ", "
         << format_rate(out.back().bytes / out.back().time_s, "B/s") << " at "
         << format_bytes_short(out.back().bytes);
    progress(line.str());
  }

  const ProfileOptions& options_;
  int rank_, size_, ranks_per_node_;
  PointTimer timer_;
  BackendFactory<T, G, W> factory_;
  ProfileGrid grid_;
  std::vector<std::unique_ptr<Backend<T, G, W>>> backends_;
  std::vector<std::pair<Backend<T, G, W>*, char*>> owned_;
  // Per collective reuse point: its slots in the pool, their size, the next one to use.
  struct PoolSlots {
    int64_t count = 0, footprint = 0, next = 0;
  };
  std::deque<PoolSlots> slots_;
};

}  // namespace

template <class T, class G, class W>
MeasuredTables measure_tables(const ProfileOptions& options, int rank, int size,
                              int ranks_per_node, const BackendFactory<T, G, W>& factory,
                              const ProfileGrid& grid) {
  return Profiler<T, G, W>(options, rank, size, ranks_per_node, factory, grid).run();
}

template MeasuredTables measure_tables<float, float, float>(const ProfileOptions&, int, int, int,
                                                            const BackendFactory<float, float, float>&,
                                                            const ProfileGrid&);
template MeasuredTables measure_tables<double, double, double>(
    const ProfileOptions&, int, int, int, const BackendFactory<double, double, double>&,
    const ProfileGrid&);
template MeasuredTables measure_tables<bf16, float, float>(const ProfileOptions&, int, int, int,
                                                           const BackendFactory<bf16, float, float>&,
                                                           const ProfileGrid&);

}  // namespace stepcast
