// MoE plan keys, their checks against the model, and the routing draw; see moe.hpp.
#include "moe.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>

#include "errors.hpp"
#include "rank_grid.hpp"

namespace stepcast {

const char* to_string(MoeDispatcher kind) { return kind == MoeDispatcher::allgather ? "allgather" : "alltoall"; }

const char* to_string(RoutingKind kind) {
  switch (kind) {
    case RoutingKind::uniform: return "uniform";
    case RoutingKind::skew: return "skew";
    case RoutingKind::histogram: return "histogram";
  }
  return "?";
}

namespace {

const std::vector<std::string> kMoeKeys = {
    "expert_model_parallel_size", "expert_tensor_parallel_size", "moe_router_topk", "moe_expert_capacity_factor",
    "moe_token_dispatcher_type", "moe_routing", "moe_routing_skew", "moe_routing_histogram", "moe_routing_seed",
    "moe_dropless_buffers", "moe_pad_expert_input_to_capacity", "moe_token_drop_policy"};

// An array of token counts of a histogram file (`key` in `path`): non-empty, integers >= 0 summing
// to more than 0; `valid` says what the key takes.
std::vector<int64_t> read_counts(const std::string& path, const std::string& key, const Json& row,
                                 const std::string& valid) {
  if (!row.is_array() || row.empty()) {
    throw_input_error(path, key, row.dump().substr(0, 60), "not a non-empty array", valid);
  }
  std::vector<int64_t> counts;
  for (const Json& c : row) {
    if (!c.is_number_integer() || c.get<int64_t>() < 0) {
      throw_input_error(path, key, c.dump(), "is not a token count", "integers >= 0");
    }
    counts.push_back(c.get<int64_t>());
  }
  if (std::accumulate(counts.begin(), counts.end(), int64_t(0)) <= 0) {
    throw_input_error(path, key, row.dump().substr(0, 60), "sums to 0", "some tokens");
  }
  return counts;
}

// A histogram file: {"tokens_per_expert": [counts] for every MoE layer, or [[counts], ...] a row
// per MoE layer in layer order; "total_tokens": N (optional: then all the counts must sum to it),
// "samples": [[[counts], ...], ...] (optional: per MoE layer, the counts of each routed
// microbatch), "notes": "..."}. `stepcast run` writes one per run (moe-routing.json).
std::vector<std::vector<double>> load_histogram(const std::string& path, const std::string& plan_file,
                                                std::vector<std::vector<std::vector<int64_t>>>& samples) {
  Json json = load_json_file(path);
  ObjectReader reader(json, path);
  reader.accept("notes");
  reader.accept("tokens_per_expert");
  reader.accept("samples");
  std::optional<int64_t> total = reader.get_optional_int("total_tokens", 1);
  if (!json.contains("tokens_per_expert")) {
    reader.fail("tokens_per_expert", "missing required key", "an array of tokens routed to each expert");
  }
  reader.finish();
  const Json& counts = json.at("tokens_per_expert");
  const std::string valid = "an array of tokens routed to each expert, or an array of such arrays (one per MoE "
                            "layer), named by " + plan_file;
  if (!counts.is_array() || counts.empty()) {
    throw_input_error(path, "tokens_per_expert", counts.dump().substr(0, 60), "not a non-empty array", valid);
  }
  const bool per_layer = counts.front().is_array();
  std::vector<std::vector<double>> rows;
  double sum = 0;
  for (size_t l = 0; l < (per_layer ? counts.size() : 1); ++l) {
    const std::string key = per_layer ? "tokens_per_expert[" + std::to_string(l) + "]" : "tokens_per_expert";
    const std::vector<int64_t> row = read_counts(path, key, per_layer ? counts[l] : counts, valid);
    rows.emplace_back(row.begin(), row.end());
    if (rows.back().size() != rows.front().size()) {
      throw_input_error(path, key, std::to_string(rows.back().size()) + " counts",
                        "differs from the " + std::to_string(rows.front().size()) + " of tokens_per_expert[0]",
                        "the same number of experts in every layer's row");
    }
    sum += std::accumulate(rows.back().begin(), rows.back().end(), 0.0);
  }
  if (total && double(*total) != sum) {
    throw_input_error(path, "total_tokens", std::to_string(*total),
                      "differs from the sum of tokens_per_expert (" + std::to_string(int64_t(sum)) + ")",
                      "the sum of tokens_per_expert, or no total_tokens");
  }
  samples.clear();
  if (json.contains("samples")) {
    const Json& layers = json.at("samples");
    const size_t experts = rows.front().size();
    const std::string valid_samples = "per MoE layer (as many as tokens_per_expert's rows), a non-empty array of "
                                      "samples, each " + std::to_string(experts) + " token counts";
    if (!layers.is_array() || layers.size() != rows.size()) {
      throw_input_error(path, "samples", layers.dump().substr(0, 60),
                        "is not an array with a layer per row of tokens_per_expert (" + std::to_string(rows.size()) +
                            ")",
                        valid_samples);
    }
    for (size_t l = 0; l < layers.size(); ++l) {
      const std::string key = "samples[" + std::to_string(l) + "]";
      if (!layers[l].is_array() || layers[l].empty()) {
        throw_input_error(path, key, layers[l].dump().substr(0, 60), "not a non-empty array", valid_samples);
      }
      samples.emplace_back();
      for (size_t i = 0; i < layers[l].size(); ++i) {
        const Json& one = layers[l][i];
        const std::string at = key + "[" + std::to_string(i) + "]";
        if (!one.is_array() || one.size() != experts) {
          throw_input_error(path, at, one.dump().substr(0, 60), "is not " + std::to_string(experts) + " counts",
                            valid_samples);
        }
        samples.back().push_back(read_counts(path, at, one, valid_samples));
      }
    }
  }
  return rows;
}

uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

double standard_normal(uint64_t key) {
  double u1 = (double(mix(key) >> 11) + 0.5) * 0x1.0p-53;
  double u2 = (double(mix(key ^ 0x5851F42D4C957F2Dull) >> 11) + 0.5) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * M_PI * u2);
}

}  // namespace

