// Faults in `stepcast run` (issue 19): a checkpoint is trusted only when it verifies completely;
// a rank that fails (a damaged file, a folder it cannot write) or stops (SIGSTOP in a checkpoint
// or in the last exchange) ends every rank promptly, the rank and the cause named, one line per
// rank; output folders are checked before the first step; two commands never mix their files in
// one folder.
#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <set>
#include <sstream>
#include <vector>

#include "json_input.hpp"
#include "sha256.hpp"
#include "test_support.hpp"

using namespace stepcast;
using namespace stepcast::test;

namespace {

// A 2-rank pipeline of the tiny model: the fastest plan with two ranks that talk every step.
std::string two_rank_plan_file(const std::string& name) {
  Json p = {{"tp_size", 1}, {"pp_size", 2}, {"dp_size", 1}, {"zero_stage", 0},
            {"schedule", "1f1b"}, {"recompute", "none"}, {"sequence_parallel", false},
            {"attention_impl", "materialized"}, {"micro_batch_size", 1},
            {"global_batch_size", 4}, {"dtype", "fp64"}, {"dropout", 0.0}};
  return write_temp_file(name + ".plan.json", p.dump());
}

std::string run_line(const std::string& plan_file, const std::string& extra) {
  return "timeout 120 " + source_path("scripts/mpirun") + " -np 2 " + STEPCAST_BINARY +
         " run --model " + source_path("models/tiny.json") + " --plan " + plan_file +
         " --topology " + source_path("topologies/localhost-cpu.json") + " --corpus " +
         source_path("data/corpus/shakespeare.txt") + " --quiet " + extra;
}

struct Timed {
  CommandResult result;
  double seconds = 0;
};

Timed timed_shell(const std::string& command) {
  auto start = std::chrono::steady_clock::now();
  Timed t;
  t.result = run_shell(command);
  t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return t;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream all;
  all << in.rdbuf();
  return all.str();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

// Re-signs an edited manifest as a forger would: its self-hash, then `latest`.
void resign(const std::string& dir, const std::string& step_dir_name, Json manifest) {
  manifest.erase("manifest_sha256");
  std::string hash = sha256_hex(manifest.dump());
  manifest["manifest_sha256"] = hash;
  write_file(dir + "/" + step_dir_name + "/manifest.json", manifest.dump(2) + "\n");
  write_file(dir + "/latest", step_dir_name + " " + hash + "\n");
}

// The checkpoint after step 4 of a fresh 4-step run, in `dir`.
void make_checkpoint(const std::string& plan_file, const std::string& dir) {
  std::filesystem::remove_all(dir);
  CommandResult made =
      run_shell(run_line(plan_file, "--steps 4 --checkpoint-dir " + dir + " --checkpoint-every 4"));
  INFO(made.output);
  REQUIRE(made.exit_code == 0);
  REQUIRE(std::filesystem::exists(dir + "/step-00000004/manifest.json"));
}

// Both ranks refuse, each on its own line, promptly (no rank waits on the other).
void check_refused_by_every_rank(const Timed& t, const std::string& fragment) {
  INFO(t.result.output);
  CHECK(t.result.exit_code == 2);
  CHECK(t.seconds < 60);
  CHECK_THAT(t.result.output, Catch::Contains("rank 0: error:"));
  CHECK_THAT(t.result.output, Catch::Contains("rank 1: error:"));
  CHECK_THAT(t.result.output, Catch::Contains(fragment));
}

}  // namespace

TEST_CASE("run: a checkpoint verifies completely or every rank refuses it", "[run][faults]") {
  std::string plan_file = two_rank_plan_file("trust");
  std::string dir = plan_file + ".ck";
  make_checkpoint(plan_file, dir);
  const std::string step = dir + "/step-00000004";
  const std::string resume = run_line(plan_file, "--steps 6 --resume " + dir);
  Json manifest = load_json_file(step + "/manifest.json");

  SECTION("the untouched checkpoint resumes") {
    Timed t = timed_shell(resume);
    INFO(t.result.output);
    CHECK(t.result.exit_code == 0);
  }
  SECTION("a manifest listing no files, and a flipped byte in a rank file") {
    Json edited = manifest;
    edited["files"] = Json::array();
    write_file(step + "/manifest.json", edited.dump(2));
    std::string bytes = read_file(step + "/rank-00001.bin");
    bytes[bytes.size() / 2] ^= 1;
    write_file(step + "/rank-00001.bin", bytes);
    check_refused_by_every_rank(timed_shell(resume), "names 0 files for 2 ranks");
  }
  SECTION("the same, re-signed: the flipped byte is still found") {
    std::string bytes = read_file(step + "/rank-00001.bin");
    bytes[bytes.size() / 2] ^= 1;
    write_file(step + "/rank-00001.bin", bytes);
    resign(dir, "step-00000004", manifest);
    Timed t = timed_shell(resume);
    INFO(t.result.output);
    CHECK(t.result.exit_code == 2);
    CHECK_THAT(t.result.output, Catch::Contains("rank 1: error:"));
    CHECK_THAT(t.result.output, Catch::Contains("SHA-256 differs from the manifest"));
    CHECK_THAT(t.result.output, Catch::Contains("rank 0: error: stopped: rank 1 failed"));
  }
  SECTION("steps_done edited from 4 to 3") {
    Json edited = manifest;
    edited["steps_done"] = 3;
    write_file(step + "/manifest.json", edited.dump(2));
    check_refused_by_every_rank(timed_shell(resume), "the manifest was edited");
    // Re-signed: `latest` still names the old hash.
    Json resigned = edited;
    resigned.erase("manifest_sha256");
    resigned["manifest_sha256"] = sha256_hex(resigned.dump());
    write_file(step + "/manifest.json", resigned.dump(2));
    check_refused_by_every_rank(timed_shell(resume), "the manifest was replaced");
    // Re-signed with `latest`: the step is not its directory's.
    resign(dir, "step-00000004", edited);
    check_refused_by_every_rank(timed_shell(resume), "is not the step of its directory");
    // And the directory renamed too: the rank files hold step 4's state.
    std::filesystem::rename(step, dir + "/step-00000003");
    resign(dir, "step-00000003", edited);
    Timed t = timed_shell(resume);
    check_refused_by_every_rank(t, "holds the state after step 4");
    CHECK_THAT(t.result.output, !Catch::Contains("resumed from"));
  }
  SECTION("a manifest naming rank 0 only, rank 1's file truncated") {
    Json edited = manifest;
    edited["world_size"] = 1;
    edited["files"] = Json::array({manifest["files"][0]});
    resign(dir, "step-00000004", edited);
    std::filesystem::resize_file(step + "/rank-00001.bin", 100);
    check_refused_by_every_rank(timed_shell(resume), "key 'world_size' = 1: this run has 2 ranks");
  }
  SECTION("a rank file whose buffer size is not a number, re-signed") {
    std::string bytes = read_file(step + "/rank-00001.bin");
    size_t header_end = bytes.find("program ");
    size_t first_size = bytes.find('\n', bytes.find('\n', header_end) + 1) + 1;
    bytes.replace(first_size, 1, "x");
    write_file(step + "/rank-00001.bin", bytes);
    Json edited = manifest;
    edited["files"][1]["sha256"] = sha256_hex(bytes);
    resign(dir, "step-00000004", edited);
    Timed t = timed_shell(resume);
    INFO(t.result.output);
    CHECK(t.result.exit_code == 2);
    CHECK(t.seconds < 60);
    CHECK_THAT(t.result.output, Catch::Contains("is not a count: the file is damaged"));
    CHECK_THAT(t.result.output, Catch::Contains("rank 0: error: stopped: rank 1 failed"));
  }
  SECTION("a pointer that is not one") {
    write_file(dir + "/latest", "step-00000004\n");
    check_refused_by_every_rank(timed_shell(resume), "not a checkpoint pointer");
  }
  SECTION("a manifest of the old format") {
    Json edited = manifest;
    edited["schema_version"] = 1;
    resign(dir, "step-00000004", edited);
    check_refused_by_every_rank(timed_shell(resume), "another stepcast");
  }
}

TEST_CASE("run: an output or checkpoint folder that cannot be written fails before any step",
          "[run][faults]") {
  // A path under a regular file can never be created (tests may run as root, to whom a
  // read-only mode is no obstacle).
  std::string plan_file = two_rank_plan_file("unwritable");
  std::string blocker = write_temp_file("unwritable.blocker", "a file, not a folder");
  for (const char* option : {"--out", "--checkpoint-dir"}) {
    std::string extra = std::string(option) + " " + blocker + "/sub --steps 50" +
                        (std::string(option) == "--checkpoint-dir" ? " --checkpoint-every 10" : "");
    Timed t = timed_shell(run_line(plan_file, extra));
    INFO(t.result.output);
    CHECK(t.result.exit_code == 2);
    CHECK_THAT(t.result.output, Catch::Contains(std::string(option) + " " + blocker + "/sub"));
    CHECK_THAT(t.result.output, Catch::Contains("rank 0: error:"));
    CHECK_THAT(t.result.output, Catch::Contains("rank 1: error: stopped: rank 0 failed"));
    CHECK_THAT(t.result.output, !Catch::Contains("step time"));
  }
}

TEST_CASE("run: a rank that cannot write its checkpoint file stops every rank, one line each",
          "[run][faults]") {
  std::string plan_file = two_rank_plan_file("ckwrite");
  std::string dir = plan_file + ".ck";
  std::filesystem::remove_all(dir);
  // Rank 1's file name taken by a folder: its rename fails, rank 0's succeeds.
  std::filesystem::create_directories(dir + "/step-00000002/rank-00001.bin");
  Timed t = timed_shell(run_line(plan_file, "--steps 4 --checkpoint-dir " + dir + " --checkpoint-every 2"));
  INFO(t.result.output);
  CHECK(t.result.exit_code == 2);
  CHECK(t.seconds < 60);
  CHECK_THAT(t.result.output, Catch::Contains("rank 1: error:"));
  CHECK_THAT(t.result.output, Catch::Contains("rank-00001.bin: rename failed"));
  CHECK_THAT(t.result.output,
             Catch::Contains("rank 0: error: stopped: rank 1 failed in writing the checkpoint after step 2"));
  CHECK_FALSE(std::filesystem::exists(dir + "/latest"));  // no manifest for an incomplete step
  // Each rank's line is whole: the two never share a line.
  std::istringstream lines(t.result.output);
  for (std::string line; std::getline(lines, line);) {
    bool both = line.find("rank 0:") != std::string::npos && line.find("rank 1:") != std::string::npos &&
                line.find("stopped") == std::string::npos;
    CHECK_FALSE(both);
  }
}

TEST_CASE("run: a rank stopped in a checkpoint or in the last exchange is caught by the watchdog",
          "[run][faults]") {
  std::string plan_file = two_rank_plan_file("stopped");
  std::string dir = plan_file + ".ck";
  for (const char* point : {"checkpoint", "gather"}) {
    std::filesystem::remove_all(dir);
    Timed t = timed_shell(std::string("STEPCAST_TEST_STOP=1:") + point + " " +
                          with_faults(run_line(plan_file, "--steps 4 --watchdog-s 3 --checkpoint-dir " + dir +
                                                              " --checkpoint-every 2")));
    INFO(point << ": " << t.result.output << " (" << t.seconds << " s)");
    CHECK(t.result.exit_code != 0);
    CHECK(t.result.exit_code != 124);  // the watchdog ended it, not the test's timeout
    CHECK(t.seconds < 60);
    CHECK_THAT(t.result.output, Catch::Contains("rank 0: watchdog: no progress for 3 s"));
    CHECK_THAT(t.result.output, Catch::Contains("waiting for rank 1;"));
  }
}

TEST_CASE("simulate: concurrent commands on one --out never mix their files", "[faults]") {
  // Four simulations with different seeds (different step times) on one folder, 30 rounds: each
  // either writes both files or is refused, and the two files in the folder come from one
  // process (the trace's last op ends at the prediction's step time).
  std::string out = write_temp_file("concurrent.keep", "") + ".out";
  std::filesystem::remove_all(out);
  auto command = [&](int seed) {
    return std::string(STEPCAST_BINARY) + " simulate" + model_arg("tiny") + topology_arg("dgx-a100-80gb") +
           plan_arg("tiny-cpu") + " --seed " + std::to_string(seed) + " --out " + out;
  };
  int refused = 0, written = 0;
  for (int round = 0; round < 30; ++round) {
    std::vector<std::future<CommandResult>> runs;
    for (int p = 0; p < 4; ++p) {
      runs.push_back(std::async(std::launch::async, [&, p] { return run_shell(command(round * 4 + p + 1)); }));
    }
    for (auto& r : runs) {
      CommandResult c = r.get();
      INFO(c.output);
      if (c.exit_code == 0) {
        ++written;
      } else {
        CHECK(c.exit_code == 2);
        // The holder's name, unless it has only just taken the folder.
        CHECK_THAT(c.output, Catch::Contains("another stepcast command (") &&
                                 Catch::Contains(") is writing this folder"));
        ++refused;
      }
    }
    Json prediction = load_json_file(out + "/prediction.json");
    Json trace = load_json_file(out + "/trace.json");
    double end_us = 0;
    for (const Json& e : trace["traceEvents"]) {
      if (e.value("ph", "") == "X") end_us = std::max(end_us, e["ts"].get<double>() + e["dur"].get<double>());
    }
    double step_us = prediction["step_time_s"].get<double>() * 1e6;
    CHECK(std::abs(end_us - step_us) < 1e-6 * step_us + 1e-3);
    for (const auto& f : std::filesystem::directory_iterator(out)) {
      CHECK(f.path().extension() != ".tmp");  // no temporary left behind
    }
  }
  WARN("concurrent writers: " << written << " commands wrote, " << refused << " were refused, 30 rounds");
  CHECK(written >= 30);
}
