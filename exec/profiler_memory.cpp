// The profile's memory-bound kernel families (profiler_tools.hpp's measure_memory_families):
// norms, dropout, activations, softmax, the loss, AdamW, the gradient norm, copies, routing,
// rotary and the embedding, each at the grid's sizes of lowering-counted bytes.
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <type_traits>

#include "bf16.hpp"
#include "cpu_kernels.hpp"
#include "errors.hpp"
#include "profiler_tools.hpp"

namespace stepcast {

template <class T, class G, class W>
void measure_memory_families(ProfilerTools<T, G, W>& tools, Backend<T, G, W>& backend, MeasuredTables& t) {
  const double s = double(sizeof(T));
  std::vector<double> size_targets =
      tools.sizes(16384, tools.grid().memory_max_bytes, {65536, 1 << 20, tools.grid().memory_max_bytes});
  // Row lengths: hidden size (norms, dropout_add), attention keys (softmax), vocabulary (loss):
  // the grid's (a CPU's sit between small test models and GPT-scale ones).
  const int64_t h = tools.grid().memory_hidden, cols = tools.grid().memory_softmax_cols, vocab = tools.grid().memory_vocab;
  // The largest tensor of any family (one tensor per element at least: a lookup writes its row,
  // the loss statistics read the logits), plus a row of slack (a size target rounds to whole rows).
  int64_t most = int64_t(size_targets.back() / s) + std::max<int64_t>({1024, h, cols, vocab});
  // Inputs are never written (passes interleave the families, and a softmax of another
  // kernel's output could be anything); outputs are never read as inputs; AdamW has its own.
  std::vector<T*> in, out;
  for (int i = 0; i < 3; ++i) in.push_back(tools.buffer(backend, most, true));
  for (int i = 0; i < 2; ++i) out.push_back(tools.buffer(backend, most));
  // AdamW's weights (T), gradient (G), moments and — for 16-bit weights — master (W).
  T* adam_param = tools.buffer(backend, most);
  G* adam_grad = tools.template buffer<G>(backend, most);
  W* adam_m = tools.template buffer<W>(backend, most);
  W* adam_v = tools.template buffer<W>(backend, most);
  W* adam_master = std::is_same_v<T, W> ? nullptr : tools.template buffer<W>(backend, most);
  W* wide_in = std::is_same_v<T, W> ? reinterpret_cast<W*>(in[0]) : tools.template buffer<W>(backend, most);
  W* wide_out = std::is_same_v<T, W> ? reinterpret_cast<W*>(out[0]) : tools.template buffer<W>(backend, most);
  T* norm_weight = tools.buffer(backend, h);
  G* dw = tools.template buffer<G>(backend, h);  // the norm backward accumulates its weight gradient here
  G* norm_bias_grad = tools.template buffer<G>(backend, h);
  const int64_t most_tokens = most / vocab + 1;
  W* stats = tools.template buffer<W>(backend, 3 * most_tokens);
  W* loss = tools.template buffer<W>(backend, most_tokens);
  std::vector<int32_t> host_targets(static_cast<size_t>(most_tokens));
  for (size_t i = 0; i < host_targets.size(); ++i) host_targets[i] = int32_t(i * 7 % size_t(vocab));
  const int32_t* targets = tools.copy_of(backend, host_targets);  // backend memory, as the executor's
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
  uint8_t* mask = tools.copy_of(backend, host_mask);
  int64_t dropout_calls = 0;
  auto fresh_dropout = [&dropout_calls] {
    return cpu::Dropout{0.1, 1, 1, dropout_calls++, cpu::DropoutSite::attention_residual};
  };
  auto mask_window = [&](int64_t elements) {
    int64_t room = std::max<int64_t>(1, most + mask_slack - elements);
    return mask + ((dropout_calls++ * 1048583) % room) / 64 * 64;
  };
  const cpu::Dropout no_dropout{0.0, 1, 1, 0, cpu::DropoutSite::attention_residual};
  const int64_t* sample_index = tools.copy_of(backend, std::vector<int64_t>{0});
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
  int32_t* route_in = tools.copy_of(backend, host_route);
  int32_t* route_out = tools.copy_of(backend, host_route);
  int32_t* expert_counts = tools.copy_of(backend, std::vector<int32_t>(kExperts, 0));
  // The permutations to and from the experts' order, in tokens of h elements (lowering counts a
  // token's row and its k copies' rows, with k int32 indices; the way back k weights too, and its
  // backward the copies' gradient rows and the weights' gradient): each token's copies routed as
  // route_in routes them, to rows counted per expert in token order. The rows of every token
  // count the grid's sizes give, made before the timing.
  const double permute_bytes = s * (1 + kTopK) + 4.0 * kTopK / double(h),
               unpermute_bytes = s * (1 + kTopK) + kTopK * (s + 4) / double(h),
               unpermute_back_bytes = s * (1 + 2 * kTopK) + kTopK * (2 * s + 4) / double(h);
  std::map<int64_t, const int64_t*> copy_rows;  // tokens → the rows of their copies
  for (double bytes : {permute_bytes, unpermute_bytes, unpermute_back_bytes}) {
    for (double target : size_targets) {
      const int64_t tokens = std::max<int64_t>(1, std::llround(target / bytes / double(h)));
      if (copy_rows.count(tokens)) continue;
      auto expert = [](int64_t copy) { return size_t((copy / kTopK * 3 + copy % kTopK) % kExperts); };
      std::vector<int64_t> next(kExperts + 1, 0), rows(static_cast<size_t>(tokens * kTopK));
      for (int64_t i = 0; i < tokens * kTopK; ++i) ++next[expert(i) + 1];
      for (size_t e = 0; e < size_t(kExperts); ++e) next[e + 1] += next[e];
      for (int64_t i = 0; i < tokens * kTopK; ++i) rows[size_t(i)] = next[expert(i)]++;
      copy_rows[tokens] = tools.copy_of(backend, rows);
    }
  }
  // The word embedding: a table of hidden-size rows as large as the grid's largest tensor (not
  // the grid's vocabulary: a step touches its table once a microbatch, and a real vocabulary's
  // rows are not in cache then — small-gpt's 8 MiB table took about 100 us a lookup in steps
  // where a 400 KiB table profiled 7 us), looked up (forward) and its gradient rows accumulated
  // (backward) for token ids spread over it.
  // Each call takes the next window of ids, so that back-to-back calls do not find the rows the
  // call before brought into cache (and its pages in the TLB).
  const int64_t table_rows = std::max<int64_t>(vocab, int64_t(tools.grid().memory_max_bytes / (double(h) * s)));
  const int64_t most_lookups = most / h + 1;
  std::vector<int32_t> host_tokens(static_cast<size_t>(most_lookups + table_rows));
  for (size_t i = 0; i < host_tokens.size(); ++i) host_tokens[i] = int32_t(i * 7919 % size_t(table_rows));
  const int32_t* all_tokens = tools.copy_of(backend, host_tokens);
  int64_t next_lookup = 0;
  auto token_window = [&](int64_t lookups) {
    const int32_t* window = all_tokens + next_lookup;
    next_lookup = (next_lookup + lookups) % table_rows;
    return window;
  };
  T* table = tools.buffer(backend, table_rows * h, true);
  G* table_grad = tools.template buffer<G>(backend, table_rows * h);
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
                                   0, false, false);
       }},
      {"moe_route_backward", 2 * s + double(kTopK) * (s + 4) / double(kExperts), kExperts,
       [&](int64_t e) {
         backend.moe_route_backward(in[0], route_in, in[1], out[0], e / kExperts, kExperts, kTopK, 1e-3, nullptr,
                                    false);
       }},
      {"moe_permute_forward", permute_bytes, h,
       [&](int64_t e) { backend.moe_permute(in[0], out[0], copy_rows.at(e / h), e / h, kTopK, h, false); }},
      {"moe_permute_backward", permute_bytes, h,
       [&](int64_t e) { backend.moe_permute(in[0], out[0], copy_rows.at(e / h), e / h, kTopK, h, true); }},
      {"moe_unpermute_forward", unpermute_bytes, h,
       [&](int64_t e) {
         backend.moe_unpermute_forward(in[0], in[1], copy_rows.at(e / h), out[0], e / h, kTopK, h);
       }},
      {"moe_unpermute_backward", unpermute_back_bytes, h,
       [&](int64_t e) {
         backend.moe_unpermute_backward(in[0], in[1], in[2], copy_rows.at(e / h), out[0], out[1], e / h, kTopK, h);
       }},
      // In place on qkv rows (lowering counts it read and written).
      {"rotary_forward", 2 * s, rotary.b * rotary.qkv_width(),
       [&](int64_t e) { backend.rotary_forward(out[1], with_rows(rotary, e), 1e4, 0); }},
      {"rotary_backward", 2 * s, rotary.b * rotary.qkv_width(),
       [&](int64_t e) { backend.rotary_backward(out[1], with_rows(rotary, e), 1e4, 0); }},
  };
  std::vector<TimedPoint> points;
  std::vector<MemoryPoint> rows;
  const std::function<void()> after = tools.step_gemm(backend);  // each call as a step makes it
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
      points.push_back({[&f, elements] { f.body(elements); }, true, nullptr, after});
      rows.push_back({f.name, double(elements) * f.bytes_per_element, 0, ""});
    }
  }
  std::vector<double> seconds = tools.time("memory-bound", points);
  for (size_t i = 0; i < rows.size(); ++i) {
    rows[i].time_s = seconds[i];
    t.memory.push_back(rows[i]);
  }
  tools.progress("memory-bound: " + std::to_string(families.size()) + " families × " +
           std::to_string(size_targets.size()) + " sizes");
}

template void measure_memory_families<float, float, float>(ProfilerTools<float, float, float>&,
                                                            Backend<float, float, float>&, MeasuredTables&);
template void measure_memory_families<double, double, double>(ProfilerTools<double, double, double>&,
                                                               Backend<double, double, double>&, MeasuredTables&);
template void measure_memory_families<bf16, float, float>(ProfilerTools<bf16, float, float>&,
                                                           Backend<bf16, float, float>&, MeasuredTables&);

}  // namespace stepcast
