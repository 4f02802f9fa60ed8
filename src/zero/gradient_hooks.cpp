#include "zero/gradient_hooks.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

namespace deepspeed {
namespace zero {

using torch::autograd::variable_list;

GradientHooks::~GradientHooks() { clear(); }

void GradientHooks::add(const at::Tensor& param, std::function<void()> fn) {
  auto accumulator = torch::autograd::impl::grad_accumulator(param);
  TORCH_CHECK(accumulator, "gradient hook: parameter is not a leaf that requires grad");
  auto hook = std::make_unique<torch::autograd::utils::LambdaPostHook>(
      [fn = std::move(fn)](const variable_list& outputs, const variable_list&) {
        fn();
        return outputs;
      });
  uintptr_t key = accumulator->add_post_hook(std::move(hook));
  entries_.push_back({std::move(accumulator), key});
}

void GradientHooks::clear() {
  for (auto& e : entries_) e.accumulator->del_post_hook(e.key);
  entries_.clear();
}

}  // namespace zero
}  // namespace deepspeed
