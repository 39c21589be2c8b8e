// Several jobs on one cluster (simulate_jobs) against closed forms: two identical data-parallel
// jobs whose rings cross the same oversubscribed leaf uplink each take twice the bandwidth term
// (their exposed communication doubles); placed on their own leaves they do not slow each other;
// a job alone on the shared platform is the job simulated on its own nodes. Then `stepcast
// contention` end to end and its bad inputs. Each TEST_CASE runs one SimGrid engine.
#include <catch2/catch.hpp>

#include <filesystem>

#include "profile.hpp"
#include "sim_fixtures.hpp"
#include "simulator.hpp"
#include "test_support.hpp"

using namespace stepcast;
using namespace stepcast::test;
using Catch::Matchers::Contains;

namespace {

constexpr double kBytes = 64e6, kNicBw = 25e9, kNicLatency = 3e-6;

// 8 nodes of one device and one NIC on a two-level fat tree (radix 4: one switch reaches 4 NICs):
// leaves of 2 NICs, nodes 0 and 1 on leaf 0, 2 and 3 on leaf 1, ...; each leaf's uplink at
// 2 · kNicBw / 2 (oversubscription 2), one NIC's bandwidth.
Topology eight_node_tree() {
  Json t = star_topology_json(8, 1, 100e9, 2e-6, 1, kNicBw, kNicLatency, 2.0);
  t["fabric"]["switch_radix"] = 4;
  return parse_test_topology(t);
}

// dp 2, one device per node: the gradients' ring all_reduce on the compute stream (all exposed).
StepProgram dp2_all_reduce() {
  StepProgram p = empty_program(1, 2, 1, 1);
  push_op(p.roles[0], collective_op(OpKind::all_reduce, GroupKind::dp, Algorithm::ring, kBytes, Stream::compute));
  return p;
}

// dp2_all_reduce jobs on these nodes of eight_node_tree, each step from its start.
struct JobAt {
  std::vector<int64_t> nodes;
  double start_s = 0;
};
std::vector<SimulationOutput> dp2_jobs(const std::vector<JobAt>& at, SimMode mode) {
  static const StepProgram program = dp2_all_reduce();
  Topology t = eight_node_tree();
  SimulateOptions o;
  o.mode = mode;
  std::vector<SharedJob> jobs(at.size());
  for (size_t j = 0; j < at.size(); ++j) {
    jobs[j].program = &program;
    jobs[j].nodes = at[j].nodes;
    jobs[j].start_s = at[j].start_s;
  }
  return simulate_jobs(jobs, t, roofline_profile(t), o);
}

std::vector<SimulationOutput> two_jobs(const std::vector<int64_t>& a, const std::vector<int64_t>& b, SimMode mode,
                                       double b_start_s = 0) {
  return dp2_jobs({{a, 0}, {b, b_start_s}}, mode);
}

// The ring of 2 across leaves: 2(n−1)/n · S/B of bandwidth term at B per flow, and 2(n−1)
// latencies of a cross-leaf route (two NIC latencies; no switch latency).
double ring_s(double bandwidth) { return kBytes / bandwidth + 2.0 * (2 * kNicLatency); }

}  // namespace

TEST_CASE("contention: two identical jobs on one shared uplink double their exposed communication (full)",
          "[sim][contention]") {
  // Job a on nodes 0 and 2, job b on 1 and 3: both rings cross leaf 0's and leaf 1's uplinks, one
  // NIC's bandwidth each way, which the two jobs' flows share: each job's bandwidth term doubles.
  std::vector<SimulationOutput> out = two_jobs({0, 2}, {1, 3}, SimMode::full);
  REQUIRE(out.size() == 2);
  for (const SimulationOutput& job : out) {
    CHECK(job.step_time_s == Approx(ring_s(kNicBw / 2)).epsilon(1e-6));
    CHECK(job.breakdown.exposed_comm_s == Approx(ring_s(kNicBw / 2)).epsilon(1e-6));
    CHECK(job.simulated_ranks == std::vector<int64_t>{0, 1});  // the job's own rank numbers
  }
}

