// checkpoint_run.hpp: saving a run's checkpoint across its ranks, and finding the one to resume.
#include "checkpoint_run.hpp"

#include <cstdio>
#include <filesystem>
#include <vector>

#include "errors.hpp"
#include "json_input.hpp"

namespace stepcast {

CheckpointShardLayout checkpoint_shard_layout(const StepProgram& program, const Plan& plan) {
  return {.tp_size = program.tp_size,
          .pp_size = program.pp_size,
          .dp_size = program.dp_size,
          .cp_size = program.cp_size,
          .ep_size = program.ep_size,
          .etp_size = program.etp_size,
          .zero_stage = plan.zero_stage,
          .dp_shard_size = program.grid().dp_shard_size(),
          .order = program.order};
}

void save_checkpoint(const StepProgram& program, const Plan& plan, const std::string& dir, int64_t steps_done,
                     ControlChannel& control, const std::function<StateBuffers()>& state,
                     const std::function<void()>& before_write) {
  std::string step_dir = dir + "/" + step_dir_name(steps_done);
  const std::string what = "the checkpoint after step " + std::to_string(steps_done);
  control.agree("creating " + what, [&] {
    if (control.rank() != 0) return;
    std::error_code error;
    std::filesystem::create_directories(step_dir, error);
    if (error) throw InputError(step_dir + ": cannot create the checkpoint directory: " + error.message());
  });
  CheckpointIdentity identity{control.rank(), control.size(), steps_done, program.program_sha256};
  std::pair<int64_t, std::string> written;
  before_write();
  control.agree("writing " + what, [&] { written = write_rank_checkpoint(step_dir, identity, state()); });
  // Each rank's size and hash to rank 0 (a hash as 8 numbers of 32 bits, exact in a double).
  std::vector<double> mine{double(written.first)};
  for (size_t i = 0; i < 64; i += 8) mine.push_back(double(std::stoul(written.second.substr(i, 8), nullptr, 16)));
  std::vector<std::vector<double>> all = control.gather(mine, "gathering the hashes of " + what);
  control.agree("the manifest of " + what, [&] {
    if (control.rank() != 0) return;
    CheckpointManifest manifest;
    manifest.plan = plan.name;
    manifest.program_sha256 = program.program_sha256;
    manifest.layout = checkpoint_shard_layout(program, plan);
    manifest.steps_done = steps_done;
    manifest.world_size = control.size();
    for (int r = 0; r < control.size(); ++r) {
      const std::vector<double>& v = all[size_t(r)];
      char hex[65];
      for (size_t i = 0; i < 8; ++i) std::snprintf(hex + 8 * i, 9, "%08lx", static_cast<unsigned long>(v.at(i + 1)));
      manifest.files.push_back({r, rank_file_name(r), int64_t(v.at(0)), std::string(hex, 64)});
    }
    std::string text = checkpoint_manifest_text(manifest);
    write_file_atomically(step_dir + "/manifest.json", text);
    write_file_atomically(dir + "/latest",
                          checkpoint_latest_text({step_dir_name(steps_done), manifest.manifest_sha256}));
  });
}

CheckpointInfo find_checkpoint(const std::string& dir, const std::string& program_sha256,
                               const CheckpointShardLayout& layout, int64_t world_size) {
  std::string latest_file = dir + "/latest";
  if (!std::filesystem::is_regular_file(latest_file)) {
    throw InputError(dir + ": no complete checkpoint (no 'latest' file)");
  }
  CheckpointLatest latest = parse_checkpoint_latest(read_text_file(latest_file), latest_file);
  CheckpointInfo info;
  info.path = dir + "/" + latest.step_dir;
  std::string manifest_file = info.path + "/manifest.json";
  info.manifest = parse_checkpoint_manifest(read_text_file(manifest_file), manifest_file);
  const CheckpointManifest& m = info.manifest;
  if (m.manifest_sha256 != latest.manifest_sha256) {
    throw InputError(manifest_file + ": its hash " + m.manifest_sha256.substr(0, 12) + " is not the one " +
                     latest_file + " names (" + latest.manifest_sha256.substr(0, 12) + "): the manifest was replaced");
  }
  if (step_dir_name(m.steps_done) != latest.step_dir) {
    throw_input_error(manifest_file, "steps_done", std::to_string(m.steps_done),
                      "is not the step of its directory " + latest.step_dir, "the manifest stepcast wrote there");
  }
  if (!(m.layout == layout)) {
    throw_input_error(manifest_file, "shard_layout", to_string(m.layout),
                      "plan '" + m.plan + "' cut its state this way; this run's plan cuts it as " + to_string(layout),
                      "a checkpoint of a plan with the same parallel sizes, rank order and ZeRO stage");
  }
  if (m.program_sha256 != program_sha256) {
    throw_input_error(manifest_file, "program_sha256", "\"" + m.program_sha256 + "\"",
                      "a checkpoint of plan '" + m.plan + "', not of this program (" + program_sha256 + ")",
                      "a checkpoint of the same model, topology and plan");
  }
  if (m.world_size != world_size) {
    throw_input_error(manifest_file, "world_size", std::to_string(m.world_size),
                      "this run has " + std::to_string(world_size) + " ranks", "a checkpoint of the same plan");
  }
  info.step = m.steps_done;
  return info;
}

}  // namespace stepcast
