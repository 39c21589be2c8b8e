// Measured device profiles: the interpolation of cost_model.hpp against closed forms (exact at
// grid points and for power laws, clamped outside the grid, leave-one-out within 5% on a smooth
// synthetic rate), the α-β fit, the schema (round trip, shipped datasheet profiles unchanged),
// the device checks, and `stepcast profile` end to end under mpirun (--quick): its profile and
// topology load, simulate accepts them on the CPU topology and refuses them on a GPU one, and
// the leave-one-out errors of the real measurements are printed as figures, not asserted (two
// shared cores are too noisy for a 5% bound on every point; see the README).
#include <catch2/catch.hpp>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cost_model.hpp"
#include "errors.hpp"
#include "profile.hpp"
#include "profile_fixtures.hpp"
#include "test_support.hpp"

using namespace stepcast;
using namespace stepcast::test;
using Catch::Matchers::Contains;
using test::source_path;

namespace {

// `mpirun -np 2 stepcast profile --quick` once for every test that needs it.
struct QuickProfile {
  std::string profile, topology, output;
  int exit_code = 0;
};
const QuickProfile& quick_profile() {
  static QuickProfile q = [] {
    QuickProfile r;
    r.profile = test::write_temp_file("quick-profile.json", "");
    r.topology = test::write_temp_file("quick-topology.json", "");
    CommandResult c = run_shell(source_path("scripts/mpirun") + " -np 2 " + STEPCAST_BINARY +
                      " profile --backend cpu --quick --out " + r.profile + " --topology-out " +
                      r.topology);
    r.exit_code = c.exit_code;
    r.output = c.output;
    return r;
  }();
  return q;
}

std::string tiny_simulate(const std::string& topology, const std::string& profile) {
  return test::model_arg("tiny") + " --topology " + topology + test::plan_arg("tiny-cpu") +
         " --profile " + profile + " --no-scaling";
}

}  // namespace

TEST_CASE("profile: GEMM interpolation is exact at grid points and for power laws", "[profile]") {
  GemmRateTable table(synthetic_grid("forward", synthetic_gemm_time_s));
  for (int64_t m : {10, 80, 640}) {
    for (int64_t k : {20, 320}) {
      double rate = 2.0 * m * 40 * k / synthetic_gemm_time_s(double(m), 40, double(k));
      CHECK(relative(table.flops_per_s(double(m), 40, double(k)), rate) < 1e-12);
    }
  }
  // log(rate) multilinear in log m, log n, log k reproduces time ∝ m^a n^b k^c off the grid.
  GemmRateTable power(synthetic_grid("forward", power_law_time_s));
  for (auto [m, n, k] : {std::tuple{13.0, 57.0, 301.0}, {64.0, 128.0, 256.0}, {600.0, 11.0, 90.0}}) {
    double rate = 2 * m * n * k / power_law_time_s(m, n, k);
    CHECK(relative(power.flops_per_s(m, n, k), rate) < 1e-9);
  }
}

TEST_CASE("profile: GEMM interpolation clamps to the grid's faces", "[profile]") {
  GemmRateTable table(synthetic_grid("forward", synthetic_gemm_time_s));
  CHECK(table.flops_per_s(5000, 80, 40) == Approx(table.flops_per_s(640, 80, 40)).epsilon(1e-12));
  CHECK(table.flops_per_s(2, 3, 4) == Approx(table.flops_per_s(10, 10, 10)).epsilon(1e-12));
  CHECK(table.flops_per_s(80, 1, 1e6) == Approx(table.flops_per_s(80, 10, 640)).epsilon(1e-12));
}

