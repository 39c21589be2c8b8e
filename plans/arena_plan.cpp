// The arena placement of arena_plan.hpp.
#include "arena_plan.hpp"

#include <algorithm>
#include <iterator>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "errors.hpp"

namespace stepcast {

namespace {

// Online first-fit in op order, as a caching allocator would place the buffers.
ArenaPlan plan_first_fit(const Role& role, int64_t alignment) {
  ArenaPlan plan;
  plan.offset_of_op.assign(role.ops.size(), -1);
  std::map<int64_t, int64_t> free_blocks;  // offset → size (coalesced)
  std::unordered_map<std::string, std::pair<int64_t, int64_t>> live;  // name → (offset, size)
  int64_t top = 0, live_bytes = 0;
  auto round_up = [&](double bytes) {
    int64_t b = int64_t(bytes);
    return std::max<int64_t>(alignment, (b + alignment - 1) / alignment * alignment);
  };
  for (const Op& op : role.ops) {
    if (op.kind == OpKind::alloc) {
      int64_t size = round_up(op.bytes);
      int64_t offset = -1;
      for (auto it = free_blocks.begin(); it != free_blocks.end(); ++it) {
        if (it->second >= size) {
          offset = it->first;
          int64_t rest = it->second - size;
          free_blocks.erase(it);
          if (rest > 0) free_blocks[offset + size] = rest;
          break;
        }
      }
      if (offset < 0) {
        offset = top;
        top += size;
      }
      plan.offset_of_op[op.id] = offset;
      live[op.buffer] = {offset, size};
      live_bytes += int64_t(op.bytes);
      plan.live_peak_bytes = std::max(plan.live_peak_bytes, live_bytes);
    } else if (op.kind == OpKind::free) {
      auto it = live.find(op.buffer);
      STEPCAST_CHECK(it != live.end(), "arena frees an unknown buffer " + op.buffer);
      auto [offset, size] = it->second;
      live.erase(it);
      live_bytes -= int64_t(op.bytes);
      // Insert and coalesce with neighbours.
      auto next = free_blocks.lower_bound(offset);
      if (next != free_blocks.end() && offset + size == next->first) {
        size += next->second;
        next = free_blocks.erase(next);
      }
      if (next != free_blocks.begin()) {
        auto prev = std::prev(next);
        if (prev->first + prev->second == offset) {
          prev->second += size;
          continue;
        }
      }
      free_blocks[offset] = size;
    }
  }
  plan.extent_bytes = top;
  return plan;
}

// Offline: the buffers' lifetimes are known before the step runs, so place them in order of
// size (TFLite's and ggml's "greedy by size"), of size × lifetime, of lifetime, or by breadth
// (TFLite's "greedy by breadth": the ops by the bytes live at them, most first, each op's
// buffers not yet placed largest first), each at the offset of the tightest gap among the
// buffers placed already whose lifetimes overlap its own.
enum class Order { size, size_lifetime, lifetime, breadth };
// Where in the gaps a buffer goes: the tightest gap that holds it, or the lowest.
enum class Fit { tightest, lowest };

struct Lifetime {
  int32_t op;
  int64_t first, last;  // op indices: alloc, and free (or the role's end)
  int64_t size;
  int64_t offset = -1;
};

// Greedy by breadth's order: a buffer is placed at the op of its lifetime where the most bytes
// are live (the earliest of equals), those ops taken most bytes first, and at one op its
// buffers largest first. The range maximum over each lifetime comes from a sparse table.
void order_by_breadth(const Role& role, const std::vector<Lifetime>& buffers, std::vector<size_t>& order) {
  const size_t n = role.ops.size() + 1;  // op indices and the role's end
  std::vector<int64_t> breadth(n, 0);    // bytes live after each op
  int64_t live = 0;
  for (const Op& op : role.ops) {
    if (op.kind == OpKind::alloc) live += int64_t(op.bytes);
    if (op.kind == OpKind::free) live -= int64_t(op.bytes);
    breadth[size_t(op.id)] = live;
  }
  breadth[n - 1] = live;
  // table[k][i]: the op of most bytes (the earliest of equals) in [i, i + 2^k).
  std::vector<std::vector<int64_t>> table(1, std::vector<int64_t>(n));
  for (size_t i = 0; i < n; ++i) table[0][i] = int64_t(i);
  auto better = [&](int64_t a, int64_t b) {
    return breadth[size_t(a)] > breadth[size_t(b)] || (breadth[size_t(a)] == breadth[size_t(b)] && a < b) ? a : b;
  };
  for (size_t k = 1; (size_t(1) << k) <= n; ++k) {
    const size_t half = size_t(1) << (k - 1);
    table.emplace_back(n - (size_t(1) << k) + 1);
    for (size_t i = 0; i < table[k].size(); ++i) table[k][i] = better(table[k - 1][i], table[k - 1][i + half]);
  }
  auto widest = [&](int64_t first, int64_t last) {  // over [first, last]
    size_t k = 0;
    while ((size_t(2) << k) <= size_t(last - first + 1)) ++k;
    return better(table[k][size_t(first)], table[k][size_t(last) - (size_t(1) << k) + 1]);
  };
  std::vector<int64_t> at(buffers.size());
  for (size_t i = 0; i < buffers.size(); ++i) at[i] = widest(buffers[i].first, buffers[i].last);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int64_t ba = breadth[size_t(at[a])], bb = breadth[size_t(at[b])];
    if (ba != bb) return ba > bb;
    if (at[a] != at[b]) return at[a] < at[b];
    return buffers[a].size > buffers[b].size;
  });
}

