// Energy and cost of a step (plans/energy.hpp) on a hand-computed case.
#include <catch2/catch.hpp>

#include "energy.hpp"

using namespace stepcast;

TEST_CASE("energy: power × time per device, summed — cost: price × devices × hours", "[energy]") {
  // A 2 s step: a rank standing for 4 devices busy 1.5 s, waiting 0.3 s, idle 0.2 s; one device
  // busy 0.5 s, waiting 1.5 s. At 400 W busy and 100 W otherwise:
  //   4 · (1.5 · 400 + 0.5 · 100) + (0.5 · 400 + 1.5 · 100) = 4 · 650 + 350 = 2950 J.
  std::vector<DeviceTime> times = {{0, 4, 1.5, 0.3, 0.2}, {8, 1, 0.5, 1.5, 0}};
  StepEnergy e = step_energy(times, 100, 400);
  CHECK(e.devices == 5);
  CHECK(e.busy_device_s == Approx(6.5));
  CHECK(e.waiting_device_s == Approx(2.7));
  CHECK(e.idle_device_s == Approx(0.8));
  CHECK(e.busy_j == Approx(2600));
  CHECK(e.other_j == Approx(350));
  CHECK(e.energy_per_step_j == Approx(2950));
  CHECK(e.mean_power_w == Approx(2950.0 / 10));
  // 1,024 devices at 2.5 an hour for a 12 s step: 1024 · 2.5 · 12 / 3600.
  CHECK(cost_per_step(2.5, 1024, 12) == Approx(1024 * 2.5 * 12 / 3600.0));
}
