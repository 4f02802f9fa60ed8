// Inputs for the tests of collectives that only move bytes (the shared-memory all-gather and
// all-to-all), and the all-reduce each of them issues beside its cases so that operations of
// several kinds are outstanding together.
#pragma once
#include <ATen/Tensor.h>

#include <cstdint>
#include <vector>

#include "deepspeed/comm.h"

namespace dstest {

// Every dtype such a collective carries: the floats, the integers of every width, bool.
const std::vector<at::ScalarType>& moved_dtypes();

// n values of `type` drawn from `seed`: normal floats, integers in [-100, 100], bools.
at::Tensor random_values(at::ScalarType type, int64_t n, uint64_t seed);

// Issues this rank's all-reduce of 3000 floats (arange + rank: 3 pieces of 4 KiB) on `c`,
// appending its tensor to `sums` and its handle to `works`.
void issue_all_reduce_beside(deepspeed::comm::Communicator& c, std::vector<at::Tensor>& sums,
                             std::vector<deepspeed::comm::WorkPtr>& works);
// After the waits: every such sum is exact (gtest expectations).
void expect_all_reduces_beside(const std::vector<at::Tensor>& sums, int world);

}  // namespace dstest