void read_routing_histogram(MoePlan& moe, const std::string& path, const std::string& named_by) {
  moe.routing = RoutingKind::histogram;
  moe.histogram_file = path;
  moe.histogram_path = std::filesystem::absolute(path).lexically_normal().string();
  moe.histogram = load_histogram(path, named_by, moe.samples);
}

MoePlan read_moe_plan(ObjectReader& reader, const std::string& plan_file) {
  MoePlan moe;
  for (const auto& key : kMoeKeys) {
    if (!moe.set && reader.has(key)) moe.set_key = key;
    moe.set = moe.set || reader.has(key);
  }
  moe.ep_size = reader.get_int_or("expert_model_parallel_size", 1, 1);
  moe.etp_size = reader.get_int_or("expert_tensor_parallel_size", 1, 0);
  moe.top_k = reader.get_int_or("moe_router_topk", 1, 0);
  if (reader.has("moe_expert_capacity_factor")) {
    moe.capacity_factor = reader.get_number("moe_expert_capacity_factor", -1e300, false);
    if (!(moe.capacity_factor > 0)) {
      reader.fail("moe_expert_capacity_factor", "must be > 0 (tokens an expert takes, in units of its even share)",
                  "a number > 0, e.g. 1.0 or 1.25; absent for dropless routing");
    }
  }
  moe.pad_to_capacity = reader.get_bool_or("moe_pad_expert_input_to_capacity", false);
  if (moe.pad_to_capacity && moe.dropless()) {  // Megatron's rule (transformer_config.py:1862-1866)
    reader.fail("moe_pad_expert_input_to_capacity", "pads each expert's input to its capacity, and the plan has none",
                "false, or a moe_expert_capacity_factor beside it");
  }
  moe.drop_by_probs = reader.get_enum_or("moe_token_drop_policy", {"probs", "position"}, "probs") == "probs";
  if (reader.has("moe_token_drop_policy") && moe.dropless()) {  // (Megatron ignores it: nothing is dropped)
    reader.fail("moe_token_drop_policy", "chooses the copies a capacity drops, and the plan has none",
                "no moe_token_drop_policy, or a moe_expert_capacity_factor beside it");
  }
  moe.dispatcher = reader.get_enum_or("moe_token_dispatcher_type", {"alltoall", "allgather"}, "alltoall") == "allgather"
                       ? MoeDispatcher::allgather
                       : MoeDispatcher::alltoall;
  std::string routing = reader.get_enum_or("moe_routing", {"uniform", "skew", "histogram"}, "uniform");
  moe.routing = routing == "skew" ? RoutingKind::skew : routing == "histogram" ? RoutingKind::histogram : RoutingKind::uniform;
  if (reader.has("moe_routing_skew") && moe.routing != RoutingKind::skew) {
    reader.fail("moe_routing_skew", "is set but moe_routing is \"" + routing + "\"", "moe_routing \"skew\" beside it");
  }
  if (reader.has("moe_routing_histogram") && moe.routing != RoutingKind::histogram) {
    reader.fail("moe_routing_histogram", "is set but moe_routing is \"" + routing + "\"",
                "moe_routing \"histogram\" beside it");
  }
  if (moe.routing == RoutingKind::skew) {
    if (!reader.has("moe_routing_skew")) {
      reader.fail("moe_routing_skew", "missing: moe_routing \"skew\" needs its exponent",
                  "a number >= 0 (expert e's share ∝ 1/(e+1)^skew; 0 is uniform)");
    }
    moe.skew = reader.get_number("moe_routing_skew", 0.0, false);
  }
  if (moe.routing == RoutingKind::histogram) {
    if (!reader.has("moe_routing_histogram")) {
      reader.fail("moe_routing_histogram", "missing: moe_routing \"histogram\" needs the file",
                  "a JSON file of tokens_per_expert, relative to the plan");
    }
    const std::string file = reader.get_string("moe_routing_histogram");
    std::filesystem::path path(file);
    if (path.is_relative()) path = std::filesystem::path(plan_file).parent_path() / path;
    read_routing_histogram(moe, path.string(), plan_file);
    moe.histogram_file = file;
  }
  moe.seed = uint64_t(reader.get_int_or("moe_routing_seed", 0, 1));
  moe.dropless_any_routing = reader.get_enum_or("moe_dropless_buffers", {"draws", "any_routing"}, "draws") == "any_routing";
  if (moe.dropless_any_routing && !moe.dropless()) {
    reader.fail("moe_dropless_buffers", "\"any_routing\" sizes dropless buffers, and the plan has a capacity factor",
                "\"draws\" (or absent) with moe_expert_capacity_factor, whose capacity sizes the buffers");
  }
  return moe;
}