TEST_CASE("profile: leave-one-out predicts each point of a smooth profile within 5%", "[profile]") {
  std::vector<LeaveOneOut> loo = gemm_leave_one_out(synthetic_grid("forward", synthetic_gemm_time_s));
  REQUIRE(loo.size() == kAxis.size() * kAxis.size() * kAxis.size());
  double worst = 0;
  std::string where;
  for (const LeaveOneOut& l : loo) {
    if (std::abs(l.relative_error()) > worst) {
      worst = std::abs(l.relative_error());
      where = l.what;
    }
  }
  INFO("largest leave-one-out error " << 100 * worst << "% at " << where);
  CHECK(worst < 0.05);
  // A hole in the grid is bridged, not a lookup: the prediction differs from the measurement.
  CHECK(std::abs(loo[100].relative_error()) > 0);

  // Memory-bound: a fixed cost and a bandwidth, 16 KiB … 64 MiB by 4×. The largest point is
  // predicted by its neighbour's bandwidth (an extrapolation, not checked); the smallest by its
  // neighbour's time less the bytes' share beyond the fixed cost, given as the table's.
  std::vector<MemoryPoint> memory;
  for (double bytes = 16384; bytes <= 64 << 20; bytes *= 4) {
    memory.push_back({"adamw", bytes, 0.2e-6 + bytes / 8e9, ""});
  }
  std::vector<LeaveOneOut> memory_loo = memory_leave_one_out(memory, 0.2e-6);
  REQUIRE(memory_loo.size() == memory.size());
  CHECK(memory_loo.front().predicted_s == Approx(memory.front().time_s).epsilon(1e-9));
  // Without the fixed cost, the smallest size at its neighbour's bandwidth: too fast.
  CHECK(memory_leave_one_out(memory, 0).front().relative_error() < -0.05);
  for (size_t i = 1; i + 1 < memory_loo.size(); ++i) {
    INFO(memory_loo[i].what);
    CHECK(std::abs(memory_loo[i].relative_error()) < 0.05);
  }
}

TEST_CASE("profile: memory-bound bandwidth is log-log between sizes and clamped outside", "[profile]") {
  BandwidthTable table({{"swiglu_forward", 1000, 1e-6, ""}, {"swiglu_forward", 100000, 2e-5, ""}});
  CHECK(table.time_s(1000) == Approx(1e-6).epsilon(1e-12));
  CHECK(table.time_s(100000) == Approx(2e-5).epsilon(1e-12));
  // Midway in log(bytes): bandwidth is the geometric mean of 1e9 and 5e9.
  CHECK(table.bandwidth_bytes_per_s(10000) == Approx(std::sqrt(1e9 * 5e9)).epsilon(1e-12));
  CHECK(table.bandwidth_bytes_per_s(10) == Approx(1e9).epsilon(1e-12));
  CHECK(table.time_s(1e7) == Approx(1e7 / 5e9).epsilon(1e-12));
  // Below the smallest size a kernel keeps its fixed cost: 0.4 µs here, the rest of the smallest
  // size's 1 µs scaled by bytes; a fixed cost beyond that time leaves the time at it.
  BandwidthTable fixed({{"swiglu_forward", 1000, 1e-6, ""}, {"swiglu_forward", 100000, 2e-5, ""}}, 0.4e-6);
  CHECK(fixed.time_s(250) == Approx(0.4e-6 + 0.6e-6 * 0.25).epsilon(1e-12));
  CHECK(fixed.bandwidth_bytes_per_s(250) == Approx(250 / 0.55e-6).epsilon(1e-12));
  CHECK(fixed.time_s(1000) == Approx(1e-6).epsilon(1e-12));
  CHECK(fixed.time_s(10000) == Approx(table.time_s(10000)).epsilon(1e-12));
  BandwidthTable slow({{"swiglu_forward", 1000, 1e-6, ""}, {"swiglu_forward", 100000, 2e-5, ""}}, 5e-6);
  CHECK(slow.time_s(10) == Approx(1e-6).epsilon(1e-12));
}

