// The CPU executor on context-parallel plans (p2p ring, allgather, a2a) and FP8 plans (delayed and
// current scaling), through `scripts/mpirun build/stepcast run`: fp64 loss curves against the
// single rank's, and measured memory against the program's.
#include "run_fixtures.hpp"

using namespace stepcast;
using namespace stepcast::test;

TEST_CASE("run: context-parallel plans give the single-rank loss curve (fp64), with their memory", "[run]") {
  // cp 2 and 4 over the p2p ring, the allgather kind and a2a (flash, and materialized scores), with tp
  // (and SP), pp, dp, ZeRO 1–3, hybrid sharding, recompute and dropout; both tiny models (rotary
  // and learned positions).
  const int steps = 6;
  auto cp_plan = [](int tp, int pp, int dp, int cp, const char* comm, int zero, const char* recompute, bool sp,
                    bool overlap, bool flash = true) {
    Json p = plan(tp, pp, dp, zero, "1f1b", recompute, sp, flash, 1, overlap);
    p["context_parallel_size"] = cp;
    p["cp_comm_type"] = comm;
    return p;
  };
  struct Case {
    const char* model;
    Json plan;
  };
  Json hybrid = cp_plan(1, 1, 2, 2, "p2p", 2, "none", false, false);
  hybrid["num_distributed_optimizer_instances"] = 2;
  std::vector<Case> cases = {
      {"tiny", cp_plan(1, 1, 1, 2, "p2p", 0, "none", false, false)},
      {"tiny", cp_plan(1, 1, 1, 2, "allgather", 0, "selective", false, false)},
      {"tiny", cp_plan(1, 1, 1, 4, "p2p", 0, "full", false, false)},
      {"tiny", cp_plan(2, 1, 1, 2, "p2p", 0, "selective", true, false)},
      {"tiny", cp_plan(1, 2, 1, 2, "allgather", 0, "full", false, true)},
      {"tiny", cp_plan(1, 1, 2, 2, "p2p", 1, "none", false, true)},
      {"tiny", cp_plan(1, 1, 2, 2, "allgather", 3, "none", false, false)},
      {"tiny", hybrid},
      {"tiny-gpt", cp_plan(2, 2, 1, 2, "p2p", 1, "selective", true, true)},
      // Materialized scores over the gathered K/V.
      {"tiny", cp_plan(1, 1, 2, 2, "allgather", 2, "selective", false, true, false)},
      {"tiny-gpt", cp_plan(2, 1, 1, 2, "allgather", 0, "full", true, false, false)},
      // a2a (Ulysses): the whole sequence for 1/cp of the heads, flash and materialized.
      {"tiny", cp_plan(1, 1, 1, 2, "a2a", 0, "none", false, false)},
      {"tiny", cp_plan(1, 1, 2, 2, "a2a", 1, "selective", false, true, false)},
      {"tiny-gpt", cp_plan(2, 1, 1, 2, "a2a", 0, "full", true, false)},
      {"tiny-gpt", cp_plan(1, 2, 1, 2, "a2a", 1, "none", false, false, false)},
  };
  std::map<std::string, std::vector<double>> reference;
  for (const char* model : {"tiny", "tiny-gpt"}) {
    RunResult single = run_plan(model, plan(1, 1, 1, 0, "1f1b", "none", false, true, 2, false), steps);
    REQUIRE(single.exit_code == 0);
    reference[model] = curve(single);
  }
  double largest = 0;
  for (const Case& c : cases) {
    RunResult r = run_plan(c.model, c.plan, steps);
    INFO(c.model << " " << c.plan.dump() << "\n" << r.output);
    REQUIRE(r.exit_code == 0);
    double d = max_relative_difference(curve(r), reference[c.model]);
    std::printf("context parallel %-9s %s: max relative loss difference %.3g\n", c.model, c.plan.dump().c_str(), d);
    largest = std::max(largest, d);
    CHECK(d < 1e-9);
    check_measured_memory(std::string("cp ") + c.plan.dump(), r, c.plan.at("zero_stage") != 3, 64 * 1024);
  }
  std::printf("context parallel: largest deviation over %zu plans: %.3g\n", cases.size(), largest);
  // Dropout: the masks are drawn at global token positions, so a cp rank draws what one rank does.
  Json one = plan(1, 1, 1, 0, "1f1b", "none", false, true, 2, false);
  Json ring = cp_plan(1, 1, 1, 2, "p2p", 0, "none", false, false);
  Json gathered = cp_plan(1, 1, 1, 2, "allgather", 0, "selective", false, false, false);
  Json ulysses = cp_plan(2, 1, 1, 2, "a2a", 0, "none", false, false, false);  // heads drawn at their global index
  one["dropout"] = ring["dropout"] = gathered["dropout"] = ulysses["dropout"] = 0.1;
  RunResult a = run_plan("tiny-gpt", one, 4), b = run_plan("tiny-gpt", ring, 4), c = run_plan("tiny-gpt", gathered, 4),
            u = run_plan("tiny-gpt", ulysses, 4);
  REQUIRE(a.exit_code == 0);
  REQUIRE(b.exit_code == 0);
  REQUIRE(c.exit_code == 0);
  REQUIRE(u.exit_code == 0);
  CHECK(max_relative_difference(curve(b), curve(a)) < 1e-9);
  CHECK(max_relative_difference(curve(c), curve(a)) < 1e-9);
  CHECK(max_relative_difference(curve(u), curve(a)) < 1e-9);
}

