// Which device profile a command costs with: --profile FILE, --profile roofline, or the profile
// the topology names; the roofline with a warning where the topology names none that exists;
// another device's profile refused unless --allow-profile-mismatch.
#include <catch2/catch.hpp>

#include <filesystem>

#include "errors.hpp"
#include "json_input.hpp"
#include "profile.hpp"
#include "test_support.hpp"
#include "topology.hpp"

namespace stepcast {
namespace {

using Catch::Matchers::Contains;
using test::source_path;

// dgx-a100-80gb.json written elsewhere with `profile` set to `value` (or removed when empty).
std::string topology_with_profile(const std::string& name, const std::string& value) {
  Json t = load_json_file(source_path("topologies/dgx-a100-80gb.json"));
  if (value.empty()) {
    t.erase("profile");
  } else {
    t["profile"] = value;
  }
  return test::write_temp_file(name, t.dump(2));
}

}  // namespace

TEST_CASE("profile choice: the topology's profile unless --profile says otherwise", "[profile]") {
  Topology a100 = load_topology(source_path("topologies/dgx-a100-80gb.json"));
  REQUIRE(std::filesystem::equivalent(a100.profile_file, source_path("profiles/a100-sxm4-80gb.json")));

  ProfileChoice by_topology = choose_profile(std::nullopt, a100);
  CHECK(by_topology.origin == "topology");
  CHECK_FALSE(by_topology.profile.is_roofline);
  CHECK(by_topology.profile.device == "A100-SXM4-80GB");
  CHECK(by_topology.warning.empty());
  CHECK(by_topology.argument == a100.profile_file);
  CHECK_THAT(by_topology.describe(), Contains("the topology's"));

  ProfileChoice roofline = choose_profile(std::string("roofline"), a100);
  CHECK(roofline.profile.is_roofline);
  CHECK(roofline.origin == "roofline");
  CHECK(roofline.argument == "roofline");
  CHECK(roofline.warning.empty());

  ProfileChoice given = choose_profile(source_path("profiles/a100-sxm4-80gb.json"), a100);
  CHECK(given.origin == "--profile");
  CHECK_FALSE(given.profile.is_roofline);

  // Every shipped GPU topology names a shipped profile of its own device.
  for (const char* name : {"dgx-a100-80gb", "dgx-h100", "h200-1gpu", "dgx-b200", "gb200-nvl72"}) {
    INFO(name);
    Topology t = load_topology(source_path(std::string("topologies/") + name + ".json"));
    ProfileChoice c = choose_profile(std::nullopt, t);
    CHECK(c.origin == "topology");
    CHECK(c.profile.device == t.node.device.name);
  }
}

TEST_CASE("profile choice: no profile named, a missing file, another device", "[profile]") {
  Topology none = load_topology(topology_with_profile("no-profile-topology.json", ""));
  ProfileChoice fallback = choose_profile(std::nullopt, none);
  CHECK(fallback.profile.is_roofline);
  CHECK(fallback.origin == "none");
  CHECK_THAT(fallback.warning, Contains("names no device profile") && Contains("roofline"));

  Topology missing = load_topology(topology_with_profile("missing-profile-topology.json", "nowhere/x.json"));
  ProfileChoice absent = choose_profile(std::nullopt, missing);
  CHECK(absent.profile.is_roofline);
  CHECK_THAT(absent.warning, Contains("nowhere/x.json") && Contains("does not exist"));

  Json empty = load_json_file(source_path("topologies/dgx-a100-80gb.json"));
  empty["profile"] = "";
  CHECK_THROWS_WITH(parse_topology(empty, "t.json"), Contains("key 'profile'") && Contains("is empty"));

  Topology a100 = load_topology(source_path("topologies/dgx-a100-80gb.json"));
  std::string h100 = source_path("profiles/h100-sxm.json");
  CHECK_THROWS_WITH(choose_profile(h100, a100),
                    Contains("H100-SXM5-80GB") && Contains("A100-SXM4-80GB") &&
                        Contains("--allow-profile-mismatch"));
  ProfileChoice allowed = choose_profile(h100, a100, true);
  CHECK(allowed.profile.device == "H100-SXM5-80GB");
  // A CPU profile on a GPU topology stays refused: another kind of device, not another model.
  Json cpu = load_json_file(h100);
  cpu["backend"] = "cpu";
  std::string cpu_file = test::write_temp_file("cpu-backend-profile.json", cpu.dump());
  CHECK_THROWS_AS(choose_profile(cpu_file, a100, true), InputError);
}

TEST_CASE("profile choice: simulate says which profile it used", "[profile][simulate]") {
  std::string args = test::model_arg("tiny") + test::topology_arg("dgx-a100-80gb") +
                     test::plan_arg("tiny-cpu") + " --no-scaling";
  std::string dir = (std::filesystem::temp_directory_path() / "stepcast-profile-choice").string();
  test::CommandResult by_topology = test::run_stepcast("simulate" + args + " --out " + dir);
  INFO(by_topology.output);
  REQUIRE(by_topology.exit_code == 0);
  CHECK_THAT(by_topology.output, Contains("a100-sxm4-80gb.json") && Contains("the topology's"));
  Json prediction = load_json_file(dir + "/prediction.json");
  CHECK(prediction["inputs"]["profile_origin"] == "topology");
  CHECK_THAT(prediction["inputs"]["profile_file"].get<std::string>(), Contains("a100-sxm4-80gb.json"));

  test::CommandResult roofline = test::run_stepcast("simulate" + args + " --profile roofline --out " + dir);
  REQUIRE(roofline.exit_code == 0);
  CHECK_THAT(roofline.output, Contains("roofline (--profile roofline)"));
  prediction = load_json_file(dir + "/prediction.json");
  CHECK(prediction["inputs"]["profile_origin"] == "roofline");
  CHECK(prediction["inputs"]["profile"]["roofline"] == true);

  std::string h100 = source_path("profiles/h100-sxm.json");
  test::CommandResult refused = test::run_stepcast("simulate" + args + " --profile " + h100);
  CHECK(refused.exit_code == 2);
  CHECK_THAT(refused.output, Contains("--allow-profile-mismatch"));
  test::CommandResult allowed =
      test::run_stepcast("simulate" + args + " --profile " + h100 + " --allow-profile-mismatch");
  INFO(allowed.output);
  CHECK(allowed.exit_code == 0);
  CHECK_THAT(allowed.output, Contains("warning: costing device \"A100-SXM4-80GB\" with profile"));
}

}  // namespace stepcast
