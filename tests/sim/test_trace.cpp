// simulate's trace.json: a Chrome trace of the detail ranks whose events are the op records,
// tracks that never overlap, one flow arrow per pipeline transfer, and a memory counter per rank
// whose peak is the program's.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "json_input.hpp"
#include "test_support.hpp"

using namespace stepcast;
using test::CommandResult;
using test::fresh_dir;
using test::model_arg;
using test::plan_arg;
using test::read_json;
using test::run_stepcast;
using test::topology_arg;

TEST_CASE("simulate: trace.json is a Chrome trace of the detail ranks", "[simulate]") {
  std::string dir = fresh_dir("trace-3d");
  CommandResult result = run_stepcast("simulate" + model_arg("tiny") + topology_arg("localhost-cpu") +
                                      plan_arg("tiny-cpu-3d") + " --nodes 4 --mode full --no-scaling --out " +
                                      dir);
  INFO(result.output);
  REQUIRE(result.exit_code == 0);
  Json prediction = read_json(dir + "/prediction.json");
  Json trace = read_json(dir + "/trace.json");
  REQUIRE(trace.contains("traceEvents"));
  REQUIRE(trace["traceEvents"].is_array());
  std::vector<int64_t> detail = prediction["detail_ranks"];
  CHECK(detail.size() == 8);  // full mode keeps every rank of a program with at most 64

  std::set<int64_t> named;
  std::map<int64_t, int> complete;
  std::map<std::pair<int64_t, int64_t>, Json> record;
  for (const Json& op : prediction["ops"]) record[{op["rank"], op["id"]}] = op;
  for (const Json& e : trace["traceEvents"]) {
    REQUIRE(e.contains("ph"));
    if (e["ph"] == "M" && e["name"] == "process_name") named.insert(e["pid"].get<int64_t>());
    if (e["ph"] != "X") continue;
    for (const char* key : {"name", "cat", "pid", "tid", "ts", "dur", "args"}) {
      INFO(key << " in " << e.dump());
      REQUIRE(e.contains(key));
    }
    int64_t rank = e["pid"];
    ++complete[rank];
    // ts and dur in microseconds, from the op's record.
    auto r = record.find({rank, e["args"]["id"].get<int64_t>()});
    REQUIRE(r != record.end());
    CHECK(e["ts"].get<double>() == Approx(r->second["start_s"].get<double>() * 1e6).margin(1e-6));
    CHECK(e["dur"].get<double>() ==
          Approx((r->second["end_s"].get<double>() - r->second["start_s"].get<double>()) * 1e6).margin(1e-6));
    CHECK(e["dur"].get<double>() > 0);
  }
  for (int64_t rank : detail) {
    INFO("rank " << rank);
    CHECK(named.count(rank) == 1);
    CHECK(complete[rank] > 0);
  }
  // No two events of one track overlap (Perfetto would mis-nest them): posted transfers that run
  // at once get tracks of their own.
  std::map<std::pair<int64_t, int64_t>, std::vector<std::pair<double, double>>> tracks;
  std::map<int64_t, int> flow_starts, flow_ends;
  std::map<int64_t, double> flow_start_ts, flow_end_ts;
  std::map<int64_t, double> memory_max;
  for (const Json& e : trace["traceEvents"]) {
    if (e["ph"] == "X") tracks[{e["pid"], e["tid"]}].push_back({e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>()});
    if (e["ph"] == "s") ++flow_starts[e["id"]], flow_start_ts[e["id"]] = e["ts"].get<double>();
    if (e["ph"] == "f") ++flow_ends[e["id"]], flow_end_ts[e["id"]] = e["ts"].get<double>();
    if (e["ph"] == "C") memory_max[e["pid"]] = std::max(memory_max[e["pid"]], e["args"]["bytes"].get<double>());
  }
  for (auto& [track, spans] : tracks) {
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i) CHECK(spans[i].first >= spans[i - 1].second - 1e-6);
  }
  // One arrow per pipeline transfer between recorded ranks (pp 2: every send has its receive).
  CHECK(flow_starts.size() > 0);
  CHECK(flow_starts == flow_ends);
  for (const auto& [id, n] : flow_starts) CHECK(n == 1);
  // An arrow never points back in time: it leaves the send and reaches the receive where the
  // two overlap.
  for (const auto& [id, at] : flow_start_ts) CHECK(flow_end_ts[id] >= at);
  // A memory counter for every recorded rank that follows the program's memory walk: its peak
  // is the program's peak for that rank.
  for (const Json& entry : prediction["memory"]["ranks"]) {
    double peak = entry["peak_bytes"].get<double>() - entry["memory_runtime_bytes"].get<double>();
    for (const Json& range : entry["ranks"]) {
      for (int64_t rank = range[0]; rank <= range[1].get<int64_t>(); ++rank) {
        if (!memory_max.count(rank)) continue;
        INFO("memory counter of rank " << rank);
        CHECK(memory_max[rank] == Approx(peak).epsilon(1e-12));
      }
    }
  }
}