// The placed buffers by lifetime, for "which of them are live at some op of [lo, hi]" in
// O(log n + answers) rather than a scan of all placed (20 s a role at GPT-3 175B's 48,000
// buffers). A segment tree over the op positions: a lifetime is kept in `cover` at the nodes
// that tile it, and in `below` at those and at every node on the paths from its two end
// leaves to the root. A query reports `below` of the nodes that tile [lo, hi] (lifetimes tiled
// inside them) and `cover` of the nodes on its own end paths (lifetimes tiled by an ancestor);
// a lifetime met twice is reported once.
class LifetimeIndex {
 public:
  explicit LifetimeIndex(int64_t positions) {
    while (leaves_ < positions) leaves_ *= 2;
    cover_.resize(size_t(2 * leaves_));
    below_.resize(size_t(2 * leaves_));
  }
  void insert(size_t id, int64_t lo, int64_t hi) {
    if (seen_.size() <= id) seen_.resize(id + 1, 0);
    for_tiles(lo, hi, [&](int64_t node) {
      cover_[size_t(node)].push_back(id);
      below_[size_t(node)].push_back(id);
    });
    for_end_paths(lo, hi, [&](int64_t node) { below_[size_t(node)].push_back(id); });
  }
  void overlapping(int64_t lo, int64_t hi, std::vector<size_t>& out) {
    out.clear();
    ++stamp_;
    auto report = [&](const std::vector<size_t>& ids) {
      for (size_t id : ids) {
        if (seen_[id] == stamp_) continue;
        seen_[id] = stamp_;
        out.push_back(id);
      }
    };
    for_tiles(lo, hi, [&](int64_t node) { report(below_[size_t(node)]); });
    for_end_paths(lo, hi, [&](int64_t node) { report(cover_[size_t(node)]); });
  }

 private:
  template <class F>
  void for_tiles(int64_t lo, int64_t hi, F f) const {
    for (int64_t l = lo + leaves_, r = hi + leaves_ + 1; l < r; l /= 2, r /= 2) {
      if (l & 1) f(l++);
      if (r & 1) f(--r);
    }
  }
  template <class F>  // each node once: the two paths join below the root
  void for_end_paths(int64_t lo, int64_t hi, F f) const {
    int64_t a = lo + leaves_, b = hi + leaves_;
    for (; a != b; a /= 2, b /= 2) {
      f(a);
      f(b);
    }
    for (; a >= 1; a /= 2) f(a);
  }

  int64_t leaves_ = 1;
  std::vector<std::vector<size_t>> cover_, below_;
  std::vector<uint64_t> seen_;
  uint64_t stamp_ = 0;
};

// The buffers' lifetimes and sizes (rounded up to the alignment), in alloc order.
std::vector<Lifetime> lifetimes(const Role& role, int64_t alignment, int64_t& live_peak_bytes) {
  std::vector<Lifetime> buffers;
  std::unordered_map<std::string, size_t> live;
  const int64_t end = int64_t(role.ops.size());
  int64_t live_bytes = 0;
  live_peak_bytes = 0;
  for (const Op& op : role.ops) {
    if (op.kind == OpKind::alloc) {
      int64_t b = int64_t(op.bytes);
      int64_t size = std::max<int64_t>(alignment, (b + alignment - 1) / alignment * alignment);
      live[op.buffer] = buffers.size();
      buffers.push_back({op.id, op.id, end, size});
      live_bytes += int64_t(op.bytes);
      live_peak_bytes = std::max(live_peak_bytes, live_bytes);
    } else if (op.kind == OpKind::free) {
      auto it = live.find(op.buffer);
      STEPCAST_CHECK(it != live.end(), "arena frees an unknown buffer " + op.buffer);
      buffers[it->second].last = op.id;
      live.erase(it);
      live_bytes -= int64_t(op.bytes);
    }
  }
  return buffers;
}

