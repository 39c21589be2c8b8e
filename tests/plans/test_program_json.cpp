// SHA-256 against FIPS 180-4's vectors; program.json round trip, tamper and truncation checks.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>

#include "errors.hpp"
#include "json_input.hpp"
#include "lower.hpp"
#include "lower_fixtures.hpp"
#include "program_check.hpp"
#include "program_inputs.hpp"
#include "program_json.hpp"
#include "sha256.hpp"

using namespace stepcast;
using namespace stepcast::test;

TEST_CASE("SHA-256 matches the FIPS 180-4 test vectors", "[program_json]") {
  CHECK(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // One million 'a', fed in uneven pieces to exercise the buffering.
  Sha256 hash;
  std::string piece(997, 'a');
  size_t left = 1000000;
  while (left > 0) {
    size_t n = std::min(left, piece.size());
    hash.update(std::string_view(piece).substr(0, n));
    left -= n;
  }
  CHECK(hash.hex_digest() == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

namespace {

std::string write_case(const PlanCase& c, StepProgram& program) {
  ModelConfig model = load_model(source_path(c.model_file));
  Topology topology = test_topology();
  program = lower_program(model, topology, make_plan(c.plan_json, model, topology));
  std::string path = write_temp_file("program.json", "");
  std::ofstream out(path, std::ios::binary);
  program.program_sha256 = write_program_json(program, &out);
  return path;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("program.json reads back to the same program", "[program_json]") {
  auto cases = lowering_cases();
  for (size_t i : {size_t(3), size_t(17), size_t(40)}) {
    StepProgram written;
    std::string path = write_case(cases[i], written);
    StepProgram read = read_program_json(path);
    CHECK(read.program_sha256 == written.program_sha256);
    hash_program(read);  // re-serialising what was read gives the same text
    CHECK(read.program_sha256 == written.program_sha256);
    CHECK(check_program(read).empty());
    REQUIRE(read.roles.size() == written.roles.size());
    CHECK(read.roles[0].ops.size() == written.roles[0].ops.size());
  }
}

TEST_CASE("an altered or truncated program.json is refused", "[program_json]") {
  StepProgram written;
  std::string path = write_case(lowering_cases()[9], written);
  std::string text = read_text(path);
  std::string altered = text;
  size_t at = altered.find("\"bytes\":");
  REQUIRE(at != std::string::npos);
  altered.insert(at + 8, "1");
  std::string altered_path = write_temp_file("altered.json", altered);
  CHECK_THROWS_WITH(read_program_json(altered_path), Catch::Contains("does not match"));
  std::string truncated_path = write_temp_file("truncated.json", text.substr(0, text.size() / 2));
  CHECK_THROWS_WITH(read_program_json(truncated_path), Catch::Contains("truncated"));
  CHECK_THROWS_AS(read_program_json("/nonexistent/program.json"), InputError);
}

namespace {

int64_t elements(const Json& shape) {
  int64_t n = 1;
  for (const Json& d : shape) n *= d.get<int64_t>();
  return n;
}

}  // namespace

TEST_CASE("program.json carries every operand by slot, with its dtype and shape", "[program_json]") {
  StepProgram written;
  std::string path = write_case(lowering_cases()[9], written);
  Json j = load_json_file(path);
  CHECK(j.at("schema_version") == 2);
  int64_t gemms = 0;
  for (const Json& op : j.at("roles")[0].at("ops")) {
    for (const char* side : {"inputs", "outputs"}) {
      if (!op.contains(side)) continue;
      for (const Json& operand : op.at(side)) {
        CHECK(operand.at("slot").is_string());
        CHECK(operand.at("buffer").is_string());
        CHECK(operand.at("dtype").is_string());
        CHECK(operand.at("shape").is_array());
      }
    }
    if (op.at("kind") != "gemm") continue;
    // x[m, k] · w → y[m, n]; dgrad d_y[m, k] → d_x[m, n]; wgrad x[k, m], d_y[k, n] → dw.
    int64_t m = op.at("m"), n = op.at("n"), k = op.at("k");
    const Json& in0 = op.at("inputs")[0];
    std::string grad = op.value("grad", "");
    CHECK(in0.at("slot") == (grad == "dgrad" ? "d_y" : "x"));
    CHECK(elements(in0.at("shape")) == (grad == "wgrad" ? k * m : m * k));
    CHECK(op.at("inputs")[1].at("slot") == (grad == "wgrad" ? "d_y" : "w"));
    if (grad != "wgrad") CHECK(elements(op.at("outputs")[0].at("shape")) == m * n);
    ++gemms;
  }
  CHECK(gemms > 0);
}

TEST_CASE("a program.json of format version 1 is refused, saying how to regenerate it",
          "[program_json]") {
  StepProgram written;
  std::string text = read_text(write_case(lowering_cases()[9], written));
  const std::string head = "{\"schema_version\":2,";
  REQUIRE(text.rfind(head, 0) == 0);
  text.replace(0, head.size(), "{\"schema_version\":1,");
  std::string path = write_temp_file("v1.json", rehash(text));
  CHECK_THROWS_AS(read_program_json(path), InputError);
  CHECK_THROWS_WITH(read_program_json(path), Catch::Contains("key 'schema_version' = 1") &&
                                                 Catch::Contains("older stepcast") &&
                                                 Catch::Contains("stepcast lower --model"));
}

TEST_CASE("an operand whose slot, dtype or shape disagrees with the program is refused",
          "[program_json]") {
  StepProgram written;
  std::string text = read_text(write_case(lowering_cases()[9], written));
  auto refused = [&](const std::string& from, const std::string& to, const std::string& says) {
    std::string edited = text;
    size_t at = edited.find(from);
    REQUIRE(at != std::string::npos);
    edited.replace(at, from.size(), to);
    std::string path = write_temp_file("edited.json", rehash(edited));
    CHECK_THROWS_AS(read_program_json(path), InputError);
    CHECK_THROWS_WITH(read_program_json(path), Catch::Contains(says));
  };
  refused("{\"slot\":\"d_y\"", "{\"slot\":\"x\"", "not the slot of this operand");
  refused("\"dtype\":\"fp32\",\"shape\":[", "\"dtype\":\"bf16\",\"shape\":[", "not its alloc's dtype");
  refused("\"dtype\":\"fp32\",\"shape\":[", "\"dtype\":\"fp32\",\"shape\":[7,", "not its alloc's shape");
  refused("\"name\":\"qkv\"", "\"name\":\"qkv_fused\"", "unknown op name");
}

TEST_CASE("a send or receive whose tag an MPI tag cannot hold is refused", "[program_json]") {
  // The first lowering case with pipeline transfers.
  std::string text;
  for (size_t i = 0; i < lowering_cases().size() && text.find("\"tag\":") == std::string::npos; ++i) {
    StepProgram written;
    text = read_text(write_case(lowering_cases()[i], written));
  }
  const size_t at = text.find("\"tag\":");
  REQUIRE(at != std::string::npos);
  const size_t end = text.find_first_of(",}", at);
  std::string edited = text;
  edited.replace(at, end - at, "\"tag\":2147483648");
  std::string path = write_temp_file("tag-beyond-int.json", rehash(edited));
  CHECK_THROWS_AS(read_program_json(path), InputError);
  CHECK_THROWS_WITH(read_program_json(path), Catch::Contains("tag") && Catch::Contains("2147483647"));
}

namespace {

// Lowering case `i`'s model, topology and validated plan.
struct CaseInputs {
  std::string label;
  ModelConfig model;
  Topology topology;
  Plan plan;
};
CaseInputs case_inputs(size_t i) {
  PlanCase c = lowering_cases()[i];
  ModelConfig model = load_model(source_path(c.model_file));
  Topology topology = test_topology();
  Plan plan = make_plan(c.plan_json, model, topology);
  return {c.label(), std::move(model), std::move(topology), std::move(plan)};
}

}  // namespace

TEST_CASE("a program carries the inputs that built it: lowering them again gives the same program",
          "[program_json]") {
  for (size_t i : {size_t(5), size_t(22), size_t(41)}) {
    const CaseInputs c = case_inputs(i);
    INFO(c.label);
    const ModelConfig& model = c.model;
    const Topology& topology = c.topology;
    const Plan& plan = c.plan;
    StepProgram program = lower_program(model, topology, plan);
    hash_program(program);
    ProgramInputs in = program_inputs(program);
    CHECK(model_to_json(in.model) == model_to_json(model));
    CHECK(plan_to_json(in.plan) == plan_to_json(plan));
    CHECK(in.topology.node.intra_node.kind == topology.node.intra_node.kind);
    StepProgram again = lower_program(in.model, in.topology, in.plan);
    hash_program(again);
    CHECK(again.program_sha256 == program.program_sha256);
  }
}

TEST_CASE("the hash written beside the lowering, role by role, is the whole program's",
          "[program_json]") {
  for (size_t i : {size_t(3), size_t(17), size_t(40)}) {
    const CaseInputs c = case_inputs(i);
    INFO(c.label);
    StepProgram whole = lower_program(c.model, c.topology, c.plan);
    hash_program(whole);
    StepProgram program;
    ProgramProgress progress;
    std::future<std::string> hash = std::async(std::launch::async, [&] {
      return write_program_json(program, nullptr, &progress);
    });
    lower_program_into(program, c.model, c.topology, c.plan, progress);
    CHECK(hash.get() == whole.program_sha256);
  }
  // A lowering that failed releases its reader with an error instead of leaving it waiting.
  StepProgram never;
  ProgramProgress failed;
  std::future<std::string> waiting = std::async(std::launch::async, [&] {
    return write_program_json(never, nullptr, &failed);
  });
  failed.fail();
  CHECK_THROWS_AS(waiting.get(), InputError);
}
