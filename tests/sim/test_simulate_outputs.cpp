// What `simulate --out DIR` writes, as a person opens it: prediction.json with the summary first
// and the records last, of one rank per role (and the critical rank) unless --records all, a
// trace of the same ranks unless --trace all or none, gzip files with --gzip that read back as
// the plain ones, and --records/--trace values it refuses with the valid ones.
#include <catch2/catch.hpp>

#include <fstream>
#include <map>
#include <set>

#include "json_input.hpp"
#include "program_json.hpp"
#include "test_support.hpp"

using namespace stepcast;
using Catch::Matchers::Contains;
using test::CommandResult;
using test::fresh_dir;
using test::model_arg;
using test::plan_arg;
using test::read_json;
using test::run_stepcast;
using test::topology_arg;

namespace {

// tiny 3D (tp 2, pp 2, dp 2) on 4 two-device nodes sharing a NIC: fast mode simulates all 8.
const std::string kArgs = "simulate" + model_arg("tiny") + topology_arg("localhost-cpu") +
                          plan_arg("tiny-cpu-3d") + " --nodes 4 --mode fast --no-scaling";

std::string simulate_into(const std::string& name, const std::string& options) {
  std::string dir = fresh_dir("outputs-" + name);
  CommandResult result = run_stepcast(kArgs + options + " --out " + dir);
  INFO(result.output);
  REQUIRE(result.exit_code == 0);
  return dir;
}

std::set<int64_t> ranks_of(const Json& events, const char* key) {
  std::set<int64_t> ranks;
  for (const Json& e : events) {
    if (e.contains(key)) ranks.insert(e[key].get<int64_t>());
  }
  return ranks;
}

std::string first_bytes(const std::string& path, size_t n) {
  std::ifstream in(path, std::ios::binary);
  std::string text(n, '\0');
  in.read(text.data(), std::streamsize(n));
  return text.substr(0, size_t(in.gcount()));
}

}  // namespace

TEST_CASE("simulate: records and trace of one rank per role by default, every rank when asked",
          "[simulate][outputs]") {
  std::string plain = simulate_into("default", "");
  Json prediction = read_json(plain + "/prediction.json");
  // One rank per role (pipeline stage: ranks 0 and 4) and the critical rank.
  std::set<int64_t> representative = ranks_of(prediction["ops"], "rank");
  std::set<int64_t> expected = {0, 4, prediction["critical_rank"].get<int64_t>()};
  CHECK(representative == expected);
  CHECK(prediction["detail_ranks"].get<std::set<int64_t>>() == representative);
  Json trace = read_json(plain + "/trace.json");
  CHECK(ranks_of(trace["traceEvents"], "pid") == representative);

  std::string all = simulate_into("all", " --records all --trace all");
  Json every = read_json(all + "/prediction.json");
  CHECK(every["simulated_ranks"] == 8);
  CHECK(ranks_of(every["ops"], "rank").size() == 8);
  CHECK(ranks_of(read_json(all + "/trace.json")["traceEvents"], "pid").size() == 8);
  CHECK(every["step_time_s"] == prediction["step_time_s"]);
  // The representative ranks' records are the same in both.
  Json kept = Json::array();
  for (const Json& op : every["ops"]) {
    if (representative.count(op["rank"].get<int64_t>())) kept.push_back(op);
  }
  CHECK(kept == prediction["ops"]);

  // A trace of every rank beside records of the representative ones, and no trace at all.
  std::string mixed = simulate_into("mixed", " --trace all");
  CHECK(read_json(mixed + "/prediction.json")["ops"] == prediction["ops"]);
  CHECK(ranks_of(read_json(mixed + "/trace.json")["traceEvents"], "pid").size() == 8);
  std::string untraced = simulate_into("untraced", " --trace none");
  CHECK_FALSE(std::ifstream(untraced + "/trace.json").good());
  CHECK(read_json(untraced + "/prediction.json")["ops"] == prediction["ops"]);
  std::string bare = simulate_into("bare", " --no-records");
  CHECK(read_json(bare + "/prediction.json")["ops"].empty());
  CHECK_FALSE(std::ifstream(bare + "/trace.json").good());
}