TEST_CASE("contention: two identical jobs on one shared uplink double their exposed communication (fast)",
          "[sim][contention]") {
  std::vector<SimulationOutput> out = two_jobs({0, 2}, {1, 3}, SimMode::fast);
  for (const SimulationOutput& job : out) {
    CHECK(job.breakdown.exposed_comm_s == Approx(ring_s(kNicBw / 2)).epsilon(1e-6));
  }
}

TEST_CASE("contention: jobs on their own leaves do not slow each other", "[sim][contention]") {
  // Job a on nodes 2 and 3 (leaf 1), job b on 0 and 1 (leaf 0): no link in common.
  std::vector<SimulationOutput> out = two_jobs({2, 3}, {0, 1}, SimMode::full);
  for (const SimulationOutput& job : out) {
    // Inside a leaf a route is two NIC latencies as well: the uncontended ring.
    CHECK(job.step_time_s == Approx(ring_s(kNicBw)).epsilon(1e-6));
  }
}

TEST_CASE("contention: a job that starts after the other's ring has ended is not slowed", "[sim][contention]") {
  // Job b starts when job a's step is over: each takes the uncontended ring, on its own clock.
  for (const SimulationOutput& job : two_jobs({0, 2}, {1, 3}, SimMode::full, 1.5 * ring_s(kNicBw))) {
    CHECK(job.step_time_s == Approx(ring_s(kNicBw)).epsilon(1e-6));
    CHECK(job.breakdown.exposed_comm_s == Approx(ring_s(kNicBw)).epsilon(1e-6));
  }
}

TEST_CASE("contention: a job that starts halfway through the other's ring shares half of it", "[sim][contention]") {
  // b starts when a has sent half its bytes (a's flows start after their latency): a's other
  // half and b's first half share the uplink (each at half the bandwidth), then b runs alone.
  // Bandwidth terms: a 1/2 + 1 = 1.5, b 1 + 1/2 = 1.5 of the uncontended one (latency aside).
  const double bandwidth_s = kBytes / kNicBw;
  for (const SimulationOutput& job :
       two_jobs({0, 2}, {1, 3}, SimMode::full, 2 * (2 * kNicLatency) + 0.5 * bandwidth_s)) {
    CHECK(job.step_time_s > ring_s(kNicBw) + 0.4 * bandwidth_s);
    CHECK(job.step_time_s < ring_s(kNicBw) + 0.6 * bandwidth_s);
  }
}

TEST_CASE("contention: one job alone on the shared platform is the job on its own nodes", "[sim][contention]") {
  std::vector<SimulationOutput> out = dp2_jobs({{{0, 2}, 0}}, SimMode::full);
  REQUIRE(out.size() == 1);
  CHECK(out[0].step_time_s == Approx(ring_s(kNicBw)).epsilon(1e-6));
}

TEST_CASE("contention: overlapping or missing nodes and a program of another size are refused", "[sim][contention]") {
  const StepProgram program = dp2_all_reduce();
  Topology t = eight_node_tree();
  std::vector<SharedJob> jobs(2);
  jobs[0].program = jobs[1].program = &program;
  jobs[0].nodes = {0, 1};
  jobs[1].nodes = {1, 2};
  CHECK_THROWS_WITH(simulate_jobs(jobs, t, roofline_profile(t), SimulateOptions{}),
                    Contains("jobs[1].nodes") && Contains("already holds"));
  jobs[1].nodes = {2, 8};
  CHECK_THROWS_WITH(simulate_jobs(jobs, t, roofline_profile(t), SimulateOptions{}),
                    Contains("jobs[1].nodes") && Contains("no such node") && Contains("0 to 7"));
  jobs[1].nodes = {2};
  CHECK_THROWS_WITH(simulate_jobs(jobs, t, roofline_profile(t), SimulateOptions{}),
                    Contains("spans 2 devices") && Contains("at least as many nodes"));
}

