// A fixed GEMM timed on this machine (validate's check that the machine did not change speed
// between the profile and a point's runs): a VM's speed shifts by 10-15% over minutes on the
// project's development machine, which no profile can describe. fp32 256 x 256 x 256 through the
// CPU backend's BLAS gemm, in blocks of about 10 ms; the median block's rate.
#pragma once

namespace stepcast::cli {

// GFLOP/s of the canary now (about 0.1 s).
double machine_canary_gflops();

}  // namespace stepcast::cli
