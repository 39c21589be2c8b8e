// StepResult's streamed JSON (write_step_result_json) against its JSON tree
// (step_result_to_json): the same document, every record's times bit for bit, through gzip too.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <sstream>

#include "gzip_file.hpp"
#include "json_input.hpp"
#include "step_result.hpp"
#include "test_support.hpp"

using namespace stepcast;

namespace {

StepResult example_result() {
  StepResult r;
  r.source = "simulator";
  r.step_time_s = 20.28670417183789;
  r.critical_rank = 48;
  r.breakdown.compute_s = 15.35245502886815;
  r.tokens_per_s = 155063.53192486122;
  r.mfu = 0.5224179492439611;
  r.scaling_efficiency = 0.969035950365458;
  r.memory = {{"fits", true}, {"peak_bytes_max", 34664868480.0}};
  r.program_sha256 = "62a4";
  r.inputs = {{"plan", {{"tp_size", 8}}}};
  r.extra = {{"mode", "fast"}, {"activities", 227347}};
  // Times that a shortest-digits writer must keep exactly: thirds, tiny and large values, zero.
  for (int64_t i = 0; i < 1000; ++i) {
    double t = double(i) / 3.0 + std::ldexp(1.0, -40) * double(i % 7);
    r.ops.push_back({i % 9, int32_t(i), t, t * 1.000001 + 1e-300, i % 3 ? t : 0.0});
  }
  r.ops.push_back({1 << 20, 2147483647, 1e-9, 1.7976931348623157e308, 5e-324});
  return r;
}

}  // namespace

TEST_CASE("step result: the streamed JSON is step_result_to_json's document", "[step_result]") {
  StepResult r = example_result();
  std::ostringstream text;
  write_step_result_json(text, r);
  Json streamed = parse_json_text(text.str(), "streamed");
  CHECK(streamed == step_result_to_json(r));
  REQUIRE(streamed["ops"].size() == r.ops.size());
  for (size_t i = 0; i < r.ops.size(); ++i) {
    INFO("record " << i);
    CHECK(streamed["ops"][i]["start_s"].get<double>() == r.ops[i].start_s);
    CHECK(streamed["ops"][i]["end_s"].get<double>() == r.ops[i].end_s);
    CHECK(streamed["ops"][i]["ready_s"].get<double>() == r.ops[i].ready_s);
  }
  // The summary before the inputs, the records last.
  CHECK(text.str().find("\"step_time_s\"") < text.str().find("\"inputs\""));
  CHECK(text.str().find("\"inputs\"") < text.str().find("\"ops\""));
}

TEST_CASE("step result: a record's non-finite time is written null, as the JSON tree writes it", "[step_result]") {
  StepResult r = example_result();
  r.ops.push_back({0, 7, std::nan(""), HUGE_VAL, -HUGE_VAL});
  std::ostringstream text;
  write_step_result_json(text, r);
  Json streamed = parse_json_text(text.str(), "streamed");  // "nan" or "inf" would not parse
  CHECK(streamed == Json::parse(step_result_to_json(r).dump()));  // the tree's text: null too
  CHECK(streamed["ops"].back()["start_s"].is_null());
  CHECK(streamed["ops"].back()["end_s"].is_null());
}

TEST_CASE("step result: a gzip file reads back as the text written into it", "[step_result]") {
  StepResult r = example_result();
  std::string path = (std::filesystem::temp_directory_path() /
                      ("stepcast-test-step-result-" + std::to_string(::getpid()) + ".json.gz"))
                         .string();
  {
    GzipFileBuf buffer(path);
    std::ostream out(&buffer);
    write_step_result_json(out, r);
    buffer.close();
  }
  std::ostringstream text;
  write_step_result_json(text, r);
  CHECK(read_text_file(path) == text.str());
  CHECK(load_json_file(path) == step_result_to_json(r));
  std::filesystem::remove(path);
  CHECK_THROWS_WITH(read_gzip_file(path), Catch::Matchers::Contains(path));
}

TEST_CASE("step result: a gap after a collective is exposed communication, an alloc run after it aside",
          "[step_result]") {
  // In order, as the CPU executor runs a rank: compute 0–1 s, an all-reduce on the comm stream
  // 1–5 s holding the thread, the next op's output allocated at 5 s, that op 5–6 s.
  Role role;
  auto op = [&](OpKind kind, Stream stream, SmallVector<int32_t, 4> deps) {
    Op o;
    o.id = int32_t(role.ops.size());
    o.kind = kind;
    o.stream = stream;
    o.deps = deps;
    role.ops.push_back(o);
  };
  op(OpKind::gemm, Stream::compute, {});
  op(OpKind::all_reduce, Stream::comm, {0});
  op(OpKind::alloc, Stream::compute, {});
  op(OpKind::gemm, Stream::compute, {1, 2});
  std::vector<OpRecord> records = {{0, 0, 0.0, 1.0, 0.0}, {0, 1, 1.0, 5.0, 1.0}, {0, 2, 5.0, 5.0 + 1e-9, 5.0},
                                   {0, 3, 5.0 + 1e-9, 6.0, 5.0}};
  Breakdown b = breakdown_of_rank(role, records, 0, 6.0);
  CHECK(b.compute_s == Approx(2.0));
  CHECK(b.exposed_comm_s == Approx(4.0));
  CHECK(b.bubble_s == Approx(0.0).margin(1e-12));
  // A receive as the latest dependency is a bubble (waiting on a peer's compute).
  role.ops[1].kind = OpKind::recv;
  Breakdown waiting = breakdown_of_rank(role, records, 0, 6.0);
  CHECK(waiting.bubble_s == Approx(4.0));
  CHECK(waiting.exposed_comm_s == Approx(0.0).margin(1e-12));
}
