// Profiles from standard tools' outputs and their strict reading: nccl-tests logs written here in
// nccl-tests' format (all_reduce, all_gather, sendrecv; truncated, mislabelled, broken), GEMM sweep
// CSVs, `profile import` and `profile fit` end to end, and every refusal of bad profile points
// (unsorted, duplicate, no time, inconsistent rates, unknown sources, spans that do not divide).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "components.hpp"
#include "errors.hpp"
#include "json_input.hpp"
#include "profile.hpp"
#include "profile_import.hpp"
#include "test_support.hpp"

using namespace stepcast;
using Catch::Matchers::Contains;

namespace {

// An nccl-tests log of `binary` (all_reduce_perf, ...) on `nodes` hosts of `per_node` GPUs, rows
// at sizes 1 KiB..1 GiB ×4 with time α + size·f/β; with `footer` its closing lines.
std::string nccl_log(const std::string& binary, int nodes, int per_node, bool footer = true,
                     int cut_after_rows = -1) {
  const int ranks = nodes * per_node;
  const bool gathered =
      binary == "all_gather_perf" || binary == "reduce_scatter_perf" || binary == "alltoall_perf";
  std::ostringstream log;
  log << "# nccl-tests version 2.17.6 nccl-headers=22803 nccl-library=22803\n"
      << "# Collective test starting: " << binary << "\n"
      << "# nThread 1 nGpus 1 minBytes 1024 maxBytes 1073741824 step: 4(factor) warmup iters: 5 iters: 20 "
         "agg iters: 1 validation: 1 graph: 0\n#\n# Using devices\n";
  for (int r = 0; r < ranks; ++r) {
    log << "#  Rank " << r << " Group  0 Pid  " << 1000 + r << " on node" << r / per_node << " device  "
        << r % per_node << " [0000:19:00] NVIDIA H100 80GB HBM3\n";
  }
  log << "#\n#                                                              out-of-place                       "
         "in-place\n"
      << "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   "
         "algbw   busbw #wrong\n"
      << "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  "
         "(GB/s)  (GB/s)\n";
  int row = 0;
  for (double size = 1024; size <= 1073741824.0; size *= 4, ++row) {
    if (cut_after_rows >= 0 && row == cut_after_rows) {
      log << "     " << int64_t(size) << "        262144     float\n";
      break;
    }
    double count = size / 4 / (gathered ? ranks : 1);
    double time_us = 20 + size / 100e9 * 1e6;
    double algbw = size / time_us / 1e3;
    log << "  " << int64_t(size) << "  " << int64_t(count) << "  float  " << (gathered ? "none" : "sum")
        << "  -1  " << time_us << "  " << algbw << "  " << algbw << "  0  " << time_us << "  " << algbw << "  "
        << algbw << "  0\n";
  }
  if (footer) log << "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 42.0\n#\n";
  return log.str();
}

std::string write(const std::string& name, const std::string& text) { return test::write_temp_file(name, text); }

// The line (from 1) where run `run` (from 1) of a file of nccl_log runs begins: its version line.
int logs_first_line(const std::string& text, int run) {
  size_t at = 0;
  for (int i = 0; i < run; ++i) at = text.find("# nccl-tests version", i == 0 ? 0 : at + 1);
  return int(std::count(text.begin(), text.begin() + std::ptrdiff_t(at), '\n')) + 1;
}

}  // namespace

TEST_CASE("profile import: nccl-tests logs read as they are", "[profile][import]") {
  NcclTestsLog log = parse_nccl_tests_log(nccl_log("all_reduce_perf", 2, 8), "ar.log");
  CHECK(log.collective == "all_reduce");
  CHECK(log.ranks == 16);
  CHECK(log.nodes == 2);
  CHECK(log.nccl_version == "2.28.3");
  REQUIRE(log.points.size() == 11);
  CHECK(log.points.front().bytes == 1024);
  CHECK(log.points.front().time_s == Approx((20 + 1024 / 100e9 * 1e6) * 1e-6));
  CHECK(log.points.back().busbw_bytes_per_s ==
        Approx(log.points.back().bytes / log.points.back().time_s * 2 * 15 / 16));
  for (const auto& p : log.points) {
    CHECK(p.algorithm == "nccl");
    CHECK(p.group_size == 16);
    CHECK(p.nodes == 2);
  }
  NcclTestsLog gather = parse_nccl_tests_log(nccl_log("all_gather_perf", 1, 8), "ag.log", "all_gather");
  CHECK(gather.collective == "all_gather");
  CHECK(gather.nodes == 1);
  NcclTestsLog a2a = parse_nccl_tests_log(nccl_log("alltoall_perf", 2, 4), "a2a.log");
  CHECK(a2a.collective == "all_to_all");
  // srun -l prefixes every line.
  std::string prefixed;
  std::istringstream in(nccl_log("all_reduce_perf", 1, 4));
  for (std::string line; std::getline(in, line);) prefixed += " 0: " + line + "\n";
  CHECK(parse_nccl_tests_log(prefixed, "srun.log").points.size() == 11);
}

