// Checkpoint manifests carry the shard layout; a checkpoint fits a run only with the run's layout
// (then its program hash is compared).
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "checkpoint.hpp"
#include "checkpoint_run.hpp"
#include "errors.hpp"
#include "sha256.hpp"
#include "test_support.hpp"

using namespace stepcast;
using namespace stepcast::test;
using Catch::Contains;

namespace {

CheckpointManifest two_rank_manifest() {
  CheckpointManifest m;
  m.plan = "dp2-zero1";
  m.program_sha256 = std::string(64, 'a');
  m.layout.dp_size = 2;
  m.layout.zero_stage = 1;
  m.layout.dp_shard_size = 2;
  m.layout.order = "tp-dp-pp";
  m.steps_done = 4;
  m.world_size = 2;
  for (int r = 0; r < 2; ++r) m.files.push_back({r, rank_file_name(r), 100, std::string(64, 'b')});
  return m;
}

// The manifest's text with `edit` applied to its JSON and its self-hash recomputed.
template <class F>
std::string edited_manifest(F&& edit) {
  CheckpointManifest m = two_rank_manifest();
  Json j = Json::parse(checkpoint_manifest_text(m));
  j.erase("manifest_sha256");
  edit(j);
  j["manifest_sha256"] = sha256_hex(j.dump());
  return j.dump(2);
}

std::string refusal(const std::string& text) {
  try {
    parse_checkpoint_manifest(text, "manifest.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "(accepted)";
}

}  // namespace

TEST_CASE("checkpoint manifests carry the shard layout and read it back strictly", "[checkpoint]") {
  CheckpointManifest m = two_rank_manifest();
  CheckpointManifest back = parse_checkpoint_manifest(checkpoint_manifest_text(m), "manifest.json");
  CHECK(back.layout == m.layout);
  CHECK(to_string(back.layout) == "tp 1 × pp 1 × dp 2 (tp-dp-pp), ZeRO-1");
  CHECK_THAT(refusal(edited_manifest([](Json& j) { j.erase("shard_layout"); })),
             Contains("key 'shard_layout'") && Contains("missing"));
  CHECK_THAT(refusal(edited_manifest([](Json& j) { j["shard_layout"]["zero_stage"] = 4; })),
             Contains("key 'shard_layout.zero_stage'") && Contains("0, 1, 2 or 3"));
  CHECK_THAT(refusal(edited_manifest([](Json& j) { j["shard_layout"]["order"] = "tp-tp-pp"; })),
             Contains("key 'shard_layout.order'") && Contains("permutation of tp, dp, pp"));
  // A plan may name cp in its order without context parallelism: its checkpoints read back.
  CHECK(refusal(edited_manifest([](Json& j) { j["shard_layout"]["order"] = "tp-cp-dp-pp"; })) == "(accepted)");
  CHECK_THAT(refusal(edited_manifest([](Json& j) { j["shard_layout"]["dp_size"] = 0; })),
             Contains("key 'shard_layout.dp_size'"));
  CHECK_THAT(refusal(edited_manifest([](Json& j) { j["shard_layout"]["extra"] = 1; })), Contains("shard_layout.extra"));
  CHECK_THAT(refusal(edited_manifest([](Json& j) { j["schema_version"] = 3; })),
             Contains("key 'schema_version' = 3") && Contains("5 its cp, ep and etp sizes"));
  CHECK_THAT(refusal(edited_manifest([](Json& j) { j["schema_version"] = 4; })),
             Contains("key 'schema_version' = 4") && Contains("5: a checkpoint written by this version"));
  CHECK_THAT(refusal(edited_manifest([](Json& j) { j["shard_layout"].erase("cp_size"); })),
             Contains("key 'shard_layout.cp_size'"));
  CHECK_THAT(refusal(edited_manifest([](Json& j) { j["shard_layout"]["ep_size"] = 0; })),
             Contains("key 'shard_layout.ep_size'"));
  // Context and expert parallelism in the layout's words, and back.
  CheckpointManifest cut = two_rank_manifest();
  cut.layout.cp_size = 2;
  cut.layout.ep_size = 2;
  cut.layout.etp_size = 2;
  cut.layout.order = "tp-cp-dp-pp";
  cut.layout.dp_shard_size = 4;  // ZeRO over dp × cp
  CheckpointManifest cut_back = parse_checkpoint_manifest(checkpoint_manifest_text(cut), "manifest.json");
  CHECK(cut_back.layout == cut.layout);
  CHECK(to_string(cut_back.layout) == "tp 1 × pp 1 × dp 2 × cp 2 (tp-cp-dp-pp), ep 2 etp 2, ZeRO-1");
  cut.layout.dp_shard_size = 2;  // hybrid: shards over 2 of the 4
  CHECK(to_string(cut.layout) == "tp 1 × pp 1 × dp 2 × cp 2 (tp-cp-dp-pp), ep 2 etp 2, ZeRO-1, shards over 2 of dp × cp");
  CHECK_THAT(refusal(edited_manifest([](Json& j) { j["shard_layout"]["dp_shard_size"] = 3; })),
             Contains("key 'shard_layout.dp_shard_size'") && Contains("a divisor of dp_size · cp_size = 2"));
}

TEST_CASE("a checkpoint of another shard layout is refused before its program hash", "[checkpoint]") {
  std::string dir = write_temp_file("layout.keep", "") + ".ck";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/" + step_dir_name(4));
  CheckpointManifest m = two_rank_manifest();
  std::string text = checkpoint_manifest_text(m);
  write_file_atomically(dir + "/" + step_dir_name(4) + "/manifest.json", text);
  write_file_atomically(dir + "/latest", checkpoint_latest_text({step_dir_name(4), m.manifest_sha256}));
  // The same layout and hash: found.
  CHECK(find_checkpoint(dir, m.program_sha256, m.layout, 2).step == 4);
  // ZeRO-3 over the same ranks: refused on the layout, naming both.
  CheckpointShardLayout zero3 = m.layout;
  zero3.zero_stage = 3;
  try {
    find_checkpoint(dir, std::string(64, 'c'), zero3, 2);
    FAIL("accepted a checkpoint of another shard layout");
  } catch (const InputError& e) {
    CHECK_THAT(e.what(), Contains("key 'shard_layout' = tp 1 × pp 1 × dp 2 (tp-dp-pp), ZeRO-1") &&
                             Contains("cuts it as tp 1 × pp 1 × dp 2 (tp-dp-pp), ZeRO-3"));
  }
  // Hybrid sharding: the same grid and stage, shards over fewer ranks (replicas across the rest).
  CheckpointShardLayout hybrid = m.layout;
  hybrid.dp_shard_size = 1;
  try {
    find_checkpoint(dir, std::string(64, 'c'), hybrid, 2);
    FAIL("accepted a checkpoint of another shard group");
  } catch (const InputError& e) {
    CHECK_THAT(e.what(), Contains("cuts it as tp 1 × pp 1 × dp 2 (tp-dp-pp), ZeRO-1, shards over 1 of dp"));
  }
  // The same layout, another program: refused on the hash.
  try {
    find_checkpoint(dir, std::string(64, 'c'), m.layout, 2);
    FAIL("accepted a checkpoint of another program");
  } catch (const InputError& e) {
    CHECK_THAT(e.what(), Contains("not of this program"));
  }
}
