// `stepcast validate --sweep published` on one small Table 1 row and one nccl-tests row: the
// command runs, and its figures and errors agree with closed forms computed here from the paper's
// eq. 3, the shipped profile and topology (not from the command's own functions).
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "json_input.hpp"
#include "test_support.hpp"

using namespace stepcast;
using namespace stepcast::test;

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

TEST_CASE("validate --sweep published: a Table 1 row and an nccl-tests row, errors as defined",
          "[validate][published]") {
  std::string out = (std::filesystem::temp_directory_path() /
                     ("stepcast-published-test-" + std::to_string(::getpid())))
                        .string();
  CommandResult r = run_stepcast("validate --sweep published --rows megatron-1.7b,nccl-149-dgx-a100 --out " + out);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("megatron-1.7b") != std::string::npos);  // a progress line per row
  CHECK(r.output.find("nccl-149-dgx-a100") != std::string::npos);
  Json j = load_json_file(out + "/published.json");

  // Table 1, 1.7B: 24 layers, h 2304, batch 512, 32 GPUs, 137 TFLOP/s per GPU (SC'21, eq. 3).
  REQUIRE(j.at("megatron").size() == 1);
  const Json& m = j.at("megatron")[0];
  CHECK(m.at("name") == "megatron-1.7b");
  REQUIRE(m.at("ok").get<bool>());
  const double B = 512, s = 2048, l = 24, h = 2304, V = 51200, gpus = 32;
  const double flops = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
  CHECK(m.at("flops_per_iteration").get<double>() == Approx(flops).epsilon(1e-12));
  double published_time = m.at("published").at("iteration_time_s").get<double>();
  CHECK(published_time == Approx(flops / (137e12 * gpus)).epsilon(1e-12));
  CHECK(published_time == Approx(3.53).margin(0.005));  // reference-figures.md's derived time
  // The plan is the authors' launch (examples/sc21/run_table_1.sh): MBS 16, torch DDP.
  Json plan = load_json_file(out + "/inputs/megatron-1.7b.plan.json");
  CHECK(plan.at("micro_batch_size") == 16);
  CHECK(plan.at("dp_size") == 32);
  CHECK(plan.at("overlap_grad_reduce") == true);
  CHECK(plan.at("grad_bucket_bytes") == 25 << 20);
  double t = m.at("predicted").at("iteration_time_s").get<double>();
  double tflops = m.at("predicted").at("tflops_per_gpu").get<double>();
  CHECK(t > 0);
  CHECK(tflops == Approx(flops / (t * gpus) / 1e12).epsilon(1e-12));
  double megatron_error = m.at("error").get<double>();
  CHECK(megatron_error == Approx((tflops - 137) / 137).epsilon(1e-12));
  CHECK(m.at("iteration_time_error").get<double>() ==
        Approx((t - published_time) / published_time).epsilon(1e-12));
  CHECK(m.at("plan").at("tp_size") == 1);
  CHECK(m.at("plan").at("dp_size") == 32);
  CHECK(m.at("plan").at("recompute") == "full");
  CHECK(j.at("megatron_mean_abs_error").get<double>() == Approx(std::abs(megatron_error)));

  // nccl-tests #149: 8 A100 in one node, 8 GiB all_reduce: the A100 profile's measured table of 8
  // ranks in one node has that size, on the system it was measured on (the DGX A100's), so the
  // prediction is its time; busbw = S / t · 2(n−1)/n.
  REQUIRE(j.at("nccl").size() == 1);
  const Json& c = j.at("nccl")[0];
  CHECK(c.at("name") == "nccl-149-dgx-a100");
  CHECK(c.at("predicted").at("algorithm").get<std::string>().rfind("ring × ", 0) == 0);
  Json profile = load_json_file(source_path("profiles/a100-sxm4-80gb.json"));
  const double S = 8.0 * 1024 * 1024 * 1024, n = 8;
  double table_time = 0;
  for (const Json& point : profile.at("measured").at("collective_points")) {
    if (point.at("group_size") == 8 && point.value("nodes", 1) == 1 && point.at("bytes").get<double>() == S) {
      table_time = point.at("time_s").get<double>();
    }
  }
  REQUIRE(table_time > 0);
  double busbw = S / table_time * 2 * (n - 1) / n;
  CHECK(c.at("predicted").at("busbw_bytes_per_s").get<double>() == Approx(busbw).epsilon(1e-9));
  double nccl_error = c.at("error").get<double>();
  CHECK(nccl_error == Approx((busbw - 230e9) / 230e9).epsilon(1e-9));
  CHECK(j.at("nccl_mean_abs_error").get<double>() == Approx(std::abs(nccl_error)));
  CHECK(j.at("mean_abs_error").get<double>() ==
        Approx((std::abs(megatron_error) + std::abs(nccl_error)) / 2));

  // Where and with what it was made, and the two other reports.
  CHECK(!j.at("git_commit").get<std::string>().empty());
  CHECK(j.at("machine").at("cores").get<int64_t>() > 0);
  CHECK(j.at("profiles").size() == 1);  // both rows use the A100 profile
  std::string md = read_text(out + "/published.md");
  CHECK(md.find("| megatron-1.7b |") != std::string::npos);
  CHECK(md.find("| nccl-149-dgx-a100 |") != std::string::npos);
  CHECK(md.find("Mean absolute error") != std::string::npos);
  // The profile's component section: every family of the A100 profile, with its points.
  REQUIRE(j.at("components").size() == 1);
  const Json& section = j.at("components")[0];
  CHECK(section.at("profile") == "profiles/a100-sxm4-80gb.json");
  for (const char* family : {"gemm", "attention", "memory", "collective"}) {
    INFO(family);
    REQUIRE(section.at("summary").contains(family));
    CHECK(section.at("summary").at(family).at("points").get<int64_t>() > 5);
  }
  for (const Json& point : section.at("points")) {
    CHECK(!point.at("source").get<std::string>().empty());
    CHECK(point.at("measured_s").get<double>() > 0);
    CHECK(point.at("error").get<double>() ==
          Approx((point.at("predicted_s").get<double>() - point.at("measured_s").get<double>()) /
                 point.at("measured_s").get<double>()));
  }
  CHECK(md.find("## Component figures of the profiles") != std::string::npos);
  std::string html = read_text(out + "/published.html");
  CHECK(html.find("<svg") != std::string::npos);
  CHECK(html.find("megatron-1.7b") != std::string::npos);
  std::filesystem::remove_all(out);
}