TEST_CASE("simulate: prediction.json records the ops that take time, the trace shows memory too",
          "[simulate][outputs]") {
  std::string dir = simulate_into("timed", "");
  std::string lowered = fresh_dir("outputs-timed-program");
  CommandResult lower = run_stepcast("lower" + model_arg("tiny") + topology_arg("localhost-cpu") +
                                     plan_arg("tiny-cpu-3d") + " --nodes 4 --out " + lowered);
  INFO(lower.output);
  REQUIRE(lower.exit_code == 0);
  const StepProgram program = read_program_json(lowered + "/program.json");
  Json prediction = read_json(dir + "/prediction.json");
  // Every op of each recorded rank that takes time, once, and no alloc or free.
  std::map<int64_t, std::set<int64_t>> recorded;
  for (const Json& op : prediction["ops"]) recorded[op["rank"].get<int64_t>()].insert(op["id"].get<int64_t>());
  REQUIRE(recorded.size() >= 2);  // one rank per pipeline stage (and the critical rank)
  for (const auto& [rank, ids] : recorded) {
    std::set<int64_t> timed;
    int64_t memory_ops = 0;
    for (const Op& op : program.role_of_rank(rank).ops) {
      if (op.kind == OpKind::alloc || op.kind == OpKind::free) {
        ++memory_ops;
      } else {
        timed.insert(op.id);
      }
    }
    INFO("rank " << rank);
    CHECK(memory_ops > 0);
    CHECK(ids == timed);
  }
  // The trace's memory counter still follows the allocs and frees.
  int64_t counters = 0;
  const Json trace = read_json(dir + "/trace.json");
  for (const Json& e : trace["traceEvents"]) counters += e["ph"] == "C";
  CHECK(counters > 0);
}

TEST_CASE("simulate: the trace is the same bytes from run to run (formatted on two threads, written in order)",
          "[simulate][outputs]") {
  // Every rank: op events, flow arrows and memory counters, pieces enough for both threads.
  const std::string first = read_text_file(simulate_into("same-bytes-1", " --trace all") + "/trace.json");
  const std::string second = read_text_file(simulate_into("same-bytes-2", " --trace all") + "/trace.json");
  REQUIRE(first.size() > 1000);
  CHECK(first == second);
  const Json trace = parse_json_text(first, "trace.json");
  std::set<std::string> phases;
  for (const Json& e : trace["traceEvents"]) phases.insert(e["ph"].get<std::string>());
  CHECK(phases == std::set<std::string>{"C", "M", "X", "f", "s"});
}

TEST_CASE("simulate: prediction.json opens on its summary, the records last",
          "[simulate][outputs]") {
  std::string dir = simulate_into("layout", "");
  std::ifstream in(dir + "/prediction.json");
  std::string first_line, second_line, third_line;
  std::getline(in, first_line);
  std::getline(in, second_line);
  std::getline(in, third_line);
  CHECK_THAT(first_line, Contains("\"schema_version\""));
  CHECK_THAT(third_line, Contains("\"step_time_s\""));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text.find("\"ops\":[") > text.find("\"inputs\""));
  CHECK(text.find("\"ops\":[") > text.find("\"memory\""));
}

TEST_CASE("simulate: --gzip writes prediction.json.gz and trace.json.gz that read back the same",
          "[simulate][outputs]") {
  std::string plain = simulate_into("plain", "");
  std::string packed = simulate_into("gzip", " --gzip");
  CHECK_FALSE(std::ifstream(packed + "/prediction.json").good());
  CHECK(first_bytes(packed + "/prediction.json.gz", 2) == "\x1f\x8b");  // gzip's magic number
  CHECK(first_bytes(packed + "/trace.json.gz", 2) == "\x1f\x8b");
  Json a = read_json(plain + "/prediction.json"), b = read_json(packed + "/prediction.json.gz");
  a.erase("simulation_wall_s");
  b.erase("simulation_wall_s");
  CHECK(a == b);
  CHECK(read_json(plain + "/trace.json") == read_json(packed + "/trace.json.gz"));
}

TEST_CASE("simulate: bad --records and --trace values name the option and the valid ones",
          "[simulate][outputs]") {
  for (const char* option : {"--records", "--trace"}) {
    CommandResult result = run_stepcast(kArgs + " " + option + " foo");
    INFO(result.output);
    CHECK(result.exit_code == 2);
    CHECK_THAT(result.output, Contains(std::string(option) + " 'foo'"));
    CHECK_THAT(result.output, Contains("valid: representative"));
    CHECK_THAT(result.output, Contains("all"));
    CHECK_THAT(result.output, Contains("none"));
  }
  CommandResult both = run_stepcast(kArgs + " --no-records --records all");
  INFO(both.output);
  CHECK(both.exit_code == 2);
  CHECK_THAT(both.output, Contains("--no-records"));
}

TEST_CASE("simulate: --no-program-hash writes a null program_sha256, which compare refuses", "[simulate]") {
  const std::string dir = fresh_dir("simulate-no-hash");
  CommandResult r = run_stepcast("simulate" + model_arg("tiny") + topology_arg("localhost-cpu") +
                                 plan_arg("tiny-cpu") + " --no-scaling --no-program-hash --out " + dir);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  Json p = read_json(dir + "/prediction.json");
  CHECK(p["program_sha256"].is_null());
  CHECK(p["step_time_s"].get<double>() > 0);
  // Any measurement: compare stops at the prediction, naming the key and the option.
  CommandResult c = run_stepcast("compare " + dir + "/prediction.json " + dir + "/prediction.json");
  INFO(c.output);
  CHECK(c.exit_code == 2);
  CHECK_THAT(c.output, Contains("program_sha256") && Contains("--no-program-hash"));
}
