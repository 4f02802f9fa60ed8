// The trainable parameters of one dtype laid into one contiguous buffer, each parameter's data
// re-pointed to its slice, so a partition is a plain slice of the buffer and the all-gather after
// the step writes straight into the model's parameters.
//
// Parameters are laid in REVERSE registration order: autograd produces the last layers' gradients
// first, so gradient buckets — contiguous ranges of this buffer — fill front to back.
#pragma once
#include <vector>

#include <ATen/Tensor.h>

#include "partition/partition.h"

namespace deepspeed {
namespace zero {

struct ParamSlot {
  at::Tensor param;    // the model's parameter (data now a view of the flat buffer)
  int64_t offset = 0;  // first element in the flat buffer
  int64_t numel = 0;
};

class FlatParams {
 public:
  // Copies the parameters' values into the buffer. REQUIRES: all params share one dtype.
  // The buffer lives on `device` (the stage context's).
  FlatParams(const std::vector<at::Tensor>& params, int world_size, int64_t alignment,
             c10::Device device = c10::kCPU);
  const PartitionLayout& layout() const { return layout_; }
  at::Tensor& buffer() { return buffer_; }
  const at::Tensor& buffer() const { return buffer_; }
  const std::vector<ParamSlot>& slots() const { return slots_; }  // in buffer order
  at::Tensor partition(int rank) const { return buffer_.narrow(0, layout_.begin(rank), layout_.partition_numel); }

 private:
  PartitionLayout layout_;
  at::Tensor buffer_;
  std::vector<ParamSlot> slots_;
};

// A contiguous range [begin, end) of the flat buffer whose gradients are reduced together.
struct BucketRange {
  int64_t begin = 0, end = 0;
  std::vector<size_t> slots;  // indices into FlatParams::slots()
};
// Cuts the buffer at parameter boundaries into buckets of at most bucket_numel elements (a larger
// parameter is a bucket of its own); the last bucket runs to the padded end so the padding is
// covered too.
std::vector<BucketRange> make_bucket_ranges(const FlatParams& flat, int64_t bucket_numel);

}  // namespace zero
}  // namespace deepspeed