namespace {

// netns-2node's devices and NICs on 8 nodes under a two-level tree (radix 4: leaves of 2 nodes)
// whose uplinks are oversubscribed 2:1; the tiny model, data parallel over the job's 2 nodes.
struct ContentionFiles {
  std::string topology, plan;
  ContentionFiles() {
    Json t = load_json_file(source_path("topologies/netns-2node.json"));
    t["name"] = "tree-8";
    t["num_nodes"] = 8;
    t["fabric"]["oversubscription"] = 2;
    topology = write_temp_file("contention-tree-8.json", t.dump());
    Json p = load_json_file(source_path("examples/tiny-cpu.json"));
    p.erase("dp_size");  // every device of the job's nodes
    p["name"] = "tiny-dp";
    plan = write_temp_file("contention-tiny-dp.json", p.dump());
  }
  std::string jobs(const std::string& a_nodes, const std::string& b_nodes) const {
    std::string model = source_path("models/tiny.json");
    std::string name = "contention-jobs-" + a_nodes + "-" + b_nodes + ".json";
    for (char& c : name) {
      if (c == ',' || c == ' ') c = '_';
    }
    return write_temp_file(name, "{\"jobs\": [{\"name\": \"a\", \"model\": \"" + model + "\", \"plan\": \"" + plan +
                                     "\", \"nodes\": [" + a_nodes +
                                     "]}, {\"name\": \"b\", \"model\": \"tiny\", \"plan\": \"" + plan +
                                     "\", \"nodes\": [" + b_nodes + "]}]}");
  }
};

Json contention_json(const std::string& jobs_file, const std::string& topology, const std::string& name) {
  std::string dir = fresh_dir("contention-" + name);
  CommandResult r =
      run_stepcast("contention --jobs " + jobs_file + " --topology " + topology + " --profile roofline --out " + dir);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Contains("slowdown"));
  return read_json(dir + "/contention.json");
}

}  // namespace

TEST_CASE("contention: the command reports each job alone and shared: slowed only where links are shared",
          "[contention][simulate]") {
  ContentionFiles f;
  // Across leaves: both rings take leaf 0's and leaf 1's uplinks.
  Json crossed = contention_json(f.jobs("0, 2", "1, 3"), f.topology, "crossed");
  REQUIRE(crossed["jobs"].size() == 2);
  for (const Json& job : crossed["jobs"]) {
    INFO(job.dump());
    CHECK(job["devices"] == 2);
    CHECK(job["slowdown"].get<double>() > 1.01);
    CHECK(job["shared"]["breakdown"]["exposed_comm_s"].get<double>() >
          job["alone"]["breakdown"]["exposed_comm_s"].get<double>());
    CHECK(job["exposed_comm_added_s"].get<double>() > 0);
  }
  // Job a alone is job a simulated on its own two nodes (one switch; a cross-leaf route of this
  // tree adds no latency, and alone one flow each way fits an uplink).
  std::string dir = fresh_dir("contention-alone-reference");
  CommandResult r =
      run_stepcast("simulate --model " + source_path("models/tiny.json") + " --topology " + f.topology +
                   " --nodes 2 --plan " + f.plan + " --profile roofline --no-scaling --no-records --out " + dir);
  REQUIRE(r.exit_code == 0);
  CHECK(crossed["jobs"][0]["alone"]["step_time_s"].get<double>() ==
        Approx(read_json(dir + "/prediction.json")["step_time_s"].get<double>()).epsilon(1e-9));
  // Each on its own leaf: nothing shared.
  Json apart = contention_json(f.jobs("0, 1", "2, 3"), f.topology, "apart");
  for (const Json& job : apart["jobs"]) {
    CHECK(job["slowdown"].get<double>() == Approx(1).epsilon(1e-12));
  }
}

