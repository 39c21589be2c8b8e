// The Chrome trace writer; see chrome_trace.hpp. Timestamps in microseconds, as the format wants.
#include "chrome_trace.hpp"

#include <algorithm>
#include <array>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <charconv>
#include <cmath>
#include <map>
#include <set>
#include <tuple>
#include <type_traits>

#include "json_text.hpp"

namespace stepcast {

namespace {

// The thread id of lane `lane` of `stream`: lane 0 is the stream's own id (0, 1, 2), further
// lanes 10·(stream + 1) + lane, so that ops of one stream that overlap in time (pipeline
// transfers posted together) sit on tracks of their own instead of mis-nesting on one.
int lane_tid(Stream stream, int lane) { return lane == 0 ? int(stream) : 10 * (int(stream) + 1) + lane; }

struct Placed {
  const OpRecord* record;
  const Op* op;
  int tid;
};

// The events after the processes' and threads' names, formatted in pieces on two threads and
// written in piece order, so that the file is the same bytes as one thread would write: piece k
// goes to the stream when piece k − 1 has (each thread holds at most the piece it formats).
class OrderedPieces {
 public:
  explicit OrderedPieces(std::ostream& out) : out_(out) {}
  // Runs `format(k, text)` for k = 0 … count − 1 on up to two threads, each text appended to an
  // empty string, and writes the texts in order of k.
  void run(size_t count, const std::function<void(size_t, std::string&)>& format) {
    auto work = [&](size_t first, size_t step) {
      std::string text;
      for (size_t k = first; k < count; k += step) {
        text.clear();
        format(k, text);
        std::unique_lock<std::mutex> lock(mutex_);
        turn_.wait(lock, [&] { return next_ == k || stopped_; });
        if (stopped_) return;
        out_.write(text.data(), std::streamsize(text.size()));
        ++next_;
        turn_.notify_all();
      }
    };
    // A piece that throws stops both threads; the first exception is rethrown here.
    std::exception_ptr failed;
    auto guarded = [&](size_t first, size_t step) {
      try {
        work(first, step);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!failed) failed = std::current_exception();
        stopped_ = true;
        turn_.notify_all();
      }
    };
    if (count < 2 || std::thread::hardware_concurrency() < 2) {
      guarded(0, 1);
    } else {
      std::thread other(guarded, 1, 2);
      guarded(0, 2);
      other.join();
    }
    if (failed) std::rethrow_exception(failed);
  }

 private:
  std::ostream& out_;
  std::mutex mutex_;
  std::condition_variable turn_;
  size_t next_ = 0;
  bool stopped_ = false;
};

// An op event's name, as JSON text, per (kind, name, grad): "gemm qkv dgrad" (each thread its own).
class EventNames {
 public:
  const std::string& of(const Op& op) {
    std::string& json = names_[(size_t(op.kind) * kNames + size_t(op.name)) * kGrads + size_t(op.grad)];
    if (json.empty()) {
      std::string name = to_string(op.kind);
      if (op.name != OpName::none) name += std::string(" ") + to_string(op.name);
      if (op.grad != Grad::none) name += std::string(" ") + to_string(op.grad);
      json = Json(name).dump();
    }
    return json;
  }

 private:
  static constexpr size_t kNames = size_t(OpName::recv) + 1, kGrads = size_t(Grad::wgrad) + 1;
  std::vector<std::string> names_ = std::vector<std::string>((size_t(OpKind::free) + 1) * kNames * kGrads);
};

// The complete ("X") event of one op, after ",\n": args' keys in sorted order as nlohmann writes
// them, numbers as the shortest text that reads back the same.
void append_op_event(std::string& event, const Placed& p, EventNames& names) {
  const OpRecord& r = *p.record;
  const Op& op = *p.op;
  auto number = [&event](auto value) { append_json_number(event, value); };
  bool first_key = true;
  auto key = [&event, &first_key](const char* name) {
    event += first_key ? "{\"" : ",\"";
    event += name;
    event += "\":";
    first_key = false;
  };
  auto text = [&event](const char* value) {
    event += '"';
    event += value;
    event += '"';
  };
  event += ",\n{\"name\":";
  event += names.of(op);
  event += ",\"cat\":\"";
  event += to_string(op.kind);
  event += "\",\"ph\":\"X\",\"pid\":";
  number(r.rank);
  event += ",\"tid\":";
  number(p.tid);
  event += ",\"ts\":";
  number(r.start_s * 1e6);
  event += ",\"dur\":";
  number((r.end_s - r.start_s) * 1e6);
  event += ",\"args\":";
  if (is_collective(op.kind)) {
    key("algorithm");
    text(to_string(op.algorithm));
  }
  key("bytes");
  number(op.bytes);
  if (op.chunk >= 0) {
    key("chunk");
    number(op.chunk);
  }
  if (is_compute(op.kind)) {
    key("flops");
    number(op.flops);
  }
  if (op.grad != Grad::none) {
    key("grad");
    text(to_string(op.grad));
  }
  if (is_collective(op.kind)) {
    key("group");
    text(to_string(op.group));
  }
  key("id");
  number(op.id);
  if (op.layer >= 0) {
    key("layer");
    number(op.layer);
  }
  if (op.microbatch >= 0) {
    key("microbatch");
    number(op.microbatch);
  }
  if (is_p2p(op.kind)) {
    key("peer");
    text(to_string(op.peer));
  }
  key("phase");
  text(to_string(op.phase));
  if (r.ready_s != r.start_s) {
    key("ready_us");
    number(r.ready_s * 1e6);
  }
  if (is_p2p(op.kind)) {
    key("tag");
    number(op.tag);
  }
  event += "}}";
}

}  // namespace