TEST_CASE("profile: the cost model uses measured tables where they exist", "[profile]") {
  Topology topology = load_topology(source_path("topologies/localhost-cpu.json"));
  DeviceProfile profile = synthetic_profile();
  ComputeCostModel model(topology.node.device, Dtype::fp32, profile, topology.file);
  Op gemm;
  gemm.kind = OpKind::gemm;
  gemm.batch = 1;
  gemm.m = 128;
  gemm.n = 64;
  gemm.k = 256;
  gemm.flops = 2.0 * 128 * 64 * 256;
  gemm.bytes = 4.0 * (128 * 256 + 256 * 64 + 128 * 64);
  GemmRateTable table(profile.measured->gemm);
  CHECK(model.op_time_s(gemm) == Approx(gemm.flops / table.flops_per_s(128, 64, 256)).epsilon(1e-12));
  // Off-grid and smooth: within a few percent of the synthetic truth.
  CHECK(relative(model.op_time_s(gemm), synthetic_gemm_time_s(128, 64, 256)) < 0.05);
  // A dgrad without its own table falls back to the forward one.
  gemm.grad = Grad::dgrad;
  CHECK(model.op_time_s(gemm) == Approx(gemm.flops / table.flops_per_s(128, 64, 256)).epsilon(1e-12));

  Op norm;
  norm.kind = OpKind::norm;
  norm.phase = Phase::recompute;
  norm.flops = 1000;
  norm.bytes = 65536;
  CHECK(memory_family(norm) == "norm_forward");
  CHECK(model.op_time_s(norm) == Approx(1e-6 + 65536 / 10e9).epsilon(1e-12));
  // Below the table's smallest size (16 KiB): the profile's kernel_overhead_s stays.
  norm.bytes = 4096;
  CHECK(model.op_time_s(norm) == Approx(1e-6 + 4096 / 10e9).epsilon(1e-12));
  norm.bytes = 65536;
  // No table: the roofline on the measured bandwidth plus the measured fixed cost.
  Op rotary;
  rotary.kind = OpKind::activation;
  rotary.name = OpName::rotary;
  rotary.phase = Phase::backward;
  rotary.bytes = 8e6;
  CHECK(memory_family(rotary) == "rotary_backward");
  CHECK(model.op_time_s(rotary) == Approx(8e6 / 8e9 + 1e-6).epsilon(1e-12));

  // A datasheet profile keeps the roofline with fractions.
  DeviceProfile sheet = load_profile(source_path("profiles/a100-sxm4-80gb.json"));
  Topology dgx = load_topology(source_path("topologies/dgx-a100-80gb.json"));
  ComputeCostModel roofline(dgx.node.device, Dtype::bf16, sheet, dgx.file);
  gemm.grad = Grad::none;
  double peak = dgx.node.device.peak_for(Dtype::bf16, dgx.file);
  // The A100 profile's GEMMs: peak · peak_fraction · the shape model (fitted to its GEMM points),
  // plus the launch and the kernel body's fixed latency.
  const GemmEfficiency& e = sheet.gemm.at(Dtype::bf16);
  REQUIRE(e.k_half > 0);
  REQUIRE(e.latency_s > 0);
  double shape = e.shape_efficiency(double(gemm.m), double(gemm.n), double(gemm.k));
  double outputs = double(gemm.m) * double(gemm.n);
  CHECK(shape == Approx((e.output_half > 0 ? outputs / (outputs + e.output_half) : 1) * double(gemm.k) /
                        (double(gemm.k) + e.k_half)));
  CHECK(roofline.op_time_s(gemm) ==
        Approx(std::max(gemm.flops / (peak * e.peak_fraction * shape),
                        gemm.bytes / (dgx.node.device.memory_bandwidth_bytes_per_s * sheet.memory_bandwidth_fraction)) +
               e.overhead_s + e.latency_s));
  // A sheet with gemm_tiling instead divides its fraction by the op's wave efficiency.
  DeviceProfile tiled = sheet;
  tiled.gemm[Dtype::bf16] = GemmEfficiency{0.859, 6e-6};
  tiled.gemm_tiling = GemmTiling{108, 256, 128};
  ComputeCostModel waves(dgx.node.device, Dtype::bf16, tiled, dgx.file);
  double wave = gemm_wave_efficiency(*tiled.gemm_tiling, gemm.m, gemm.n, 1);
  CHECK(waves.op_time_s(gemm) ==
        Approx(std::max(gemm.flops / (peak * 0.859 * wave),
                        gemm.bytes / (dgx.node.device.memory_bandwidth_bytes_per_s * sheet.memory_bandwidth_fraction)) +
               6e-6));
  // A ceiling (a maximum-achievable-matmul search's best) caps the shape model's rate: below the
  // fraction a large GEMM reaches, the ceiling sets its time; above it, nothing changes.
  Op big = gemm;
  big.m = big.n = big.k = 8192;
  big.flops = 2.0 * 8192 * 8192 * 8192;
  big.bytes = 3.0 * 8192 * 8192 * 2;
  const double reached = e.peak_fraction * e.shape_efficiency(8192, 8192, 8192);
  REQUIRE(big.flops / (peak * reached) > big.bytes / (dgx.node.device.memory_bandwidth_bytes_per_s *
                                                       sheet.memory_bandwidth_fraction));  // compute-bound
  DeviceProfile capped = sheet;
  capped.gemm[Dtype::bf16].ceiling_fraction = 0.9 * reached;
  ComputeCostModel ceiling(dgx.node.device, Dtype::bf16, capped, dgx.file);
  CHECK(ceiling.op_time_s(big) == Approx(big.flops / (peak * 0.9 * reached) + e.overhead_s + e.latency_s));
  CHECK(ceiling.op_time_s(big) > roofline.op_time_s(big));
  capped.gemm[Dtype::bf16].ceiling_fraction = std::min(1.0, 1.1 * reached);
  CHECK(ComputeCostModel(dgx.node.device, Dtype::bf16, capped, dgx.file).op_time_s(big) == roofline.op_time_s(big));
  // It round-trips; outside (0, 1] it is refused, naming the key.
  Json with_ceiling = profile_to_json(capped);
  CHECK(with_ceiling["gemm"]["bf16"]["ceiling_fraction"] == capped.gemm[Dtype::bf16].ceiling_fraction);
  CHECK(parse_profile(with_ceiling, "c.json").gemm.at(Dtype::bf16).ceiling_fraction ==
        capped.gemm[Dtype::bf16].ceiling_fraction);
  with_ceiling["gemm"]["bf16"]["ceiling_fraction"] = 1.5;
  CHECK_THROWS_WITH(parse_profile(with_ceiling, "bad.json"),
                    Contains("bad.json") && Contains("gemm.bf16.ceiling_fraction") && Contains("1.5"));
}