TEST_CASE("run: a context-parallel run resumed from a checkpoint continues the uninterrupted one", "[run][checkpoint]") {
  // cp 2 with ZeRO-1 (the optimizer state sharded over dp × cp, so the two ranks hold different
  // slices), dropout and delayed-scaling FP8 (amax histories carried from step to step).
  const std::string dir = fresh_dir("run-cp-resume");
  Json p = plan(1, 1, 1, 1, "1f1b", "none", false, true, 1, false);
  p["name"] = "cp-resume";  // the program (and its hash) names the plan
  p["context_parallel_size"] = 2;
  p["cp_comm_type"] = "p2p";
  p["dropout"] = 0.1;
  p["fp8"] = "hybrid";
  p["fp8_amax_history_len"] = 3;
  p["fp8_amax_compute_algo"] = "max";
  const WholeAndResumed runs = whole_and_resumed("tiny", p, 5, 3, dir);
  const std::vector<double>& w = runs.whole;
  const std::vector<double>& r = runs.resumed;
  CHECK(r[0] == w[3]);  // identical, not approximately
  CHECK(r[1] == w[4]);
  const Json manifest = load_json_file(dir + "/step-00000003/manifest.json");
  CHECK(manifest.at("shard_layout").at("cp_size") == 2);
  // The same two ranks as data parallel: another cut of the state, refused naming both.
  Json dp = plan(1, 1, 2, 1, "1f1b", "none", false, true, 1, false);
  dp["name"] = "cp-resume";
  dp["dropout"] = 0.1;
  RunResult refused = run_plan("tiny", dp, 5, "--resume " + dir);
  CHECK(refused.exit_code == 2);
  CHECK_THAT(refused.output, Catch::Contains("tp 1 × pp 1 × dp 1 × cp 2") &&
                                 Catch::Contains("cuts it as tp 1 × pp 1 × dp 2"));
}