void validate_moe_plan(MoePlan& moe, const std::string& f, const ModelConfig& model, int64_t tp_size,
                       int64_t stage_ranks, bool sequence_parallel) {
  if (!model.is_moe()) {
    if (moe.set) {
      // The key the plan set, with the value read from it.
      const std::string& k = moe.set_key;
      auto quoted = [](const std::string& s) { return "\"" + s + "\""; };
      const std::string value =
          k == "expert_model_parallel_size"    ? std::to_string(moe.ep_size)
          : k == "expert_tensor_parallel_size" ? std::to_string(moe.etp_size)
          : k == "moe_router_topk"             ? std::to_string(moe.top_k)
          : k == "moe_expert_capacity_factor"  ? Json(moe.capacity_factor).dump()
          : k == "moe_token_dispatcher_type"   ? quoted(to_string(moe.dispatcher))
          : k == "moe_routing"                 ? quoted(to_string(moe.routing))
          : k == "moe_routing_skew"            ? Json(moe.skew).dump()
          : k == "moe_routing_histogram"       ? quoted(moe.histogram_file)
          : k == "moe_routing_seed"            ? std::to_string(moe.seed)
          : k == "moe_token_drop_policy"       ? quoted(moe.drop_by_probs ? "probs" : "position")
                                               : quoted(moe.dropless_any_routing ? "any_routing" : "draws");
      throw_input_error(f, k, value, "the model " + model.file + " has no experts",
                        "no expert_* or moe_* keys, or a model with num_local_experts");
    }
    moe.etp_size = 1;
    return;
  }
  const int64_t E = model.num_experts;
  if (moe.top_k == 0) moe.top_k = model.num_experts_per_tok;
  if (moe.etp_size == 0) moe.etp_size = tp_size;  // Megatron: expert_tensor_parallel_size defaults to tp
  if (moe.top_k > E) {
    throw_input_error(f, "moe_router_topk", std::to_string(moe.top_k),
                      "exceeds the " + std::to_string(E) + " experts of " + model.file,
                      "an integer in [1, " + std::to_string(E) + "]");
  }
  if (E % moe.ep_size != 0) {
    throw_input_error(f, "expert_model_parallel_size", std::to_string(moe.ep_size),
                      "does not divide the " + std::to_string(E) + " experts of " + model.file,
                      "a divisor of " + std::to_string(E));
  }
  if (model.moe_intermediate_size % moe.etp_size != 0) {
    throw_input_error(f, "expert_tensor_parallel_size", std::to_string(moe.etp_size),
                      "does not divide the expert width moe_intermediate_size = " +
                          std::to_string(model.moe_intermediate_size) + " of " + model.file,
                      "a divisor of " + std::to_string(model.moe_intermediate_size));
  }
  if (stage_ranks % (moe.ep_size * moe.etp_size) != 0) {
    throw_input_error(f, "expert_model_parallel_size", std::to_string(moe.ep_size),
                      "times expert_tensor_parallel_size = " + std::to_string(moe.etp_size) +
                          " does not divide the " + std::to_string(stage_ranks) +
                          " ranks of a pipeline stage (tp_size · context_parallel_size · dp_size) the experts lay over",
                      "ep · etp a divisor of " + std::to_string(stage_ranks));
  }
  const int64_t shared = model.n_shared_experts * model.moe_intermediate_size;
  if (shared % tp_size != 0) {
    throw_input_error(f, "tp_size", std::to_string(tp_size),
                      "does not divide the shared experts' width n_shared_experts · moe_intermediate_size = " +
                          std::to_string(shared) + " of " + model.file,
                      "a divisor of " + std::to_string(shared));
  }
  if (tp_size > 1 && !sequence_parallel) {  // Megatron-LM's rule (transformer_config.py)
    throw_input_error(f, "sequence_parallel", "false",
                      "a mixture of experts with tensor parallelism needs sequence parallelism "
                      "(the router and dispatch work on each rank's own tokens)",
                      "true, or tp_size 1");
  }
  moe.first_moe_layer = model.first_k_dense_replace;
  check_routing_histogram(moe, f, "moe_routing_histogram", model);
}