TEST_CASE("profile: GEMM wave quantization on an A100 (108 SMs, 256x128 tiles)", "[profile]") {
  GemmTiling a100{108, 256, 128};
  // MAMF's best shape 6912x16384: 27 x 128 = 3,456 tiles, exactly 32 waves.
  CHECK(gemm_wave_efficiency(a100, 6912, 16384, 1) == Approx(1.0));
  // 2048 x 2304: 8 x 18 = 144 tiles (either orientation), 2 waves of 108 slots.
  CHECK(gemm_wave_efficiency(a100, 2048, 2304, 1) == Approx(144.0 / 216));
  // 2048 x 4608: 288 tiles, 3 waves; a partial tile counts as a whole one (100 x 100: 1 slot of 108).
  CHECK(gemm_wave_efficiency(a100, 2048, 4608, 1) == Approx(288.0 / 324));
  CHECK(gemm_wave_efficiency(a100, 100, 100, 1) == Approx(100.0 * 100 / (108.0 * 256 * 128)));
  // A batch fills waves: 12 heads of 2048 x 2048 scores, 128 tiles each = 1,536 tiles, 15 waves.
  CHECK(gemm_wave_efficiency(a100, 2048, 2048, 12) == Approx(1536.0 / 1620));
  // The better orientation: 128 x 4096 fits 128x256 tiles whole (16 tiles), not 256x128 ones.
  CHECK(gemm_wave_efficiency(a100, 128, 4096, 1) == Approx(128.0 * 4096 / (108.0 * 128 * 256)));
}

TEST_CASE("profile: the α-β fit recovers latency and bandwidth", "[profile]") {
  std::vector<P2pPoint> p2p;
  for (double bytes = 8; bytes <= 32 << 20; bytes *= 4) p2p.push_back({bytes, 1.5e-6 + bytes / 4e9, ""});
  std::optional<LinkFit> fit = fit_link(p2p_link_samples(p2p));
  REQUIRE(fit);
  CHECK(fit->latency_s == Approx(1.5e-6).epsilon(1e-9));
  CHECK(fit->bandwidth_bytes_per_s == Approx(4e9).epsilon(1e-9));
  CHECK(fit->max_relative_error < 1e-9);
  // Ring collectives of 4: all_reduce 2(n−1) steps of S/n, reduce_scatter n−1.
  std::vector<CollectivePoint> ring;
  for (double bytes = 4096; bytes <= 64 << 20; bytes *= 4) {
    ring.push_back({"all_reduce", "ring", 4, bytes, 6 * (1e-6 + bytes / 4 / 2e9), 0, 0, "", 1});
    ring.push_back({"reduce_scatter", "ring", 4, bytes, 3 * (1e-6 + bytes / 4 / 2e9), 0, 0, "", 1});
    ring.push_back({"all_reduce", "mpi", 4, bytes, 1.0, 0, 0, "", 1});  // not a modelled algorithm
    ring.push_back({"all_reduce", "ring", 4, bytes, 1.0, 0, 0, "", 2});  // across 2 nodes: not this link
  }
  fit = fit_link(collective_link_samples(ring, 4));
  REQUIRE(fit);
  CHECK(fit->samples == 16);
  CHECK(fit->latency_s == Approx(1e-6).epsilon(1e-9));
  CHECK(fit->bandwidth_bytes_per_s == Approx(2e9).epsilon(1e-9));
  CHECK_FALSE(fit_link({{1, 8, 1e-6}}));
}