TEST_CASE("run: FP8 plans give the single-rank FP8 curve (fp64), near the curve without FP8", "[run][fp8]") {
  // Delayed scaling's amax is maximised over every rank, so every plan rounds to the same FP8
  // values as one rank does: the curves agree like the plans without FP8. Both formats, both tiny
  // models (tiny-gpt has column-parallel biases), with tp + SP, pp, dp with ZeRO 1-3, cp, recompute.
  const int steps = 6;
  auto fp8 = [](Json p, const char* format) {
    p["fp8"] = format;
    p["fp8_amax_history_len"] = 3;
    p["fp8_amax_compute_algo"] = "max";
    return p;
  };
  struct Case {
    const char* model;
    Json plan;
  };
  Json cp = plan(1, 1, 1, 0, "1f1b", "none", false, true, 1, false);
  cp["context_parallel_size"] = 2;
  std::vector<Case> cases = {
      {"tiny", fp8(plan(1, 1, 2, 1, "1f1b", "none", false, false, 2, true), "hybrid")},
      {"tiny", fp8(plan(2, 1, 1, 0, "1f1b", "selective", true, false, 2, false), "hybrid")},
      {"tiny", fp8(plan(1, 2, 1, 0, "1f1b", "full", false, false, 1, false), "hybrid")},
      {"tiny", fp8(cp, "hybrid")},
      {"tiny-gpt", fp8(plan(2, 1, 1, 0, "1f1b", "full", false, false, 2, false), "e4m3")},
      {"tiny-gpt", fp8(plan(1, 1, 2, 2, "1f1b", "none", false, true, 1, true), "e4m3")},
      // ZeRO-3: each use casts the gathered weights (no FP8 copy kept), prefetched or not.
      {"tiny", fp8(plan(1, 1, 2, 3, "1f1b", "none", false, false, 2, true), "hybrid")},
      {"tiny-gpt", fp8(plan(1, 1, 2, 3, "1f1b", "full", false, true, 1, false), "e4m3")},
  };
  std::map<std::string, std::vector<double>> reference;
  for (const Case& c : cases) {
    std::string key = std::string(c.model) + c.plan.at("fp8").get<std::string>();
    if (reference.count(key)) continue;
    Json one =
        fp8(plan(1, 1, 1, 0, "1f1b", "none", false, true, 2, false), c.plan.at("fp8").get<std::string>().c_str());
    RunResult single = run_plan(c.model, one, steps);
    INFO(single.output);
    REQUIRE(single.exit_code == 0);
    reference[key] = curve(single);
    RunResult plain = run_plan(c.model, plan(1, 1, 1, 0, "1f1b", "none", false, true, 2, false), steps);
    REQUIRE(plain.exit_code == 0);
    double d = max_relative_difference(losses(single), losses(plain));
    std::printf("fp8 %-8s %-6s against no FP8: max relative loss difference %.3g\n", c.model,
                c.plan.at("fp8").get<std::string>().c_str(), d);
    CHECK(d > 0);     // the rounding is there
    CHECK(d < 0.01);  // and small: Transformer Engine's recipe keeps FP8 training on the curve
  }
  for (const Case& c : cases) {
    RunResult r = run_plan(c.model, c.plan, steps);
    INFO(c.model << " " << c.plan.dump() << "\n" << r.output);
    REQUIRE(r.exit_code == 0);
    double d =
        max_relative_difference(curve(r), reference[std::string(c.model) + c.plan.at("fp8").get<std::string>()]);
    std::printf("fp8 %-8s %s: max relative loss difference %.3g\n", c.model, c.plan.dump().c_str(), d);
    CHECK(d < 1e-9);
    check_measured_memory(std::string("fp8 ") + c.plan.dump(), r, true, 64 * 1024);
  }
}

