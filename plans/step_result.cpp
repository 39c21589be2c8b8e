// The shared breakdown and the StepResult's JSON; see step_result.hpp.
#include "step_result.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <type_traits>

#include "errors.hpp"
#include "json_text.hpp"
#include "version.hpp"

namespace stepcast {

namespace {

enum class Wait { bubble, comm };

// What kept op `id` from starting earlier: follow its latest-finishing dep through frees (an
// alloc waits for nothing: where an executor runs it, just before its user, its record would
// hide what the user really waited for — a collective that held the thread).
Wait wait_reason(const Role& role, const std::vector<OpRecord>& records, int32_t id) {
  for (int depth = 0; depth < 8; ++depth) {
    const Op& op = role.ops[id];
    int32_t latest = -1;
    for (int32_t d : op.deps) {
      if (role.ops[d].kind == OpKind::alloc) continue;
      if (latest < 0 || records[d].end_s > records[latest].end_s) latest = d;
    }
    if (latest < 0) return Wait::bubble;
    const Op& dep = role.ops[latest];
    if (dep.kind == OpKind::recv || dep.kind == OpKind::send) return Wait::bubble;
    if (is_collective(dep.kind)) return Wait::comm;
    if (dep.kind != OpKind::alloc && dep.kind != OpKind::free) return Wait::bubble;
    id = latest;
  }
  return Wait::bubble;
}

}  // namespace

Breakdown breakdown_of_rank(const Role& role, const std::vector<OpRecord>& records,
                            double step_start_s, double step_end_s) {
  STEPCAST_CHECK(records.size() == role.ops.size(), "one record per op of the role");
  std::vector<int32_t> compute_ops;
  for (const Op& op : role.ops) {
    if (op.stream != Stream::compute || op.kind == OpKind::alloc || op.kind == OpKind::free) continue;
    compute_ops.push_back(op.id);
  }
  std::sort(compute_ops.begin(), compute_ops.end(), [&](int32_t a, int32_t b) {
    return records[a].start_s < records[b].start_s ||
           (records[a].start_s == records[b].start_s && a < b);
  });
  Breakdown out;
  double cursor = step_start_s;
  auto attribute_gap = [&](double until, Wait reason) {
    if (until <= cursor) return;
    (reason == Wait::comm ? out.exposed_comm_s : out.bubble_s) += until - cursor;
    cursor = until;
  };
  for (int32_t id : compute_ops) {
    const Op& op = role.ops[id];
    const OpRecord& r = records[id];
    attribute_gap(r.start_s, wait_reason(role, records, id));
    double begin = std::max(cursor, r.start_s);
    double end = std::max(begin, r.end_s);
    double busy = end - begin;
    if (in_optimizer_part(op)) out.optimizer_s += busy;
    else if (is_collective(op.kind)) out.exposed_comm_s += busy;
    else out.compute_s += busy;
    cursor = end;
  }
  // After its last compute op the rank waits for its communication to drain.
  if (step_end_s > cursor) out.exposed_comm_s += step_end_s - cursor;
  return out;
}

void fill_ready_times(const StepProgram& program, std::vector<OpRecord>& records) {
  RankGrid grid = program.grid();
  std::map<std::pair<int64_t, int32_t>, size_t> index;  // (rank, id) → record
  for (size_t i = 0; i < records.size(); ++i) index[{records[i].rank, records[i].id}] = i;
  // Per role: send op of each tag; collectives in list order per (group kind, stream).
  std::vector<std::map<int64_t, int32_t>> send_of_tag(program.roles.size());
  std::vector<std::map<std::pair<int, int>, std::vector<int32_t>>> collectives(program.roles.size());
  std::vector<std::map<int32_t, size_t>> sequence(program.roles.size());
  for (const Role& role : program.roles) {
    for (const Op& op : role.ops) {
      if (op.kind == OpKind::send) send_of_tag[role.index][op.tag] = op.id;
      if (is_collective(op.kind)) {
        auto& list = collectives[role.index][{int(op.group), int(op.stream)}];
        sequence[role.index][op.id] = list.size();
        list.push_back(op.id);
      }
    }
  }
  for (OpRecord& r : records) {
    const Role& role = program.role_of_rank(r.rank);
    const Op& op = role.ops[r.id];
    if (op.kind == OpKind::recv) {
      int64_t peer = peer_rank(grid, r.rank, op.peer);
      const auto& sends = send_of_tag[program.role_of_rank(peer).index];
      auto send = sends.find(op.tag);
      if (send == sends.end()) continue;
      auto rec = index.find({peer, send->second});
      if (rec != index.end()) r.ready_s = std::max(r.start_s, records[rec->second].start_s);
    } else if (is_collective(op.kind)) {
      size_t k = sequence[role.index].at(op.id);
      double ready = r.start_s;
      for (int64_t member : grid.group(op.group, r.rank)) {
        const auto& list = collectives[program.role_of_rank(member).index][{int(op.group), int(op.stream)}];
        if (k >= list.size()) continue;
        auto rec = index.find({member, list[k]});
        if (rec != index.end()) ready = std::max(ready, records[rec->second].start_s);
      }
      r.ready_s = ready;
    }
  }
}

namespace {

// Everything of step_result_to_json but "ops".
Json summary_to_json(const StepResult& r) {
  Json out = {{"schema_version", StepResult::kSchemaVersion},
              {"source", r.source},
              {"step_time_s", r.step_time_s},
              {"critical_rank", r.critical_rank},
              {"breakdown_s",
               {{"compute", r.breakdown.compute_s},
                {"exposed_comm", r.breakdown.exposed_comm_s},
                {"bubble", r.breakdown.bubble_s},
                {"optimizer", r.breakdown.optimizer_s},
                {"variability", r.breakdown.variability_s},
                {"overlap_interference", r.breakdown.overlap_interference_s}}},
              {"tokens_per_s", r.tokens_per_s},
              {"mfu", r.mfu},
              {"hfu", r.hfu},
              {"memory", r.memory},
              // null: simulate --no-program-hash
              {"program_sha256", r.program_sha256.empty() ? Json(nullptr) : Json(r.program_sha256)},
              {"inputs", r.inputs},
              {"stepcast_version", stepcast_version()},
              {"git_commit", stepcast_git_commit()}};
  out["scaling_efficiency"] = r.scaling_efficiency ? Json(*r.scaling_efficiency) : Json(nullptr);
  for (auto it = r.extra.begin(); it != r.extra.end(); ++it) out[it.key()] = it.value();
  return out;
}

}  // namespace

Json step_result_to_json(const StepResult& r) {
  Json ops = Json::array();
  for (const OpRecord& o : r.ops) {
    ops.push_back({{"rank", o.rank}, {"id", o.id}, {"start_s", o.start_s}, {"end_s", o.end_s},
                   {"ready_s", o.ready_s}});
  }
  Json out = summary_to_json(r);
  out["ops"] = ops;
  return out;
}

void write_step_result_json(std::ostream& out, const StepResult& result) {
  Json summary = summary_to_json(result);
  summary.erase("ops");  // the records come last, below
  // The keys a person looks for first, then the rest of the summary, memory and inputs last.
  const std::vector<std::string> first = {"schema_version", "source", "step_time_s", "critical_rank",
                                          "breakdown_s", "tokens_per_s", "mfu", "hfu",
                                          "scaling_efficiency"};
  const std::vector<std::string> last = {"memory", "inputs"};
  std::vector<std::string> keys = first;
  for (auto it = summary.begin(); it != summary.end(); ++it) {
    if (std::find(first.begin(), first.end(), it.key()) == first.end() &&
        std::find(last.begin(), last.end(), it.key()) == last.end()) {
      keys.push_back(it.key());
    }
  }
  keys.insert(keys.end(), last.begin(), last.end());
  out << "{";
  for (const std::string& key : keys) {
    auto it = summary.find(key);
    if (it != summary.end()) out << Json(key).dump() << ":" << it->dump() << ",\n";
  }
  out << "\"ops\":[";
  constexpr size_t kChunkBytes = 1 << 20;
  std::string chunk;
  chunk.reserve(kChunkBytes);
  for (size_t i = 0; i < result.ops.size(); ++i) {
    const OpRecord& o = result.ops[i];
    chunk += i ? ",\n{\"rank\":" : "\n{\"rank\":";
    append_json_number(chunk, o.rank);
    chunk += ",\"id\":";
    append_json_number(chunk, o.id);
    chunk += ",\"start_s\":";
    append_json_number(chunk, o.start_s);
    chunk += ",\"end_s\":";
    append_json_number(chunk, o.end_s);
    chunk += ",\"ready_s\":";
    append_json_number(chunk, o.ready_s);
    chunk += '}';
    if (chunk.size() > kChunkBytes - 256) {
      out.write(chunk.data(), std::streamsize(chunk.size()));
      chunk.clear();
    }
  }
  out.write(chunk.data(), std::streamsize(chunk.size()));
  out << "]}\n";
}

}  // namespace stepcast