void write_chrome_trace(std::ostream& out, const StepProgram& program,
                        const std::vector<OpRecord>& records) {
  RankGrid grid = program.grid();
  // role_of_rank once per rank, not per record (10^6 records; records come rank by rank, so the
  // last rank's role is kept).
  int64_t last_rank = -1;
  const Role* last_role = nullptr;
  auto role_of = [&](int64_t rank) -> const Role& {
    if (rank != last_rank) {
      last_role = &program.role_of_rank(rank);
      last_rank = rank;
    }
    return *last_role;
  };
  std::string event = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  bool first_event = true;
  auto separator = [&]() {
    if (!first_event) event += ",\n";
    first_event = false;
  };

  // Lanes: per rank and stream, each op on the lowest lane free when it starts (greedy interval
  // partitioning: as few tracks as the most ops running at once).
  std::map<std::pair<int64_t, Stream>, std::vector<const OpRecord*>> by_track;
  std::vector<Placed> placed;
  for (const OpRecord& r : records) {
    const Op& op = role_of(r.rank).ops[r.id];
    if (op.kind == OpKind::alloc || op.kind == OpKind::free || r.end_s <= r.start_s) continue;
    by_track[{r.rank, op.stream}].push_back(&r);
  }
  std::map<std::pair<int64_t, int>, int> lanes_of;  // (rank, stream) → lanes used
  for (auto& [track, ops] : by_track) {
    std::stable_sort(ops.begin(), ops.end(), [](const OpRecord* a, const OpRecord* b) { return a->start_s < b->start_s; });
    std::vector<double> lane_end;
    for (const OpRecord* r : ops) {
      size_t lane = 0;
      while (lane < lane_end.size() && lane_end[lane] > r->start_s) ++lane;
      if (lane == lane_end.size()) lane_end.push_back(0);
      lane_end[lane] = r->end_s;
      int tid = lane_tid(track.second, int(lane));
      placed.push_back({r, &role_of(r->rank).ops[r->id], tid});
    }
    lanes_of[{track.first, int(track.second)}] = int(lane_end.size());
  }

  std::set<int64_t> ranks;
  for (const OpRecord& r : records) ranks.insert(r.rank);
  for (int64_t rank : ranks) {
    RankCoord c = grid.coord(rank);
    separator();
    event += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + std::to_string(rank) +
             ",\"args\":{\"name\":\"rank " + std::to_string(rank) + " (tp " + std::to_string(c.tp) +
             (grid.cp_size() > 1 ? ", cp " + std::to_string(c.cp) : std::string()) + ", dp " +
             std::to_string(c.dp) + ", pp " + std::to_string(c.pp) + ")\"}}";
    for (Stream s : {Stream::compute, Stream::comm, Stream::p2p}) {
      int lanes = std::max(1, lanes_of.count({rank, int(s)}) ? lanes_of[{rank, int(s)}] : 1);
      for (int lane = 0; lane < lanes; ++lane) {
        separator();
        event += "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + std::to_string(rank) +
                 ",\"tid\":" + std::to_string(lane_tid(s, lane)) + ",\"args\":{\"name\":\"" + to_string(s) +
                 (lane ? " (" + std::to_string(lane + 1) + ")" : "") + "\"}}";
      }
    }
  }
  out.write(event.data(), std::streamsize(event.size()));
  // Every event from here on follows one (a rank's process name, when there are records), after
  // ",\n".

  // Flow arrows from each send to its receive, where both ranks are in the records: the flow
  // starts inside the send's slice and ends inside the receive's (Perfetto binds each end to the
  // slice enclosing its time).
  std::map<std::tuple<int64_t, int64_t, int64_t>, const Placed*> sends;  // (from, to, tag)
  for (const Placed& p : placed) {
    if (p.op->kind != OpKind::send) continue;
    int64_t to = peer_rank(grid, p.record->rank, p.op->peer);
    sends[{p.record->rank, to, p.op->tag}] = &p;
  }
  auto append_flows = [&](std::string& text) {
    auto number = [&text](auto value) { append_json_number(text, value); };
    int64_t flow = 0;
    for (const Placed& p : placed) {
      if (p.op->kind != OpKind::recv) continue;
      int64_t from = peer_rank(grid, p.record->rank, p.op->peer);
      auto send = sends.find({from, p.record->rank, p.op->tag});
      if (send == sends.end()) continue;
      const OpRecord& s = *send->second->record;
      const OpRecord& r = *p.record;
      // Inside both slices where they overlap (the data moves then), the arrow's end after its
      // start: a receive posted long before its send would otherwise point back in time.
      double from_s = (s.start_s + s.end_s) / 2, to_s = (r.start_s + r.end_s) / 2;
      const double lo = std::max(s.start_s, r.start_s), hi = std::min(s.end_s, r.end_s);
      if (hi > lo) {
        from_s = lo + 0.1 * (hi - lo);
        to_s = lo + 0.9 * (hi - lo);
      }
      ++flow;
      text += ",\n{\"name\":\"activation\",\"cat\":\"p2p\",\"ph\":\"s\",\"id\":";
      number(flow);
      text += ",\"pid\":";
      number(s.rank);
      text += ",\"tid\":";
      number(send->second->tid);
      text += ",\"ts\":";
      append_json_double(text, from_s * 1e6);
      text += "}";
      text += ",\n{\"name\":\"activation\",\"cat\":\"p2p\",\"ph\":\"f\",\"bp\":\"e\",\"id\":";
      number(flow);
      text += ",\"pid\":";
      number(r.rank);
      text += ",\"tid\":";
      number(p.tid);
      text += ",\"ts\":";
      append_json_double(text, to_s * 1e6);
      text += "}";
    }
  };

  // A memory counter per rank: the program's memory walk (its alloc and free ops in list order,
  // so the counter's peak is the program's), each change placed at its op's time and never
  // before the previous one (an alloc without deps happens at 0). Where the records leave the
  // allocs and frees out (a prediction's: they happen as their deps end), their times are
  // derived so from the recorded ops.
  struct RankRecords {
    int64_t rank = 0;
    std::vector<const OpRecord*> memory, timed;
  };
  std::vector<RankRecords> of_rank;
  {
    std::map<int64_t, size_t> index;
    for (const OpRecord& r : records) {
      auto [it, added] = index.try_emplace(r.rank, of_rank.size());
      if (added) of_rank.push_back({r.rank, {}, {}});
      OpKind kind = role_of(r.rank).ops[r.id].kind;
      RankRecords& rr = of_rank[it->second];
      (kind == OpKind::alloc || kind == OpKind::free ? rr.memory : rr.timed).push_back(&r);
    }
    std::sort(of_rank.begin(), of_rank.end(), [](const RankRecords& a, const RankRecords& b) { return a.rank < b.rank; });
  }
  auto append_memory_counter = [&](const RankRecords& rr, std::string& text) {
    const Role& role = program.role_of_rank(rr.rank);
    std::vector<std::pair<int32_t, double>> changes;  // (op id, time) of the rank's allocs and frees
    if (!rr.memory.empty()) {
      for (const OpRecord* r : rr.memory) changes.emplace_back(r->id, r->start_s);
      std::sort(changes.begin(), changes.end());
    } else {
      std::vector<double> end_of(role.ops.size(), 0);
      for (const OpRecord* r : rr.timed) end_of[size_t(r->id)] = r->end_s;
      for (const Op& op : role.ops) {
        if (op.kind != OpKind::alloc && op.kind != OpKind::free) continue;
        double at = 0;
        for (int32_t d : op.deps) at = std::max(at, end_of[size_t(d)]);
        end_of[size_t(op.id)] = at;
        changes.emplace_back(op.id, at);
      }
    }
    double level = 0, at = 0;
    for (size_t i = 0; i < changes.size(); ++i) {
      const Op& op = role.ops[size_t(changes[i].first)];
      level += op.kind == OpKind::alloc ? op.bytes : -op.bytes;
      at = std::max(at, changes[i].second);
      // One sample per instant: the level after the last change at that time.
      if (i + 1 < changes.size() && std::max(at, changes[i + 1].second) == at) {
        // the next change lands at the same instant: sample after it, unless this is the peak
        const Op& next = role.ops[size_t(changes[i + 1].first)];
        if (next.kind == OpKind::alloc) continue;
      }
      text += ",\n{\"name\":\"memory\",\"ph\":\"C\",\"pid\":";
      append_json_number(text, rr.rank);
      text += ",\"ts\":";
      append_json_double(text, at * 1e6);
      text += ",\"args\":{\"bytes\":";
      append_json_double(text, level);
      text += "}}";
    }
  };

  // The pieces, in the order one thread would write them: the op events a few thousand at a
  // time, the flow arrows, each rank's memory counter.
  constexpr size_t kOpsPerPiece = 8192;
  const size_t op_pieces = (placed.size() + kOpsPerPiece - 1) / kOpsPerPiece;
  std::array<EventNames, 2> names;  // a cache per thread: piece k is formatted by thread k % 2
  OrderedPieces(out).run(op_pieces + 1 + of_rank.size(), [&](size_t k, std::string& text) {
    if (k < op_pieces) {
      const size_t end = std::min(placed.size(), (k + 1) * kOpsPerPiece);
      for (size_t i = k * kOpsPerPiece; i < end; ++i) append_op_event(text, placed[i], names[k % 2]);
    } else if (k == op_pieces) {
      append_flows(text);
    } else {
      append_memory_counter(of_rank[k - op_pieces - 1], text);
    }
  });
  out << "\n]}\n";
}

}  // namespace stepcast