TEST_CASE("run: FP8 current scaling: exact across dp and pp, near across tp and cp", "[run][fp8]") {
  // Each tensor's scale from its own amax (tensorwise): a data- or pipeline-parallel rank casts the
  // microbatches and layers one rank casts, with the same amax, so their curves are the single
  // rank's. Tensor- and context-parallel ranks cast shards (weights, row-parallel inputs, a cp
  // rank's tokens) with the shard's own amax, as Transformer Engine does: near, not equal.
  const int steps = 6;
  auto current = [](Json p) {
    p["fp8"] = "hybrid";
    p["fp8_recipe"] = "tensorwise";
    return p;
  };
  Json one = current(plan(1, 1, 1, 0, "1f1b", "none", false, true, 2, false));
  RunResult single = run_plan("tiny", one, steps);
  INFO(single.output);
  REQUIRE(single.exit_code == 0);
  RunResult plain = run_plan("tiny", plan(1, 1, 1, 0, "1f1b", "none", false, true, 2, false), steps);
  REQUIRE(plain.exit_code == 0);
  const double off_fp8 = max_relative_difference(losses(single), losses(plain));
  std::printf("fp8 tensorwise against no FP8: max relative loss difference %.3g\n", off_fp8);
  CHECK(off_fp8 > 0);
  CHECK(off_fp8 < 0.01);
  // (The same micro batch size as the reference: a microbatch is what an amax is taken over.) The
  // pipelines without recompute keep several microbatches' FP8 inputs for their wgrads, each with
  // the scale it was cast with (a slot per microbatch).
  for (const Json& p : {current(plan(1, 1, 2, 1, "1f1b", "none", false, false, 2, true)),
                        current(plan(1, 1, 2, 3, "1f1b", "none", false, false, 2, true)),
                        current(plan(1, 2, 1, 0, "1f1b", "none", false, false, 2, false)),
                        current(plan(1, 2, 1, 0, "interleaved_1f1b", "none", false, true, 2, false)),
                        current(plan(1, 2, 1, 0, "1f1b", "full", false, false, 2, false))}) {
    RunResult r = run_plan("tiny", p, steps);
    INFO(p.dump() << "\n" << r.output);
    REQUIRE(r.exit_code == 0);
    const double d = max_relative_difference(curve(r), curve(single));
    std::printf("fp8 tensorwise %s: max relative loss difference %.3g\n", p.dump().c_str(), d);
    CHECK(d < 1e-9);
    check_measured_memory(std::string("fp8 tensorwise ") + p.dump(), r, true, 64 * 1024);
  }
  Json cp = plan(1, 1, 1, 0, "1f1b", "none", false, true, 1, false);
  cp["context_parallel_size"] = 2;
  for (const Json& p : {current(plan(2, 1, 1, 0, "1f1b", "selective", true, false, 2, false)), current(cp)}) {
    RunResult r = run_plan("tiny", p, steps);
    INFO(p.dump() << "\n" << r.output);
    REQUIRE(r.exit_code == 0);
    const double d = max_relative_difference(losses(r), losses(single));
    std::printf("fp8 tensorwise %s: max relative loss difference %.3g (shards scaled on their own)\n", p.dump().c_str(),
                d);
    CHECK(d < off_fp8);  // nearer the single rank's FP8 curve than that is to the curve without FP8
  }
}

TEST_CASE(
    "run: FP8 with transposed weight copies (fp8_columnwise transposed): the same curve bit for bit, the copies in "
    "memory",
    "[run][fp8]") {
  // A device that reads FP8 operands only row-wise (Hopper): each layer's FP8 weights are also
  // kept transposed (fp8_transpose) and the dgrad GEMMs read that copy; the wgrad GEMMs read
  // transient transposed copies of their input and output gradient. The products are the same
  // codes in another order: the loss curve is the native device's exactly, and the copies are in
  // the program's memory and the arena's.
  Json topology = load_json_file(source_path("topologies/localhost-cpu.json"));
  topology["node"]["device"]["fp8_columnwise"] = "transposed";
  const std::string transposed = write_temp_file("localhost-cpu-fp8-transposed.json", topology.dump());
  for (const Json& base : {plan(2, 1, 1, 0, "1f1b", "selective", true, false, 2, false),
                           plan(1, 2, 1, 1, "1f1b", "full", false, true, 1, false),
                           plan(1, 1, 2, 3, "1f1b", "none", false, true, 1, false)}) {
    Json p = base;
    p["fp8"] = "hybrid";
    RunResult native = run_plan("tiny-gpt", p, 4);
    RunResult copied = run_plan("tiny-gpt", p, 4, "", transposed);
    INFO(p.dump() << "\n" << native.output << copied.output);
    REQUIRE(native.exit_code == 0);
    REQUIRE(copied.exit_code == 0);
    CHECK(losses(copied) == losses(native));
    check_measured_memory("fp8 transposed " + p.dump(), copied, true, 64 * 1024);
    // Rank 0's program holds one more FP8 copy of its layers' weights (under ZeRO-3 a transient one
    // at each backward use, cast from the gathered weights: the lowering tests count those).
    auto weights = [](const RunResult& r) {
      return r.measurement.at("memory").at("ranks")[0].at("memory_weights_bytes").get<double>();
    };
    if (p.at("zero_stage") != 3) CHECK(weights(copied) > weights(native));
  }
}

