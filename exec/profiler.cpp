// The measured tables of profiler.hpp (measure_tables); point_timer.cpp times them,
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
// groups of two; ping-pong between rank pairs (2i, 2i+1) at 8 B · 4^i (… 32 MiB; quick: 8 B,
// 4 KiB, 1 MiB).
#include "profiler.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <sstream>
#include <tuple>

#include "collective.hpp"
#include "cpu_kernels.hpp"
#include "errors.hpp"
#include "mpi_check.hpp"
#include "point_timer.hpp"

namespace stepcast {

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
class Profiler {
 public:
  Profiler(const ProfileOptions& options, int rank, int size, int ranks_per_node,
           const BackendFactory<T, G, W>& factory, const ProfileGrid& grid)
      : options_(options), rank_(rank), size_(size), ranks_per_node_(ranks_per_node),
        timer_(options, rank, size, [this] { for (auto& b : backends_) b->synchronize(); }),
        factory_(factory), grid_(grid) {}

  MeasuredTables run() {
    MeasuredTables t;
    t.dtype = options_.dtype;
    Backend<T, G, W>& world = make_backend(RankGrid(1, size_, 1, "tp-dp-pp"), false);
    measure_gemms(world, t);
    measure_memory(world, t);
    measure_attention(world, t);
    if (size_ > 1) {
      measure_collectives(world, GroupKind::dp, grid_.collective_algorithm, t);
      if (!options_.quick && grid_.mpi_collectives) {
        measure_collectives(make_backend(RankGrid(1, size_, 1, "tp-dp-pp"), true), GroupKind::dp,
                            "mpi", t);
      }
      if (size_ > 2 && size_ % 2 == 0) {
        measure_collectives(make_backend(RankGrid(2, size_ / 2, 1, "tp-dp-pp"), false),
                            GroupKind::tp, "ring", t);
      }
      // Ping-pong inside a node (pairs of neighbouring ranks), and across nodes (node 2j with
      // node 2j+1, rank for rank) when the ranks span more than one.
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
  void progress(const std::string& line) {
    if (rank_ == 0 && options_.progress) options_.progress(line);
  }

  std::vector<double> sizes(double first, double last, const std::vector<double>& quick) const {
    if (options_.quick) return quick;
    std::vector<double> out;
    for (double s = first; s <= last; s *= 4) out.push_back(s);
    return out;
  }

  // Backend memory of `count` elements of X holding small non-zero values (no denormals, no
  // overflow however often a kernel accumulates into it). `random_signs`: each value's sign
  // drawn at random, as activations' are — a kernel that branches on it runs faster on values
  // of one sign (GeLU on libm's tanh did, 1.6×; the kernels' own tanh no longer branches).
  template <class X = T>
  X* buffer(Backend<T, G, W>& backend, int64_t count, bool random_signs = false) {
    char* memory = backend.allocate(count * int64_t(sizeof(X)));
    owned_.push_back({&backend, memory});
    std::vector<X> host(static_cast<size_t>(count));
    uint64_t state = 0x9E3779B97F4A7C15ull;
    for (int64_t i = 0; i < count; ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;  // LCG, top bit
      double sign = random_signs && (state >> 63) ? -1.0 : 1.0;
      host[size_t(i)] = X(sign * (0.25 + 0.01 * double(i % 17)));
    }
    backend.upload(memory, host.data(), count * int64_t(sizeof(X)));
    return reinterpret_cast<X*>(memory);
  }
  // Backend memory holding a copy of host data (token ids, masks, sample indices).
  template <class X>
  X* copy_of(Backend<T, G, W>& backend, const std::vector<X>& host) {
    char* memory = backend.allocate(int64_t(host.size() * sizeof(X)));
    owned_.push_back({&backend, memory});
    backend.upload(memory, host.data(), int64_t(host.size() * sizeof(X)));
    return reinterpret_cast<X*>(memory);
  }

  // Collective over MPI_COMM_WORLD (the backend splits its communicators); lives as long as
  // the profiler, so its buffers are released before it.
  Backend<T, G, W>& make_backend(const RankGrid& grid, bool use_mpi_collectives) {
    backends_.push_back(factory_(grid, use_mpi_collectives));
    return *backends_.back();
  }

  // Times `points`, printing a line per pass: "LABEL: pass P/R".
  std::vector<double> time(const std::string& label, const std::vector<TimedPoint>& points) {
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
    T* a = buffer(backend, largest + pool);
    T* b = buffer(backend, largest + pool);
    T* c = buffer(backend, largest + pool);
    G* cg = buffer<G>(backend, largest + pool);  // weight gradients accumulate in G
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
    W* lse = buffer<W>(backend, b * heads * seqs.back());
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
    for (size_t i = 0; i < points.size(); i += 2) points[i].body();  // lse of every shape
    std::vector<double> seconds = time("attention", points);
    for (size_t i = 0; i < rows.size(); ++i) {
      rows[i].flops_per_s = rows[i].flops_per_s / seconds[i];  // the flops over the time
    }
    // The table is ordered by (pass, head_dim, causal), seq rising within each.
    std::stable_sort(rows.begin(), rows.end(), [](const AttentionPoint& x, const AttentionPoint& y) {
      return std::tie(x.pass, x.head_dim) < std::tie(y.pass, y.head_dim);
    });
    for (const AttentionPoint& a : rows) t.attention.push_back(a);
    progress("attention: flash forward and backward, " + std::to_string(rows.size()) + " points");
  }

  void measure_memory(Backend<T, G, W>& backend, MeasuredTables& t) {
    const double s = double(sizeof(T));
    std::vector<double> size_targets =
        sizes(16384, grid_.memory_max_bytes, {65536, 1 << 20, grid_.memory_max_bytes});
    // Row lengths: hidden size (norms, dropout_add), attention keys (softmax), vocabulary (loss):
    // the grid's (a CPU's sit between small test models and GPT-scale ones).
    const int64_t h = grid_.memory_hidden, cols = grid_.memory_softmax_cols, vocab = grid_.memory_vocab;
    // The largest tensor of any family (one tensor per element at least: a lookup writes its row,
    // the loss statistics read the logits), plus a row of slack (a size target rounds to whole rows).
    int64_t most = int64_t(size_targets.back() / s) + std::max<int64_t>({1024, h, cols, vocab});
    // Inputs are never written (passes interleave the families, and a softmax of another
    // kernel's output could be anything); outputs are never read as inputs; AdamW has its own.
    std::vector<T*> in, out;
    for (int i = 0; i < 3; ++i) in.push_back(buffer(backend, most, true));
    for (int i = 0; i < 2; ++i) out.push_back(buffer(backend, most));
    // AdamW's weights (T), gradient (G), moments and — for 16-bit weights — master (W).
    T* adam_param = buffer(backend, most);
    G* adam_grad = buffer<G>(backend, most);
    W* adam_m = buffer<W>(backend, most);
    W* adam_v = buffer<W>(backend, most);
    W* adam_master = std::is_same_v<T, W> ? nullptr : buffer<W>(backend, most);
    W* wide_in = std::is_same_v<T, W> ? reinterpret_cast<W*>(in[0]) : buffer<W>(backend, most);
    W* wide_out = std::is_same_v<T, W> ? reinterpret_cast<W*>(out[0]) : buffer<W>(backend, most);
    T* norm_weight = buffer(backend, h);
    G* dw = buffer<G>(backend, h);  // the norm backward accumulates its weight gradient here
    G* norm_bias_grad = buffer<G>(backend, h);
    const int64_t most_tokens = most / vocab + 1;
    W* stats = buffer<W>(backend, 3 * most_tokens);
    W* loss = buffer<W>(backend, most_tokens);
    std::vector<int32_t> host_targets(static_cast<size_t>(most_tokens));
    for (size_t i = 0; i < host_targets.size(); ++i) host_targets[i] = int32_t(i * 7 % size_t(vocab));
    const int32_t* targets = copy_of(backend, host_targets);  // backend memory, as the executor's
    // Rotary computes one sin and cos per position and frequency, shared by the micro batch and
    // the heads: per byte it costs as a model with micro batch 2 and 4 + 2·2 heads does.
    const cpu::AttentionShape rotary{0, 2, 4, 2, 32};  // s set per size
    // Dropout as a step's: every call draws with a key of its own (in a step each layer,
    // microbatch and step has one), and the backward reads a window of a mask drawn by the
    // kernels' own generator at another offset each call. A mask or key repeated call after
    // call lets the branch predictor learn it at the small sizes: dropout then profiled 2–4×
    // faster than it ran in steps.
    const int64_t mask_slack = int64_t(1) << 22;
    std::vector<uint8_t> host_mask(static_cast<size_t>(most + mask_slack));
    {
      std::vector<float> ones(host_mask.size(), 1.0f), dropped(host_mask.size());
      const int64_t zero_index = 0;
      cpu::dropout_add_forward(ones.data(), static_cast<const float*>(nullptr), dropped.data(),
                               host_mask.data(), int64_t(host_mask.size()), 1, 1,
                               cpu::Dropout{0.1, 7, 0, 0, cpu::DropoutSite::attention_residual}, 0,
                               &zero_index);
    }
    uint8_t* mask = copy_of(backend, host_mask);
    int64_t dropout_calls = 0;
    auto fresh_dropout = [&dropout_calls] {
      return cpu::Dropout{0.1, 1, 1, dropout_calls++, cpu::DropoutSite::attention_residual};
    };
    auto mask_window = [&](int64_t elements) {
      int64_t room = std::max<int64_t>(1, most + mask_slack - elements);
      return mask + ((dropout_calls++ * 1048583) % room) / 64 * 64;
    };
    const cpu::Dropout no_dropout{0.0, 1, 1, 0, cpu::DropoutSite::attention_residual};
    const int64_t* sample_index = copy_of(backend, std::vector<int64_t>{0});
    auto with_rows = [](cpu::AttentionShape shape, int64_t elements) {
      shape.s = elements / (shape.b * shape.qkv_width());
      return shape;
    };
    const cpu::AdamW adamw{1e-3, 0.9, 0.95, 1e-8, 0.1};
    // Mixture-of-experts routing over 8 experts, top 2 (an element is a token's logit for one
    // expert): the forward writes route_out, the backward reads route_in, each token's two
    // distinct experts.
    constexpr int64_t kExperts = 8, kTopK = 2;
    const int64_t most_routed = kTopK * (most / kExperts + 1);
    std::vector<int32_t> host_route(static_cast<size_t>(most_routed));
    for (size_t i = 0; i < host_route.size(); ++i) host_route[i] = int32_t((i / kTopK * 3 + i % kTopK) % kExperts);
    int32_t* route_in = copy_of(backend, host_route);
    int32_t* route_out = copy_of(backend, host_route);
    int32_t* expert_counts = copy_of(backend, std::vector<int32_t>(kExperts, 0));
    // The word embedding: a table of hidden-size rows as large as the grid's largest tensor (not
    // the grid's vocabulary: a step touches its table once a microbatch, and a real vocabulary's
    // rows are not in cache then — small-gpt's 8 MiB table took about 100 us a lookup in steps
    // where a 400 KiB table profiled 7 us), looked up (forward) and its gradient rows accumulated
    // (backward) for token ids spread over it.
    // Each call takes the next window of ids, so that back-to-back calls do not find the rows the
    // call before brought into cache (and its pages in the TLB).
    const int64_t table_rows = std::max<int64_t>(vocab, int64_t(grid_.memory_max_bytes / (double(h) * s)));
    const int64_t most_lookups = most / h + 1;
    std::vector<int32_t> host_tokens(static_cast<size_t>(most_lookups + table_rows));
    for (size_t i = 0; i < host_tokens.size(); ++i) host_tokens[i] = int32_t(i * 7919 % size_t(table_rows));
    const int32_t* all_tokens = copy_of(backend, host_tokens);
    int64_t next_lookup = 0;
    auto token_window = [&](int64_t lookups) {
      const int32_t* window = all_tokens + next_lookup;
      next_lookup = (next_lookup + lookups) % table_rows;
      return window;
    };
    T* table = buffer(backend, table_rows * h, true);
    G* table_grad = buffer<G>(backend, table_rows * h);
    backend.cross_entropy_stats(in[0], targets, stats, most / vocab, 0, vocab);  // for cross_entropy_softmax
    // family, bytes per element (as lowering counts the op's bytes), row length, body(elements).
    struct Family {
      const char* name;
      double bytes_per_element;
      int64_t row;  // elements come in whole rows of this length
      std::function<void(int64_t)> body;
    };
    const std::vector<Family> families = {
        {"norm_forward", 2 * s, h,
         [&](int64_t e) { backend.rmsnorm_forward(in[0], norm_weight, out[0], e / h, h, 1e-5); }},
        {"norm_backward", 4 * s, h,
         [&](int64_t e) {
           backend.rmsnorm_backward(in[0], norm_weight, in[1], out[0], dw, e / h, h, 1e-5);
         }},
        // LayerNorm (GPT-style models) next to RMSNorm: a mean, a bias and its gradient more.
        {"layernorm_forward", 2 * s, h,
         [&](int64_t e) {
           backend.layernorm_forward(in[0], norm_weight, norm_weight, out[0], e / h, h, 1e-5);
         }},
        {"layernorm_backward", 4 * s, h,
         [&](int64_t e) {
           backend.layernorm_backward(in[0], norm_weight, in[1], out[0], dw, norm_bias_grad, e / h,
                                      h, 1e-5);
         }},
        // Dropout on the attention probabilities (64×64 per head: probs in, dropped probs and
        // the 1-byte mask out), and the masked scale of every dropout's backward (gradient and
        // mask in, gradient out).
        {"attention_dropout_forward", 2 * s + 1, 64 * 64,
         [&](int64_t e) {
           const cpu::AttentionShape square{64, 1, e / (64 * 64), e / (64 * 64), 16};
           backend.attention_dropout_forward(in[0], out[0], mask, square, fresh_dropout(), 0,
                                             sample_index);
         }},
        {"dropout_backward", 2 * s + 1, 1,
         [&](int64_t e) { backend.dropout_backward(in[0], mask_window(e), out[0], e, 0.1); }},
        {"swiglu_forward", 3 * s, 1,
         [&](int64_t e) { backend.swiglu_forward(in[0], in[1], out[0], e); }},
        {"swiglu_backward", 5 * s, 1,
         [&](int64_t e) { backend.swiglu_backward(in[0], in[1], in[2], out[0], out[1], e); }},
        // Branch + residual → out (the mask, written only with dropout > 0, is not counted).
        {"dropout_add_forward", 3 * s, h,
         [&](int64_t e) {
           backend.dropout_add_forward(in[0], in[1], out[0], mask, e / h, 1, h, fresh_dropout(), 0,
                                       sample_index);
         }},
        // The same without dropout: the residual add, no mask, nothing drawn.
        {"residual_add", 3 * s, h,
         [&](int64_t e) {
           backend.dropout_add_forward(in[0], in[1], out[0], nullptr, e / h, 1, h, no_dropout, 0,
                                       nullptr);
         }},
        {"gelu_forward", 2 * s, 1, [&](int64_t e) { backend.gelu_forward(in[0], out[0], e); }},
        // The gradient norm's sum of squares: each element read once.
        {"grad_norm", double(sizeof(G)), 1, [&](int64_t e) { backend.grad_norm_sq(adam_grad, e); }},
        // The copy a staged send makes of its tensor (read and written once).
        {"copy", 2 * s, 1,
         [&](int64_t e) { backend.copy(out[0], in[0], e * int64_t(sizeof(T))); }},
        {"gelu_backward", 3 * s, 1, [&](int64_t e) { backend.gelu_backward(in[0], in[1], out[0], e); }},
        {"softmax_forward", 2 * s, cols,
         [&](int64_t e) { backend.softmax_forward(in[0], out[0], e / cols, cols); }},
        {"softmax_backward", 3 * s, cols,
         [&](int64_t e) { backend.softmax_backward(in[1], in[0], out[0], e / cols, cols); }},
        // Lowering counts the gradient, two 4-byte moments and the weight per parameter.
        {"adamw", 2 * s + 16, 1,
         [&](int64_t e) {
           backend.adamw_step(adam_param, adam_master, adam_grad, adam_m, adam_v, e, adamw, 1, 1.0);
         }},
        // One rank's whole vocabulary (tp = 1): statistics and softmax forward, logits → softmax.
        {"cross_entropy_forward", 2 * s, vocab,
         [&](int64_t e) {
           backend.cross_entropy_stats(in[0], targets, stats, e / vocab, 0, vocab);
           backend.cross_entropy_forward(in[0], stats, 1, wide_out, loss, e / vocab, vocab);
         }},
        // A tensor-parallel rank's statistics alone (max, sum of exp, target logit per token):
        // lowering counts the logits, the targets and three wide statistics per token.
        {"cross_entropy_stats", s + (4 + 3 * double(sizeof(W))) / double(vocab), vocab,
         [&](int64_t e) { backend.cross_entropy_stats(in[0], targets, stats, e / vocab, 0, vocab); }},
        // Lowering counts a lookup's output row and its token id (forward), the gradient row read
        // and the id (backward); the table's rows are not counted (a parameter buffer).
        {"embedding_forward", s + 4.0 / double(h), h,
         [&](int64_t e) { backend.embedding_forward(token_window(e / h), table, out[0], e / h, 1, h, 0, table_rows); }},
        {"embedding_backward", s + 4.0 / double(h), h,
         [&](int64_t e) {
           backend.embedding_backward(token_window(e / h), in[0], table_grad, e / h, 1, h, 0, table_rows);
         }},
        // A tensor-parallel rank's softmax pass from the gathered statistics (its loss forward at
        // tp > 1: the statistics were a cross_entropy_stats op of their own). The statistics are
        // the largest call's, read as a smaller call's layout: finite values, which is all the
        // time depends on.
        {"cross_entropy_softmax", 2 * s, vocab,
         [&](int64_t e) { backend.cross_entropy_forward(in[0], stats, 1, wide_out, loss, e / vocab, vocab); }},
        {"cross_entropy_backward", 2 * s, vocab,
         [&](int64_t e) {
           backend.cross_entropy_backward(wide_in, targets, out[0], e / vocab, 0, vocab, 1e-3);
         }},
        // Logits → probabilities, top-k weights and indices (lowering counts logits, probabilities,
        // weights and int32 indices; its backward probabilities, indices and the weights'
        // gradient → the logits' gradient: the same bytes).
        {"moe_route_forward", 2 * s + double(kTopK) * (s + 4) / double(kExperts), kExperts,
         [&](int64_t e) {
           backend.moe_route_forward(in[0], out[0], out[1], route_out, expert_counts, e / kExperts, kExperts, kTopK,
                                     0);
         }},
        {"moe_route_backward", 2 * s + double(kTopK) * (s + 4) / double(kExperts), kExperts,
         [&](int64_t e) {
           backend.moe_route_backward(in[0], route_in, in[1], out[0], e / kExperts, kExperts, kTopK, 1e-3);
         }},
        // In place on qkv rows (lowering counts it read and written).
        {"rotary_forward", 2 * s, rotary.b * rotary.qkv_width(),
         [&](int64_t e) { backend.rotary_forward(out[1], with_rows(rotary, e), 1e4, 0); }},
        {"rotary_backward", 2 * s, rotary.b * rotary.qkv_width(),
         [&](int64_t e) { backend.rotary_backward(out[1], with_rows(rotary, e), 1e4, 0); }},
    };
    std::vector<TimedPoint> points;
    std::vector<MemoryPoint> rows;
    for (const Family& f : families) {
      int64_t previous = 0;
      for (double target : size_targets) {
        int64_t whole_rows = std::max<int64_t>(1, std::llround(target / f.bytes_per_element / double(f.row)));
        int64_t elements = whole_rows * f.row;
        if (elements <= previous) continue;  // small targets of a wide row: one point, not two
        previous = elements;
        STEPCAST_CHECK(elements <= most, std::string("memory-bound family ") + f.name + ": " +
                                             std::to_string(elements) + " elements overrun its buffers of " +
                                             std::to_string(most));
        points.push_back({[&f, elements] { f.body(elements); }});
        rows.push_back({f.name, double(elements) * f.bytes_per_element, 0, ""});
      }
    }
    std::vector<double> seconds = time("memory-bound", points);
    for (size_t i = 0; i < rows.size(); ++i) {
      rows[i].time_s = seconds[i];
      t.memory.push_back(rows[i]);
    }
    progress("memory-bound: " + std::to_string(families.size()) + " families × " +
             std::to_string(size_targets.size()) + " sizes");
  }

  void measure_collectives(Backend<T, G, W>& backend, GroupKind group, const std::string& algorithm,
                           MeasuredTables& t) {
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

  // Pairs rank r with r ± stride: blocks of `stride` ranks, block 2j with block 2j+1.
  void measure_p2p(Backend<T, G, W>& backend, int stride, const std::string& label,
                   const std::vector<double>& quick_sizes, std::vector<P2pPoint>& out) {
    std::vector<double> bytes_list = sizes(8, 32.0 * (1 << 20), quick_sizes);
    int64_t most = std::max<int64_t>(1, int64_t(bytes_list.back() / double(sizeof(T))));
    T* data = buffer(backend, most);
    const bool first = (rank_ / stride) % 2 == 0;
    const int peer = first ? rank_ + stride : rank_ - stride;
    const bool paired = peer < size_;
    std::vector<TimedPoint> points;
    std::vector<double> bytes_sent;
    for (double bytes : bytes_list) {
      int64_t count = std::max<int64_t>(1, int64_t(bytes / double(sizeof(T))));
      // One round trip; the one-way time is half of it.
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
                        paired});
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
