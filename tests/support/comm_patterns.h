// The data the collective tests send and the results they expect (comm_test, gloo_hierarchy_test).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

#include "deepspeed/comm.h"

namespace dstest {

// Rank r's data at positions [offset, offset + n): small integers in [-8, 8] that differ
// between ranks and positions (exact in every dtype tested, sums of a few ranks too).
at::Tensor pattern(int64_t n, int r, at::ScalarType type, int salt = 0, int64_t offset = 0);

// Reference reduction over all ranks' patterns, in double, cast to `type` at the end.
at::Tensor expected_reduce(int64_t n, int world, at::ScalarType type,
                           deepspeed::comm::ReduceOp op, int64_t offset = 0);

}  // namespace dstest