// Σ over buffers of the buffers live with it at some op (itself included): the offline orders'
// work, each placement sorting those by offset.
int64_t overlapping_pairs(const std::vector<Lifetime>& buffers) {
  std::vector<int64_t> firsts, lasts;
  for (const Lifetime& b : buffers) {
    firsts.push_back(b.first);
    lasts.push_back(b.last);
  }
  std::sort(firsts.begin(), firsts.end());
  std::sort(lasts.begin(), lasts.end());
  int64_t pairs = 0;
  for (const Lifetime& b : buffers) {  // allocated before b ends, minus freed by its alloc
    pairs += (std::lower_bound(firsts.begin(), firsts.end(), b.last) - firsts.begin()) -
             (std::upper_bound(lasts.begin(), lasts.end(), b.first) - lasts.begin());
  }
  return pairs;
}

ArenaPlan plan_greedy(const Role& role, std::vector<Lifetime> buffers, Order by, Fit fit) {
  const int64_t end = int64_t(role.ops.size());
  ArenaPlan plan;
  plan.offset_of_op.assign(role.ops.size(), -1);
  std::vector<size_t> order(buffers.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (by == Order::breadth) {
    order_by_breadth(role, buffers, order);
  } else {
    auto key = [&](size_t i) {
      double size = double(buffers[i].size), lifetime = double(buffers[i].last - buffers[i].first);
      return by == Order::size ? size : by == Order::lifetime ? lifetime : size * lifetime;
    };
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return key(a) > key(b) || (key(a) == key(b) && buffers[a].size > buffers[b].size);
    });
  }
  LifetimeIndex index(end);
  std::vector<size_t> overlapping;
  std::vector<std::pair<int64_t, int64_t>> taken;  // their [offset, end) in the arena
  int64_t top = 0;
  for (size_t i : order) {
    Lifetime& me = buffers[i];
    index.overlapping(me.first, me.last - 1, overlapping);
    taken.clear();
    for (size_t j : overlapping) taken.push_back({buffers[j].offset, buffers[j].offset + buffers[j].size});
    std::sort(taken.begin(), taken.end());
    int64_t best = -1, best_gap = 0, at = 0;
    for (auto [from, to] : taken) {
      int64_t gap = from - at;
      if (gap >= me.size && (best < 0 || (fit == Fit::tightest && gap < best_gap))) {
        best = at;
        best_gap = gap;
      }
      at = std::max(at, to);
    }
    me.offset = best >= 0 ? best : at;
    top = std::max(top, me.offset + me.size);
    index.insert(i, me.first, me.last - 1);
  }
  for (const Lifetime& b : buffers) plan.offset_of_op[size_t(b.op)] = b.offset;
  plan.extent_bytes = top;
  return plan;
}

}  // namespace

// The smallest of the layouts. No one order wins everywhere: on the tiny model's plans by size
// is exact but for ZeRO-3 (2.5% over the live peak, by lifetime 0.3%), by lifetime is 1.6% over
// on tp2; tiny-gpt's cp 2 (a2a) pp 2 ZeRO-1 first stage is 1.4% over by size and exact by
// breadth; small-gpt's ZeRO-3 (dp 2) stays 3.0% over (by size, lowest fit): its gathered
// weights of different sizes do not pack, and no order or local search found a tighter layout.
// The offline orders cost about 12 ns a pair of overlapping_pairs each (1.3 s by size on GPT-3
// 175B's first stage, 1.2·10^8 pairs; the CPU sweep's roles have at most 5.2·10^5): past
// kOfflinePairs a role is placed by first fit alone, which such large roles of many alike
// buffers pack well (175B's stages 0.5–1.0% over the live peak, by size 0.15%), where on small
// ones it leaves up to 38% (small-gpt's ZeRO-3).
constexpr int64_t kOfflinePairs = 1'000'000;

ArenaPlan plan_arena(const Role& role, int64_t alignment) {
  ArenaPlan best = plan_first_fit(role, alignment);
  int64_t live_peak_bytes = 0;
  std::vector<Lifetime> buffers = lifetimes(role, alignment, live_peak_bytes);
  if (overlapping_pairs(buffers) > kOfflinePairs) return best;
  for (Order by : {Order::size, Order::size_lifetime, Order::lifetime, Order::breadth}) {
    for (Fit fit : {Fit::tightest, Fit::lowest}) {
      ArenaPlan plan = plan_greedy(role, buffers, by, fit);
      plan.live_peak_bytes = live_peak_bytes;
      if (plan.extent_bytes < best.extent_bytes) best = std::move(plan);
    }
  }
  return best;
}

}  // namespace stepcast
