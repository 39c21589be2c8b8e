// Asynchronous data parallelism with parameter servers (plan data_parallel_mode "async" with
// parameter_servers S): the dp workers (ranks 0 … dp − 1, one replica each: tp, pp and cp 1) train
// at their own pace; server j (rank dp + j) holds slice j of every parameter group's weights and
// optimizer state. A worker's step pulls the weights' slices from every server, runs its
// microbatches, computes its gradient's norm and pushes the norm and the gradient's slices to
// every server, which applies each push as it arrives (AdamW, clipped by the pushing worker's
// norm) — one update per worker step — and sends the worker its slices of the weights for its
// next step. Stale synchronous parallelism (Ho et al., NIPS 2013) bounds the staleness: a
// worker's step c is answered (its weights sent) once every worker has pushed step
// c − 1 − staleness, so no worker runs more than `staleness` steps ahead of the slowest.
// The servers send every worker the initial weights as the run starts.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace stepcast {

struct Plan;
struct ModelConfig;
struct Topology;
class ObjectReader;

// Reads the plan key parameter_servers (an integer >= 1, only with data_parallel_mode "async").
void read_parameter_servers(ObjectReader& reader, Plan& plan);

// Checks a plan with parameter servers: dp_size given (the workers; the servers take
// parameter_servers more devices, which the topology must have), tp, pp and cp 1, ZeRO-0, no
// experts, no FP8, equal replicas, no overlap options. Throws InputError naming the plan file,
// the key, the value and what is valid.
void validate_parameter_servers(const Plan& plan, const ModelConfig& model, const Topology& topology);

// Server `server`'s slice [first, last) of a parameter group of `elements` (contiguous, the
// first servers one element more where S does not divide it).
std::pair<int64_t, int64_t> server_slice(int64_t elements, int64_t servers, int64_t server);

// Message tags between a worker and a server: per parameter group g (in the role's order) the
// weights' slice (pull) and the gradient's slice (push), and the gradient norm's square.
inline int64_t ps_pull_tag(int64_t group) { return 2 * group; }
inline int64_t ps_push_tag(int64_t group) { return 2 * group + 1; }
inline constexpr int64_t kPsNormTag = 1 << 20;

// Stale synchronous parallelism: may a worker start step `step`, given the steps every worker
// has pushed (pushes[w] = steps of worker w applied)? Step 0 always.
bool ssp_may_start(const std::vector<int64_t>& pushes, int64_t step, int64_t staleness);

}  // namespace stepcast