TEST_CASE("profile: JSON round-trips, and shipped datasheet profiles load unchanged", "[profile]") {
  DeviceProfile p = synthetic_profile();
  Json json = profile_to_json(p);
  DeviceProfile back = parse_profile(json, "round-trip.json");
  CHECK(profile_to_json(back) == json);
  REQUIRE(back.measured);
  CHECK(back.measured->gemm.size() == p.measured->gemm.size());
  CHECK(back.measured->gemm[5].time_s == p.measured->gemm[5].time_s);
  CHECK(back.machine->cpu_model == "Some CPU");
  CHECK(*back.intra_node_latency_s == 2e-6);
  CHECK(back.execution_in_order);
  CHECK(back.execution_staged_sends);
  CHECK(json["execution"] == Json({{"in_order", true}, {"staged_sends", true}}));
  Json unordered = json;
  unordered["execution"] = {{"staged_sends", true}};
  CHECK_THROWS_WITH(parse_profile(unordered, "bad.json"), Contains("staged_sends needs in_order"));
  // The overlap figures (compute beside a collective) round-trip; CTAs must leave SMs to compute.
  Json overlap = json;
  overlap["overlap"] = {{"sms", 108}, {"collective_ctas_intra_node", 24}, {"collective_ctas_inter_node", 16}};
  DeviceProfile with_overlap = parse_profile(overlap, "overlap.json");
  CHECK(with_overlap.overlap.compute_speed(false) == Approx(84.0 / 108));
  CHECK(with_overlap.overlap.compute_speed(true) == Approx(92.0 / 108));
  CHECK(profile_to_json(with_overlap)["overlap"] == overlap["overlap"]);
  CHECK_FALSE(back.overlap.modelled());
  overlap["overlap"]["collective_ctas_inter_node"] = 108;
  CHECK_THROWS_WITH(parse_profile(overlap, "bad.json"),
                    Contains("overlap.collective_ctas_inter_node") && Contains("fewer CTAs than the device has SMs"));
  overlap["overlap"] = {{"sms", 108}, {"collective_ctas_intra_node", 24}};
  CHECK_THROWS_WITH(parse_profile(overlap, "bad.json"), Contains("collective_ctas_inter_node"));
  // A collective's share of the NIC rate across nodes round-trips; absent, the sends' share.
  CHECK_FALSE(back.inter_node_exchange_fraction);
  CHECK(back.collective_inter_node_fraction() == back.inter_node_bus_fraction);
  Json exchange = json;
  exchange["links"]["inter_node_exchange_fraction"] = 0.92;
  DeviceProfile with_exchange = parse_profile(exchange, "exchange.json");
  CHECK(with_exchange.collective_inter_node_fraction() == 0.92);
  CHECK(profile_to_json(with_exchange)["links"]["inter_node_exchange_fraction"] == 0.92);
  exchange["links"]["inter_node_exchange_fraction"] = 1.5;
  CHECK_THROWS_WITH(parse_profile(exchange, "bad.json"),
                    Contains("bad.json") && Contains("inter_node_exchange_fraction") && Contains("1.5"));
  // Shipped GPU profiles: published component points, every one naming a source it lists.
  for (const char* name : {"a100-sxm4-80gb", "h100-sxm", "h200-sxm", "b200-sxm", "gb200"}) {
    INFO(name);
    DeviceProfile sheet = load_profile(source_path(std::string("profiles/") + name + ".json"));
    REQUIRE(sheet.measured);
    CHECK(sheet.measured->system);
    CHECK_FALSE(sheet.intra_node_bandwidth_bytes_per_s);
    Json j = profile_to_json(sheet);
    CHECK(profile_to_json(parse_profile(j, "x.json")) == j);
    CHECK_FALSE(j.contains("execution"));  // GPU backends: streams run concurrently
    CHECK_FALSE(sheet.execution_in_order);
    CHECK(sheet.variability.device_speed_cv > 0);
    // Compute beside a collective: the SMs NCCL's CTAs leave, with the figures' sources named.
    CHECK(sheet.overlap.modelled());
    CHECK(sheet.overlap.compute_speed(true) < 1);
    CHECK(sheet.overlap.compute_speed(false) < 1);
    CHECK(sheet.sources.count("NCCL-689") == 1);
    const MeasuredTables& t = *sheet.measured;
    CHECK(!t.gemm.empty());
    CHECK(!t.memory.empty());
    CHECK(!t.collectives.empty());
    CHECK(!t.attention.empty());
    auto cited = [&](const std::string& source) { return !source.empty() && sheet.sources.count(source) == 1; };
    for (const auto& g : t.gemm) CHECK(cited(g.source));
    for (const auto& m : t.memory) CHECK(cited(m.source));
    for (const auto& c : t.collectives) CHECK(cited(c.source));
    for (const auto& a : t.attention) CHECK(cited(a.source));
  }
  Json bad = json;
  bad["measured"]["gemm_points"][0]["varient"] = "forward";
  CHECK_THROWS_WITH(parse_profile(bad, "bad.json"), Contains("varient"));
}

