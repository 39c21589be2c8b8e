// An inter-node link measured at several NIC rates (DeviceProfile::inter_node_at_rates, `stepcast
// profile --add-links-to`): the fraction a link of each rate gets (exact at the measured rates,
// log-linear in log rate between them, the nearest's outside), every fabric link at its own
// rate's, the JSON form and its bad inputs, and how a measurement at one more rate is added.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>

#include "errors.hpp"
#include "profile.hpp"
#include "test_support.hpp"

using namespace stepcast;
using Catch::Matchers::Contains;

namespace {

constexpr double k200M = 25e6, k1G = 125e6, k10G = 1.25e9;

// Measured at 1 Gbit/s (0.64 sends, 0.62 collectives), then at 200 Mbit/s and 10 Gbit/s.
DeviceProfile three_rates() {
  DeviceProfile p;
  p.name = "link-rates";
  p.device = "cpu-core";
  p.backend = "cpu";
  p.gemm[Dtype::fp32] = GemmEfficiency{1.0, 0.0};
  p.inter_node_rate_bytes_per_s = k1G;
  p.inter_node_bus_fraction = 0.64;
  p.inter_node_exchange_fraction = 0.62;
  p.inter_node_at_rates = {{k200M, 0.95, 0.90}, {k10G, 0.93, std::nullopt}};
  return p;
}

}  // namespace

TEST_CASE("link rates: each measured rate its own fraction and log-linear between them", "[profile]") {
  DeviceProfile p = three_rates();
  CHECK(p.inter_node_fraction_at(k200M, false) == 0.95);
  CHECK(p.inter_node_fraction_at(k200M, true) == 0.90);
  CHECK(p.inter_node_fraction_at(k1G, false) == 0.64);
  CHECK(p.inter_node_fraction_at(k1G, true) == 0.62);
  // 10 Gbit/s measured no collective: its sends' fraction.
  CHECK(p.inter_node_fraction_at(k10G, true) == 0.93);
  // Halfway in log rate (√(200 Mbit/s · 1 Gbit/s)), halfway in fraction.
  CHECK(p.inter_node_fraction_at(std::sqrt(k200M * k1G), false) == Approx((0.95 + 0.64) / 2));
  CHECK(p.inter_node_fraction_at(std::sqrt(k1G * k10G), true) == Approx((0.62 + 0.93) / 2));
  // Outside the measured rates: the nearest's.
  CHECK(p.inter_node_fraction_at(1e6, false) == 0.95);
  CHECK(p.inter_node_fraction_at(1e12, false) == 0.93);
  CHECK(p.collective_fraction_differs());
  // One rate (or none recorded): the profile's fractions at every rate, as before.
  DeviceProfile one = three_rates();
  one.inter_node_at_rates.clear();
  CHECK(one.inter_node_fraction_at(k200M, false) == 0.64);
  CHECK(one.inter_node_fraction_at(k10G, true) == 0.62);
  one.inter_node_exchange_fraction.reset();
  CHECK_FALSE(one.collective_fraction_differs());
  one.inter_node_at_rates = {{k200M, 0.95, 0.90}};
  CHECK(one.collective_fraction_differs());
}

TEST_CASE("link rates: NICs and the fabric's links each get their own rate's fraction", "[profile]") {
  Topology t = load_topology(test::source_path("topologies/netns-2node.json"));
  REQUIRE(t.fabric.nic_bandwidth_bytes_per_s == k1G);
  // Two leaves joined by a 200 Mbit/s uplink (a dragonfly's global link, as netns-cluster.sh
  // writes it with --uplink-rate).
  t.fabric.dragonfly.global_link_bandwidth_bytes_per_s = k200M;
  t.fabric.dragonfly.local_link_bandwidth_bytes_per_s = k10G;
  DeviceProfile p = three_rates();
  Topology sends = apply_link_fractions(t, p);
  CHECK(sends.fabric.nic_bandwidth_bytes_per_s == Approx(k1G * 0.64));
  CHECK(sends.fabric.dragonfly.global_link_bandwidth_bytes_per_s == Approx(k200M * 0.95));
  CHECK(sends.fabric.dragonfly.local_link_bandwidth_bytes_per_s == Approx(k10G * 0.93));
  Topology collectives = apply_link_fractions(t, p, true);
  CHECK(collectives.fabric.nic_bandwidth_bytes_per_s == Approx(k1G * 0.62));
  CHECK(collectives.fabric.dragonfly.global_link_bandwidth_bytes_per_s == Approx(k200M * 0.90));
  // A profile of one rate scales every link by its one fraction.
  p.inter_node_at_rates.clear();
  CHECK(apply_link_fractions(t, p).fabric.dragonfly.global_link_bandwidth_bytes_per_s == Approx(k200M * 0.64));
}

