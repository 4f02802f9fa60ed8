// Default uneven reduce-scatter: all-reduce a copy of the input, keep this rank's segment.
// Twice the traffic of an all-to-all, but correct on any backend.
#include <numeric>
#include <string>

#include <torch/torch.h>

#include "comm/reduce_scatter_v.h"
#include "comm/work.h"
#include "deepspeed/comm.h"

namespace deepspeed {
namespace comm {

int64_t check_reduce_scatter_v(const Communicator& comm, const at::Tensor& output,
                               const at::Tensor& input, const std::vector<int64_t>& splits) {
  if (static_cast<int>(splits.size()) != comm.world_size())
    throw CommError("reduce_scatter_v: " + std::to_string(splits.size()) +
                    " splits for world size " + std::to_string(comm.world_size()));
  const int64_t total = std::accumulate(splits.begin(), splits.end(), int64_t{0});
  if (total != input.numel() || output.numel() != splits[comm.rank()])
    throw CommError("reduce_scatter_v: splits sum to " + std::to_string(total) + " for an input of " +
                    std::to_string(input.numel()) + " elements, output has " +
                    std::to_string(output.numel()) + " (expected " +
                    std::to_string(splits[comm.rank()]) + ") on rank " + std::to_string(comm.rank()));
  return std::accumulate(splits.begin(), splits.begin() + comm.rank(), int64_t{0});
}

WorkPtr Communicator::reduce_scatter_v(at::Tensor& output, const at::Tensor& input,
                                       const std::vector<int64_t>& input_splits, ReduceOp op) {
  const int64_t offset = check_reduce_scatter_v(*this, output, input, input_splits);
  at::Tensor reduced = input.contiguous().view({-1}).clone();
  WorkPtr inner = all_reduce(reduced, op);
  // Shaped like the output (a strided output has no flat view to copy into).
  return std::make_shared<ThenWork>(std::move(inner), [reduced, output, offset]() mutable {
    output.copy_(reduced.narrow(0, offset, output.numel()).view(output.sizes()));
  });
}

}  // namespace comm
}  // namespace deepspeed
