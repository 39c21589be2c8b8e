// The prediction/measurement join on (rank, id): step time, breakdown, memory by class, ops by
// kind, compute name and collective, the largest contributors; see compare.hpp. Reading the
// files is compare_read.cpp; the writers are compare_json.cpp and compare_text.cpp.
#include "compare.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "compare_fields.hpp"
#include "errors.hpp"

namespace stepcast {

using namespace compare_detail;

namespace {

const Json* memory_entry_of_rank(const Json& ranks, int64_t rank) {
  for (const Json& entry : ranks) {
    for (const Json& range : entry.at("ranks")) {
      if (range.at(0).get<int64_t>() <= rank && rank <= range.at(1).get<int64_t>()) return &entry;
    }
  }
  return nullptr;
}

void add_to_group(std::map<std::string, OpGroupCompare>& groups, OpGroupCompare key,
                  double predicted_s, double measured_s) {
  auto [it, inserted] = groups.try_emplace(key.label(), std::move(key));
  OpGroupCompare& g = it->second;
  ++g.count;
  g.predicted_s += predicted_s;
  g.measured_s += measured_s;
  g.abs_gap_s += std::abs(predicted_s - measured_s);
}

std::vector<OpGroupCompare> sorted_groups(const std::map<std::string, OpGroupCompare>& groups,
                                          bool by_gap) {
  std::vector<OpGroupCompare> out;
  for (const auto& [label, g] : groups) out.push_back(g);
  std::stable_sort(out.begin(), out.end(), [&](const OpGroupCompare& a, const OpGroupCompare& b) {
    return by_gap ? a.abs_gap_s > b.abs_gap_s : a.measured_s > b.measured_s;
  });
  return out;
}

}  // namespace

std::optional<double> CompareFigure::relative() const { return ratio(error(), measured); }
std::optional<double> MeasuredPeakCompare::relative() const {
  return ratio(error_bytes(), measured_peak_bytes);
}
std::optional<double> OpGroupCompare::relative() const { return ratio(error_s(), measured_s); }

std::string OpGroupCompare::label() const {
  std::string out = kind;
  for (const std::string* part : {&name, &group, &algorithm}) {
    if (!part->empty()) out += " " + *part;
  }
  return out;
}

namespace {

// Memory by class, rank entry by rank entry (both sides list the same entries), and the measured
// high-water marks.
void compare_memory(const StepResult& prediction, const StepResult& measurement, CompareResult& c) {
  const Json& p_ranks = prediction.memory.at("ranks");
  const Json& m_ranks = measurement.memory.at("ranks");
  double arena_peak_max = 0;
  for (const Json& pe : p_ranks) {
    RankMemoryCompare rm;
    rm.rank = integer(pe, "rank", label(prediction, "prediction"), "memory.ranks[].");
    rm.stage = integer(pe, "stage", label(prediction, "prediction"), "memory.ranks[].");
    for (const Json& range : pe.at("ranks")) rm.ranks.emplace_back(range.at(0), range.at(1));
    const Json* me = memory_entry_of_rank(m_ranks, rm.rank);
    if (!me) {
      throw_input_error(
          label(measurement, "measurement"), "memory.ranks", "",
          "has no entry for rank " + std::to_string(rm.rank) + ", which the prediction lists",
          "the memory of the same program");
    }
    for (const char* key : kMemoryKeys) {
      rm.classes.push_back({key, number(pe, key, label(prediction, "prediction"), "memory.ranks[]."),
                            number(*me, key, label(measurement, "measurement"), "memory.ranks[].")});
    }
    if (pe.contains(kPlacementKey) && me->contains(kPlacementKey)) {
      auto runtime = std::find_if(rm.classes.begin(), rm.classes.end(),
                                  [](const CompareFigure& f) { return f.name == "memory_runtime_bytes"; });
      rm.classes.insert(runtime,
                        {kPlacementKey, number(pe, kPlacementKey, label(prediction, "prediction"), "memory.ranks[]."),
                         number(*me, kPlacementKey, label(measurement, "measurement"), "memory.ranks[].")});
    }
    arena_peak_max = std::max(arena_peak_max, pe.at("peak_bytes").get<double>() -
                                                  pe.at("memory_runtime_bytes").get<double>());
    c.memory_ranks.push_back(std::move(rm));
  }
  c.peak_bytes_max = {"peak_bytes_max",
                      number(prediction.memory, "peak_bytes_max", label(prediction, "prediction"), "memory."),
                      number(measurement.memory, "peak_bytes_max", label(measurement, "measurement"), "memory.")};
  if (measurement.memory.contains("measured_peak_bytes_max")) {
    c.measured_peak_max = MeasuredPeakCompare{
        -1, arena_peak_max,
        number(measurement.memory, "measured_peak_bytes_max", label(measurement, "measurement"), "memory.")};
  }
  for (const Json& mp : measurement.memory.value("measured", Json::array())) {
    MeasuredPeakCompare rank_peak;
    rank_peak.rank = integer(mp, "rank", label(measurement, "measurement"), "memory.measured[].");
    rank_peak.measured_peak_bytes =
        number(mp, "measured_peak_bytes", label(measurement, "measurement"), "memory.measured[].");
    if (mp.contains("arena_extent_bytes")) {
      rank_peak.arena_extent_bytes =
          number(mp, "arena_extent_bytes", label(measurement, "measurement"), "memory.measured[].");
    }
    const Json* pe = memory_entry_of_rank(p_ranks, rank_peak.rank);
    if (!pe) continue;  // a rank the prediction's memory does not list: nothing to compare with
    rank_peak.predicted_arena_peak_bytes =
        number(*pe, "peak_bytes", label(prediction, "prediction")) - number(*pe, "memory_runtime_bytes", label(prediction, "prediction"));
    c.measured_peak_ranks.push_back(rank_peak);
  }
}

// The op join on (rank, id) and its aggregations.
void compare_ops(const StepResult& prediction, const StepResult& measurement,
                 const StepProgram& program, CompareResult& c) {
  auto check_record = [&](const OpRecord& r, const std::string& side) {
    if (r.rank < 0 || r.rank >= program.world_size() || r.id < 0 ||
        r.id >= int32_t(program.role_of_rank(r.rank).ops.size())) {
      throw_input_error(
          side, "ops[]", "{rank " + std::to_string(r.rank) + ", id " + std::to_string(r.id) + "}",
          "is not an op of the program",
          "ranks 0.." + std::to_string(program.world_size() - 1) + " and the ids of their role");
    }
  };
  // Alloc and free take no time: a prediction does not record them (simulate writes the ops that
  // take time), and a measurement's are left out of the join too.
  auto memory_op = [&](const OpRecord& r) {
    const OpKind kind = program.role_of_rank(r.rank).ops[size_t(r.id)].kind;
    return kind == OpKind::alloc || kind == OpKind::free;
  };
  std::map<std::pair<int64_t, int32_t>, const OpRecord*> predicted;
  std::set<int64_t> p_ranks, m_ranks;
  for (const OpRecord& r : prediction.ops) {
    check_record(r, label(prediction, "prediction"));
    p_ranks.insert(r.rank);
    if (!memory_op(r)) predicted[{r.rank, r.id}] = &r;
  }
  c.predicted_ranks.assign(p_ranks.begin(), p_ranks.end());
  auto duration = [](const OpRecord& r) {
    return std::max(0.0, r.end_s - std::max(r.start_s, r.ready_s));
  };
  std::map<std::string, OpGroupCompare> kinds, names, collectives, finest;
  std::vector<OpCompare> ops;
  for (const OpRecord& mr : measurement.ops) {
    check_record(mr, label(measurement, "measurement"));
    m_ranks.insert(mr.rank);
    if (memory_op(mr)) continue;
    auto it = predicted.find({mr.rank, mr.id});
    if (it == predicted.end()) {
      ++c.ops_measured_only;
      continue;
    }
    ++c.ops_joined;
    const Op& op = program.role_of_rank(mr.rank).ops[mr.id];
    if (is_collective(op.kind) || op.kind == OpKind::recv) {
      ++c.waiting_ops_joined;
      c.waiting_ops_measured_ready_at_start += mr.ready_s == mr.start_s;
    }
    double p_s = duration(*it->second), m_s = duration(mr);
    OpGroupCompare key;
    key.kind = to_string(op.kind);
    add_to_group(kinds, key, p_s, m_s);
    if (is_compute(op.kind)) {
      key.name = op.grad == Grad::none ? to_string(op.name) : to_string(op.name) + std::string("/") + to_string(op.grad);
      add_to_group(names, key, p_s, m_s);
    } else if (is_collective(op.kind)) {
      key.group = to_string(op.group);
      key.algorithm = to_string(op.algorithm);
      add_to_group(collectives, key, p_s, m_s);
    }
    add_to_group(finest, key, p_s, m_s);
    std::ostringstream label;
    label << key.label() << " (" << to_string(op.phase);
    if (op.layer >= 0) label << ", layer " << op.layer;
    if (op.microbatch >= 0) label << ", microbatch " << op.microbatch;
    label << ")";
    ops.push_back({mr.rank, mr.id, label.str(), p_s, m_s});
  }
  c.measured_ranks.assign(m_ranks.begin(), m_ranks.end());
  c.ops_predicted_only = int64_t(predicted.size()) - c.ops_joined;
  c.by_kind = sorted_groups(kinds, false);
  c.by_compute_name = sorted_groups(names, false);
  c.by_collective = sorted_groups(collectives, false);
  c.contributors = sorted_groups(finest, true);
  std::stable_sort(ops.begin(), ops.end(), [](const OpCompare& a, const OpCompare& b) {
    return std::abs(a.error_s()) > std::abs(b.error_s());
  });
  if (ops.size() > size_t(kCompareTopOps)) ops.resize(kCompareTopOps);
  c.top_ops = std::move(ops);
}

}  // namespace

CompareResult compare_results(const StepResult& prediction, const StepResult& measurement,
                              const StepProgram& program) {
  check_comparable(prediction, measurement, label(prediction, "prediction"), label(measurement, "measurement"));
  if (program.program_sha256 != prediction.program_sha256) {
    throw InputError("the program given (program_sha256 " + program.program_sha256 +
                     ") is not the one the pair ran (" + prediction.program_sha256 + ")");
  }
  CompareResult c;
  c.program_sha256 = prediction.program_sha256;
  c.inputs = prediction.inputs;
  c.step_time_s = {"step_time_s", prediction.step_time_s, measurement.step_time_s};
  c.predicted_critical_rank = prediction.critical_rank;
  c.measured_critical_rank = measurement.critical_rank;
  const Breakdown& pb = prediction.breakdown;
  const Breakdown& mb = measurement.breakdown;
  // A measurement's compute includes its run-to-run variation and its slowdown by overlapped
  // collectives; the prediction's are split out.
  auto compute = [](const Breakdown& b) { return b.compute_s + b.variability_s + b.overlap_interference_s; };
  c.breakdown_s = {{"compute", compute(pb), compute(mb)},
                   {"exposed_comm", pb.exposed_comm_s, mb.exposed_comm_s},
                   {"bubble", pb.bubble_s, mb.bubble_s},
                   {"optimizer", pb.optimizer_s, mb.optimizer_s}};
  compare_memory(prediction, measurement, c);
  compare_ops(prediction, measurement, program, c);
  return c;
}

}  // namespace stepcast