TEST_CASE("profile: a CPU profile is refused on a GPU topology and another device", "[profile]") {
  DeviceProfile p = synthetic_profile();
  Topology cpu = load_topology(source_path("topologies/localhost-cpu.json"));
  Topology dgx = load_topology(source_path("topologies/dgx-a100-80gb.json"));
  CHECK_NOTHROW(check_profile_matches(p, cpu));
  CHECK_THROWS_AS(check_profile_matches(p, dgx), InputError);
  CHECK_THROWS_WITH(check_profile_matches(p, dgx),
                    Contains("cpu-core") && Contains("A100-SXM4-80GB") && Contains("GPU"));
  p.device = "cpu-socket";
  CHECK_THROWS_WITH(check_profile_matches(p, cpu), Contains("cpu-socket") && Contains("cpu-core"));
  DeviceProfile sheet = load_profile(source_path("profiles/a100-sxm4-80gb.json"));
  CHECK_NOTHROW(check_profile_matches(sheet, dgx));
  // Measured link figures replace the topology's; fractions scale them otherwise.
  Topology applied = apply_link_fractions(cpu, synthetic_profile());
  CHECK(applied.node.intra_node.bandwidth_bytes_per_s == 3e9);
  CHECK(applied.node.intra_node.latency_s == 2e-6);
  Topology scaled = apply_link_fractions(dgx, sheet);
  CHECK(scaled.node.intra_node.bandwidth_bytes_per_s ==
        Approx(dgx.node.intra_node.bandwidth_bytes_per_s * 0.80));
}

TEST_CASE("profile: machine differences name their fields", "[profile]") {
  DeviceProfile p = synthetic_profile();
  MachineInfo same{"other-host", "Some CPU", 2};
  CHECK(machine_differences(p, same, p.libraries).empty());  // the hostname is not the type
  MachineInfo other{"host", "Another CPU", 8};
  std::vector<std::string> d = machine_differences(p, other, {{"openblas", "OpenBLAS 0.3.26"}});
  REQUIRE(d.size() == 3);
  CHECK_THAT(d[0], Contains("machine.cpu_model") && Contains("Another CPU"));
  CHECK_THAT(d[1], Contains("machine.cores"));
  CHECK_THAT(d[2], Contains("libraries.openblas") && Contains("0.3.26"));
}

TEST_CASE("profile: `stepcast profile --backend cuda` without a topology is refused with a message", "[profile]") {
  // A CUDA build needs the topology whose device the GPU is; a build without CUDA says so.
  test::CommandResult r = test::run_stepcast("profile --backend cuda --out /tmp/never.json");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Contains("cuda") &&
                           (Contains("needs --topology") || Contains("built without CUDA")));
  r = test::run_stepcast("profile --backend cpu --dtype bf16 --out /tmp/never.json");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Contains("fp32, fp64"));
}

