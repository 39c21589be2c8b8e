// FP8 blockwise scaling run for real on CPUs (fp8_recipe "blockwise"; Transformer Engine's
// Float8BlockScaling): plans across tp, SP, pp, dp, ZeRO and cp give the single rank's curve.
#include <algorithm>
#include <cstdio>

#include "run_fixtures.hpp"

using namespace stepcast;
using namespace stepcast::test;

TEST_CASE("run: FP8 blockwise plans give the single-rank blockwise curve (fp64), near the curve without FP8",
          "[run][fp8]") {
  // fp8_recipe blockwise on a device that runs it (localhost-cpu marked so). small-gpt's dimensions
  // are multiples of 128 on every rank of these plans (hidden 256, a tp 2 rank's heads 2 · 64 and
  // MLP 512; two sequences of 128 tokens a microbatch, a shard of 128 under SP), so a rank's
  // 1×128 blocks and 128×128 weight tiles hold the elements a single rank's hold: the same curve.
  Json topology = load_json_file(source_path("topologies/localhost-cpu.json"));
  topology["node"]["device"]["fp8_blockwise"] = true;
  const std::string bw_topology = write_temp_file("localhost-cpu-blockwise.json", topology.dump());
  const int steps = 2;
  auto bw = [](Json p, const char* format = "hybrid") {
    p["fp8"] = format;
    p["fp8_recipe"] = "blockwise";
    return p;
  };
  auto run = [&](const Json& p) {
    RunResult r = run_plan("small-gpt", p, steps, "", bw_topology);
    INFO(p.dump() << "\n" << r.output);
    REQUIRE(r.exit_code == 0);
    return r;
  };
  const Json one = plan(1, 1, 1, 0, "1f1b", "none", false, true, 2, false);
  const RunResult single = run(bw(one)), plain = run(one);
  const double off = max_relative_difference(losses(single), losses(plain));
  Json tensorwise = bw(one);
  tensorwise["fp8_recipe"] = "tensorwise";
  const double off_tensorwise = max_relative_difference(losses(single), losses(run(tensorwise)));
  std::printf("blockwise against no FP8: max relative loss difference %.3g; against tensorwise %.3g\n", off,
              off_tensorwise);
  CHECK(off > 0);
  CHECK(off < 0.01);
  CHECK(off_tensorwise > 0);  // per-block scales round otherwise than per-tensor ones
  const std::vector<Json> cases = {bw(plan(2, 1, 1, 0, "1f1b", "selective", true, false, 2, false)),
                                   bw(plan(1, 2, 1, 0, "interleaved_1f1b", "full", false, true, 2, false)),
                                   bw(plan(1, 1, 2, 1, "1f1b", "none", false, true, 2, true)),
                                   bw(plan(1, 1, 2, 3, "1f1b", "none", false, true, 2, false))};
  double largest = 0;
  for (const Json& p : cases) {
    RunResult r = run(p);
    const double d = max_relative_difference(curve(r), curve(single));
    std::printf("blockwise %s: max relative loss difference %.3g\n", p.dump().c_str(), d);
    largest = std::max(largest, d);
    CHECK(d < 1e-9);
    check_measured_memory(std::string("blockwise ") + p.dump(), r, p.at("zero_stage") != 3, 64 * 1024);
  }
  std::printf("blockwise: largest deviation over %zu plans: %.3g\n", cases.size(), largest);
  // e4m3 gradients too (Transformer Engine's default format for this recipe).
  const RunResult e4m3 = run(bw(one, "e4m3"));
  const RunResult e4m3_tp = run(bw(plan(2, 1, 1, 0, "1f1b", "full", true, true, 2, false), "e4m3"));
  CHECK(max_relative_difference(curve(e4m3_tp), curve(e4m3)) < 1e-9);
  CHECK(max_relative_difference(losses(e4m3), losses(single)) > 0);
  // cp 2: a rank's 128 rows are two chunks from both ends of each of its two sequences, so its
  // column-wise blocks are not the single rank's. Power-of-two scales change no normal value's
  // rounding, so only elements near the subnormal range move: near, not equal.
  Json cp = one;
  cp["context_parallel_size"] = 2;
  const double near = max_relative_difference(curve(run(bw(cp))), curve(single));
  std::printf("blockwise cp 2: max relative loss difference %.3g\n", near);
  CHECK(near < off);
  // fp32 scales round every value by its block's own amax, so a block of other elements shows:
  // tp 2 with SP, whose blocks are the single rank's, still gives its curve; cp 2 does not.
  auto fp32 = [&](Json p) {
    p = bw(p);
    p["fp8_block_scales"] = "fp32";
    return p;
  };
  Json cp_tp = plan(2, 1, 1, 0, "1f1b", "selective", true, false, 2, false);
  const RunResult single32 = run(fp32(one));
  const double tp32 = max_relative_difference(curve(run(fp32(cp_tp))), curve(single32));
  const double cp32 = max_relative_difference(curve(run(fp32(cp))), curve(single32));
  std::printf("blockwise, fp32 scales: tp 2 %.3g, cp 2 %.3g\n", tp32, cp32);
  CHECK(tp32 < 1e-9);
  CHECK(cp32 > 1e-6);
}