TEST_CASE("contention: jobs that fold rail groups by different counts run unfolded and share nothing on one switch",
          "[contention][simulate]") {
  // Llama 3 8B on 2 DGX A100 nodes each, one switch of a fat tree (32 NICs, radix 40: no leaf
  // uplinks): job a tp 8 (fast mode folds its rail groups by 8, dividing shared links' capacity
  // by 8), job b tp 4 dp 4 (dp shares its nodes: nothing folded). The
  // shared run simulates both unfolded; folding is exact without cross traffic, so each job's
  // shared step is its (folded) alone step.
  Json a = {{"name", "a"},           {"tp_size", 8},
            {"pp_size", 1},          {"zero_stage", 1},
            {"micro_batch_size", 1}, {"global_batch_size", 4},
            {"recompute", "full"},   {"sequence_parallel", true},
            {"dtype", "bf16"},       {"attention_impl", "flash"},
            {"dropout", 0.0}};
  Json b = a;
  b["name"] = "b";
  b["tp_size"] = 4;
  b["global_batch_size"] = 8;
  const std::string pa = write_temp_file("contention-tp8.json", a.dump()),
                    pb = write_temp_file("contention-tp4.json", b.dump());
  const std::string jobs =
      write_temp_file("contention-mixed-folds.json",
                      "{\"jobs\": [{\"name\": \"a\", \"model\": \"llama3-8b\", \"plan\": \"" + pa +
                          "\", \"nodes\": [0, 1]}, {\"name\": \"b\", \"model\": \"llama3-8b\", \"plan\": \"" + pb +
                          "\", \"nodes\": [2, 3]}]}");
  Json out = contention_json(jobs, source_path("topologies/dgx-a100-80gb.json") + " --nodes 4 --variability off",
                             "mixed-folds");
  REQUIRE(out["jobs"].size() == 2);
  for (const Json& job : out["jobs"]) {
    INFO(job.dump());
    CHECK(job["slowdown"].get<double>() == Approx(1).epsilon(1e-6));
  }
}

TEST_CASE("contention: under --mode approx each job alone folds as it does among the others",
          "[contention][simulate]") {
  // approx folds the data-parallel copies and divides the shared links' capacity by the copies on
  // a node: 8 for job a (dp 16 over two nodes), 4 for job b (pp 2 × dp 4 on one node), so the
  // shared run folds neither. Alone, each must fold the same way: on one switch (no uplinks) the
  // jobs share nothing, and each job's breakdown alone is its breakdown shared (job b's exposed
  // communication read 5.5 ms alone against 3.6 ms shared when alone folded its copies).
  Json a = {{"name", "dp16"}, {"dp_size", 16}, {"micro_batch_size", 1}, {"global_batch_size", 32},
            {"overlap_grad_reduce", true}};
  Json b = {{"name", "pp2-dp4"}, {"pp_size", 2}, {"dp_size", 4}, {"micro_batch_size", 1},
            {"global_batch_size", 16}, {"zero_stage", 1}};
  const std::string jobs = write_temp_file(
      "contention-approx-folds.json",
      "{\"jobs\": [{\"name\": \"a\", \"model\": \"gpt2-124m\", \"plan\": \"" +
          write_temp_file("contention-dp16.json", a.dump()) +
          "\", \"nodes\": [0, 1]}, {\"name\": \"b\", \"model\": \"gpt2-124m\", \"plan\": \"" +
          write_temp_file("contention-pp2-dp4.json", b.dump()) + "\", \"nodes\": [2]}]}");
  // The A100 profile: its variability is what the fold approximates (without it, the fold is
  // exact here and alone matched shared either way).
  std::string dir = fresh_dir("contention-approx-folds");
  CommandResult r = run_stepcast("contention --jobs " + jobs + " --topology " +
                                 source_path("topologies/dgx-a100-80gb.json") + " --nodes 3 --mode approx --profile " +
                                 source_path("profiles/a100-sxm4-80gb.json") + " --out " + dir);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  Json out = read_json(dir + "/contention.json");
  REQUIRE(out["jobs"].size() == 2);
  for (const Json& job : out["jobs"]) {
    INFO(job.dump());
    CHECK(job["shared"]["breakdown"]["exposed_comm_s"].get<double>() ==
          Approx(job["alone"]["breakdown"]["exposed_comm_s"].get<double>()).epsilon(1e-9));
    CHECK(job["slowdown"].get<double>() == Approx(1).epsilon(1e-9));
  }
}