void check_routing_histogram(const MoePlan& moe, const std::string& f, const std::string& key,
                             const ModelConfig& model) {
  if (moe.routing != RoutingKind::histogram) return;
  const int64_t E = model.num_experts;
  if (int64_t(moe.histogram.front().size()) != E) {
    throw_input_error(f, key, "\"" + moe.histogram_file + "\"",
                      "has " + std::to_string(moe.histogram.front().size()) + " experts' counts, the model " +
                          model.file + " has " + std::to_string(E),
                      "a histogram of " + std::to_string(E) + " counts");
  }
  const int64_t moe_layers = model.num_moe_layers();
  if (routing_per_layer(moe) && int64_t(moe.histogram.size()) != moe_layers) {
    throw_input_error(f, key, "\"" + moe.histogram_file + "\"",
                      "has " + std::to_string(moe.histogram.size()) + " rows of counts, the model " + model.file +
                          " has " + std::to_string(moe_layers) + " MoE layers",
                      "one row for every MoE layer, or a row per MoE layer (" + std::to_string(moe_layers) + ")");
  }
}

void moe_plan_to_json(const MoePlan& moe, Json& out) {
  if (moe.top_k == 0) return;  // a dense model: absent (outputs of dense plans keep their bytes)
  out["expert_model_parallel_size"] = moe.ep_size;
  out["expert_tensor_parallel_size"] = moe.etp_size;
  out["moe_router_topk"] = moe.top_k;
  if (!moe.dropless()) out["moe_expert_capacity_factor"] = moe.capacity_factor;
  if (moe.pad_to_capacity) out["moe_pad_expert_input_to_capacity"] = true;
  if (!moe.dropless()) out["moe_token_drop_policy"] = moe.drop_by_probs ? "probs" : "position";
  out["moe_token_dispatcher_type"] = to_string(moe.dispatcher);
  out["moe_routing"] = to_string(moe.routing);
  if (moe.routing == RoutingKind::skew) out["moe_routing_skew"] = moe.skew;
  // (the file as resolved: a program's plan, read again, finds it wherever the plan was)
  if (moe.routing == RoutingKind::histogram) out["moe_routing_histogram"] = moe.histogram_path;
  out["moe_routing_seed"] = moe.seed;
  if (moe.dropless_any_routing) out["moe_dropless_buffers"] = "any_routing";
}