TEST_CASE("link rates: JSON round-trips, and bad tables are refused naming the key", "[profile]") {
  Json json = profile_to_json(three_rates());
  CHECK(json["links"]["inter_node_rate_bytes_per_s"] == k1G);
  REQUIRE(json["links"]["inter_node_at_rates"].size() == 2);
  CHECK_FALSE(json["links"]["inter_node_at_rates"][1].contains("exchange_fraction"));
  DeviceProfile back = parse_profile(json, "rates.json");
  CHECK(profile_to_json(back) == json);
  CHECK(back.inter_node_fraction_at(k200M, true) == 0.90);
  auto refused = [&](const std::function<void(Json&)>& edit, const std::string& key, const std::string& why) {
    Json bad = json;
    edit(bad);
    CHECK_THROWS_WITH(parse_profile(bad, "bad.json"), Contains("bad.json") && Contains(key) && Contains(why));
  };
  refused([](Json& j) { j["links"].erase("inter_node_rate_bytes_per_s"); }, "inter_node_at_rates[0]",
          "inter_node_rate_bytes_per_s");
  refused([](Json& j) { j["links"]["inter_node_at_rates"][0]["nic_bandwidth_bytes_per_s"] = k1G; },
          "inter_node_at_rates[0]", "repeats a rate or is out of order");
  refused([](Json& j) { j["links"]["inter_node_at_rates"][1]["nic_bandwidth_bytes_per_s"] = k200M; },
          "inter_node_at_rates[1]", "repeats a rate or is out of order");
  refused([](Json& j) { j["links"]["inter_node_at_rates"][1]["nic_bandwidth_bytes_per_s"] = 1e6; },
          "inter_node_at_rates[1]", "ascending");
  refused([](Json& j) { j["links"]["inter_node_at_rates"][0]["bus_fraction"] = 1.5; }, "bus_fraction", "1.5");
  refused([](Json& j) { j["links"]["inter_node_at_rates"][0]["exchange_fraction"] = 0; }, "exchange_fraction", "0");
  refused([](Json& j) { j["links"]["inter_node_at_rates"][0].erase("bus_fraction"); }, "bus_fraction", "");
  refused([](Json& j) { j["links"]["inter_node_at_rates"][0]["nic_bandwidth_bytes_per_s"] = -1; },
          "nic_bandwidth_bytes_per_s", "-1");
  refused([](Json& j) { j["links"]["inter_node_at_rates"][0]["rate"] = 1; }, "rate", "");
  refused([](Json& j) { j["links"]["inter_node_at_rates"] = 3; }, "inter_node_at_rates", "array");
  refused([](Json& j) { j["links"]["inter_node_rate_bytes_per_s"] = 0; }, "inter_node_rate_bytes_per_s", "0");
}

TEST_CASE("link rates: a measurement at one more rate is added to a profile", "[profile]") {
  DeviceProfile links;
  links.inter_node_rate_bytes_per_s = 62.5e6;
  links.inter_node_bus_fraction = 0.85;
  links.inter_node_exchange_fraction = 0.75;
  links.inter_node_latency_s = 9e-6;
  links.measured = MeasuredTables{};
  links.measured->fits["inter_node_p2p"] = {{"bandwidth_bytes_per_s", 53e6}};
  DeviceProfile base = three_rates();
  base.inter_node_latency_s = 5e-6;
  base.measured = MeasuredTables{};
  // Another rate: between 200 Mbit/s and 1 Gbit/s in the table; the profile's own figures stay.
  DeviceProfile added = add_inter_node_rate(base, links);
  REQUIRE(added.inter_node_at_rates.size() == 3);
  CHECK(added.inter_node_at_rates[1].nic_bandwidth_bytes_per_s == 62.5e6);
  CHECK(added.inter_node_fraction_at(62.5e6, true) == 0.75);
  CHECK(added.inter_node_bus_fraction == 0.64);
  CHECK(*added.inter_node_latency_s == 5e-6);
  CHECK(added.measured->fits["inter_node_at_rates"][0]["inter_node_p2p"]["bandwidth_bytes_per_s"] == 53e6);
  CHECK_NOTHROW(parse_profile(profile_to_json(added), "added.json"));
  // The same rate again replaces its entry (and its fits record), not a second one.
  links.inter_node_bus_fraction = 0.8;
  DeviceProfile again = add_inter_node_rate(added, links);
  CHECK(again.inter_node_at_rates.size() == 3);
  CHECK(again.inter_node_fraction_at(62.5e6, false) == 0.8);
  CHECK(again.measured->fits["inter_node_at_rates"].size() == 1);
  // At the profile's own rate: its own figures are measured again.
  links.inter_node_rate_bytes_per_s = k1G;
  DeviceProfile own = add_inter_node_rate(base, links);
  CHECK(own.inter_node_at_rates.size() == 2);
  CHECK(own.inter_node_bus_fraction == 0.8);
  CHECK(*own.inter_node_latency_s == 9e-6);
  // A profile of one host (no inter-node link measured): the link becomes its own.
  DeviceProfile one_host;
  DeviceProfile first = add_inter_node_rate(one_host, links);
  CHECK(*first.inter_node_rate_bytes_per_s == k1G);
  CHECK(first.inter_node_at_rates.empty());
  CHECK(*first.inter_node_exchange_fraction == 0.75);
  // Nothing measured across hosts: refused.
  CHECK_THROWS_AS(add_inter_node_rate(base, DeviceProfile{}), InputError);
}
