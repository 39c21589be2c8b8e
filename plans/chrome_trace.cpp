// The Chrome trace writer; see chrome_trace.hpp. Timestamps in microseconds, as the format wants.
#include "chrome_trace.hpp"

#include <set>

namespace stepcast {

void write_chrome_trace(std::ostream& out, const StepProgram& program,
                        const std::vector<OpRecord>& records) {
  RankGrid grid = program.grid();
  out << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  bool first = true;
  auto separator = [&]() {
    if (!first) out << ",\n";
    first = false;
  };
  std::set<int64_t> ranks;
  for (const OpRecord& r : records) ranks.insert(r.rank);
  for (int64_t rank : ranks) {
    RankCoord c = grid.coord(rank);
    separator();
    out << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" << rank
        << ",\"args\":{\"name\":\"rank " << rank << " (tp " << c.tp << ", dp " << c.dp << ", pp "
        << c.pp << ")\"}}";
    for (Stream s : {Stream::compute, Stream::comm, Stream::p2p}) {
      separator();
      out << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" << rank << ",\"tid\":" << int(s)
          << ",\"args\":{\"name\":\"" << to_string(s) << "\"}}";
    }
  }
  for (const OpRecord& r : records) {
    const Op& op = program.role_of_rank(r.rank).ops[r.id];
    if (op.kind == OpKind::alloc || op.kind == OpKind::free || r.end_s <= r.start_s) continue;
    separator();
    Json args = {{"id", op.id}, {"phase", to_string(op.phase)}, {"bytes", op.bytes}};
    if (op.layer >= 0) args["layer"] = op.layer;
    if (op.microbatch >= 0) args["microbatch"] = op.microbatch;
    if (op.chunk >= 0) args["chunk"] = op.chunk;
    if (is_compute(op.kind)) args["flops"] = op.flops;
    if (op.grad != Grad::none) args["grad"] = to_string(op.grad);
    if (is_collective(op.kind)) {
      args["group"] = to_string(op.group);
      args["algorithm"] = to_string(op.algorithm);
    }
    if (is_p2p(op.kind)) {
      args["peer"] = to_string(op.peer);
      args["tag"] = op.tag;
    }
    if (r.ready_s != r.start_s) args["ready_us"] = r.ready_s * 1e6;
    std::string name = to_string(op.kind);
    if (op.name != OpName::none) name += std::string(" ") + to_string(op.name);
    if (op.grad != Grad::none) name += std::string(" ") + to_string(op.grad);
    out << "{\"name\":" << Json(name).dump() << ",\"cat\":\"" << to_string(op.kind)
        << "\",\"ph\":\"X\",\"pid\":" << r.rank << ",\"tid\":" << int(op.stream)
        << ",\"ts\":" << Json(r.start_s * 1e6).dump() << ",\"dur\":"
        << Json((r.end_s - r.start_s) * 1e6).dump() << ",\"args\":" << args.dump() << "}";
  }
  out << "\n]}\n";
}

}  // namespace stepcast
