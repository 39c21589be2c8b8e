// Megatron-LM arguments → model config and plan keys; see megatron_import.hpp.
// Citations are file:line in Megatron-LM at commit d98e8a64ddf3, megatron/training/arguments.py
// unless a file is named, as in megatron_export.cpp. Flags generated from dataclass fields
// (training/argument_utils.py:45) cite the field: `a_b` is `--a-b`.
#include "megatron_import.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "errors.hpp"
#include "megatron_flags.hpp"

namespace stepcast {

namespace {

// Flags that take no value (store_true / store_false).
const std::set<std::string> kSwitches = {
    "group-query-attention", "swiglu", "untie-embeddings-and-output-weights", "disable-bias-linear",
    "sequence-parallel", "use-distributed-optimizer", "use-megatron-fsdp", "overlap-grad-reduce",
    "overlap-param-gather", "fp8-param-gather", "no-overlap-p2p-communication", "bf16", "fp16", "grad-reduce-in-bf16",
    "use-tp-pp-dp-mapping", "recompute-activations", "use-flash-attn", "use-rotary-position-embeddings",
    "mock-data", "use-mcore-models", "no-masked-softmax-fusion", "no-bias-gelu-fusion",
    "no-bias-dropout-fusion", "no-bias-swiglu-fusion", "no-rope-fusion", "cross-entropy-loss-fusion",
    "no-gradient-accumulation-fusion", "attention-softmax-in-fp32",
    "accumulate-allreduce-grads-in-fp32", "no-load-optim", "no-load-rng", "no-save-optim",
    "no-save-rng", "use-checkpoint-args", "manual-gc", "log-throughput", "async-save",
    "no-check-for-nan-in-loss-and-grad", "use-legacy-models", "check-for-nan-in-loss-and-grad",
    "ckpt-fully-parallel-save", "ckpt-fully-parallel-load", "no-ckpt-fully-parallel-save",
    "use-dist-ckpt", "dist-ckpt-strictness", "moe-grouped-gemm", "moe-pad-expert-input-to-capacity",
    "moe-router-pre-softmax"};

// Flags read into the model or plan (the rest of what is known is ignored or refused).
const std::set<std::string> kRead = {
    "no-gradient-accumulation-fusion", "cross-entropy-loss-fusion", "num-layers", "hidden-size", "num-attention-heads", "num-query-groups", "ffn-hidden-size",
    "kv-channels", "normalization", "norm-epsilon", "position-embedding-type", "rotary-base",
    "rotary-percent", "max-position-embeddings", "seq-length", "vocab-size",
    "make-vocab-size-divisible-by", "tokenizer-type", "hidden-dropout", "attention-dropout",
    "attention-backend", "tensor-model-parallel-size", "pipeline-model-parallel-size",
    "context-parallel-size", "cp-comm-type", "num-layers-per-virtual-pipeline-stage",
    "num-virtual-stages-per-pipeline-rank", "pipeline-model-parallel-layout",
    "decoder-first-pipeline-num-layers", "decoder-last-pipeline-num-layers", "micro-batch-size",
    "global-batch-size", "data-parallel-sharding-strategy", "num-distributed-optimizer-instances",
    "ddp-bucket-size", "recompute-granularity", "recompute-method", "recompute-num-layers",
    "recompute-modules", "optimizer", "ckpt-format", "fp8-format", "fp8-recipe", "fp8-amax-history-len",
    "fp8-amax-compute-algo", "fp8-margin",
    // mixture of experts (megatron_import_moe.cpp)
    "num-experts", "moe-ffn-hidden-size", "moe-router-topk", "moe-shared-expert-intermediate-size",
    "moe-layer-freq", "moe-router-pre-softmax", "moe-router-load-balancing-type", "moe-aux-loss-coeff",
    "expert-model-parallel-size", "expert-tensor-parallel-size", "moe-token-dispatcher-type",
    "moe-grouped-gemm", "moe-expert-capacity-factor", "moe-pad-expert-input-to-capacity",
    "moe-token-drop-policy"};

// Flags that do not change one step's time or memory: accepted and listed.
bool ignored_flag(const std::string& name) {
  static const std::set<std::string> names = {
      "data-path", "mock-data", "split", "num-workers", "dataloader-type", "tokenizer-model",
      "vocab-file", "merge-file", "lr", "min-lr", "weight-decay", "clip-grad", "init-method-std",
      "train-iters", "train-samples", "seed", "initial-loss-scale", "min-loss-scale",
      "loss-scale", "loss-scale-window", "hysteresis", "distributed-backend",
      "distributed-timeout-minutes", "use-mcore-models", "transformer-impl",
      "no-masked-softmax-fusion", "no-bias-gelu-fusion", "no-bias-dropout-fusion",
      "no-bias-swiglu-fusion", "no-rope-fusion",
      "attention-softmax-in-fp32", "accumulate-allreduce-grads-in-fp32", "use-checkpoint-args", "use-legacy-models",
      "check-for-nan-in-loss-and-grad", "no-check-for-nan-in-loss-and-grad", "use-dist-ckpt",
      "micro-batch-size-per-gpu", "rampup-batch-size", "decoupled-lr", "decoupled-min-lr",
      "sgd-momentum", "tokenizer-prompt-format", "data-args-path", "per-split-data-args-path",
      "train-data-path", "valid-data-path", "test-data-path", "object-storage-cache-path",
      "mmap-bin-files", "no-mmap-bin-files", "reset-position-ids", "reset-attention-mask",
      "eod-mask-loss", "create-attention-mask-in-dataloader", "no-create-attention-mask-in-dataloader",
      "num-dataset-builder-threads", "full-validation", "skip-train", "pretrained-checkpoint"};
  static const std::vector<std::string> prefixes = {
      "log", "tensorboard", "wandb", "eval-", "lr-", "save", "load", "exit-", "adam-",
      "data-cache", "timing", "manual-gc", "no-load-", "no-save-", "ckpt-", "dist-ckpt",
      "async-save", "profile", "one-logger", "straggler", "check-weight-hash", "logging-",
      "non-persistent-", "finetune", "override-opt", "record-memory-history", "memory-snapshot"};
  if (names.count(name)) return true;
  for (const auto& p : prefixes) {
    if (name.rfind(p, 0) == 0) return true;
  }
  return false;
}

// Flags that change the step in ways stepcast does not model: refused by name, with why.
void refuse_unmodelled(const MegatronFlags& f) {
  static const std::vector<std::pair<std::string, std::string>> refused = {
      {"multi-latent-attention", "multi-latent attention is not modelled"},
      {"squared-relu", "only GeLU and SwiGLU MLPs are modelled"},
      {"qk-layernorm", "query/key norms are not modelled"},
      {"add-qkv-bias", "a bias on q, k, v alone is not modelled (use_bias is all linear layers or none)"},
      {"tp-comm-overlap", "overlapping tensor-parallel communication with GEMMs is not modelled"},
      {"use-torch-fsdp2", "torch FSDP2 is not modelled (Megatron-FSDP, --use-megatron-fsdp, is)"},
      {"account-for-embedding-in-pipeline-split", "the embedding as a pipeline layer is not modelled"},
      {"account-for-loss-in-pipeline-split", "the loss as a pipeline layer is not modelled"},
      {"hierarchical-context-parallel-sizes", "hierarchical context parallelism is not modelled"},
      {"distribute-saved-activations", "distributing saved activations over tp is not modelled"},
      {"mtp-num-layers", "multi-token prediction layers are not modelled"},
      {"window-size", "sliding-window attention is not modelled"},
      {"num-layers-at-start-in-bf16", "mixed FP8/BF16 layers are not modelled"},
      {"cpu-offloading", "activation offloading is not modelled"},
      {"encoder-num-layers", "encoder-decoder models are not modelled"},
      {"decoder-num-layers", "encoder-decoder models are not modelled"}};
  for (const auto& [name, why] : refused) {
    if (f.has(name)) f.fail(name, f.all().at(name), why, "a launch line without --" + name);
  }
  for (const auto& [name, value] : f.all()) {
    if (name.rfind("moe-", 0) == 0 && !kRead.count(name)) {
      f.fail(name, value, "is a mixture-of-experts option stepcast does not model",
             "the --moe-* flags README lists under `--from-megatron`, or none");
    }
    // --fp4-format and its options (transformer_config.py:587-690); FP8's are read below.
    if (name.rfind("fp4-", 0) == 0) f.fail(name, value, "FP4 training is not modelled", "no --fp4-* flags");
    if (!kRead.count(name) && !kSwitches.count(name) && !ignored_flag(name)) {
      f.fail(name, value, "is not a flag stepcast reads or knows to leave the step unchanged",
             "the flags README lists under `--from-megatron` (model shape, parallel layout, batch, "
             "schedule, recompute, precision, data-parallel overlap), or ones that only set data, "
             "optimizer hyper-parameters, logging or checkpoints");
    }
  }
  (void)f.choice("optimizer", {"adam"}, "adam");  // the optimizer state stepcast models
}

Json import_model(const MegatronFlags& f, int64_t tp, const std::string& name) {
  const int64_t h = f.required("hidden-size"), heads = f.required("num-attention-heads");
  Json m;
  m["name"] = name;
  m["num_hidden_layers"] = f.required("num-layers");
  m["hidden_size"] = h;
  m["num_attention_heads"] = heads;
  // num_query_groups is read only under --group-query-attention (argument_utils.py:330-333).
  if (f.has("num-query-groups") && !f.on("group-query-attention")) {
    f.fail("num-query-groups", *f.text("num-query-groups"),
           "is ignored by Megatron-LM without --group-query-attention (training/argument_utils.py:330-333)",
           "--group-query-attention with it, or neither");
  }
  m["num_key_value_heads"] = f.on("group-query-attention") ? f.integer("num-query-groups").value_or(heads) : heads;
  // A head width of its own (kv_channels, transformer_config.py:184): the model's head_dim.
  if (f.has("kv-channels") && *f.integer("kv-channels") * heads != h) m["head_dim"] = *f.integer("kv-channels");
  const bool swiglu = f.on("swiglu");
  // Megatron's default width (arguments.py:1322-1329): 4h, or SwiGLU's 2/3 of it in 64s.
  m["intermediate_size"] = f.integer("ffn-hidden-size").value_or(
      swiglu ? int64_t((4.0 * double(h) * 2 / 3) / 64) * 64 : 4 * h);
  m["mlp_type"] = swiglu ? "swiglu" : "gelu";
  m["norm_type"] = f.choice("normalization", {"LayerNorm", "RMSNorm"}, "LayerNorm") == "RMSNorm" ? "rmsnorm" : "layernorm";
  m["norm_eps"] = f.number("norm-epsilon", 1e-12, 1).value_or(1e-5);  // transformer_config.py:201
  const std::string position =
      f.on("use-rotary-position-embeddings") ? "rope" : f.choice("position-embedding-type", {"learned_absolute", "rope"}, "learned_absolute");
  m["position_embedding_type"] = position == "rope" ? "rotary" : "learned";
  if (position == "rope") m["rope_theta"] = double(f.integer("rotary-base").value_or(10000));  // :2418
  if (f.number("rotary-percent", 0, 1).value_or(1.0) != 1.0) {
    f.fail("rotary-percent", *f.text("rotary-percent"), "partial rotary embeddings are not modelled", "1.0");
  }
  // Required (arguments.py:1314-1317); seq_length has no default (arguments.py:3305).
  m["max_position_embeddings"] = f.required("max-position-embeddings");
  m["seq_length"] = f.required("seq-length");
  m["tie_word_embeddings"] = !f.on("untie-embeddings-and-output-weights");  // :2460
  m["use_bias"] = !f.on("disable-bias-linear");                             // transformer_config.py:212
  // The vocabulary: the NullTokenizer's --vocab-size, padded to make_vocab_size_divisible_by · tp
  // (core/tokenizers/utils/build_tokenizer.py:133-139); a real tokenizer's size is in its files.
  if (!f.has("vocab-size")) {
    throw_input_error(f.source(), "--vocab-size", "(absent)",
                      "stepcast cannot read a tokenizer's files for the vocabulary size",
                      "--vocab-size N (the NullTokenizer's size, as the export writes it)");
  }
  const int64_t vocab = *f.integer("vocab-size");
  const int64_t divisible_by = f.integer("make-vocab-size-divisible-by").value_or(128);  // :2441
  const int64_t multiple = divisible_by * tp;
  // 1: stepcast pads to tp itself, as Megatron would; the config keeps the tokenizer's size.
  m["vocab_size"] = divisible_by == 1 ? vocab : (vocab + multiple - 1) / multiple * multiple;
  return m;
}

}  // namespace

namespace {

// Layers per virtual stage of --pipeline-model-parallel-layout, in its order (the order of
// layers_per_stage). Grammar of core/transformer/pipeline_parallel_layer_layout.py:283-321:
// commas dropped, "(x)*n" then "c*n" unrolled, '|' splits stages of E, L, t, m;
// validate_layer_layout (:86-110) wants E first and L last.
std::vector<int64_t> layout_layers(const MegatronFlags& f, const std::string& layout) {
  auto bad = [&](const std::string& why) {
    f.fail("pipeline-model-parallel-layout", layout, why,
           "stages of 't' split by '|', \"x*n\" or \"(..)*n\" for repeats, 'E' opening the first, 'L' closing the last");
  };
  constexpr size_t kMaxLength = 1 << 20;
  std::string s;
  for (char c : layout) {
    if (c != ',' && c != ' ') s += c;
  }
  auto unroll = [&](bool groups) {
    std::string out;
    for (size_t i = 0; i < s.size();) {
      size_t body_begin = i, body_end = i + 1;
      if (groups && s[i] == '(') {
        body_end = s.find(')', i);
        if (body_end == std::string::npos) bad("has '(' without ')'");
        body_begin = i + 1;
      } else if (groups || s[i] == '(' || s[i] == ')') {
        if (!groups) bad("has parentheses not followed by *n");
        out += s[i++];
        continue;
      }
      size_t star = groups ? body_end + 1 : body_end;
      if (star < s.size() && s[star] == '*') {
        size_t digits_end = star + 1;
        while (digits_end < s.size() && std::isdigit(static_cast<unsigned char>(s[digits_end]))) ++digits_end;
        if (digits_end == star + 1) bad("has '*' without a count");
        int64_t n = std::stoll(s.substr(star + 1, std::min<size_t>(digits_end - star - 1, 9)));
        std::string body = s.substr(body_begin, body_end - body_begin);
        if (body.size() * size_t(n) + out.size() > kMaxLength) bad("unrolls to more than 2^20 characters");
        for (int64_t k = 0; k < n; ++k) out += body;
        i = digits_end;
      } else {
        out += s.substr(i, body_end + (groups ? 1 : 0) - i);
        i = body_end + (groups ? 1 : 0);
      }
    }
    s = out;
  };
  unroll(true);
  unroll(false);
  std::vector<std::string> stages(1);
  for (char c : s) {
    if (c == '|') {
      stages.emplace_back();
    } else if (c == 'E' || c == 'L' || c == 't') {
      stages.back() += c;
    } else if (c == 'm') {
      bad("has multi-token prediction layers ('m'), which are not modelled");
    } else {
      bad(std::string("has '") + c + "', not a layer Megatron-LM knows (E, L, t, m)");
    }
  }
  std::vector<int64_t> layers;
  for (size_t k = 0; k < stages.size(); ++k) {
    std::string body = stages[k];
    if (k == 0 && !body.empty() && body[0] == 'E') body.erase(0, 1);
    if (k + 1 == stages.size() && !body.empty() && body.back() == 'L') body.pop_back();
    if (body.find_first_not_of('t') != std::string::npos) {
      bad("has 'E' or 'L' other than the first layer of the first stage and the last of the last "
          "(stepcast places the embedding and the loss there)");
    }
    layers.push_back(int64_t(body.size()));
  }
  if (stages.front().empty() || stages.front()[0] != 'E' || stages.back().empty() || stages.back().back() != 'L') {
    bad("does not open with 'E' and close with 'L' (validate_layer_layout, pipeline_parallel_layer_layout.py:86-110)");
  }
  return layers;
}

void import_pipeline(const MegatronFlags& f, int64_t num_layers, int64_t pp, Json& p) {
  const bool layout = f.has("pipeline-model-parallel-layout"),
             per_stage = f.has("num-layers-per-virtual-pipeline-stage"),
             stages = f.has("num-virtual-stages-per-pipeline-rank");
  if (int(layout) + int(per_stage) + int(stages) > 1) {
    f.fail(layout ? "pipeline-model-parallel-layout" : "num-layers-per-virtual-pipeline-stage",
           *f.text(layout ? "pipeline-model-parallel-layout" : "num-layers-per-virtual-pipeline-stage"),
           "is given with another of --num-layers-per-virtual-pipeline-stage, "
           "--num-virtual-stages-per-pipeline-rank, --pipeline-model-parallel-layout (arguments.py:928-939)",
           "one of the three");
  }
  int64_t vpp = 1;
  if (layout) {
    std::vector<int64_t> layers = layout_layers(f, *f.text("pipeline-model-parallel-layout"));
    if (int64_t(layers.size()) % pp != 0) {
      f.fail("pipeline-model-parallel-layout", *f.text("pipeline-model-parallel-layout"),
             "has " + std::to_string(layers.size()) + " stages, not a multiple of pipeline_model_parallel_size " +
                 std::to_string(pp) + " (arguments.py:944-949)",
             "pp · vpp stages");
    }
    vpp = int64_t(layers.size()) / pp;
    int64_t placed = 0;
    for (int64_t n : layers) placed += n;
    if (placed != num_layers) {
      f.fail("pipeline-model-parallel-layout", *f.text("pipeline-model-parallel-layout"),
             "places " + std::to_string(placed) + " decoder layers ('t'), the model has --num-layers " +
                 std::to_string(num_layers),
             "a layout with " + std::to_string(num_layers) + " 't'");
    }
    p["layers_per_stage"] = layers;
  } else if (per_stage) {
    const int64_t n = *f.integer("num-layers-per-virtual-pipeline-stage");
    if (num_layers % pp != 0 || (num_layers / pp) % n != 0) {
      f.fail("num-layers-per-virtual-pipeline-stage", *f.text("num-layers-per-virtual-pipeline-stage"),
             "does not divide the " + std::to_string(num_layers) + " layers / pp " + std::to_string(pp) +
                 " evenly (arguments.py:966-975)",
             "a divisor of num_layers / pipeline_model_parallel_size, or --pipeline-model-parallel-layout");
    }
    vpp = num_layers / pp / n;
  } else if (stages) {
    vpp = *f.integer("num-virtual-stages-per-pipeline-rank");
  }
  const bool first = f.has("decoder-first-pipeline-num-layers"), last = f.has("decoder-last-pipeline-num-layers");
  if (first || last) {
    const std::string key = first ? "decoder-first-pipeline-num-layers" : "decoder-last-pipeline-num-layers";
    if (vpp > 1 || layout || pp < 2) {
      f.fail(key, *f.text(key), "is modelled for a pipeline without virtual stages or a layout only",
             "--pipeline-model-parallel-layout for uneven virtual stages");
    }
    const int64_t a = f.integer("decoder-first-pipeline-num-layers", 0).value_or(-1),
                  b = f.integer("decoder-last-pipeline-num-layers", 0).value_or(-1);
    const int64_t middle_stages = pp - (a >= 0) - (b >= 0);
    const int64_t middle_layers = num_layers - std::max<int64_t>(a, 0) - std::max<int64_t>(b, 0);
    if (middle_layers < 0 || (middle_stages > 0 && middle_layers % middle_stages != 0) ||
        (middle_stages == 0 && middle_layers != 0)) {
      f.fail(key, *f.text(key), "leaves " + std::to_string(middle_layers) + " layers that " +
                                    std::to_string(middle_stages) + " other stages cannot share evenly",
             "first and last stage counts whose remainder the other stages split evenly");
    }
    std::vector<int64_t> layers(size_t(pp), middle_stages > 0 ? middle_layers / middle_stages : 0);
    if (a >= 0) layers.front() = a;
    if (b >= 0) layers.back() = b;
    p["layers_per_stage"] = layers;
  }
  if (vpp > 1) {
    p["schedule"] = "interleaved_1f1b";
    p["virtual_pp_size"] = vpp;
  }
  if (f.on("no-overlap-p2p-communication")) p["overlap_p2p_comm"] = false;  // arguments.py:3118
}

void import_data_parallel(const MegatronFlags& f, Json& p, int64_t grad_bytes) {
  if (f.has("data-parallel-sharding-strategy") && !f.on("use-megatron-fsdp")) {
    f.fail("data-parallel-sharding-strategy", *f.text("data-parallel-sharding-strategy"),
           "is read by Megatron-FSDP only", "--use-megatron-fsdp with it, or neither");
  }
  if (f.on("use-megatron-fsdp")) {
    // no_shard, optim, optim_grads, optim_grads_params: ZeRO 0-3 (arguments.py:3190, default the last).
    std::string s = f.choice("data-parallel-sharding-strategy",
                             {"no_shard", "optim", "optim_grads", "optim_grads_params"}, "optim_grads_params");
    p["zero_stage"] = s == "no_shard" ? 0 : s == "optim" ? 1 : s == "optim_grads" ? 2 : 3;
  } else if (f.on("use-distributed-optimizer")) {
    p["zero_stage"] = 1;  // arguments.py:3156
  }
  if (f.has("num-distributed-optimizer-instances")) {
    p["num_distributed_optimizer_instances"] = *f.integer("num-distributed-optimizer-instances");
  }
  if (f.on("overlap-grad-reduce")) p["overlap_grad_reduce"] = true;
  if (f.on("no-gradient-accumulation-fusion")) p["gradient_accumulation_fusion"] = false;  // arguments.py:2944
  // Off unless given (model_parallel_config.py:320): Megatron's loss is then separate PyTorch ops.
  p["cross_entropy_loss_fusion"] = f.on("cross-entropy-loss-fusion");
  if (f.on("overlap-param-gather")) p["overlap_param_gather"] = true;
  // --ddp-bucket-size counts parameters (arguments.py:3125).
  if (f.has("ddp-bucket-size")) p["grad_bucket_bytes"] = double(*f.integer("ddp-bucket-size")) * double(grad_bytes);
}

void import_precision_and_recompute(const MegatronFlags& f, Json& p) {
  if (f.on("bf16") && f.on("fp16")) f.fail("fp16", "", "is given with --bf16 (arguments.py:1205)", "one of them");
  if (f.on("grad-reduce-in-bf16") && !f.on("bf16")) {
    f.fail("grad-reduce-in-bf16", "", "needs --bf16", "--bf16 with it, or neither");
  }
  p["dtype"] = f.on("bf16") ? "bf16" : f.on("fp16") ? "fp16" : "fp32";  // params_dtype fp32 by default
  p["grad_dtype"] = f.on("grad-reduce-in-bf16") ? "bf16" : "fp32";    // arguments.py:1204-1216
  std::string granularity = f.choice("recompute-granularity", {"full", "selective"}, "");
  if (f.on("recompute-activations")) {  // the old name of selective (arguments.py:2869)
    if (granularity == "full") {
      f.fail("recompute-activations", "", "(selective) contradicts --recompute-granularity full", "one of them");
    }
    granularity = "selective";
  }
  if (granularity == "selective") {
    if (f.has("recompute-method")) {
      f.fail("recompute-method", *f.text("recompute-method"),
             "is refused with selective recompute (arguments.py:1425-1428)", "no --recompute-method");
    }
    if (f.text("recompute-modules").value_or("core_attn") != "core_attn") {
      f.fail("recompute-modules", *f.text("recompute-modules"),
             "selective recompute of other modules than the core attention is not modelled", "core_attn");
    }
  }
  if (granularity == "full") {
    // stepcast recomputes each layer from its input: uniform over chunks of one layer.
    if (f.text("recompute-method").value_or("") != "uniform" || f.integer("recompute-num-layers").value_or(0) != 1) {
      f.fail(f.has("recompute-method") ? "recompute-method" : "recompute-granularity",
             f.has("recompute-method") ? *f.text("recompute-method") : "full",
             "full recompute is modelled layer by layer only", "--recompute-method uniform --recompute-num-layers 1");
    }
  } else if (f.has("recompute-method") || f.has("recompute-num-layers")) {
    const std::string key = f.has("recompute-method") ? "recompute-method" : "recompute-num-layers";
    f.fail(key, *f.text(key), "needs --recompute-granularity full", "--recompute-granularity full with it, or neither");
  }
  if (!granularity.empty()) p["recompute"] = granularity;
  // attention_backend (transformer_config.py:151): auto lets Transformer Engine pick a fused kernel.
  std::string backend = f.choice("attention-backend", {"auto", "flash", "fused", "unfused", "local"}, "auto");
  if (f.on("use-flash-attn") && (backend == "unfused" || backend == "local")) {
    f.fail("use-flash-attn", "", "contradicts --attention-backend " + backend, "one of them");
  }
  p["attention_impl"] = backend == "unfused" || backend == "local" ? "materialized" : "flash";
  const double hidden = f.number("hidden-dropout", 0, 0.99).value_or(0.1),   // transformer_config.py:188
      attention = f.number("attention-dropout", 0, 0.99).value_or(0.1);    // transformer_config.py:191
  if (hidden != attention) {
    f.fail("attention-dropout", *f.text(f.has("attention-dropout") ? "attention-dropout" : "hidden-dropout"),
           "differs from --hidden-dropout; stepcast has one dropout for both", "the same rate for both");
  }
  p["dropout"] = hidden;
}

}  // namespace

bool megatron_switch(const std::string& name) { return kSwitches.count(name) > 0; }

MegatronImport import_megatron_arguments(const std::string& text, const std::string& source,
                                         const std::string& name) {
  std::vector<MegatronFlag> all = read_megatron_flags(text, source), flags;
  std::map<std::string, int64_t> launcher;  // the launchers' integer flags, '-' as '_'
  for (MegatronFlag& flag : all) {
    if (!flag.launcher) {
      flags.push_back(flag);
      continue;
    }
    std::string key = flag.name;
    for (char& c : key) c = c == '-' ? '_' : c;
    try {
      size_t used = 0;
      int64_t n = std::stoll(flag.value, &used);
      if (used == flag.value.size() && n >= 1 && n < (int64_t{1} << 24)) launcher[key] = n;
    } catch (const std::exception&) {  // "$NNODES", "2:4" (elastic), ...: not a world size
    }
  }
  MegatronFlags f(flags, source);
  refuse_unmodelled(f);
  MegatronImport out;
  if (launcher.count("nproc_per_node")) {
    const int64_t nodes = launcher.count("nnodes") ? launcher.at("nnodes") : 1;
    out.world_size = nodes * launcher.at("nproc_per_node");
    out.world_from = "torchrun --nnodes " + std::to_string(nodes) + " --nproc_per_node " +
                     std::to_string(launcher.at("nproc_per_node"));
  }
  const int64_t tp = f.integer("tensor-model-parallel-size").value_or(1),
                pp = f.integer("pipeline-model-parallel-size").value_or(1),
                cp = f.integer("context-parallel-size").value_or(1);
  out.model = import_model(f, tp, name);
  Json& p = out.plan;
  p["name"] = name;
  p["tp_size"] = tp;
  p["pp_size"] = pp;
  import_moe(f, tp, out.model, p);
  if (cp > 1) p["context_parallel_size"] = cp;
  if (f.has("cp-comm-type")) p["cp_comm_type"] = f.choice("cp-comm-type", {"p2p", "allgather", "a2a"}, "p2p");
  // Transformer Engine's FP8 (arguments.py, _add_transformer_engine_args): the plan's fp8 keys,
  // whose values the plan checks.
  for (const char* flag : {"fp8-format", "fp8-recipe", "fp8-amax-compute-algo"}) {
    std::string key = std::string(flag) == "fp8-format" ? "fp8" : std::string(flag);
    std::replace(key.begin(), key.end(), '-', '_');
    if (f.has(flag)) p[key] = *f.text(flag);
  }
  // The amax history, its algorithm and the margin configure delayed scaling only (Megatron passes
  // them to Transformer Engine's DelayedScaling alone: transformer_engine.py, get_fp8_recipe).
  if (f.has("fp8-recipe") && *f.text("fp8-recipe") != "delayed") {
    p.erase("fp8_amax_compute_algo");
  } else {
    if (f.has("fp8-amax-history-len")) p["fp8_amax_history_len"] = *f.integer("fp8-amax-history-len", 0);
    if (f.has("fp8-margin")) p["fp8_margin"] = *f.integer("fp8-margin", 0);
  }
  if (f.on("fp8-param-gather")) p["fp8_param_gather"] = true;  // arguments.py:2016 (the plan checks its rules)
  // Megatron turns sequence parallelism off without tensor parallelism (arguments.py:1433-1439).
  if (f.on("sequence-parallel") && tp > 1) p["sequence_parallel"] = true;
  if (f.on("use-tp-pp-dp-mapping")) p["order"] = "tp-pp-dp";  // training/initialize.py:395
  p["micro_batch_size"] = f.required("micro-batch-size");
  if (f.has("global-batch-size")) p["global_batch_size"] = *f.integer("global-batch-size");
  import_pipeline(f, out.model["num_hidden_layers"].get<int64_t>(), pp, p);
  import_precision_and_recompute(f, p);
  import_data_parallel(f, p, p["grad_dtype"] == "bf16" ? 2 : 4);
  for (const auto& [flag, value] : f.all()) {
    if (!kRead.count(flag) && ignored_flag(flag)) out.ignored.push_back("--" + flag);
  }
  return out;
}

}  // namespace stepcast
