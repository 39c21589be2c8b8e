// The dp_size = 1 reference of `simulate`'s scaling efficiency: the same plan at dp_size 1 and
// global_batch_size / dp_size (unequal replicas: the replicas' mean microbatches, rounded to the
// nearest count the schedule takes, at least one), lowered and simulated in a forked child process while the parent
// simulates the plan itself (one SimGrid engine per process; the two cores busy at once). The
// child shares the parent's parsed inputs and profile, so it reads no file and writes none.
#pragma once

#include "forked_child.hpp"
#include "inputs.hpp"
#include "profile.hpp"
#include "simulator.hpp"

namespace stepcast::cli {

class ScalingReference {
 public:
  // Forks the child. Call before this process creates its SimGrid engine or starts a thread.
  ScalingReference(const Inputs& in, const DeviceProfile& profile, const SimulateOptions& options);

  // Waits for the child: the reference's tokens/s per device; std::runtime_error with the
  // child's message when it failed.
  double tokens_per_s_per_device();

 private:
  ForkedChild child_;
};

}  // namespace stepcast::cli