TEST_CASE("profile import: NCCL's coll channels set the profile's overlap CTAs", "[profile][import]") {
  // NCCL_DEBUG=INFO lines inside the log (2.12 and later print collnet and nvls counts too).
  auto with_channels = [](std::string log, int channels) {
    const std::string line = "node0:1:2 [0] NCCL INFO " + std::to_string(channels) +
                             " coll channels, 0 collnet channels, 0 nvls channels, 32 p2p channels, 32 p2p channels per peer\n";
    return log.insert(log.find("#\n#  "), line);
  };
  NcclTestsLog intra = parse_nccl_tests_log(with_channels(nccl_log("all_reduce_perf", 1, 8), 24), "intra.log");
  NcclTestsLog inter = parse_nccl_tests_log(with_channels(nccl_log("all_reduce_perf", 2, 8), 16), "inter.log");
  CHECK(intra.coll_channels == 24);
  CHECK(inter.coll_channels == 16);
  CHECK(parse_nccl_tests_log(nccl_log("all_reduce_perf", 1, 8), "none.log").coll_channels == 0);
  DeviceProfile base = load_profile(test::source_path("profiles/h100-sxm.json"));
  // Without the device's SMs in the base they are not used, and the caller is told.
  base.overlap = OverlapInterference{};
  base.overlap_notes.clear();
  std::vector<std::string> unused;
  DeviceProfile merged = merge_imports(base, {intra, inter}, nullptr, &unused);
  CHECK_FALSE(merged.overlap.modelled());
  REQUIRE(unused.size() == 2);
  CHECK_THAT(unused[0], Contains("intra.log") && Contains("24 coll channels") && Contains("overlap.sms"));
  base.overlap.sms = 132;
  unused.clear();
  merged = merge_imports(base, {intra, inter}, nullptr, &unused);
  CHECK(unused.empty());
  CHECK(merged.overlap.ctas_intra_node == 24);
  CHECK(merged.overlap.ctas_inter_node == 16);
  CHECK_THAT(merged.overlap_notes, Contains("import:inter.log"));
  CHECK(parse_profile(profile_to_json(merged), "merged.json").overlap.compute_speed(true) == Approx(116.0 / 132));
  CHECK_THROWS_WITH(parse_nccl_tests_log(with_channels(nccl_log("all_reduce_perf", 1, 8), 0), "zero.log"),
                    Contains("zero.log:") && Contains("coll channels"));
}

TEST_CASE("profile import: a sendrecv log across nodes is the profile's inter-node send table", "[profile][import]") {
  // 2 nodes of one GPU: measured.p2p_inter_node_points, which the simulator's sends across nodes
  // take (CollectiveCostModel::p2p_time_s); one node of 2: measured.p2p_points.
  DeviceProfile base = load_profile(test::source_path("profiles/h100-sxm.json"));
  NcclTestsLog across = parse_nccl_tests_log(nccl_log("sendrecv_perf", 2, 1), "sr2.log");
  NcclTestsLog inside = parse_nccl_tests_log(nccl_log("sendrecv_perf", 1, 2), "sr1.log");
  REQUIRE(across.collective == "sendrecv");
  DeviceProfile merged = merge_imports(base, {across, inside}, nullptr, nullptr);
  REQUIRE(merged.measured->p2p_inter_node.size() == across.points.size());
  REQUIRE(merged.measured->p2p.size() == inside.points.size());
  CHECK(merged.measured->p2p_inter_node.front().time_s == across.points.front().time_s);
  CHECK(merged.measured->p2p_inter_node.front().source.find("sr2.log") != std::string::npos);
  CHECK(merged.measured->p2p.back().source.find("sr1.log") != std::string::npos);
  const Topology t = load_topology(test::source_path("topologies/dgx-h100.json"));
  size_t sends = 0;
  for (const ComponentCheck& c : check_components(merged, t)) sends += c.family == "p2p";
  CHECK(sends == across.points.size() + inside.points.size());
}

