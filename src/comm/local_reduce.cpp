#include "comm/local_reduce.h"

#include <ATen/ATen.h>

#include "comm/dtypes.h"

namespace deepspeed {
namespace comm {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::Max:
      return c10d::ReduceOp::MAX;
    case ReduceOp::Min:
      return c10d::ReduceOp::MIN;
    default:
      return c10d::ReduceOp::SUM;
  }
}

void divide_by(at::Tensor& t, int n) {
  if (at::isFloatingType(t.scalar_type())) {
    t.div_(n);
  } else {
    t.div_(n, "trunc");
  }
}

at::Tensor reduce_chunks(const at::Tensor& chunks, ReduceOp op, int world) {
  at::Tensor acc = chunks.to(accumulate_dtype(chunks.scalar_type()));
  if (op == ReduceOp::Max) return std::get<0>(acc.max(0));
  if (op == ReduceOp::Min) return std::get<0>(acc.min(0));
  at::Tensor sum = acc.sum(0, false, acc.scalar_type());
  if (op == ReduceOp::Avg) divide_by(sum, world);
  return sum;
}

}  // namespace comm
}  // namespace deepspeed
