// A plan's FP8 keys (Megatron-LM's --fp8-format, --fp8-recipe, …), read and checked against the
// model and the device.
#pragma once

#include "json_input.hpp"
#include "model.hpp"
#include "plan.hpp"
#include "topology.hpp"

namespace stepcast {

// The fp8 keys of a plan file; the recipe's keys without fp8 are refused rather than ignored.
Fp8Recipe read_fp8(ObjectReader& reader);

// The recipe against the model and the device: MXFP8 needs MX tensor cores (the device's mxfp8),
// blockwise a device with fp8_blockwise; both a dense model, and every linear layer's dimensions
// on a rank multiples of their block (32; 128).
void validate_fp8(const Plan& plan, const ModelConfig& model, const Topology& topology);

}  // namespace stepcast
