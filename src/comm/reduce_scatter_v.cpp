// Default uneven reduce-scatter: all-reduce a copy of the input, keep this rank's segment.
// Twice the traffic of an all-to-all, but correct on any backend.
#include <numeric>
#include <string>

#include <torch/torch.h>

#include "deepspeed/comm.h"

namespace deepspeed {
namespace comm {
namespace {

class SegmentWork : public Work {
 public:
  SegmentWork(WorkPtr inner, at::Tensor reduced, at::Tensor output, int64_t offset)
      : inner_(std::move(inner)), reduced_(std::move(reduced)), output_(std::move(output)),
        offset_(offset) {}
  void wait() override {
    inner_->wait();
    output_.view({-1}).copy_(reduced_.narrow(0, offset_, output_.numel()));
  }

 private:
  WorkPtr inner_;
  at::Tensor reduced_, output_;
  int64_t offset_;
};

}  // namespace

WorkPtr Communicator::reduce_scatter_v(at::Tensor& output, const at::Tensor& input,
                                       const std::vector<int64_t>& input_splits, ReduceOp op) {
  if (static_cast<int>(input_splits.size()) != world_size())
    throw CommError("reduce_scatter_v: " + std::to_string(input_splits.size()) +
                    " splits for world size " + std::to_string(world_size()));
  const int64_t total = std::accumulate(input_splits.begin(), input_splits.end(), int64_t{0});
  if (total != input.numel() || output.numel() != input_splits[rank()])
    throw CommError("reduce_scatter_v: splits sum to " + std::to_string(total) + " for an input of " +
                    std::to_string(input.numel()) + " elements, output has " +
                    std::to_string(output.numel()) + " (expected " +
                    std::to_string(input_splits[rank()]) + ") on rank " + std::to_string(rank()));
  const int64_t offset =
      std::accumulate(input_splits.begin(), input_splits.begin() + rank(), int64_t{0});
  at::Tensor reduced = input.contiguous().view({-1}).clone();
  WorkPtr inner = all_reduce(reduced, op);
  return std::make_shared<SegmentWork>(std::move(inner), reduced, output, offset);
}

}  // namespace comm
}  // namespace deepspeed
