// Two fixed kernels timed on this machine (validate's check that the machine did not change speed
// between the profile and a point's runs): a VM's speed shifts by 10-15% over minutes on the
// project's development machine, which no profile can describe, and a compute-bound GEMM does
// not see every shift (the steps' non-GEMM kernels ran 6-12% slower while the GEMM held).
//   - a GEMM: fp32 256 x 256 x 256 through the CPU backend's BLAS gemm;
//   - a kernel of the kind steps spend their other time in: the CPU backend's fp32 softmax over
//     a 128 KiB tensor (rows of 256), in cache as a step's attention scores are (its exp, not
//     memory, sets its rate here: about 0.75 GB/s on the development VM).
// Each in blocks of about 10 ms; the median block's rate.
#pragma once

namespace stepcast::cli {

struct CanaryRates {
  double gemm_gflops = 0;    // GFLOP/s of the GEMM
  double softmax_gbps = 0;   // GB/s of the softmax (its input read and its output written)
};

// The canaries now (about 0.2 s).
CanaryRates machine_canary();

}  // namespace stepcast::cli
