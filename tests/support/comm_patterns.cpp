#include "support/comm_patterns.h"

namespace dstest {

at::Tensor pattern(int64_t n, int r, at::ScalarType type, int salt, int64_t offset) {
  return at::arange(offset, offset + n, at::kLong)
      .mul(7)
      .add(r * 13 + salt * 5)
      .remainder(17)
      .sub(8)
      .to(type);
}

at::Tensor expected_reduce(int64_t n, int world, at::ScalarType type,
                           deepspeed::comm::ReduceOp op, int64_t offset) {
  using deepspeed::comm::ReduceOp;
  at::Tensor acc = pattern(n, 0, at::kDouble, 0, offset);
  for (int r = 1; r < world; ++r) {
    at::Tensor x = pattern(n, r, at::kDouble, 0, offset);
    if (op == ReduceOp::Max)
      acc = at::maximum(acc, x);
    else if (op == ReduceOp::Min)
      acc = at::minimum(acc, x);
    else
      acc = acc + x;
  }
  if (op == ReduceOp::Avg) acc = acc / world;
  return acc.to(type);
}

}  // namespace dstest
