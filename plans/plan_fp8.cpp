// A plan's FP8 keys (plan_fp8.hpp).
#include "plan_fp8.hpp"

#include <string>
#include <utility>
#include <vector>

#include "errors.hpp"

namespace stepcast {

const char* to_string(Fp8Format format) {
  switch (format) {
    case Fp8Format::none: return "none";
    case Fp8Format::e4m3: return "e4m3";
    case Fp8Format::hybrid: return "hybrid";
  }
  return "?";
}

const char* to_string(Fp8AmaxAlgo algo) { return algo == Fp8AmaxAlgo::max ? "max" : "most_recent"; }
const char* to_string(Fp8Scaling scaling) {
  switch (scaling) {
    case Fp8Scaling::delayed: return "delayed";
    case Fp8Scaling::current: return "tensorwise";
    case Fp8Scaling::mxfp8: return "mxfp8";
    case Fp8Scaling::blockwise: return "blockwise";
  }
  fail_invariant(__FILE__, __LINE__, "unknown Fp8Scaling");
}

std::optional<Fp8Scaling> parse_fp8_scaling(const std::string& recipe) {
  for (Fp8Scaling s : {Fp8Scaling::delayed, Fp8Scaling::current, Fp8Scaling::mxfp8, Fp8Scaling::blockwise}) {
    if (recipe == to_string(s)) return s;
  }
  return std::nullopt;
}

namespace {

// Megatron-LM's --fp8-format (dest fp8), --fp8-recipe and --fp8-amax-compute-algo choices
// (megatron/training/arguments.py, _add_transformer_engine_args).
const std::vector<std::string> kFp8Formats = {"e4m3", "hybrid"};
const std::vector<std::string> kFp8Recipes = {"delayed", "tensorwise", "mxfp8", "blockwise"};
const std::vector<std::string> kFp8AmaxAlgos = {"most_recent", "max"};
// Transformer Engine's Float8BlockScaling scales: powers of two (its default) or any fp32
// (NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1).
const std::vector<std::string> kFp8BlockScales = {"power_of_two", "fp32"};

}  // namespace

// The fp8 keys; the recipe's keys without fp8 are refused rather than ignored.
Fp8Recipe read_fp8(ObjectReader& reader) {
  Fp8Recipe r;
  if (reader.has("fp8")) {
    r.format = reader.get_enum_or("fp8", kFp8Formats, "e4m3") == "e4m3" ? Fp8Format::e4m3 : Fp8Format::hybrid;
  }
  for (const char* key : {"fp8_recipe", "fp8_amax_history_len", "fp8_amax_compute_algo", "fp8_margin",
                          "fp8_block_scales", "fp8_param_gather"}) {
    if (reader.has(key) && !r.enabled()) {
      reader.fail(key, "is set but the plan has no fp8 key (FP8 off)",
                  "fp8 = \"e4m3\" or \"hybrid\" beside it, or no " + std::string(key));
    }
  }
  std::string recipe = reader.get_enum_or("fp8_recipe", kFp8Recipes, "delayed");
  r.scaling = *parse_fp8_scaling(recipe);
  if (r.scaling != Fp8Scaling::delayed) {
    for (const char* key : {"fp8_amax_history_len", "fp8_amax_compute_algo", "fp8_margin"}) {
      if (reader.has(key)) {
        reader.fail(key, "is a delayed-scaling setting, and fp8_recipe is \"" + recipe + "\"",
                    "fp8_recipe \"delayed\" beside it, or no " + std::string(key));
      }
    }
  }
  if (reader.has("fp8_block_scales") && r.scaling != Fp8Scaling::blockwise) {
    reader.fail("fp8_block_scales", "is a blockwise-scaling setting, and fp8_recipe is \"" + recipe + "\"",
                "fp8_recipe \"blockwise\" beside it, or no fp8_block_scales");
  }
  r.power_of_two_scales = reader.get_enum_or("fp8_block_scales", kFp8BlockScales, "power_of_two") == "power_of_two";
  r.amax_history_len = reader.get_int_or("fp8_amax_history_len", 1, 1);
  r.amax_compute_algo =
      reader.get_enum_or("fp8_amax_compute_algo", kFp8AmaxAlgos, "most_recent") == "max" ? Fp8AmaxAlgo::max
                                                                                         : Fp8AmaxAlgo::most_recent;
  r.margin = reader.get_int_or("fp8_margin", 0, 0);
  r.param_gather = reader.get_bool_or("fp8_param_gather", false);
  return r;
}

namespace {

// fp8_param_gather: Megatron-LM's rules (arguments.py: the distributed optimizer or FSDP) and what
// stepcast lowers of it (per-tensor recipes, dense layers).
void validate_fp8_param_gather(const Plan& plan, const ModelConfig& model) {
  const std::string& f = plan.file;
  auto refuse = [&](const std::string& why, const std::string& valid) {
    throw_input_error(f, "fp8_param_gather", "true", why, valid);
  };
  const std::string off = "false (or absent)";
  if (plan.zero_stage == 0) {
    refuse("needs the distributed optimizer or FSDP (Megatron-LM: \"--fp8-param-gather only supported with "
           "distributed optimizer, torch fsdp2, megatron fsdp\"); the plan has zero_stage = 0",
           off + ", or zero_stage 1, 2 or 3");
  }
  if (!plan.fp8.delayed() && !plan.fp8.current()) {
    refuse(std::string("is lowered for per-tensor scales only; fp8_recipe is \"") + to_string(plan.fp8.scaling) + "\"",
           off + ", or fp8_recipe \"delayed\" or \"tensorwise\"");
  }
  if (model.is_moe()) {
    refuse("is not lowered for mixtures of experts yet (model " + model.file + " has experts)",
           off + ", or a dense model");
  }
  if (plan.async_dp()) {
    refuse("needs the synchronous distributed optimizer; the plan's data_parallel_mode is \"async\"",
           off + ", or data_parallel_mode \"sync\"");
  }
}

}  // namespace


void validate_fp8(const Plan& plan, const ModelConfig& model, const Topology& topology) {
  if (plan.fp8.param_gather) validate_fp8_param_gather(plan, model);
  if (!plan.fp8.block_scaled()) return;
  const std::string& f = plan.file;
  const DeviceSpec& device = topology.node.device;
  const bool mx = plan.fp8.mx();
  const std::string recipe = std::string("\"") + to_string(plan.fp8.scaling) + "\"";
  const std::string other = "\"delayed\" or \"tensorwise\"";
  if (mx && !device.mxfp8) {
    throw_input_error(f, "fp8_recipe", recipe,
                      "needs tensor cores that take MX block scales; the device " + device.name + " of " +
                          topology.file + " has none (its key mxfp8 is absent or false)",
                      other + ", or a topology whose device has \"mxfp8\": true (Blackwell: dgx-b200, gb200-nvl72)");
  }
  if (!mx && !device.fp8_blockwise) {
    throw_input_error(f, "fp8_recipe", recipe,
                      "needs GEMMs on blockwise-scaled FP8 (Hopper or later); the device " + device.name + " of " +
                          topology.file + " has none (its key fp8_blockwise is absent or false)",
                      other + ", or a topology whose device has \"fp8_blockwise\": true (dgx-h100, h200-1gpu, "
                              "dgx-b200, gb200-nvl72)");
  }
  if (!plan.fp8.power_of_two_scales && device.mxfp8) {
    throw_input_error(f, "fp8_block_scales", "\"fp32\"",
                      "Blackwell runs blockwise scaling as MXFP8, whose scales are powers of two (TE's docs); the "
                      "device " + device.name + " of " + topology.file + " has MX tensor cores",
                      "\"power_of_two\" (the default), or a Hopper device (dgx-h100, h200-1gpu)");
  }
  if (model.is_moe()) {
    throw_input_error(f, "fp8_recipe", recipe,
                      "is not lowered for mixtures of experts yet (model " + model.file + " has experts)",
                      other + ", or a dense model");
  }
  // Each linear layer's operands on a rank: its inputs' rows (a microbatch's tokens of the rank's
  // sequence; the shard cast before its gather under sequence parallelism) and both dimensions of
  // its weight, every one blocked by the block length in some GEMM (tiles: both at once).
  const int64_t tp = plan.tp_size, d = model.head_dim(), block = mx ? kMxBlock : kFp8BlockwiseBlock;
  const int64_t rows = model.seq_length / plan.cp_size * plan.micro_batch_size;
  const std::vector<std::pair<std::string, int64_t>> dims = {
      {"hidden_size", model.hidden_size},
      {"(num_attention_heads + 2 · num_key_value_heads) · head_dim / tp_size",
       (model.num_attention_heads + 2 * model.num_key_value_heads) * d / tp},
      {"num_attention_heads · head_dim / tp_size", model.num_attention_heads * d / tp},
      {"intermediate_size / tp_size", model.intermediate_size / tp},
      {"a microbatch's tokens on a rank (seq_length / context_parallel_size · micro_batch_size)", rows},
      {"a sequence-parallel shard's tokens (those / tp_size)", plan.sequence_parallel ? rows / tp : block}};
  for (const auto& [what, value] : dims) {
    if (value % block == 0) continue;
    const std::string scales = mx ? "an E8M0 scale per 32 elements along rows and down columns"
                                  : "an fp32 scale per 128 elements along rows and down columns, per 128 x 128 "
                                    "tile of a weight";
    throw_input_error(f, "fp8_recipe", recipe,
                      "needs every linear layer's dimensions on a rank multiples of " + std::to_string(block) + " (" +
                          scales + "); " + what + " = " + std::to_string(value) + " (model " + model.file + ")",
                      other + ", or a model and plan whose dimensions are multiples of " + std::to_string(block));
  }
}

}  // namespace stepcast