TEST_CASE("validate --sweep published: an unknown row is refused naming the valid ones",
          "[validate][published]") {
  CommandResult r = run_stepcast("validate --sweep published --rows megatron-2b --out /tmp/never");
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("unknown row 'megatron-2b'") != std::string::npos);
  CHECK(r.output.find("megatron-1.7b") != std::string::npos);
  CHECK(!std::filesystem::exists("/tmp/never/published.json"));
}

TEST_CASE("validate --sweep published: a damaged figures file is refused naming the file, key and value",
          "[validate][published]") {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("stepcast-figures-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const Json shipped = load_json_file(source_path("data/published.json"));
  auto refused = [&](const std::string& name, const std::string& text) {
    std::string file = (dir / name).string();
    std::ofstream(file) << text;
    CommandResult r = run_stepcast("validate --sweep published --rows nccl-149-dgx-a100 --figures " + file +
                                   " --out " + (dir / "out").string());
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find(file) != std::string::npos);
    CHECK(r.output.find("internal error") == std::string::npos);
    CHECK(!fs::exists(dir / "out" / "published.json"));
    return r.output;
  };

  Json wrong_type = shipped;
  wrong_type["megatron_sc21_table1"]["rows"][0]["tflops_per_gpu"] = "137";
  std::string out = refused("wrong-type.json", wrong_type.dump(2));
  CHECK(out.find("key 'megatron_sc21_table1.rows[0].tflops_per_gpu' = \"137\"") != std::string::npos);
  CHECK(out.find("valid: a number > 0") != std::string::npos);

  Json zero = shipped;
  zero["nccl_tests_all_reduce"]["rows"][1]["busbw_bytes_per_s"] = 0;
  out = refused("zero.json", zero.dump(2));
  CHECK(out.find("key 'nccl_tests_all_reduce.rows[1].busbw_bytes_per_s' = 0: out of range") != std::string::npos);

  Json misspelt = shipped;
  misspelt["nccl_tests_all_reduce"]["rows"][0]["excluded_because"] = "a typo of 'excluded'";
  out = refused("misspelt.json", misspelt.dump(2));
  CHECK(out.find("key 'nccl_tests_all_reduce.rows[0].excluded_because': unknown key") != std::string::npos);
  CHECK(out.find("did you mean 'excluded'") != std::string::npos);

  Json twice = shipped;
  twice["nccl_tests_all_reduce"]["rows"][2]["name"] = "megatron-1.7b";
  out = refused("twice.json", twice.dump(2));
  CHECK(out.find("key 'nccl_tests_all_reduce.rows[2].name' = \"megatron-1.7b\": duplicate") != std::string::npos);

  Json indivisible = shipped;
  indivisible["megatron_sc21_table1"]["rows"][1]["gpus"] = 63;
  out = refused("indivisible.json", indivisible.dump(2));
  CHECK(out.find("key 'megatron_sc21_table1.rows[1].gpus' = 63: not a multiple of tp_size") != std::string::npos);

  // The authors' launch settings of a row: DDP, micro batch, virtual stages.
  Json ddp = shipped;
  ddp["megatron_sc21_table1"]["rows"][0]["ddp_impl"] = "fsdp";
  out = refused("ddp.json", ddp.dump(2));
  CHECK(out.find("key 'megatron_sc21_table1.rows[0].ddp_impl' = \"fsdp\": not a Megatron-LM --DDP-impl") !=
        std::string::npos);
  CHECK(out.find("valid: \"torch\" or \"local\"") != std::string::npos);

  Json micro = shipped;  // 1.7B: 512 samples over dp 32 = 16 per replica
  micro["megatron_sc21_table1"]["rows"][0]["micro_batch_size"] = 3;
  out = refused("micro.json", micro.dump(2));
  CHECK(out.find("key 'megatron_sc21_table1.rows[0].micro_batch_size' = 3: does not divide "
                 "global_batch_size / dp = 16") != std::string::npos);

  Json no_micro = shipped;
  no_micro["megatron_sc21_table1"]["rows"][0].erase("micro_batch_size");
  out = refused("no-micro.json", no_micro.dump(2));
  CHECK(out.find("megatron_sc21_table1.rows[0].micro_batch_size") != std::string::npos);

  Json virtual_stage = shipped;  // 76.1B: 60 layers over pp 4 = 15 per stage
  virtual_stage["megatron_sc21_table1"]["rows"][5]["layers_per_virtual_stage"] = 4;
  out = refused("virtual.json", virtual_stage.dump(2));
  CHECK(out.find("key 'megatron_sc21_table1.rows[5].layers_per_virtual_stage' = 4: does not divide the "
                 "15 layers of a stage") != std::string::npos);
  virtual_stage["megatron_sc21_table1"]["rows"][0]["layers_per_virtual_stage"] = 1;
  virtual_stage["megatron_sc21_table1"]["rows"][5]["layers_per_virtual_stage"] = 5;
  out = refused("virtual-no-pipeline.json", virtual_stage.dump(2));
  CHECK(out.find("rows[0].layers_per_virtual_stage' = 1: set on a row without a pipeline") != std::string::npos);

  Json version = shipped;
  version["format_version"] = 2;
  out = refused("version.json", version.dump(2));
  CHECK(out.find("key 'format_version' = 2") != std::string::npos);

  std::string text = shipped.dump(2);
  out = refused("truncated.json", text.substr(0, text.size() / 2));
  CHECK(out.find("malformed JSON") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("validate --sweep published --profile-dir: every row names the profile it used", "[validate]") {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("stepcast-published-profiles-" + std::to_string(::getpid()));
  fs::create_directories(dir / "profiles");
  fs::copy_file(source_path("profiles/a100-sxm4-80gb.json"), dir / "profiles/a100-sxm4-80gb.json");
  std::string out = (dir / "out").string();
  CommandResult r = run_stepcast("validate --sweep published --rows nccl-149-dgx-a100 --profile-dir " +
                                 (dir / "profiles").string() + " --out " + out);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  Json report = load_json_file(out + "/published.json");
  REQUIRE(report["nccl"].size() == 1);
  const std::string used = report["nccl"][0]["profile"].get<std::string>();
  CHECK(used.find("stepcast-published-profiles-") != std::string::npos);  // not "profiles/NAME.json"
  CHECK(used == report["profiles"][0]["file"].get<std::string>());
  fs::remove_all(dir);
}