TEST_CASE("profile: a measured --quick profile drives simulate on this machine's topology",
          "[profile]") {
  const QuickProfile& q = quick_profile();
  INFO(q.output);
  REQUIRE(q.exit_code == 0);
  DeviceProfile p = load_profile(q.profile);
  REQUIRE(p.measured);
  CHECK(p.backend == "cpu");
  CHECK(p.device == "cpu-core");
  CHECK(p.measured->gemm.size() == 3 * 27);
  CHECK(p.measured->memory.size() == 31 * 3);  // 29 kernel families, grad_norm, copy
  for (const char* family : {"moe_route_forward", "moe_route_backward", "moe_permute_forward", "moe_permute_backward",
                             "moe_unpermute_forward", "moe_unpermute_backward", "embedding_forward",
                             "embedding_backward", "cross_entropy_stats", "cross_entropy_softmax"}) {
    INFO(family);
    CHECK(std::count_if(p.measured->memory.begin(), p.measured->memory.end(),
                        [&](const MemoryPoint& m) { return m.family == family; }) == 3);
  }
  CHECK(p.execution_in_order);
  CHECK(p.execution_staged_sends);
  CHECK_FALSE(p.measured->collectives.empty());
  CHECK(p.measured->p2p.size() == 3);
  CHECK(p.libraries.count("openblas"));
  CHECK(p.libraries.count("mpi"));
  for (const CollectivePoint& c : p.measured->collectives) {
    double factor = c.kind == "all_reduce" ? 2.0 * (c.group_size - 1) / c.group_size
                                           : double(c.group_size - 1) / c.group_size;
    CHECK(c.busbw_bytes_per_s == Approx(c.bytes / c.time_s * factor));
  }
  // Operands out of cache: the quick pools of 16 and 64 MiB per rank, each size whose operands
  // fill two slots (ring: the buffer and a scratch as large; tree: a scratch twice as large, so
  // 4 MiB does not fit 16 MiB twice): 3 ring kinds × 3 sizes and the tree's 2, then all 12.
  const double MiB = 1024.0 * 1024;
  CHECK(p.measured->collective_reuse.size() == 11 + 12);
  for (const CollectivePoint& c : p.measured->collective_reuse) {
    CHECK((c.reuse_distance_bytes == 16 * MiB || c.reuse_distance_bytes == 64 * MiB));
    CHECK(c.algorithm != "mpi");
    CHECK_FALSE((c.algorithm == "tree" && c.bytes == 4 * MiB && c.reuse_distance_bytes == 16 * MiB));
  }
  CHECK(p.measured->method.at("collective_reuse").at("pools_bytes") == Json({16 * MiB, 64 * MiB}));
  // The GEMMs of {20, 320}³ again: back to back and through the same two pools, relative to the
  // table's rotation through 4× the core's L2 of each operand.
  CHECK(p.measured->gemm_reuse.size() == 3 * 8 * 3);
  CHECK(p.measured->gemm_table_pool_bytes > 0);
  for (const GemmPoint& g : p.measured->gemm_reuse) {
    CHECK((g.reuse_distance_bytes == 0 || g.reuse_distance_bytes == 16 * MiB || g.reuse_distance_bytes == 64 * MiB));
    CHECK((g.m == 20 || g.m == 320));
    CHECK(g.time_s > 0);
  }
  // The measured leave-one-out errors, as figures: two shared cores are too noisy to bound.
  auto report = [](const std::vector<LeaveOneOut>& loo, const char* what) {
    std::vector<double> errors;
    for (const LeaveOneOut& l : loo) errors.push_back(std::abs(l.relative_error()));
    std::sort(errors.begin(), errors.end());
    WARN(what << " leave-one-out on this machine's --quick profile: median "
              << 100 * errors[errors.size() / 2] << "%, largest " << 100 * errors.back() << "%");
  };
  report(gemm_leave_one_out(p.measured->gemm), "GEMM");
  report(memory_leave_one_out(p.measured->memory, p.kernel_overhead_s), "memory-bound");

  Topology written = load_topology(q.topology);
  CHECK(written.node.device.name == "cpu-core");
  CHECK(written.node.devices_per_node == 2);
  CHECK(written.node.intra_node.bandwidth_bytes_per_s == *p.intra_node_bandwidth_bytes_per_s);

  test::CommandResult ok = test::run_stepcast(
      "simulate" + tiny_simulate(source_path("topologies/localhost-cpu.json"), q.profile));
  INFO(ok.output);
  CHECK(ok.exit_code == 0);
  CHECK_THAT(ok.output, Contains("(cpu-"));
  CHECK_THAT(ok.output, !Contains("another machine"));
  test::CommandResult own = test::run_stepcast("simulate" + tiny_simulate(q.topology, q.profile));
  CHECK(own.exit_code == 0);
  // The written topology names the profile, so a simulation given no --profile costs with it.
  CHECK(std::filesystem::equivalent(written.profile_file, q.profile));
  test::CommandResult by_topology = test::run_stepcast(
      "simulate" + test::model_arg("tiny") + " --topology " + q.topology + test::plan_arg("tiny-cpu") +
      " --no-scaling");
  INFO(by_topology.output);
  CHECK(by_topology.exit_code == 0);
  CHECK_THAT(by_topology.output, Contains("the topology's") && !Contains("warning"));

  test::CommandResult refused = test::run_stepcast(
      "simulate" + tiny_simulate(source_path("topologies/dgx-a100-80gb.json"), q.profile));
  CHECK(refused.exit_code == 2);
  CHECK_THAT(refused.output, Contains("cpu-core") && Contains("A100-SXM4-80GB"));

  // A profile from another machine type: a warning naming the fields, and the simulation runs.
  Json other = load_json_file(q.profile);
  other["machine"]["cpu_model"] = "Imaginary CPU 9000";
  other["machine"]["cores"] = 512;
  std::string other_file = test::write_temp_file("other-machine-profile.json", other.dump());
  test::CommandResult warned = test::run_stepcast(
      "simulate" + tiny_simulate(source_path("topologies/localhost-cpu.json"), other_file));
  CHECK(warned.exit_code == 0);
  CHECK_THAT(warned.output, Contains("warning") && Contains("machine.cpu_model") &&
                                Contains("Imaginary CPU 9000") && Contains("machine.cores"));
}

