// Sequence parallelism's replicated gradients (norms, learned positions: each tp rank's partial
// sum from its sequence shard): their tp all_reduce once a step on unsharded gradients, per
// microbatch on the full gradient before its reduce_scatter under ZeRO-2/3.
#include <catch2/catch.hpp>

#include <algorithm>

#include "lower.hpp"
#include "lower_fixtures.hpp"
#include "program_check.hpp"
#include "test_support.hpp"

using namespace stepcast;
using namespace stepcast::test;

TEST_CASE("sequence parallel: replicated gradients summed over tp once a step or per microbatch when sharded",
          "[lower]") {
  // tp 2, dp 2, 4 microbatches of tiny (its layers, its final norm). ZeRO-1: one all_reduce of every
  // group's replicated part at the step's end. ZeRO-2/3: one per group and microbatch, on the
  // microbatch's full gradient, before the bucket's reduce_scatter reads it.
  ModelConfig model = load_model(source_path("models/tiny.json"));
  Topology topology = load_topology(source_path("topologies/dgx-a100-80gb.json"), 1);
  Json j = {{"tp_size", 2},        {"dp_size", 2},           {"sequence_parallel", true},
            {"micro_batch_size", 1}, {"global_batch_size", 8}, {"zero_stage", 1}};
  for (int zero : {1, 2, 3}) {
    j["zero_stage"] = zero;
    StepProgram p = lower_program(model, topology, make_plan(j, model, topology));
    std::vector<std::string> errors = check_program(p);
    INFO("ZeRO-" << zero << ": " << (errors.empty() ? std::string() : errors.front()));
    CHECK(errors.empty());
    const Role& role = p.roles[0];
    int reductions = 0;
    double bytes = 0;
    for (const Op& op : role.ops) {
      if (op.name != OpName::sp_replicated_grads) continue;
      ++reductions;
      bytes += op.bytes;
      CHECK(op.kind == OpKind::all_reduce);
      CHECK(op.group == GroupKind::tp);
      CHECK((op.phase == Phase::optimizer) == (zero == 1));
      if (zero == 1) continue;
      // Its buffer is a microbatch's full gradient, and the next reader of it is the reduce_scatter.
      REQUIRE(op.inputs.size() == 1);
      CHECK(op.inputs[0].str().rfind("gradfull.", 0) == 0);
      bool read_by_bucket = false;
      for (size_t k = size_t(op.id) + 1; k < role.ops.size() && !read_by_bucket; ++k) {
        const Op& later = role.ops[k];
        if (std::find(later.inputs.begin(), later.inputs.end(), op.inputs[0]) == later.inputs.end()) continue;
        CHECK(later.name == OpName::grad_bucket);
        read_by_bucket = true;
      }
      CHECK(read_by_bucket);
    }
    // The replicated elements: 2 RMSNorm weights a layer and the final norm's, of h each.
    const int64_t layers = model.num_hidden_layers;
    const double replicated =
        double(2 * layers + 1) * double(model.hidden_size) * dtype_bytes(make_plan(j, model, topology).grad_dtype);
    CHECK(reductions == (zero == 1 ? 1 : 4 * (layers + 1)));  // per microbatch, each layer and the final norm
    CHECK(bytes == Approx(zero == 1 ? replicated : 4 * replicated));
  }
}
