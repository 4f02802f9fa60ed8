#include "runtime/module_placement.h"

#include <torch/torch.h>

#include <unordered_set>

#include "zero/stage3/unit_layout.h"

namespace deepspeed {

std::vector<at::Tensor> parameters_stage3_moves(torch::nn::Module& module) {
  std::vector<at::Tensor> out;
  std::unordered_set<const void*> seen;
  for (auto* unit : zero::find_units(module))
    for (const auto& p : unit->parameters())
      if (p.requires_grad() && seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
  return out;
}

void move_module_to_device(torch::nn::Module& module, c10::Device device, int zero_stage) {
  if (device.is_cpu()) return;
  if (zero_stage < 3) {
    module.to(device);
    return;
  }
  std::unordered_set<const void*> left_to_stage3;
  for (const auto& p : parameters_stage3_moves(module)) left_to_stage3.insert(p.unsafeGetTensorImpl());
  // As Module::to does it: the tensors keep their identity (set_data), so the client's handles
  // and the optimizer's parameter lists stay valid.
  torch::NoGradGuard no_grad;
  for (auto& p : module.parameters())
    if (!left_to_stage3.count(p.unsafeGetTensorImpl()) && p.device() != device)
      p.set_data(p.to(device));
  for (auto& b : module.buffers())
    if (b.device() != device) b.set_data(b.to(device));
}

}  // namespace deepspeed
