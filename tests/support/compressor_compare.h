// One call of the 1-bit compressed all-reduce on two paths (src/optim/compressed_allreduce.h)
// compared: the host loops as the reference, the tensor operations (on the CPU or a GPU) against
// them. Used by the CPU tests (lamb_onebit_test) and the GPU ones (onebit_gpu_test).
#pragma once
#include <string>
#include <vector>

#include <torch/torch.h>

#include "optim/compressed_allreduce.h"

namespace dstest {

// Inputs for one call of the compressor: tensor i of `sizes` is a normal draw from its own
// generator seeded `seed + i`, moved 0.01 away from zero (no element so near zero that a scale's
// last bits flip a worker's sign), or its signs, ±1, with `plus_minus_one` (every sum of squares
// exact, so two paths agree to the bit).
std::vector<torch::Tensor> compressor_inputs(const std::vector<int64_t>& sizes, uint64_t seed,
                                             bool plus_minus_one);

// Runs `reference` (its host loops) on a copy of `inputs` and `other` on a copy on other's device
// (its tensor operations: run_with_tensor_ops on the CPU; on a GPU run(), whose dispatch chooses
// them there), and compares the outputs and both error buffers. `exact`: bit for bit;
// else within 1e-5 of the largest value (of the buffer or the inputs, whichever is larger), but
// for at most 2 elements per buffer (a server element so near zero that a scale's last bits flip
// its sign; a layout slip moves hundreds). Each difference, and an output not on other's device,
// is appended to `failures`, prefixed by `call`.
void compare_compressor_paths(deepspeed::optim::CompressedAllReduce& reference,
                              deepspeed::optim::CompressedAllReduce& other,
                              const std::vector<torch::Tensor>& inputs, bool exact,
                              const std::string& call, std::vector<std::string>& failures);

}  // namespace dstest