TEST_CASE("profile import: a file of several runs gives a table each", "[profile][import]") {
  // As scripts that run every *_perf binary write them: one run after another, each closed by
  // "# Collective test concluded" (which names its binary too).
  auto concluded = [](const std::string& log, const std::string& binary) {
    return log + "# Collective test concluded: " + binary + "\n#\n\n";
  };
  std::string runs = concluded(nccl_log("all_reduce_perf", 1, 4), "all_reduce_perf") +
                     concluded(nccl_log("all_gather_perf", 1, 4), "all_gather_perf") +
                     nccl_log("alltoall_perf", 1, 4);
  std::vector<NcclTestsLog> logs = parse_nccl_tests_logs(runs, "runs.log");
  REQUIRE(logs.size() == 3);
  CHECK(logs[0].collective == "all_reduce");
  CHECK(logs[1].collective == "all_gather");
  CHECK(logs[2].collective == "all_to_all");
  for (int i = 0; i < 3; ++i) {
    CHECK(logs[size_t(i)].run == i + 1);
    CHECK(logs[size_t(i)].ranks == 4);
    CHECK(logs[size_t(i)].points.size() == 11);
  }
  // One run alone is run 0, as parse_nccl_tests_log reads it.
  std::vector<NcclTestsLog> one = parse_nccl_tests_logs(nccl_log("all_reduce_perf", 1, 4), "one.log");
  REQUIRE(one.size() == 1);
  CHECK(one[0].run == 0);
  // Merged: a table each, each run its own source.
  const DeviceProfile base = load_profile(test::source_path("profiles/h100-sxm.json"));
  DeviceProfile merged = merge_imports(base, logs, nullptr, nullptr);
  int from_runs = 0;
  for (const CollectivePoint& c : merged.measured->collectives) from_runs += c.source.rfind("import:runs.log#", 0) == 0;
  CHECK(from_runs == 33);
  CHECK_THAT(merged.sources.at("import:runs.log#2"), Contains("all_gather_perf") && Contains("run 2 of runs.log"));
  // Refused: a second run of one collective and span (its line named), a run cut short inside the
  // file, and two files measuring the same collective and span.
  std::string twice =
      concluded(nccl_log("all_reduce_perf", 1, 4), "all_reduce_perf") + nccl_log("all_reduce_perf", 1, 4);
  CHECK_THROWS_WITH(parse_nccl_tests_logs(twice, "twice.log"),
                    Contains("twice.log:" + std::to_string(logs_first_line(twice, 2)) + ":") &&
                        Contains("a second all_reduce_perf run"));
  // KIND names every run: a run of another collective is refused at the line it begins.
  CHECK_THROWS_WITH(parse_nccl_tests_logs(runs, "runs.log", "all_reduce"),
                    Contains("runs.log:" + std::to_string(logs_first_line(runs, 2)) + ":") &&
                        Contains("all_gather_perf log, given as all_reduce"));
  std::string cut = concluded(nccl_log("all_reduce_perf", 1, 4, true, 3), "all_reduce_perf") +
                    nccl_log("all_gather_perf", 1, 4);
  CHECK_THROWS_WITH(parse_nccl_tests_logs(cut, "cut.log"), Contains("cut.log:") && Contains("cut short"));
  NcclTestsLog a = parse_nccl_tests_log(nccl_log("all_reduce_perf", 1, 4), "a.log");
  NcclTestsLog b = parse_nccl_tests_log(nccl_log("all_reduce_perf", 1, 4), "b.log");
  CHECK_THROWS_WITH(merge_imports(base, {a, b}, nullptr, nullptr),
                    Contains("b.log") && Contains("as a.log does"));
}

