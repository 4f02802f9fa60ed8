#include "zero/flat_params.h"

#include <torch/torch.h>

#include "device/out_of_memory.h"

namespace deepspeed {
namespace zero {

FlatParams::FlatParams(const std::vector<at::Tensor>& params, int world_size, int64_t alignment,
                       c10::Device device) {
  int64_t total = 0;
  for (auto& p : params) total += p.numel();
  layout_ = make_partition_layout(total, world_size, alignment);
  auto dtype = params.empty() ? torch::kFloat : params.front().scalar_type();
  {
    AllocatingFor naming("the flat parameters (every trainable parameter's, one buffer)", -1,
                         layout_.padded_numel, c10::elementSize(dtype));
    buffer_ = torch::zeros({layout_.padded_numel},
                           torch::TensorOptions().dtype(dtype).device(device));
  }
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (size_t k = params.size(); k-- > 0;) {
    at::Tensor p = params[k];
    TORCH_CHECK(p.scalar_type() == dtype, "FlatParams: mixed dtypes in one group");
    auto slice = buffer_.narrow(0, offset, p.numel());
    slice.copy_(p.detach().reshape({-1}));
    p.set_data(slice.view(p.sizes()));
    slots_.push_back({p, offset, p.numel()});
    offset += p.numel();
  }
}

std::vector<BucketRange> make_bucket_ranges(const FlatParams& flat, int64_t bucket_numel) {
  std::vector<BucketRange> buckets;
  const auto& slots = flat.slots();
  for (size_t i = 0; i < slots.size(); ++i) {
    // A parameter that would take the bucket past bucket_numel starts the next one (DeepSpeed
    // reduces its bucket before it would overflow), so bucket_numel is a cap.
    const int64_t end = slots[i].offset + slots[i].numel;
    if (buckets.empty() || end - buckets.back().begin > bucket_numel)
      buckets.push_back({slots[i].offset, slots[i].offset, {}});
    buckets.back().slots.push_back(i);
    buckets.back().end = slots[i].offset + slots[i].numel;
  }
  if (buckets.empty()) buckets.push_back({0, 0, {}});
  buckets.back().end = flat.layout().padded_numel;
  return buckets;
}

}  // namespace zero
}  // namespace deepspeed
