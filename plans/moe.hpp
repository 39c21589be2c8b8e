// A plan's mixture-of-experts settings in Megatron-LM's names (expert_model_parallel_size,
// expert_tensor_parallel_size, moe_router_topk, moe_expert_capacity_factor,
// moe_token_dispatcher_type) and the routing distribution tokens follow (uniform, a skew, or a
// measured histogram, with a seed), and the routing draw: how many tokens each expert receives in
// one (microbatch, layer). Pure data and arithmetic; the plan file's reading is plan.cpp's, the
// checks against the model are validate_moe_plan.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "json_input.hpp"
#include "model.hpp"

namespace stepcast {

// alltoall: tokens go to their experts' ranks over the expert-parallel group and come back
// (stepcast's default; Megatron-LM's is allgather); allgather: every rank gathers the ep group's tokens and keeps its
// experts' (the reverse a reduce_scatter).
enum class MoeDispatcher { alltoall, allgather };
const char* to_string(MoeDispatcher kind);
enum class RoutingKind { uniform, skew, histogram };
const char* to_string(RoutingKind kind);

struct MoePlan {
  int64_t ep_size = 1;    // expert_model_parallel_size: experts split over the dp×cp ranks of a stage
  int64_t etp_size = 0;   // expert_tensor_parallel_size: each expert's width split (resolved: tp_size)
  int64_t top_k = 0;      // moe_router_topk (resolved: the model's num_experts_per_tok)
  double capacity_factor = 0;  // moe_expert_capacity_factor; 0: dropless (absent)
  // moe_pad_expert_input_to_capacity (Megatron's, default false): each expert computes its capacity
  // of rows, padded, rather than the copies the routing keeps.
  bool pad_to_capacity = false;
  // moe_token_drop_policy (Megatron's, default "probs"): under a capacity each expert keeps the
  // copies of highest routing weight (true) or its first copies in token order ("position").
  bool drop_by_probs = true;
  MoeDispatcher dispatcher = MoeDispatcher::alltoall;
  RoutingKind routing = RoutingKind::uniform;
  double skew = 0;                 // Zipf exponent: expert e gets a share ∝ 1/(e+1)^skew
  std::string histogram_file;      // tokens per expert measured (a JSON file), as the plan names it
  std::string histogram_path;      // resolved: that file's absolute path (the plan's folder for a relative one)
  // Resolved: the file's counts, one row for every MoE layer, or a row per MoE layer (in layer
  // order, as `stepcast run` writes moe-routing.json).
  std::vector<std::vector<double>> histogram;
  int64_t first_moe_layer = 0;     // resolved: the model's first_k_dense_replace (histogram rows)
  // The histogram file's "samples": per MoE layer, the copies per expert of each (step, microbatch,
  // expert block) a run routed (`stepcast run` writes them); each (microbatch, layer) of the
  // simulation then replays one of its layer's samples instead of a draw from the shares.
  std::vector<std::vector<std::vector<int64_t>>> samples;
  uint64_t seed = 1;               // moe_routing_seed
  // moe_dropless_buffers: dropless dispatch buffers sized by the heaviest load the routing draws
  // give (false, "draws": the default), or for any routing (true, "any_routing": every token copy
  // of an expert block may reach one rank), which real routing can never overflow.
  bool dropless_any_routing = false;
  // Microbatches whose routing draws size the dropless buffers; 0: the plan's own. The planner
  // lowers fewer microbatches than the step has (memory_path_plan) and sets the step's count,
  // so that its buffers are the step's; −1: no draws (shapes and parameters only, the dispatch
  // buffers left unsized: the planner's persistent bound). Not a plan key.
  int64_t draw_microbatches = 0;
  bool set = false;                // any MoE key in the plan
  std::string set_key;             // the first of them (in kMoeKeys' order), for refusals
  bool dropless() const { return capacity_factor <= 0; }
};

// Reads the plan's MoE keys (histogram files relative to the plan's folder).
MoePlan read_moe_plan(ObjectReader& reader, const std::string& plan_file);
// Refuses a histogram routing that does not fit the model (its experts, its MoE layers), naming
// file `f` and `key`.
void check_routing_histogram(const MoePlan& moe, const std::string& f, const std::string& key,
                             const ModelConfig& model);
// The routing of the histogram file at `path` (its rows, and samples where it has them), named
// by `named_by` (a plan file, or a command-line option) in refusals.
void read_routing_histogram(MoePlan& moe, const std::string& path, const std::string& named_by);
// Resolves defaults from the model and refuses every invalid combination naming file, key, value
// and what is valid. `stage_ranks`: tp·cp·dp, the ranks of one pipeline stage experts lay over.
void validate_moe_plan(MoePlan& moe, const std::string& plan_file, const ModelConfig& model, int64_t tp_size,
                       int64_t stage_ranks, bool sequence_parallel);
void moe_plan_to_json(const MoePlan& moe, Json& out);
// Hybrid sharding (`instances` optimizer instances, already checked against dp·cp) with experts:
// the instances must divide edp (Megatron's intra-partial expert data-parallel groups), and each
// instance must hold whole blocks of expert shards (rank_grid.hpp), which Megatron's orders do.
// (`moe` resolved by validate_moe_plan; sizes and order the plan's.)
void validate_moe_hybrid_sharding(const MoePlan& moe, const std::string& plan_file, int64_t tp_size, int64_t cp_size,
                                  int64_t dp_size, int64_t pp_size, const std::string& order, int64_t instances);

// The share of routed tokens each expert expects (sums to 1): over every MoE layer (a histogram's
// rows summed), or in the model's layer `layer` (its own row where the histogram has one per layer).
std::vector<double> routing_shares(const MoePlan& moe, int64_t num_experts);
std::vector<double> routing_shares(const MoePlan& moe, int64_t num_experts, int64_t layer);
// Whether the shares differ by layer (a histogram with a row per MoE layer).
bool routing_per_layer(const MoePlan& moe);
// The measured samples layer `layer` replays (empty: the layer draws from its shares).
const std::vector<std::vector<int64_t>>& routing_samples(const MoePlan& moe, int64_t layer);
// Tokens each of the experts receives when `tokens` token-copies (tokens × top-k) are routed in
// (microbatch, layer): a draw from the shares keyed on (seed, microbatch, layer), the same on every
// platform (its own hash generator, normal approximation of the multinomial); sums to `tokens`.
std::vector<int64_t> draw_routing(const std::vector<double>& shares, int64_t tokens, uint64_t seed,
                                  int64_t microbatch, int64_t layer);
// `sample`'s counts scaled to `tokens` copies (largest remainders; ties to the lower expert).
std::vector<int64_t> scale_routing(const std::vector<int64_t>& sample, int64_t tokens);
// The counts of (microbatch, layer) replayed from measured samples (one of `samples`, picked by a
// hash of (seed, microbatch, layer)), scaled to `tokens` copies (largest remainders); sums to
// `tokens`.
std::vector<int64_t> replay_routing(const std::vector<std::vector<int64_t>>& samples, int64_t tokens, uint64_t seed,
                                    int64_t microbatch, int64_t layer);
// Token copies routed to each of `experts` experts by route_idx (expert e, or −1 − e for a copy
// its capacity dropped: counted too, as the aux loss counts them).
std::vector<double> routed_copies(const int32_t* route_idx, int64_t copies, int64_t experts);
// Capacity of one expert under a capacity factor, for `tokens` token-copies over `experts`
// (Megatron's get_capacity: ceil(tokens / experts · factor)).
int64_t expert_capacity(int64_t tokens, int64_t experts, double capacity_factor);

}  // namespace stepcast