TEST_CASE("profile import: truncated, mislabelled and broken logs are refused", "[profile][import]") {
  CHECK_THROWS_WITH(parse_nccl_tests_log(nccl_log("all_reduce_perf", 1, 8, false), "t.log"),
                    Contains("t.log") && Contains("truncated"));
  CHECK_THROWS_WITH(parse_nccl_tests_log(nccl_log("all_reduce_perf", 1, 8, true, 3), "cut.log"),
                    Contains("cut.log:") && Contains("cut short"));
  CHECK_THROWS_WITH(parse_nccl_tests_log(nccl_log("all_gather_perf", 1, 8), "ag.log", "all_reduce"),
                    Contains("all_gather_perf log, given as all_reduce"));
  // A table of another collective than the log says (an alltoall table labelled all_reduce).
  std::string mislabelled = nccl_log("all_gather_perf", 2, 8);
  mislabelled.replace(mislabelled.find("all_gather_perf"), 15, "all_reduce_perf");
  CHECK_THROWS_WITH(parse_nccl_tests_log(mislabelled, "m.log"), Contains("m.log:") && Contains("not all_reduce"));
  // Every process ran alone: the device lines all say rank 0.
  std::string alone = nccl_log("all_reduce_perf", 1, 2);
  alone.replace(alone.find("#  Rank 1"), 9, "#  Rank 0");
  CHECK_THROWS_WITH(parse_nccl_tests_log(alone, "alone.log"), Contains("listed twice"));
  CHECK_THROWS_WITH(parse_nccl_tests_log("hello\n", "none.log", "all_reduce"), Contains("no nccl-tests table"));
  std::string unnamed = nccl_log("all_reduce_perf", 1, 2);
  for (size_t at; (at = unnamed.find("all_reduce_perf")) != std::string::npos;) unnamed.replace(at, 15, "x");
  CHECK_THROWS_WITH(parse_nccl_tests_log(unnamed, "u.log"), Contains("KIND:FILE"));
  CHECK_THROWS_WITH(parse_nccl_tests_log(nccl_log("broadcast_perf", 1, 2), "b.log"), Contains("does not use"));
}

TEST_CASE("profile import: GEMM CSVs", "[profile][import]") {
  GemmCsv grid = parse_gemm_csv(
      "m,n,k,layout,dtype,tflops\n"
      "256,256,256,TN,bf16,10\n256,256,512,TN,bf16,20\n256,512,256,TN,bf16,20\n256,512,512,TN,bf16,40\n"
      "512,256,256,TN,bf16,20\n512,256,512,TN,bf16,40\n512,512,256,TN,bf16,40\n512,512,512,TN,bf16,80\n",
      "grid.csv");
  CHECK(grid.dtype == Dtype::bf16);
  CHECK(grid.grid);
  REQUIRE(grid.points.size() == 8);
  CHECK(grid.points[0].variant == "forward");
  CHECK(grid.points[0].time_s == Approx(2.0 * 256 * 256 * 256 / 10e12));
  GemmCsv scattered = parse_gemm_csv("m,n,k,layout,dtype,seconds,count\n2048,2048,2048,NN,fp16,1e-4,1\n"
                                     "1024,1024,128,NT,fp16,2e-5,16\n",
                                     "s.csv");
  CHECK_FALSE(scattered.grid);
  CHECK(scattered.points[0].variant == "dgrad");
  CHECK(scattered.points[1].variant == "wgrad");
  CHECK(scattered.points[1].count == 16);
  CHECK_THROWS_WITH(parse_gemm_csv("m,n,layout,dtype,seconds\n1,2,TN,bf16,1\n", "c.csv"), Contains("'k' column"));
  CHECK_THROWS_WITH(parse_gemm_csv("m,n,k,layout,dtype\n1,2,3,TN,bf16\n", "c.csv"), Contains("seconds") && Contains("tflops"));
  CHECK_THROWS_WITH(parse_gemm_csv("m,n,k,layout,dtype,seconds\n1,2,3,XY,bf16,1\n", "c.csv"), Contains("c.csv:2") && Contains("XY"));
  CHECK_THROWS_WITH(parse_gemm_csv("m,n,k,layout,dtype,seconds\n1,2,3,TN,bf16,-1\n", "c.csv"), Contains("positive"));
  CHECK_THROWS_WITH(parse_gemm_csv("m,n,k,layout,dtype,seconds\n1,2,3,TN,bf16,1\n1,2,3,TN,bf16,2\n", "c.csv"),
                    Contains("c.csv:3") && Contains("repeats"));
  CHECK_THROWS_WITH(parse_gemm_csv("m,n,k,layout,dtype,seconds\n1,2,3,TN,bf16,1\n4,5,6,TN,fp16,1\n", "c.csv"),
                    Contains("one dtype"));
}

