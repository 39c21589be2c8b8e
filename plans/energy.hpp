// Energy and cost of one training step from how each device spent it: busy (its compute stream
// running an op) at power_busy_w, the rest of the step (communication in flight, waiting on a
// peer, idle) at power_idle_w. Joules, watts, seconds; pure functions, tested by hand.
#pragma once

#include <cstdint>
#include <vector>

namespace stepcast {

// One simulated (or measured) rank's step: busy_s + waiting_s + idle_s = the step time. A
// simulated rank may stand for several devices alike (fast mode's folded tensor-parallel group).
struct DeviceTime {
  int64_t rank = 0;
  int64_t devices = 1;
  double busy_s = 0;     // its compute stream ran an op (compute, optimizer)
  double waiting_s = 0;  // no compute, but a collective, send or receive in flight
  double idle_s = 0;     // nothing in flight (before its first op, after its last)
};

struct StepEnergy {
  int64_t devices = 0;
  double busy_device_s = 0, waiting_device_s = 0, idle_device_s = 0;  // summed over devices
  double busy_j = 0;   // busy_device_s · power_busy_w
  double other_j = 0;  // (waiting + idle) · power_idle_w
  double energy_per_step_j = 0;
  double mean_power_w = 0;  // energy_per_step_j / (devices · step time)
};

// Σ over devices of busy_s · power_busy_w + (waiting_s + idle_s) · power_idle_w.
StepEnergy step_energy(const std::vector<DeviceTime>& times, double power_idle_w, double power_busy_w);

// price_per_gpu_hour · devices · step_time_s / 3600.
double cost_per_step(double price_per_gpu_hour, int64_t devices, double step_time_s);

}  // namespace stepcast
