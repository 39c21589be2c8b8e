// Unequal data-parallel replicas run for real (`stepcast run` under mpirun, fp64, dropout on): a
// replica of 3 microbatches beside one of 1 (alone, with a pipeline, with tensor parallelism and
// ZeRO-1) trains the single-rank loss curve of the same global batch within 1e-9 — every sample of
// the step once, every microbatch's loss scaled by the step's tokens, the gradients summed.
#include <catch2/catch.hpp>

#include <tuple>

#include "run_fixtures.hpp"

using namespace stepcast;
using namespace stepcast::test;

TEST_CASE("run: unequal replicas give the single-rank loss curve of the global batch (fp64)", "[run][replicas]") {
  const int steps = 3;
  Json single = {{"micro_batch_size", 1}, {"global_batch_size", 8}, {"dtype", "fp64"}, {"dropout", 0.1}};
  RunResult reference = run_plan("tiny", single, steps);
  INFO(reference.output);
  REQUIRE(reference.exit_code == 0);
  for (const auto& [tp, pp, zero, counts] :
       {std::tuple{1, 1, 0, Json({5, 3})}, std::tuple{1, 2, 0, Json({6, 2})}, std::tuple{2, 1, 1, Json({3, 5})}}) {
    Json p = {{"tp_size", tp}, {"pp_size", pp}, {"dp_size", 2}, {"zero_stage", zero}, {"micro_batch_size", 1},
              {"microbatches_per_replica", counts}, {"dtype", "fp64"}, {"dropout", 0.1}};
    RunResult r = run_plan("tiny", p, steps);
    INFO(p.dump() << "\n" << r.output);
    REQUIRE(r.exit_code == 0);
    CHECK(max_relative_difference(curve(r), curve(reference)) < 1e-9);
  }
}
