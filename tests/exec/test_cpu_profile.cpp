// The CPU profile: its inter-node figures from its measured tables (exec/profiler.hpp), the
// ping-pong's pairs, and the point timer's untimed before_each.
#include <catch2/catch.hpp>

#include <chrono>

#include "point_timer.hpp"
#include "profiler.hpp"

using namespace stepcast;

TEST_CASE("cpu profile: a collective's share of the NICs from the ring all_gather across nodes", "[profile]") {
  // 2 ranks, one a node, on a 25 MB/s NIC: (n−1)/n of the buffer each way at 0.92 of it, plus a
  // fixed 3 ms (which the marginal rate between the two largest sizes leaves out).
  const double nic = 25e6;
  auto gather = [&](double bytes) {
    return CollectivePoint{"all_gather", "ring", 2, bytes, 3e-3 + bytes / 2 / (0.92 * nic), 0, 0, "", 1};
  };
  std::vector<CollectivePoint> points = {gather(4194304), gather(4096), gather(262144)};
  // Other kinds, algorithms and group sizes are not read.
  points.push_back({"all_reduce", "ring", 2, 8388608, 1.0, 0, 0, "", 1});
  points.push_back({"all_gather", "tree", 2, 8388608, 1.0, 0, 0, "", 1});
  points.push_back({"all_gather", "ring", 4, 8388608, 1.0, 0, 0, "", 1});
  std::optional<double> f = inter_node_exchange_fraction(points, 2, nic);
  REQUIRE(f);
  CHECK(*f == Approx(0.92).epsilon(1e-9));
  CHECK_FALSE(inter_node_exchange_fraction({gather(4194304)}, 2, nic));  // one size
  CHECK_FALSE(inter_node_exchange_fraction(points, 3, nic));             // no such group
  CHECK_FALSE(inter_node_exchange_fraction(points, 2, 0));               // no NIC rate
  // A rate above the NIC's is clamped to it.
  CHECK(*inter_node_exchange_fraction(points, 2, 0.5 * nic) == 1.0);
}

TEST_CASE("cpu profile: the ping-pong across nodes is one pair at a time and inside a node every pair", "[profile]") {
  // 2 nodes of 2 ranks: across nodes only rank 0 with rank 2 (two pairs at once on one NIC read
  // half its rate); inside a node (0, 1) and (2, 3).
  CHECK(ping_pong_peer(0, 4, 2) == 2);
  CHECK(ping_pong_peer(2, 4, 2) == 0);
  CHECK(ping_pong_peer(1, 4, 2) == -1);
  CHECK(ping_pong_peer(3, 4, 2) == -1);
  CHECK(ping_pong_peer(0, 4, 1) == 1);
  CHECK(ping_pong_peer(3, 4, 1) == 2);
  // One rank a node: every pair of nodes (node 2j with 2j+1); an odd last node sits out.
  CHECK(ping_pong_peer(2, 4, 1) == 3);
  CHECK(ping_pong_peer(2, 3, 1) == -1);
  // 4 nodes of 8: ranks 0 and 16 lead their pairs of nodes.
  CHECK(ping_pong_peer(0, 32, 8) == 8);
  CHECK(ping_pong_peer(16, 32, 8) == 24);
  CHECK(ping_pong_peer(17, 32, 8) == -1);
}

namespace {

void spin_for(double seconds) {
  auto start = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds) {
  }
}

}  // namespace

TEST_CASE("point timer: a point's before_each runs before every call and is not timed", "[profile]") {
  int64_t before = 0, calls = 0, synced = 0;
  TimedPoint plain{[&] { spin_for(50e-6); }};
  TimedPoint after{[&] {
                     spin_for(50e-6);
                     ++calls;
                   },
                   true, nullptr, [&] {
                     spin_for(400e-6);
                     ++before;
                   }};
  auto sync = [&] { ++synced; };
  // 20 calls of 50 us: about 1 ms either way (a loaded machine only adds); the 400 us before
  // each call of the second is not counted.
  double plain_s = time_calls(plain, 20, sync);
  CHECK(synced == 1);  // once after the calls
  double after_s = time_calls(after, 20, sync);
  CHECK(before == 20);
  CHECK(calls == 20);
  CHECK(synced == 1 + 2 * 20);  // after each before_each and each call
  CHECK(plain_s > 20 * 45e-6);
  CHECK(after_s > 20 * 45e-6);
  CHECK(after_s < 20 * 300e-6);
}