TEST_CASE("profile: collective tables interpolate time log-log, latency below, bandwidth above",
          "[profile]") {
  std::vector<CollectivePoint> points = {{"all_reduce", "ring", 2, 1024, 10e-6, 0, 0, "", 1},
                                         {"all_reduce", "ring", 2, 1048576, 400e-6, 0, 0, "", 1}};
  CollectiveTable table(points);
  CHECK(table.time_s(1024) == Approx(10e-6).epsilon(1e-12));
  CHECK(table.time_s(32768) == Approx(std::sqrt(10e-6 * 400e-6)).epsilon(1e-9));  // halfway in log
  CHECK(table.time_s(4) == Approx(10e-6).epsilon(1e-12));                 // latency-bound
  CHECK(table.time_s(4.0 * 1048576) == Approx(4 * 400e-6).epsilon(1e-9));  // the largest's bandwidth
  // A point slower than a larger message's (load while it was measured) takes the larger's time.
  points.push_back({"all_reduce", "ring", 2, 32768, 900e-6, 0, 0, "", 1});
  CollectiveTable bumpy(points);
  CHECK(bumpy.time_s(32768) == Approx(400e-6).epsilon(1e-9));
  CHECK(bumpy.time_s(1024) == Approx(10e-6).epsilon(1e-12));

  Topology topology = load_topology(source_path("topologies/localhost-cpu.json"));
  ComputeCostModel model(topology.node.device, Dtype::fp32, synthetic_profile(), topology.file);
  CHECK(*model.measured_collective_time_s(OpKind::all_reduce, Algorithm::ring, 2, 1048576) ==
        Approx(4e-4).epsilon(1e-12));
  CHECK_FALSE(model.measured_collective_time_s(OpKind::all_reduce, Algorithm::tree, 2, 1048576));
  CHECK_FALSE(model.measured_collective_time_s(OpKind::all_gather, Algorithm::ring, 2, 1048576));
  // Points measured across nodes are not the in-order model's: it costs groups inside a node.
  DeviceProfile across = synthetic_profile();
  across.measured->collectives.push_back({"all_gather", "ring", 2, 1048576, 1e-3, 0, 0, "", 2});
  ComputeCostModel across_model(topology.node.device, Dtype::fp32, across, topology.file);
  CHECK_FALSE(across_model.measured_collective_time_s(OpKind::all_gather, Algorithm::ring, 2, 1048576));
  // No copy family: the staging copy reads and writes the bytes at the measured bandwidth.
  CHECK(model.staging_copy_time_s(1e6) == Approx(2e6 / 8e9 + 1e-6).epsilon(1e-12));
}