TEST_CASE("profile import and fit: end to end through the command line", "[profile][import]") {
  namespace fs = std::filesystem;
  std::string ar = write("h100-ar.log", nccl_log("all_reduce_perf", 1, 8));
  std::string ag = write("h100-ag.log", nccl_log("all_gather_perf", 2, 8));
  // GEMM points from a known shape model: peak 989.4e12 · 0.8 · O/(O + 1e6) · k/(k + 300), plus
  // the 5 µs launch (the base's overhead_s) and a 3 µs kernel latency.
  std::ostringstream csv;
  csv << "m,n,k,layout,dtype,seconds\n";
  for (int64_t m : {512, 2048, 8192}) {
    for (int64_t n : {1024, 4096}) {
      for (int64_t k : {128, 1024, 8192}) {
        double o = double(m) * n, e = 0.8 * o / (o + 1e6) * k / (k + 300.0);
        csv << m << "," << n << "," << k << ",NN,bf16," << 2.0 * m * n * k / (989.4e12 * e) + 8e-6 << "\n";
      }
    }
  }
  // Not a grid (one shape missing): evidence to fit, not a table.
  csv << "3000,3000,3000,NN,bf16," << 2.0 * 27e9 / (989.4e12 * 0.8 * 9e6 / 10e6 * 3000 / 3300.0) + 8e-6 << "\n";
  std::string gemm = write("h100-gemm.csv", csv.str());
  std::string out = (fs::temp_directory_path() / "stepcast-import-h100.json").string();
  test::CommandResult r = test::run_stepcast("profile import --nccl-tests " + ar + " all_gather:" + ag +
                                             " --gemm-csv " + gemm + test::topology_arg("dgx-h100") + " --out " + out);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  DeviceProfile imported = load_profile(out);
  REQUIRE(imported.measured);
  CHECK(imported.measured->gemm_use == "fit");
  CHECK(imported.measured->gemm.size() == 19);
  int all_reduce_8 = 0, all_gather_16 = 0;
  for (const auto& c : imported.measured->collectives) {
    all_reduce_8 += c.kind == "all_reduce" && c.group_size == 8 && c.nodes == 1 && c.source.rfind("import:", 0) == 0;
    all_gather_16 += c.kind == "all_gather" && c.group_size == 16 && c.nodes == 2;
  }
  CHECK(all_reduce_8 == 11);  // replaced the base's table of that span
  CHECK(all_gather_16 == 11);
  CHECK(imported.sources.count("import:h100-ag.log") == 1);
  {  // A row's own source column is its citation, which says where it was named.
    std::string cited = write("cited-gemm.csv", "m,n,k,layout,dtype,seconds,source\n4096,4096,4096,NN,bf16,2e-4,MYBENCH\n");
    std::string cited_out = (fs::temp_directory_path() / "stepcast-import-cited.json").string();
    test::CommandResult c = test::run_stepcast("profile import --gemm-csv " + cited + test::topology_arg("dgx-h100") +
                                               " --out " + cited_out);
    INFO(c.output);
    REQUIRE(c.exit_code == 0);
    DeviceProfile p = load_profile(cited_out);
    REQUIRE(p.sources.count("MYBENCH") == 1);
    CHECK_THAT(p.sources.at("MYBENCH"), Contains("source column of") && Contains("cited-gemm.csv"));
  }

  std::string fitted = (fs::temp_directory_path() / "stepcast-fit-h100.json").string();
  r = test::run_stepcast("profile fit --profile " + out + test::topology_arg("dgx-h100") + " --out " + fitted);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  DeviceProfile f = load_profile(fitted);
  const GemmEfficiency& e = f.gemm.at(Dtype::bf16);
  CHECK(e.peak_fraction == Approx(0.8).epsilon(0.01));
  CHECK(e.output_half == Approx(1e6).epsilon(0.05));
  CHECK(e.k_half == Approx(300).epsilon(0.05));
  CHECK(e.latency_s == Approx(3e-6).epsilon(0.05));
  CHECK(f.gemm.at(Dtype::fp16).peak_fraction == e.peak_fraction);
  for (const ComponentCheck& c : check_components(f, load_topology(test::source_path("topologies/dgx-h100.json")))) {
    if (c.family == "gemm") CHECK(std::abs(c.relative_error()) < 0.01);
  }

  // Refusals: a truncated log, nothing to import, a missing file.
  std::string cut = write("cut.log", nccl_log("all_reduce_perf", 1, 8, false));
  r = test::run_stepcast("profile import --nccl-tests " + cut + test::topology_arg("dgx-h100") + " --out " + out);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Contains("cut.log") && Contains("truncated"));
  r = test::run_stepcast("profile import" + test::topology_arg("dgx-h100") + " --out " + out);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Contains("nothing to import"));
  r = test::run_stepcast("profile import --nccl-tests /nonexistent.log" + test::topology_arg("dgx-h100") + " --out " + out);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Contains("/nonexistent.log"));
}

