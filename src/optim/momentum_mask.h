// DeepSpeed's exp_avg_mask for the 1-bit optimizers (a param-group entry there; set through
// deepspeed::set_exp_avg_mask here, include/deepspeed/optimizer.h).
//
// 1-bit compression cannot represent an exact zero: every element of a compressed momentum comes
// back as ±scale. Where a parameter's gradient is always zero in part (an attention key bias,
// whose gradient softmax cancels; position rows past the trained length), the exchange then
// invents momentum there, and divided by a variance near zero it moves those elements without
// bound. The mask (1 keep, 0 zero) is multiplied into the momentum after every compressed
// exchange, as DeepSpeed does.
#pragma once
#include <map>

#include <ATen/Tensor.h>

namespace deepspeed {
namespace optim {

class MomentumMasks {
 public:
  virtual ~MomentumMasks() = default;
  // REQUIRES: `index` is the parameter's position in the optimizer's parameter order and `mask`
  // has its shape (checked by the caller, set_exp_avg_mask).
  void set_mask(size_t index, at::Tensor mask) { masks_[index] = std::move(mask); }
  // momentum *= mask of parameter `index`, when it has one.
  void apply_mask(size_t index, at::Tensor& momentum) const {
    auto it = masks_.find(index);
    if (it != masks_.end()) momentum.mul_(it->second);
  }
  bool has_masks() const { return !masks_.empty(); }

 private:
  std::map<size_t, at::Tensor> masks_;
};

}  // namespace optim
}  // namespace deepspeed