bool routing_per_layer(const MoePlan& moe) {
  return moe.routing == RoutingKind::histogram && moe.histogram.size() > 1;
}

const std::vector<std::vector<int64_t>>& routing_samples(const MoePlan& moe, int64_t layer) {
  static const std::vector<std::vector<int64_t>> none;
  if (moe.routing != RoutingKind::histogram || moe.samples.empty() || layer < moe.first_moe_layer) return none;
  return moe.samples.size() == 1 ? moe.samples.front() : moe.samples.at(size_t(layer - moe.first_moe_layer));
}

std::vector<double> routing_shares(const MoePlan& moe, int64_t num_experts) {
  return routing_shares(moe, num_experts, -1);
}

std::vector<double> routing_shares(const MoePlan& moe, int64_t num_experts, int64_t layer) {
  std::vector<double> shares(size_t(num_experts), 1.0);
  if (moe.routing == RoutingKind::skew) {
    for (int64_t e = 0; e < num_experts; ++e) shares[size_t(e)] = 1.0 / std::pow(double(e + 1), moe.skew);
  } else if (moe.routing == RoutingKind::histogram && routing_per_layer(moe) && layer >= 0) {
    shares = moe.histogram.at(size_t(layer - moe.first_moe_layer));
  } else if (moe.routing == RoutingKind::histogram) {
    shares.assign(size_t(num_experts), 0.0);
    for (const std::vector<double>& row : moe.histogram) {
      for (size_t e = 0; e < shares.size(); ++e) shares[e] += row.at(e);
    }
  }
  double sum = std::accumulate(shares.begin(), shares.end(), 0.0);
  for (double& s : shares) s /= sum;
  return shares;
}