TEST_CASE("run: MXFP8 plans give the single-rank MXFP8 curve (fp64), near the curve without FP8", "[run][fp8]") {
  // fp8_recipe mxfp8 on a device with MX tensor cores (localhost-cpu marked so): every 32 elements
  // scaled on their own. The tiny models' dimensions are multiples of 32 and so are a rank's
  // tokens (two sequences of 64; a shard of 32 under SP), so their rows' blocks are one rank's.
  // Not every column-wise block is: tp 2's k and v sections of qkv are 16 rows each, and cp 2's
  // chunks 16 tokens. A power-of-two scale changes no normal value's rounding, so such a block
  // changes only elements near e4m3's subnormal range: equal curves here check the numerics end
  // to end, the kernel tests (test_cpu_kernels_mx.cpp) each block's elements.
  Json topology = load_json_file(source_path("topologies/localhost-cpu.json"));
  topology["node"]["device"]["mxfp8"] = true;
  const std::string mx_topology = write_temp_file("localhost-cpu-mxfp8.json", topology.dump());
  const int steps = 6;
  auto mx = [](Json p, const char* format = "hybrid") {
    p["fp8"] = format;
    p["fp8_recipe"] = "mxfp8";
    return p;
  };
  auto run = [&](const char* model, const Json& p) {
    RunResult r = run_plan(model, p, steps, "", mx_topology);
    INFO(model << " " << p.dump() << "\n" << r.output);
    REQUIRE(r.exit_code == 0);
    return r;
  };
  const Json one = plan(1, 1, 1, 0, "1f1b", "none", false, true, 2, false);
  const RunResult single = run("tiny", mx(one)), plain = run("tiny", one);
  Json delayed = one;
  delayed["fp8"] = "hybrid";
  const double off = max_relative_difference(losses(single), losses(plain));
  const double off_delayed = max_relative_difference(losses(single), losses(run("tiny", delayed)));
  std::printf("mxfp8 against no FP8: max relative loss difference %.3g; against delayed scaling %.3g\n", off,
              off_delayed);
  CHECK(off > 0);
  CHECK(off < 0.01);
  CHECK(off_delayed > 0);  // per-block scales round otherwise than per-tensor ones
  Json cp = plan(1, 1, 1, 0, "1f1b", "none", false, true, 2, false);
  cp["context_parallel_size"] = 2;
  Json a2a = cp;
  a2a["cp_comm_type"] = "a2a";
  const std::vector<Json> cases = {mx(plan(2, 1, 1, 0, "1f1b", "selective", true, false, 2, false)),
                                   mx(plan(1, 2, 1, 0, "1f1b", "full", false, true, 2, false)),
                                   mx(plan(1, 2, 1, 0, "interleaved_1f1b", "none", false, true, 2, false)),
                                   mx(plan(1, 1, 2, 1, "1f1b", "none", false, true, 2, true)),
                                   mx(plan(1, 1, 2, 3, "1f1b", "none", false, true, 2, false)),
                                   mx(cp),
                                   mx(a2a)};
  double largest = 0;
  for (const Json& p : cases) {
    RunResult r = run("tiny", p);
    const double d = max_relative_difference(curve(r), curve(single));
    std::printf("mxfp8 %s: max relative loss difference %.3g\n", p.dump().c_str(), d);
    largest = std::max(largest, d);
    CHECK(d < 1e-9);
    check_measured_memory(std::string("mxfp8 ") + p.dump(), r, p.at("zero_stage") != 3, 64 * 1024);
  }
  // tiny-gpt: biases (the bias gradient from the column-wise d_y), GeLU, learned positions; e4m3.
  const RunResult gpt = run("tiny-gpt", mx(one, "e4m3"));
  const RunResult gpt_tp = run("tiny-gpt", mx(plan(2, 1, 1, 0, "1f1b", "full", true, true, 2, false), "e4m3"));
  const double d = max_relative_difference(curve(gpt_tp), curve(gpt));
  largest = std::max(largest, d);
  CHECK(d < 1e-9);
  std::printf("mxfp8: largest deviation over %zu plans: %.3g\n", cases.size() + 1, largest);
  // cp 2 with one sequence a microbatch: a rank's 32 tokens are two chunks of 16 from both ends of
  // the sequence, so its column-wise blocks are not one rank's: near, not equal.
  Json cp1 = plan(1, 1, 1, 0, "1f1b", "none", false, true, 1, false);
  const RunResult one_mb1 = run("tiny", mx(cp1));
  cp1["context_parallel_size"] = 2;
  const double near = max_relative_difference(curve(run("tiny", mx(cp1))), curve(one_mb1));
  std::printf("mxfp8 cp 2, one sequence a microbatch: max relative loss difference %.3g\n", near);
  CHECK(near < off);
}