TEST_CASE("profile points: bad input is refused with the file and key", "[profile]") {
  Json base = load_json_file(test::source_path("profiles/h100-sxm.json"));
  auto refused = [&](Json p, const std::string& expected) {
    INFO(expected);
    CHECK_THROWS_WITH(parse_profile(p, "p.json"), Contains("p.json") && Contains(expected));
  };
  Json p = base;
  std::swap(p["measured"]["memory_points"][0], p["measured"]["memory_points"][1]);
  refused(p, "out of order");
  p = base;
  p["measured"]["memory_points"][1] = p["measured"]["memory_points"][0];
  refused(p, "duplicates an earlier point");
  p = base;
  p["measured"]["gemm_points"][0].erase("time_s");
  p["measured"]["gemm_points"][0].erase("flops_per_s");
  refused(p, "neither time_s nor flops_per_s");
  p = base;
  p["measured"]["gemm_points"][0]["time_s"] = 0;
  refused(p, "gemm_points[0].time_s");
  p = base;
  p["measured"]["gemm_points"][0]["time_s"] = -1e-6;
  refused(p, "out of range");
  p = base;
  p["measured"]["gemm_points"][0]["time_s"] = 1.0;  // the flops_per_s beside it says otherwise
  refused(p, "disagrees with flops_per_s");
  p = base;
  p["measured"]["collective_points"][0]["source"] = "NOWHERE";
  refused(p, "names no entry of the profile's \"sources\"");
  p = base;
  p["measured"]["collective_points"][0]["nodes"] = 3;
  refused(p, "does not divide group_size");
  p = base;
  p["measured"].erase("dtype");
  refused(p, "measured.dtype");
  p = base;
  p["measured"]["dtype"] = "fp12";
  refused(p, "fp12");
  p = base;
  p["variability"]["device_speed_cv"] = 0.9;
  refused(p, "variability.device_speed_cv");
  p = base;
  p["sources"]["XLA"] = "";
  refused(p, "sources.XLA");
  p = base;
  p["measured"]["system"]["oversubscription"] = 0.5;
  refused(p, "oversubscription");
  p = base;
  p["measured"]["gemm_use"] = "fit";
  p["measured"]["gemm_points"] = Json::array();
  refused(p, "gemm_use");
}

TEST_CASE("profile: every section's notes are written back (import and calibrate keep the citations)", "[profile]") {
  for (const char* file : {"profiles/a100-sxm4-80gb.json", "profiles/h100-sxm.json", "profiles/h200-sxm.json",
                           "profiles/b200-sxm.json", "profiles/gb200.json"}) {
    INFO(file);
    Json original = load_json_file(test::source_path(file));
    Json written = profile_to_json(load_profile(test::source_path(file)));
    int sections = 0;
    for (auto it = original.begin(); it != original.end(); ++it) {
      if (!it.value().is_object()) continue;
      if (it.value().contains("notes")) {
        INFO(it.key());
        ++sections;
        REQUIRE(written.contains(it.key()));
        CHECK(written[it.key()].value("notes", "") == it.value()["notes"]);
      }
      for (auto inner = it.value().begin(); inner != it.value().end(); ++inner) {  // gemm.<dtype>
        if (!inner.value().is_object() || !inner.value().contains("notes") || it.key() == "measured") continue;
        INFO(it.key() << "." << inner.key());
        ++sections;
        CHECK(written[it.key()][inner.key()].value("notes", "") == inner.value()["notes"]);
      }
    }
    CHECK(sections >= 3);
  }
  // A note that is not text is refused by key.
  Json bad = load_json_file(test::source_path("profiles/a100-sxm4-80gb.json"));
  bad["links"]["notes"] = 42;
  CHECK_THROWS_WITH(parse_profile(bad, "bad.json"), Catch::Contains("links.notes"));
}