std::vector<int64_t> draw_routing(const std::vector<double>& shares, int64_t tokens, uint64_t seed,
                                  int64_t microbatch, int64_t layer) {
  // Sequential binomials: expert e takes Binomial(left, share_e / share_left) of the tokens left,
  // each approximated by a normal rounded and clamped; the last takes the rest.
  std::vector<int64_t> counts(shares.size(), 0);
  int64_t left = tokens;
  double share_left = 1.0;
  uint64_t key = mix(seed ^ mix(uint64_t(microbatch) * 0x100000001B3ull ^ mix(uint64_t(layer))));
  for (size_t e = 0; e + 1 < shares.size() && left > 0; ++e) {
    double p = share_left > 0 ? std::clamp(shares[e] / share_left, 0.0, 1.0) : 0.0;
    double mean = double(left) * p, sd = std::sqrt(double(left) * p * (1 - p));
    int64_t c = int64_t(std::llround(mean + sd * standard_normal(mix(key ^ uint64_t(e)))));
    counts[e] = std::clamp<int64_t>(c, 0, left);
    left -= counts[e];
    share_left -= shares[e];
  }
  if (!shares.empty()) counts.back() += left;
  return counts;
}

std::vector<int64_t> replay_routing(const std::vector<std::vector<int64_t>>& samples, int64_t tokens, uint64_t seed,
                                    int64_t microbatch, int64_t layer) {
  const uint64_t key = mix(seed ^ mix(uint64_t(microbatch) * 0x100000001B3ull ^ mix(uint64_t(layer))));
  return scale_routing(samples.at(size_t(key % samples.size())), tokens);
}

std::vector<int64_t> scale_routing(const std::vector<int64_t>& sample, int64_t tokens) {
  const double total = double(std::accumulate(sample.begin(), sample.end(), int64_t(0)));
  std::vector<int64_t> counts(sample.size());
  std::vector<std::pair<double, size_t>> remainders;
  int64_t left = tokens;
  for (size_t e = 0; e < sample.size(); ++e) {
    const double exact = double(sample[e]) * double(tokens) / total;
    counts[e] = int64_t(std::floor(exact));
    left -= counts[e];
    remainders.emplace_back(exact - double(counts[e]), e);
  }
  std::stable_sort(remainders.begin(), remainders.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; left > 0 && i < remainders.size(); ++i, --left) ++counts[remainders[i].second];
  return counts;
}

std::vector<double> routed_copies(const int32_t* route_idx, int64_t copies, int64_t experts) {
  std::vector<double> chosen(size_t(experts), 0.0);
  for (int64_t i = 0; i < copies; ++i) {
    const int32_t r = route_idx[i];
    chosen[size_t(r >= 0 ? r : -1 - r)] += 1;
  }
  return chosen;
}

int64_t expert_capacity(int64_t tokens, int64_t experts, double capacity_factor) {
  return int64_t(std::ceil(double(tokens) / double(experts) * capacity_factor));
}

void validate_moe_hybrid_sharding(const MoePlan& moe, const std::string& plan_file, int64_t tp_size, int64_t cp_size,
                                  int64_t dp_size, int64_t pp_size, const std::string& order, int64_t instances) {
  const std::string key = "num_distributed_optimizer_instances", value = std::to_string(instances);
  const int64_t edp = tp_size * cp_size * dp_size / (moe.ep_size * moe.etp_size);
  if (edp % instances != 0) {
    throw_input_error(plan_file, key, value,
                      "must divide the expert data-parallel size too (tp·cp·dp / (ep·etp) = " + std::to_string(edp) +
                          " with expert_model_parallel_size " + std::to_string(moe.ep_size) +
                          " and expert_tensor_parallel_size " + std::to_string(moe.etp_size) +
                          "): each instance shards the experts over its own ranks",
                      "a divisor of both " + std::to_string(dp_size * cp_size) + " and " + std::to_string(edp));
  }
  const RankGrid grid(tp_size, dp_size, pp_size, order, dp_size * cp_size / instances, cp_size, moe.ep_size,
                      moe.etp_size);
  if (!grid.expert_shards_within_instances()) {
    throw_input_error(plan_file, "order", "\"" + order + "\"",
                      "puts the ranks of an optimizer instance across the experts' shard groups (with " + key +
                          " " + value + "), so no instance holds each expert shard once",
                      "an order with tp innermost, then cp, then dp (Megatron's \"tp-dp-pp\", \"tp-pp-dp\")");
  }
}

}  // namespace stepcast
