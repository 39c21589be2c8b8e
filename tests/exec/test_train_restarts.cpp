// Failures on real runs: scripts/train-with-restarts.sh restarts a CPU job whose ranks are
// killed at chosen steps (stepcast-with-faults, STEPCAST_TEST_DIE) from its last checkpoint; the
// final weights and optimizer state are bit-identical to an uninterrupted run's, and the
// restarts, the checkpoints they resume and the steps run are the ones `stepcast goodput
// --failure-at-steps` predicts for the same failures. (Wall times: bench/goodput_restarts.sh.)
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "json_input.hpp"
#include "test_support.hpp"

using namespace stepcast;
using namespace stepcast::test;

namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream all;
  all << in.rdbuf();
  return all.str();
}

// A 2-rank pipeline of the tiny model, fp64, with dropout (its masks follow the step number).
std::string plan_file() {
  Json p = {{"tp_size", 1}, {"pp_size", 2}, {"dp_size", 1}, {"zero_stage", 0},
            {"schedule", "1f1b"}, {"recompute", "none"}, {"sequence_parallel", false},
            {"attention_impl", "materialized"}, {"micro_batch_size", 1},
            {"global_batch_size", 4}, {"dtype", "fp64"}, {"dropout", 0.1}};
  return write_temp_file("restarts.plan.json", p.dump());
}

std::string run_line(const std::string& plan, const std::string& checkpoint_dir) {
  return "timeout 120 " + source_path("scripts/mpirun") + " -np 2 " + STEPCAST_BINARY + " run --model " +
         source_path("models/tiny.json") + " --plan " + plan + " --topology " +
         source_path("topologies/localhost-cpu.json") + " --corpus " + source_path("data/corpus/shakespeare.txt") +
         " --steps 12 --checkpoint-every 3 --checkpoint-dir " + checkpoint_dir;
}

}  // namespace

TEST_CASE("train-with-restarts: ranks killed at steps 5 and 10 end bit-identical to a run without failures",
          "[run][restarts]") {
  const std::string plan = plan_file();
  const std::string dir = fresh_dir("restarts");
  std::filesystem::create_directories(dir + "/marks");
  CommandResult clean = run_shell(run_line(plan, dir + "/clean") + " --quiet");
  INFO(clean.output);
  REQUIRE(clean.exit_code == 0);

  // Rank 1 dies as step 5 begins, rank 0 as step 10 begins; each once.
  const std::string log = dir + "/attempts.jsonl";
  CommandResult supervised = run_shell(
      "STEPCAST_TEST_DIE=1:5,0:10 STEPCAST_TEST_DIE_ONCE_DIR=" + dir + "/marks " +
      source_path("scripts/train-with-restarts.sh") + " --max-restarts 3 --log " + log + " -- " +
      with_faults(run_line(plan, dir + "/restarted")));
  INFO(supervised.output);
  REQUIRE(supervised.exit_code == 0);
  CHECK_THAT(supervised.output, Catch::Contains("done after 2 restart(s)"));

  // The state after step 12: every rank's file, byte for byte.
  for (const char* rank_file : {"rank-00000.bin", "rank-00001.bin"}) {
    std::string a = read_bytes(dir + "/clean/step-00000012/" + rank_file);
    std::string b = read_bytes(dir + "/restarted/step-00000012/" + rank_file);
    INFO(rank_file);
    REQUIRE(!a.empty());
    CHECK(a == b);
  }

  // What goodput predicts for the same failures (12 steps of 4 × 64 tokens, a checkpoint every 3).
  const std::string out = dir + "/goodput";
  CommandResult predicted = run_stepcast(
      "goodput --model " + source_path("models/tiny.json") + " --plan " + plan + " --topology " +
      source_path("topologies/localhost-cpu.json") + " --tokens 3072 --job-mtbf-hours 1 --step-time-s 0.1 "
      "--storage-gbps 1 --restart-s 1 --checkpoint-every 3 --failure-at-steps 5,10 --out " + out);
  INFO(predicted.output);
  REQUIRE(predicted.exit_code == 0);
  Json g = read_json(out + "/goodput.json");
  CHECK(g["steps"] == 12);
  const Json& scripted = g["scripted"];
  CHECK(scripted["resumed_from_steps"] == Json::array({3, 9}));

  // The supervisor's attempts: from the start, then from the checkpoints after steps 3 and 9.
  std::ifstream lines(log);
  std::vector<Json> attempts;
  for (std::string line; std::getline(lines, line);) attempts.push_back(Json::parse(line));
  REQUIRE(attempts.size() == 3);
  CHECK(attempts[0]["resumed_from_step"] == 0);
  for (size_t i = 1; i < attempts.size(); ++i) {
    CHECK(attempts[i]["resumed_from_step"] == scripted["resumed_from_steps"][i - 1]);
    CHECK(attempts[i - 1]["exit_code"] != 0);
  }
  CHECK(attempts[2]["exit_code"] == 0);
  // Steps run, redone ones included: one "step K/12" line per step completed.
  std::regex step_line("(^|\n)step [0-9]+/12 ");
  auto count = std::distance(std::sregex_iterator(supervised.output.begin(), supervised.output.end(), step_line),
                             std::sregex_iterator());
  CHECK(count == scripted["steps_run"].get<int64_t>());
  CHECK(count == 15);  // 12 + steps 3, 4 (lost to the first failure) + step 9 (to the second)

  // The checkpoint size goodput charges is what the ranks write (their files add a short header).
  double predicted_rank_max = g["checkpoint"]["rank_bytes_max"].get<double>();
  double largest = 0;
  for (const char* rank_file : {"rank-00000.bin", "rank-00001.bin"}) {
    largest = std::max(largest, double(std::filesystem::file_size(dir + "/clean/step-00000012/" + rank_file)));
  }
  CHECK(largest >= predicted_rank_max);
  CHECK(largest <= predicted_rank_max + 8192);
}

TEST_CASE("train-with-restarts: bad input is not retried, and a command without checkpoints is refused",
          "[run][restarts]") {
  const std::string plan = plan_file();
  CommandResult no_dir = run_shell(source_path("scripts/train-with-restarts.sh") + " -- " + STEPCAST_BINARY +
                                   " run --model x --plan y");
  CHECK(no_dir.exit_code == 2);
  CHECK_THAT(no_dir.output, Catch::Contains("no --checkpoint-dir"));
  const std::string dir = fresh_dir("restarts-bad");
  const std::string log = dir + ".jsonl";
  CommandResult bad = run_shell(source_path("scripts/train-with-restarts.sh") + " --log " + log + " -- " +
                                run_line(plan, dir) + " --lr -1");
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.output, Catch::Contains("not restarting"));
  std::ifstream lines(log);
  int attempts = 0;
  for (std::string line; std::getline(lines, line);) ++attempts;
  CHECK(attempts == 1);
}
