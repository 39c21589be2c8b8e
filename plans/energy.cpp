// Energy and cost of a step; see energy.hpp.
#include "energy.hpp"

namespace stepcast {

StepEnergy step_energy(const std::vector<DeviceTime>& times, double power_idle_w, double power_busy_w) {
  StepEnergy e;
  double device_s = 0;
  for (const DeviceTime& t : times) {
    const double n = double(t.devices);
    e.devices += t.devices;
    e.busy_device_s += n * t.busy_s;
    e.waiting_device_s += n * t.waiting_s;
    e.idle_device_s += n * t.idle_s;
    device_s += n * (t.busy_s + t.waiting_s + t.idle_s);
  }
  e.busy_j = e.busy_device_s * power_busy_w;
  e.other_j = (e.waiting_device_s + e.idle_device_s) * power_idle_w;
  e.energy_per_step_j = e.busy_j + e.other_j;
  e.mean_power_w = device_s > 0 ? e.energy_per_step_j / device_s : 0;
  return e;
}

double cost_per_step(double price_per_gpu_hour, int64_t devices, double step_time_s) {
  return price_per_gpu_hour * double(devices) * step_time_s / 3600.0;
}

}  // namespace stepcast
